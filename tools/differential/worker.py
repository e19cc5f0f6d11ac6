"""One fresh process of the oracle: real ``torch.load`` calls next to ``predict()``.

Started by :mod:`tools.differential.oracle` with the environment state already in
``os.environ`` (torch reads it at every load), so each process is one environment state.
It imports torch and the library only -- not the corpus -- so the loads see the import state
of a fresh process.  Work items run in three passes (weights-only loads with nothing
declared, then with exactly ``required_globals``, then ``weights_only=False``), so loads
that import modules come after the ones whose outcome could depend on them.

Every file this process loads with ``weights_only=False`` was written by the generator of the
same run into a directory it created; nothing else is ever fully unpickled.

Results are JSON lines; ``{"begin": i}`` precedes item *i* so that the parent can tell
which item a crashed process was on, record the crash, and restart after it.
"""

from __future__ import annotations

import contextlib
import difflib
import io
import json
import os
import pickle
import re
import sys
import warnings
from typing import Any, Iterator, Optional

_GLOBAL_RE = re.compile(r"GLOBAL (\S+) was not an allowed global")
_WARNING_RE = re.compile(r"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected")
_CONFLICT_RE = re.compile(r"Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD`")

PASSES = {
    1: ("default", "safe_globals:none"),
    2: ("safe_globals:required",),
    3: ("weights_only_false",),
}


def work_items(ids: list[int], probe: bool) -> list[tuple[int, int]]:
    """(pass, checkpoint id) in the order a worker runs them."""
    if probe:
        return [(0, i) for i in ids]
    return [(p, i) for p in sorted(PASSES) for i in ids]


# -- the real load ----------------------------------------------------------------------------


def actual(variant: str, data: bytes, declared: list[Any]) -> dict[str, Any]:
    """What torch.load really does with *data* in *variant*."""
    import torch

    buf = io.BytesIO(data)
    out: dict[str, Any] = {"outcome": "loads", "warned": False}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            if variant == "weights_only_false":
                torch.load(buf, weights_only=False)
            elif variant == "default":
                torch.load(buf)
            else:
                from torch_serial_testing.registry import allowlisted

                with allowlisted(declared):  # the safe_globals context, or the registry before torch 2.5
                    torch.load(buf, weights_only=True)
        except Exception as e:  # noqa: BLE001 - every outcome is data here
            message = str(e)
            out["type"] = type(e).__name__
            out["message"] = message[-1200:]
            if isinstance(e, RuntimeError) and _CONFLICT_RE.search(message):
                out["outcome"] = "conflict"
            elif isinstance(e, pickle.UnpicklingError):
                out["outcome"] = "rejects"
            else:
                out["outcome"] = "error"
    out["warned"] = any(_WARNING_RE.search(str(w.message)) for w in caught)
    return out


def probe(data: bytes) -> dict[str, Any]:
    """The exclusion probe: can torch read its own bytes back with weights_only=False?"""
    import torch

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(io.BytesIO(data), weights_only=False)
    except Exception as e:  # noqa: BLE001
        return {"ok": False, "error": f"{type(e).__name__}: {_first_line(e)}"}
    return {"ok": True}


# -- the prediction ---------------------------------------------------------------------------


def predicted(variant: str, checkpoint: Any, declared: list[Any]) -> dict[str, Any]:
    """What the library's predict() says about *variant* here."""
    from torch_serial_testing.errors import ConflictingEnvironmentError
    from torch_serial_testing.prediction import predict

    mode = variant.partition(":")[0]
    try:
        exp = predict(mode, checkpoint, declared)
    except ConflictingEnvironmentError as e:
        return {"outcome": "conflict", "warns": False, "reason": str(e)}
    except Exception as e:  # noqa: BLE001 - a prediction that cannot be made is a disagreement
        return {"outcome": "predict-error", "type": type(e).__name__, "reason": _first_line(e)}
    if exp.unknown:  # a probe of this torch failed: not predicted, which is a disagreement too
        return {"outcome": "unknown", "warns": exp.warns, "reason": exp.unknown[:200]}
    return {
        "outcome": "loads" if exp.loads else "rejects",
        "warns": exp.warns,
        "weights_only": exp.weights_only,
        "missing": list(exp.missing),
        "opcodes": list(exp.unsupported_opcodes),
        "reason": exp.reason,
        "error_type": getattr(exp, "error_type", None),
        "_exp": exp,
    }


def declared_for(variant: str, checkpoint: Any) -> tuple[list[Any], Optional[str]]:
    """The safe_globals a variant declares: nothing, or exactly required_globals(...) resolved.

    Resolved as the mixin resolves strings: the object, or ``(obj, name)`` where the
    object's own ``module.qualname`` differs from the name.  Returns (declared, problem).
    """
    if variant != "safe_globals:required":
        return [], None
    from torch_serial_testing.declarations import resolve_global
    from torch_serial_testing.errors import qualified_name
    from torch_serial_testing.prediction import required_globals

    try:
        names = required_globals(checkpoint)
    except Exception as e:  # noqa: BLE001
        return [], f"required_globals raised {type(e).__name__}: {_first_line(e)}"
    out: list[Any] = []
    for name in names:
        try:
            obj = resolve_global(name)
        except Exception as e:  # noqa: BLE001
            return [], f"required global {name} is not importable: {_first_line(e)}"
        try:
            own = qualified_name(obj)
        except Exception:  # noqa: BLE001
            own = None
        out.append(obj if own == name else (obj, name))
    if any(isinstance(e, tuple) for e in out) and not registry_takes_named_entries():
        # torch 2.4 allowlists objects only, by their own name: this declaration cannot be made
        named = ", ".join(n for e in out if isinstance(e, tuple) for n in e[1:])
        return [], f"required globals {named} can only be allowlisted as (obj, name), which this torch cannot take"
    return out, None


_named_entries: dict[Any, bool] = {}


def registry_takes_named_entries() -> bool:
    """Whether torch's allowlist takes ``(obj, "module.Name")`` entries (torch 2.4 keys every entry by
    its own ``__module__.__name__``): registers ``(obj, "<its module>.RenamedProbe")`` and unpickles it."""
    from torch import _weights_only_unpickler as wou

    from torch_serial_testing.unpickler import STOP, ProbeFailed, ProbeOther, global_op, unpickle
    from torch_serial_testing.registry import preserved_registry

    key = wou._get_user_allowed_globals
    known = _named_entries.get(key)
    if known is None:
        name = f"{ProbeOther.__module__}.RenamedProbe"
        with preserved_registry():
            try:
                wou._add_safe_globals([(ProbeOther, name)])
                outcome = unpickle(global_op(name) + STOP)
            except ProbeFailed:
                raise
            except Exception as e:  # noqa: BLE001 - a registry that rejects the tuple form says no
                outcome = None
                if not isinstance(e, (TypeError, ValueError, AttributeError)):
                    raise ProbeFailed(f"registering an (obj, name) entry raised {type(e).__name__}: {e}") from None
        known = _named_entries[key] = outcome is not None and outcome.loaded and outcome.value is ProbeOther
    return known


# -- the comparison ---------------------------------------------------------------------------


def classify(message: str, kind: str) -> str:
    """A short cause label for a torch message (used to group disagreements)."""
    if "TorchScript" in message:
        return "R2 TorchScript archive"
    if "Can only SETITEM" in message or "Can only extend" in message or "Can only append" in message:
        return "R4 SETITEM/APPEND container check"
    if "Only persistent_load of storage" in message:
        return "R5 legacy ('module', ...) persistent id"
    if "must be imported" in message or "must be (" in message:
        return "R6 torch message naming no global"
    if kind.startswith("numpy"):
        return "R3 numpy BUILD type check"
    if "Unsupported operand" in message:
        return "opcode refused"
    m = _GLOBAL_RE.search(message)
    if m:
        return f"global not predicted ({m.group(1)})"
    last = [line for line in message.strip().splitlines() if line.strip()]
    return "other: " + re.sub(r" at 0x[0-9a-fA-F]+", "", last[0] if last else "")[:70]


def _similar(a: str, b: str) -> bool:
    match = difflib.SequenceMatcher(None, a, b).find_longest_match(0, len(a), 0, len(b))
    return match.size >= 20


def compare(pred: dict[str, Any], act: dict[str, Any], kind: str, fmt: str, checkpoint: Any) -> Optional[str]:
    """None when predict() agrees with torch, else the cause label."""
    from torch_serial_testing import loading as load_modes

    po, ao = pred["outcome"], act["outcome"]
    message = act.get("message", "")
    if po == "predict-error":
        if fmt.startswith("legacy-p") and fmt[-1] in "01" and pred["type"] == "CheckpointFormatError":
            return "R1 legacy protocol 0/1 not read as a torch checkpoint"
        return f"predict() raised {pred['type']}"
    if po == "unknown":
        return "not predicted here (a probe of torch failed): " + pred["reason"][:80]
    if (po == "conflict") != (ao == "conflict"):
        return "env: both-switches conflict"
    if po == "conflict":
        return None
    if pred["warns"] != act["warned"]:
        return "env: FORCE_NO warning"
    if po == "loads":
        if ao == "loads":
            return None
        return "predicted load, torch refused: " + classify(message, kind)
    if ao == "loads":
        return f"predicted rejection, torch loaded ({', '.join(pred['missing'] + pred['opcodes'])[:80]})"
    expected_type = pred.get("error_type") or "UnpicklingError"
    if act.get("type") != expected_type:
        return f"exception type: predicted {expected_type}, torch {act.get('type')} ({classify(message, kind)})"
    named = _GLOBAL_RE.search(message)
    if named:
        name = named.group(1)
        if name in pred["missing"] or f"builtins.{name}" in pred["missing"]:
            return None
        return "rejected, torch names a global predict() does not: " + classify(message, kind)
    if load_modes._names_a_cause(pred["_exp"], message):
        return None
    blocker = getattr(getattr(checkpoint, "info", None), "weights_only_blocker", None)
    if blocker and _similar(str(blocker), message):
        return None
    return "rejected for a reason predict() does not name: " + classify(message, kind)


def _first_line(e: BaseException) -> str:
    lines = [line for line in str(e).strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:200]


# -- main -------------------------------------------------------------------------------------


def generate_main(outdir: str, out_path: str, start: int) -> int:
    from tools.differential import cases

    with open(out_path.replace(".jsonl", ".ids")) as fh:
        spec = json.load(fh)
    items = cases.generation_items(tuple(spec["formats"]), spec["kinds"])
    cache: dict[str, Any] = {}
    with open(out_path, "a", buffering=1) as out:
        for index in range(start, len(items)):
            out.write(json.dumps({"begin": index}) + "\n")
            out.flush()
            kind, fmt = items[index]
            out.write(json.dumps({"i": index, **cases.generate_one(outdir, index, kind, fmt, cache)}) + "\n")
    return 0


def main(argv: list[str]) -> int:
    manifest_path, out_path, start, role = argv[0], argv[1], int(argv[2]), argv[3]
    if role == "generate":
        return generate_main(os.path.dirname(manifest_path), out_path, start)
    with open(manifest_path) as fh:
        manifest = {e["id"]: e for e in json.load(fh)}
    with open(out_path.replace(".jsonl", ".ids")) as fh:
        ids = json.load(fh)
    items = work_items(ids, role == "probe")
    with open(out_path, "a", buffering=1) as out:
        for index in range(start, len(items)):
            pass_no, cid = items[index]
            entry = manifest[cid]
            out.write(json.dumps({"begin": index}) + "\n")
            out.flush()
            with open(entry["path"], "rb") as fh:
                data = fh.read()
            with _qengine(entry.get("qengine")):
                if role == "probe":
                    out.write(json.dumps({"i": index, "id": cid, "probe": probe(data)}) + "\n")
                    continue
                out.write(json.dumps({"i": index, "id": cid, "r": _compare_all(pass_no, entry, data)}) + "\n")
    return 0


@contextlib.contextmanager
def _qengine(name: Optional[str]) -> Iterator[None]:
    """Load under the quantized engine the checkpoint's packed parameters need (restored after)."""
    if name is None:
        yield
        return
    import torch

    before = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = before


def _compare_all(pass_no: int, entry: dict[str, Any], data: bytes) -> list[dict[str, Any]]:
    """Every variant of one pass for one checkpoint: the real load next to predict()."""
    from torch_serial_testing.checkpoint import Checkpoint
    from torch_serial_testing.tools import FileCheckpoint

    # The core reads torch.save's zip archive from memory; legacy streams and TorchScript archives are
    # read by the tools, as inspect reads them.  The predictions are the same either way.
    reader = Checkpoint if entry["format"].startswith("zip") else FileCheckpoint
    checkpoint = reader.from_bytes(data)
    results = []
    for variant in PASSES[pass_no]:
        declared, problem = declared_for(variant, checkpoint)
        act = actual(variant, data, declared)
        if problem is not None:
            # required_globals could not give a declaration: the variant agrees only if
            # torch indeed cannot load this weights-only (it rejects even the bare set).
            pred = {"outcome": "required-refused", "reason": problem}
            ok = act["outcome"] in ("rejects", "error", "conflict")
            if not ok and act["outcome"] == "loads":
                # Not a weights-only load at all (torch 2.4 hands a TorchScript archive to
                # torch.jit.load): no declaration was needed, as the bare prediction must say.
                bare = predicted(variant, checkpoint, [])
                ok = bare.get("outcome") == "loads" and bare.get("weights_only") is False
            cause = None if ok else "required_globals refused, torch loads weights-only: " + problem[:60]
        else:
            pred = predicted(variant, checkpoint, declared)
            cause = compare(pred, act, entry["kind"], entry["format"], checkpoint)
            pred.pop("_exp", None)
        rec: dict[str, Any] = {"v": variant, "ok": cause is None}
        if cause is not None:
            rec.update(cause=cause, pred=pred, act=act)
        results.append(rec)
    return results


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
