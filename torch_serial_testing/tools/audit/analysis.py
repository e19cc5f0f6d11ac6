"""One observed ``torch.load``'s record: what it needed, where its bytes came from, a verified fix.

``needs`` is the library's static scan (:func:`~..loading.required.required_globals`, dtype classes
included), never an unpickling.  Every trial load goes through torch's own ``torch.serialization.load``
(:func:`~...serialization.genuine`: known by identity, never the ``torch.load`` a test or a shim
installed), on a fresh buffer of the *same bytes*, with the call's ``map_location``:

* a call that loaded weights-only needs nothing when torch's own weights-only load of those bytes, with
  the globals the test allows at that moment, loads them (the fix: nothing to change);
* ``safe_globals`` when every needed global passes the trust policy, verified by ``weights_only=True``
  inside ``torch.serialization.safe_globals`` of exactly those globals;
* ``weights_only_false`` only when the bytes are exactly the bytes one ``torch.save`` of the same test
  wrote (the save's sha256 covers the range it wrote, nothing before or after), verified by a full
  load after the digest of the bytes to load is checked once more against that save's;
* otherwise ``none`` with the policy's reasons.  Foreign bytes are never loaded in full.
"""

from __future__ import annotations

import hashlib
import io
import os
import re
import sys
from typing import Any, Mapping, Optional, Sequence

from ...modes import FORCE_NO_WO, FORCE_WO, LoadMode, decide, switch_values

__all__ = ["digest", "load_record", "needs_of", "verified_fix", "resolve_names", "trial"]

_MODES = {None: LoadMode.DEFAULT, True: LoadMode.SAFE_GLOBALS, False: LoadMode.WEIGHTS_ONLY_FALSE}
#: The fix of a call that loaded weights-only and needs nothing more (verified by torch's own loader).
NOTHING_TO_CHANGE = {"kind": "none", "snippet": None, "verified": True}


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def first_line(error: BaseException) -> str:
    """``Type: first line`` of *error*; for torch's weights-only rejection, the unpickler's own line."""
    text = re.sub(r"\x1b\[[0-9;]*m", "", str(error))
    _, marker, rest = text.partition("WeightsUnpickler error: ")
    lines = (rest if marker else text).strip().splitlines()
    return f"{type(error).__name__}: {lines[0] if lines else ''}".rstrip(": ")


def needs_of(data: Optional[bytes]) -> Optional[list[str]]:
    """Globals the bytes need beyond torch's allowlist (None: not a checkpoint the scan can read)."""
    if data is None:
        return None
    from ..formats import required_globals

    try:
        return required_globals(data)
    except Exception:  # torchscript, legacy, truncated: nothing weights_only could be asked about
        return None


def resolve_names(names: Sequence[str]) -> list[Any]:
    """The objects the verified names refer to, among modules already imported (nothing is imported)."""
    found = []
    for name in names:
        parts = name.split(".")
        for cut in range(len(parts) - 1, 0, -1):
            module = sys.modules.get(".".join(parts[:cut]))
            if module is not None:
                obj: Any = module
                for attr in parts[cut:]:
                    obj = getattr(obj, attr)
                found.append(obj)
                break
        else:
            raise LookupError(f"{name} is not in an imported module")
    return found


def trial(
    data: bytes, weights_only: bool, args: tuple[Any, ...] = (), kwargs: Optional[Mapping[str, Any]] = None
) -> bool:
    """Whether torch's own ``torch.serialization.load`` loads *data* with *weights_only* and the call's
    ``map_location`` (positional or keyword); False when it raises, or when torch's own function cannot be
    found (:class:`~...errors.ProbeFailed`: replaced in place)."""
    from ...serialization import genuine

    kwargs = kwargs or {}
    where = {"map_location": kwargs["map_location"]} if "map_location" in kwargs else {}
    try:
        genuine("load")(io.BytesIO(data), *args[:1], weights_only=weights_only, **where)
    except Exception:
        return False
    return True


def verified_fix(
    data: Optional[bytes],
    needs: Optional[list[str]],
    own_digest: Optional[str] = None,
    args: tuple[Any, ...] = (),
    kwargs: Optional[Mapping[str, Any]] = None,
) -> dict[str, Any]:
    """``{"kind", "snippet", "verified"}`` for a load of *data* (*own_digest*: the sha256 of the bytes one
    ``torch.save`` of this test wrote, when the bytes loaded are those)."""
    if data is None or needs is None:
        return {"kind": "none", "snippet": None, "verified": False}
    if not needs:
        return {"kind": "none", "snippet": None, "verified": trial(data, True, args, kwargs)}
    from ..policy.snippet import refusal_notes, safe_globals_snippet, suggestible

    if sorted(suggestible(needs)) == sorted(needs):
        try:
            objects = resolve_names(needs)
        except (LookupError, AttributeError):
            objects = None
        ok = False
        if objects is not None:
            from ...registry import allowlisted  # safe_globals, or add_safe_globals undone (torch < 2.5)

            with allowlisted(objects):
                ok = trial(data, True, args, kwargs)
        return {"kind": "safe_globals", "snippet": safe_globals_snippet(needs), "verified": ok}
    if own_digest is not None and digest(data) == own_digest:  # checked again right before the full load
        return {
            "kind": "weights_only_false",
            "snippet": "obj = torch.load(f, weights_only=False)  # only for bytes this test saved itself",
            "verified": trial(data, False, args, kwargs),
        }
    notes = "; ".join(refusal_notes(needs)) or "the trust policy vouches for none of " + ", ".join(needs)
    return {"kind": "none", "snippet": f"# no safe fix: {notes}", "verified": False}


def provenance(
    data: Optional[bytes], path: Optional[str], saved: Mapping[str, tuple[Optional[str], Optional[str]]]
) -> dict[str, Any]:
    """Where the loaded bytes came from: exactly the bytes one ``torch.save`` of this process wrote, a
    repository file, or unknown."""
    if data is not None:
        hit = saved.get(digest(data))
        if hit is not None:
            return {"kind": "saved_in_process", "test": hit[0], "site": hit[1]}
    if path is not None:
        full = os.path.abspath(path)
        rel = os.path.relpath(full, os.getcwd())
        if not rel.startswith(os.pardir) and os.path.isfile(full):
            return {"kind": "repository_file", "path": rel}
    return {"kind": "unknown"}


def load_record(
    test: Optional[str],
    site: Optional[str],
    data: Optional[bytes],
    path: Optional[str],
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any],
    error: Optional[BaseException],
    saved: Mapping[str, tuple[Optional[str], Optional[str]]],
) -> dict[str, Any]:
    """The JSONL record of one observed load (keys in the documented order)."""
    arg = kwargs.get("weights_only")
    arg = arg if arg is None or isinstance(arg, bool) else bool(arg)
    wo, no = switch_values()
    try:
        effective: Optional[bool] = decide(_MODES[arg]).weights_only
    except Exception:  # both switches set: torch raises on every load; or torch cannot be asked
        effective = None
    data = None if data is None else bytes(data)
    where = provenance(data, path, saved)
    own = digest(data) if data is not None and where["kind"] == "saved_in_process" and where["test"] == test else None
    needs = needs_of(data)
    if error is None and effective is True and data is not None and trial(data, True, args, kwargs):
        fix = dict(NOTHING_TO_CHANGE)  # loaded weights-only: the globals it needs, the test already allows
    else:
        fix = verified_fix(data, needs, own, args, kwargs)
    return {
        "event": "load",
        "test": test,
        "site": site,
        "weights_only_arg": arg,
        "effective_weights_only": effective,
        "switches": {FORCE_WO: _text(wo), FORCE_NO_WO: _text(no)},
        "loaded": error is None,
        "error": None if error is None else first_line(error),
        "needs": needs,
        "provenance": where,
        "fix": fix,
    }


def _text(value: Any) -> Optional[str]:
    return value.decode("utf-8", "surrogateescape") if isinstance(value, bytes) else value
