"""The differential matrix: formats, environment states, load variants, and the generator.

The generator (a worker process of its own, so a torch crash while saving is recorded, not
fatal) saves every corpus kind in every format into a private temporary directory; the
workers (:mod:`tools.differential.worker`) load those files.  A kind that cannot be built,
or that torch cannot save in a format, is recorded with torch's exception -- a visible
exclusion, never a missing case.
"""

from __future__ import annotations

import io
import os
import warnings
from dataclasses import asdict, dataclass
from typing import Any, Optional

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"

#: Every format: zip (torch.save's default) and the legacy format with pickle protocols 0-5,
#: and torch.jit.save for TorchScript kinds.
FULL_FORMATS = tuple(f"zip-p{p}" for p in range(6)) + tuple(f"legacy-p{p}" for p in range(6)) + ("jit",)
#: The CI subset: the default protocol in both formats, protocol 0 legacy, and TorchScript.
CI_FORMATS = ("zip-p2", "legacy-p2", "legacy-p0", "jit")

#: The spellings tried for each switch: torch's truthy ones in several cases, and near misses.
VALUES = ("1", "Y", "true", "YES", "yes ", " 1", "on", "0", "")


def _env_states(values: tuple[str, ...], both: tuple[tuple[str, str], ...]) -> list[dict[str, str]]:
    states: list[dict[str, str]] = [{}]
    states += [{FORCE_WO: v} for v in values]
    states += [{FORCE_NO_WO: v} for v in values]
    states += [{FORCE_WO: a, FORCE_NO_WO: b} for a, b in both]
    return states


FULL_ENVS = _env_states(VALUES, (("1", "1"), ("true", "Y"), ("1", "0"), ("0", "YES")))
CI_ENVS = _env_states(("YES", "yes "), (("true", "Y"),))

#: Load variants per checkpoint: the three modes, the safe_globals one twice (nothing declared,
#: and exactly required_globals(...)).
VARIANTS = ("weights_only_false", "default", "safe_globals:none", "safe_globals:required")


def env_label(env: dict[str, str]) -> str:
    if not env:
        return "unset"
    short = {FORCE_WO: "WO", FORCE_NO_WO: "NO"}
    return ",".join(f"{short[k]}={v!r}" for k, v in sorted(env.items()))


@dataclass
class Saved:
    """One checkpoint file of the corpus."""

    id: int
    kind: str
    format: str
    path: str
    #: The quantized engine the loads run under (None: the process default).
    qengine: Optional[str] = None


@dataclass
class Excluded:
    """A case that never reaches the comparison, and torch's (or the corpus's) reason."""

    kind: str
    format: str
    stage: (
        str  # "build" (corpus cannot build it here), "save" (torch cannot save it), "load" (torch cannot read it back)
    )
    error: str


def save_bytes(obj: Any, fmt: str) -> bytes:
    """The bytes torch writes for *obj* in *fmt*."""
    import torch

    buf = io.BytesIO()
    if fmt == "jit":
        if not isinstance(obj, torch.jit.ScriptModule):
            raise TypeError("torch.jit.save takes only ScriptModules")
        torch.jit.save(obj, buf)
    else:
        family, _, proto = fmt.partition("-p")
        torch.save(obj, buf, pickle_protocol=int(proto), _use_new_zipfile_serialization=(family == "zip"))
    return buf.getvalue()


def generation_items(formats: tuple[str, ...], kind_names: Optional[list[str]] = None) -> list[tuple[str, str]]:
    """(kind, format) pairs to save, in a fixed order (TorchScript kinds also get ``jit``)."""
    from . import corpus

    all_kinds = corpus.kinds()
    if kind_names:
        unknown = sorted(set(kind_names) - set(all_kinds))
        if unknown:
            raise SystemExit(f"unknown kinds: {', '.join(unknown)}; see tools.differential.corpus.kinds()")
    return [
        (kind, fmt)
        for kind in all_kinds
        if not kind_names or kind in kind_names
        for fmt in formats
        if fmt != "jit" or kind in corpus.SCRIPT_KINDS  # torch.jit.save takes only ScriptModules
    ]


def generate_one(outdir: str, index: int, kind: str, fmt: str, cache: dict[str, Any]) -> dict[str, Any]:
    """Save one (kind, format) into *outdir*; a record of the file or of the exclusion."""
    from . import corpus

    if cache.get("kind") != kind:
        cache.clear()
        cache["kind"] = kind
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache["obj"] = corpus.kinds()[kind]()
        except Exception as e:  # noqa: BLE001 - reported as a build exclusion
            cache["error"] = f"{type(e).__name__}: {_first_line(e)}"
    if "error" in cache:
        return {"excluded": asdict(Excluded(kind, fmt, "build", cache["error"]))}
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            data = save_bytes(cache["obj"], fmt)
    except Exception as e:  # noqa: BLE001 - reported as a save exclusion
        return {"excluded": asdict(Excluded(kind, fmt, "save", f"{type(e).__name__}: {_first_line(e)}"))}
    path = os.path.join(outdir, f"{index:05d}.pt")
    with open(path, "wb") as fh:
        fh.write(data)
    return {"saved": asdict(Saved(index, kind, fmt, path, corpus.LOAD_QENGINE.get(kind)))}


def _first_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    return (text[0] if text else "")[:160]
