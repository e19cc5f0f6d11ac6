"""``inspect``: what ``torch.load`` would do with a checkpoint here, without unpickling it.

The checkpoint's pickle opcodes are scanned (never unpickled; ``torch.load`` is
never called on the input); the report says which globals it needs, what each
load mode would do, and offers a ``safe_globals`` snippet of validated names.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from .cli import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, MODES, SCHEMA_VERSION, _torch_info

__all__ = ["inspect_report", "format_inspect"]


def _judge_here(name: str) -> Optional[tuple[str, str]]:
    """("dangerous"|"unknown", why) for *name*, judged only from modules already imported.

    Nothing is imported and no module ``__getattr__`` runs: attributes are read from
    module ``__dict__``s and with :func:`inspect.getattr_static`.  Returns None when
    the name looks fine or cannot be judged without importing.
    """
    import importlib.machinery
    import inspect as _inspect
    import types

    from .allowlist import dangerous_reason

    parts = name.split(".")
    if parts[0] in ("__main__", "__mp_main__"):
        return None  # the saving script's __main__, not this one
    for cut in range(len(parts) - 1, 0, -1):
        path = ".".join(parts[:cut])
        obj: Any = sys.modules.get(path)
        if obj is None:
            continue
        for attr in parts[cut:]:
            if isinstance(obj, types.ModuleType):
                sub = sys.modules.get(f"{path}.{attr}")
                if attr in vars(obj):
                    obj = vars(obj)[attr]
                elif sub is not None:
                    obj = sub
                else:
                    search = getattr(obj, "__path__", None)
                    try:
                        found = search is not None and importlib.machinery.PathFinder.find_spec(
                            f"{path}.{attr}", list(search)) is not None
                    except (ImportError, ValueError):
                        found = False
                    if found or "__getattr__" in vars(obj):
                        return None  # a submodule not imported yet, or a lazy attribute: cannot tell
                    return "unknown", (
                        f"{path} (already imported) has no attribute {attr!r}: a forged name or one "
                        "from another torch version; no load mode can load it here"
                    )
            else:
                try:
                    obj = _inspect.getattr_static(obj, attr)
                except AttributeError:
                    return "unknown", f"{path} has no attribute {attr!r}: no load mode can load it here"
            path = f"{path}.{attr}"
        if isinstance(obj, types.ModuleType):
            return "dangerous", (
                f"it is the module {obj.__name__}: torch.save never writes a module as a global, and "
                "a module hands the pickle all of its attributes"
            )
        real_module = getattr(obj, "__module__", None)
        real_name = getattr(obj, "__qualname__", None)
        if isinstance(real_module, str) and isinstance(real_name, str):
            real = f"{real_module}.{real_name}"
            reason = dangerous_reason(real) if real != name else None
            if reason:
                return "dangerous", f"it resolves to {real}: {reason}"
        return None
    return None


def _read_input(arg: str) -> bytes:
    if arg == "-":
        return sys.stdin.buffer.read()
    with open(arg, "rb") as fh:
        return fh.read()


def inspect_report(checkpoint: str, safe_globals: Sequence[str] = (), data: Optional[bytes] = None,
                   environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The facts ``inspect`` prints, as the documented JSON object (never unpickles *data*)."""
    from .allowlist import SafeGlobal, dangerous_reason, safe_globals_snippet, torch_allowlist
    from .checkpoint import Checkpoint
    from .errors import CheckpointFormatError, ConflictingEnvironmentError
    from .load_modes import LoadMode, mode_skip_reason, predict, torch_load_replacement

    given = list(dict.fromkeys(safe_globals))
    report: dict[str, Any] = {
        "schema": SCHEMA_VERSION,
        "command": "inspect",
        "status": "unreadable",
        "exit_code": EXIT_DANGEROUS,
        "checkpoint": checkpoint,
        "nbytes": None,
        "format": None,
        "error": None,
        "globals": [],
        "required_globals": [],
        "dangerous": [],
        "unknown": [],
        "safe_globals": {"given": given, "unused": []},
        "modes": {},
        "snippet": None,
        "torch": _torch_info(),
        "torch_load_replaced_by": torch_load_replacement(),
    }
    try:
        if data is None:
            data = _read_input(checkpoint)
    except OSError as e:
        report["error"] = f"cannot read {checkpoint!r}: {e.strerror or e}"
        return report
    report["nbytes"] = len(data)
    ckpt = Checkpoint.from_bytes(data)  # foreign bytes: only ever scanned here
    try:
        info = ckpt.info
    except CheckpointFormatError as e:
        report["error"] = str(e)
        return report
    allowed = torch_allowlist()
    required = [g for g in info.globals if g not in allowed]
    dangerous = [{"name": g, "reason": dangerous_reason(g)} for g in required if dangerous_reason(g)]
    flagged = {d["name"] for d in dangerous}
    unknown = []
    for g in required:
        if g not in flagged:
            judged = _judge_here(g)
            if judged:
                (dangerous if judged[0] == "dangerous" else unknown).append({"name": g, "reason": judged[1]})
    dangerous.sort(key=lambda d: d["name"])
    flagged |= {u["name"] for u in dangerous + unknown}
    report.update(
        format=info.format,
        globals=list(info.globals),
        required_globals=required,
        dangerous=dangerous,
        unknown=unknown,
    )
    report["safe_globals"]["unused"] = [n for n in given if n not in required]
    sgs = [SafeGlobal(None, n, explicit_name=True) for n in given]  # names only: never imported

    modes: dict[str, dict[str, Any]] = {}
    conflict: Optional[str] = None
    for mode in LoadMode:
        try:
            exp = predict(mode, ckpt, sgs, environ)
        except ConflictingEnvironmentError as e:
            conflict = str(e)
            modes[mode.value] = {"weights_only": None, "outcome": "error", "missing": [],
                                 "summary": "error: RuntimeError on every torch.load: " + conflict}
            continue
        modes[mode.value] = _mode_result(mode.value, exp, info.format, flagged, given)
        unavailable = mode_skip_reason(mode)
        if unavailable:
            modes[mode.value]["summary"] += (
                f" [{unavailable}: the same allowlist works with torch.serialization.add_safe_globals]"
            )
    report["modes"] = modes

    if conflict:
        status, report["error"] = "environment_error", conflict
    elif dangerous:
        status = "dangerous"
    elif unknown:
        status = "unloadable"
    elif info.format in ("torchscript", "tar"):
        status = "needs_trusted_loader"
    elif modes["safe_globals"]["outcome"] == "loads":
        status = "loads"
    else:
        status = "needs_allowlist"
    report["status"] = status
    report["exit_code"] = {"loads": EXIT_OK, "needs_allowlist": EXIT_ATTENTION,
                           "needs_trusted_loader": EXIT_ATTENTION}.get(status, EXIT_DANGEROUS)
    suggest = [g for g in required if g not in flagged]
    if status in ("needs_allowlist", "loads") and info.format not in ("torchscript", "tar") and suggest:
        report["snippet"] = safe_globals_snippet(suggest)
    return report


def _mode_result(mode: str, exp: Any, fmt: str, flagged: set[str], given: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"weights_only": exp.weights_only, "missing": list(exp.missing)}
    why = exp.reason + ("; torch warns (UserWarning)" if exp.warns else "")
    if not exp.weights_only:
        target = "hands the archive to torch.jit.load, which runs its TorchScript code" if fmt == "torchscript" \
            else "would execute arbitrary pickle code from the file"
        out["outcome"] = "unsafe"
        out["summary"] = (f"unsafe: {why}: {target}; this tool never does it (only for trusted files)")
        return out
    if fmt == "torchscript":
        out["outcome"] = "rejected"
        out["summary"] = (f"rejected: {why}: torch.load refuses TorchScript archives weights-only "
                          "(RuntimeError); torch.jit.load loads them, only for trusted files")
        return out
    if fmt == "tar":
        out["outcome"] = "rejected"
        out["summary"] = (f"rejected: {why}: torch.load cannot read the legacy .tar format weights-only "
                          "(RuntimeError); re-save it from a trusted environment")
        return out
    if exp.loads:
        risky = [g for g in given if g in flagged] if mode == "safe_globals" else []
        if risky:
            out["outcome"] = "unsafe"
            out["summary"] = (f"unsafe: {why}; it would load only because --safe-global allowlists "
                              f"{', '.join(risky)}, which the pickle would call: DANGEROUS, never allowlist it")
            return out
        out["outcome"] = "loads"
        out["summary"] = f"loads ({why})"
        return out
    out["outcome"] = "rejected"
    names = ", ".join(exp.missing)
    raised = (f"'Unsupported global: GLOBAL {exp.missing[0]}'" if len(exp.missing) == 1
              else "'Unsupported global: GLOBAL <name>' for the first one it meets")
    out["summary"] = f"rejected: {why}; not allowlisted: {names} (torch raises _pickle.UnpicklingError: {raised})"
    return out


def format_inspect(r: dict[str, Any]) -> str:
    lines = []
    if r["format"] is None:
        lines.append(f"checkpoint: {r['checkpoint']}" + (f" ({r['nbytes']} bytes)" if r["nbytes"] is not None else ""))
        lines.append(f"UNREADABLE: {r['error']}")
        lines.append(f"status: {r['status'].upper()} (exit {r['exit_code']})")
        return "\n".join(lines)
    t = r["torch"]
    lines.append(f"checkpoint: {r['checkpoint']} ({r['nbytes']} bytes, format {r['format']})")
    lines.append(f"torch {t['version']}; torch.load is "
                 + (f"REPLACED by {r['torch_load_replaced_by']} (predictions follow torch's own rules)"
                    if r["torch_load_replaced_by"] else "torch's own"))
    req = r["required_globals"]
    flagged = {d["name"]: f"DANGEROUS: {d['reason']}" for d in r["dangerous"]}
    flagged.update({u["name"]: f"UNKNOWN: {u['reason']}" for u in r["unknown"]})
    if r["format"] == "torchscript":
        lines.append("a TorchScript archive: its code is not a pickle of globals; weights_only does not apply")
    else:
        lines.append(f"globals beyond torch's allowlist ({len(req)}), found without unpickling:"
                     + ("" if req else " none"))
        for g in req:
            lines.append(f"  {g}" + (f"    <-- {flagged[g]}" if g in flagged else ""))
    sg = r["safe_globals"]
    if sg["given"]:
        lines.append(f"--safe-global: {', '.join(sg['given'])}"
                     + (f" (not needed: {', '.join(sg['unused'])})" if sg["unused"] else ""))
    lines.append("load modes here:")
    for name in MODES:
        lines.append(f"  {name:<19} {r['modes'][name]['summary']}")
    if r["snippet"]:
        lines.append("to load it weights-only, only if you trust these classes:")
        lines.extend(f"    {line}" if line else "" for line in r["snippet"].splitlines())
    lines.append(f"status: {r['status'].upper()} (exit {r['exit_code']})")
    default = r["modes"]["default"]
    if r["status"] == "needs_allowlist" and default["outcome"] == "rejected":
        lines.append(
            f"  - answer: a bare torch.load here is {default['summary'].split('; ')[0][len('rejected: '):]}, "
            f"and this checkpoint needs {len(r['required_globals'])} global(s) beyond torch's allowlist: "
            "allowlist them as above if you trust them, or pass weights_only=False for a trusted file only"
        )
    if r["error"]:
        lines.append(f"  - {r['error']}")
    if r["dangerous"]:
        lines.append("  - DANGEROUS: do not load this file with weights_only=False, and never allowlist "
                     + ", ".join(d["name"] for d in r["dangerous"]))
    return "\n".join(lines)
