"""``inspect``: what ``torch.load`` would do with a checkpoint here, without unpickling it.

The checkpoint's pickle opcodes are scanned (never unpickled; ``torch.load`` is
never called on the input); every global it needs is judged by the trust policy
(:mod:`torch_serial_testing.policy.trust`, which never imports what a checkpoint names);
the report says what each load mode would do and offers a snippet holding only
imports of verified classes and one ``safe_globals`` call.  Names are data: every
one is shown escaped, and the text report escapes every non-printable character.
"""

from __future__ import annotations

import sys
from typing import Any, Optional, Sequence

from ..core.names import escape_text, show_name
from .contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, SCHEMA_VERSION, torch_info

MODES = ("weights_only_false", "safe_globals", "default")
#: loading.prediction.undecided's reason: torch could not be asked what weights_only the call gets.
_UNDECIDED = "what torch.load decides here is unknown"

__all__ = ["inspect_report", "format_inspect"]


def _full_load_names(info: Any) -> list[str]:
    """``CheckpointInfo.full_load_globals`` as a list of names, when the scanner provides it."""
    full = getattr(info, "full_load_globals", None)
    if not full:
        return []
    values = full.values() if hasattr(full, "values") else full
    return sorted({n for n in values if isinstance(n, str)})


def _read_input(arg: str) -> bytes:
    if arg == "-":
        return sys.stdin.buffer.read()
    with open(arg, "rb") as fh:
        return fh.read()


def inspect_report(checkpoint: str, safe_globals: Sequence[str] = (), data: Optional[bytes] = None,
                   environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The facts ``inspect`` prints, as the documented JSON object (never unpickles *data*)."""
    from ..core.errors import CheckpointFormatError, ConflictingEnvironmentError
    from ..core.modes import LoadMode
    from ..loading.load import mode_skip_reason
    from ..loading.prediction import predict
    from ..policy.declared import SafeGlobal
    from ..policy.snippet import refusal_notes, safe_globals_snippet
    from ..policy.trust import judge_name
    from ..scan.checkpoint import Checkpoint
    from ..torch_facts.loader import torch_load_replacement
    from ..torch_facts.registry import torch_allowlist

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
        "malformed": [],
        "unknown": [],
        "needs_opt_in": [],
        "notes": [],
        "safe_globals": {"given": given, "unused": []},
        "modes": {},
        "snippet": None,
        "torch": torch_info(),
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
    except Exception as e:  # noqa: BLE001 - hostile bytes must end as "unreadable" (exit 2), never a traceback
        report["error"] = f"cannot scan it ({type(e).__name__}: {e})"
        return report
    allowed = torch_allowlist()
    required = [g for g in info.globals if g not in allowed]
    verdicts = {g: judge_name(g, allowed) for g in required}

    def listed(kind: str) -> list[dict[str, str]]:
        return [{"name": g, "reason": v.reason} for g, v in verdicts.items() if v.kind == kind]

    dangerous, malformed, unknown, opt_in = listed("dangerous"), listed("malformed"), listed("absent") + listed("alias"), listed("callable")
    flagged = {g for g, v in verdicts.items() if v.kind in ("dangerous", "malformed", "absent", "alias")}
    # Where the scanner records the names a *full* unpickle resolves (pickle's _compat_pickle,
    # torch's load_module_mapping), a gadget hiding behind a rewrite is flagged under that name.
    for full in _full_load_names(info):
        if full not in verdicts and full not in allowed:
            verdict = judge_name(full, allowed)
            if verdict.kind in ("dangerous", "malformed"):
                dangerous.append({"name": full, "reason": f"a full unpickle of this file resolves a global as "
                                                          f"{show_name(full)}: {verdict.reason}"})
    blocker = getattr(info, "weights_only_blocker", None)
    # --safe-global names the checkpoint needs but the policy refuses (a load "because" of them)
    refused_given = [g for g in given if g in flagged]
    callable_given = [g for g in given if g in verdicts and verdicts[g].kind == "callable"]
    report.update(
        format=info.format,
        globals=list(info.globals),
        required_globals=required,
        dangerous=dangerous,
        malformed=malformed,
        unknown=unknown,
        needs_opt_in=opt_in,
    )
    report["safe_globals"]["unused"] = [n for n in given if n not in required]
    sgs = [SafeGlobal(None, n, explicit_name=True) for n in given]  # names only: never imported

    modes: dict[str, dict[str, Any]] = {}
    conflict: Optional[str] = None
    unpredictable: Optional[str] = None
    for mode in LoadMode:
        try:
            exp = predict(mode, ckpt, sgs, environ)
        except ConflictingEnvironmentError as e:
            conflict = str(e)
            modes[mode.value] = {"weights_only": None, "outcome": "error", "missing": [],
                                 "summary": "error: RuntimeError on every torch.load: " + conflict}
            continue
        modes[mode.value] = _mode_result(mode.value, exp, info.format, refused_given, callable_given)
        unpredictable = unpredictable or exp.unknown
        unavailable = mode_skip_reason(mode)
        if unavailable:
            modes[mode.value]["summary"] += (
                f" [{unavailable}: the same allowlist works with torch.serialization.add_safe_globals]"
            )
    report["modes"] = modes

    if blocker and not conflict:
        report["error"] = f"no allowlist makes it load weights-only here: {blocker}"
    if unpredictable and not conflict:  # never a guess: this torch could not be asked what it does
        report["error"] = f"cannot predict what torch.load does here: {unpredictable}"
    if conflict:
        status, report["error"] = "environment_error", conflict
    elif dangerous or malformed:
        status = "dangerous"
    elif unpredictable:
        status = "environment_error"
    elif info.format in ("torchscript", "tar"):  # never weights-only: a loader only for trusted files
        status = "needs_trusted_loader"
    elif unknown or blocker:
        status = "unloadable"
    elif opt_in:
        status = "needs_opt_in"
    elif modes["safe_globals"]["outcome"] == "loads":
        status = "loads"
    else:
        status = "needs_allowlist"
    report["status"] = status
    report["exit_code"] = {"loads": EXIT_OK, "needs_allowlist": EXIT_ATTENTION, "needs_opt_in": EXIT_ATTENTION,
                           "needs_trusted_loader": EXIT_ATTENTION}.get(status, EXIT_DANGEROUS)
    suggest = [g for g, v in verdicts.items() if v.suggestible]
    if status in ("needs_allowlist", "loads", "needs_opt_in") and suggest:
        report["snippet"] = safe_globals_snippet(suggest)
    report["notes"] = refusal_notes(required, allowed) if required else []
    return report


def _mode_result(mode: str, exp: Any, fmt: str, refused_given: list[str], callable_given: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {"weights_only": exp.weights_only, "missing": list(exp.missing)}
    if exp.unknown:  # a probe of this torch failed: no outcome is claimed
        out["weights_only"] = None if exp.reason == _UNDECIDED else exp.weights_only
        out["outcome"] = "error"
        out["summary"] = f"error: cannot predict this load here ({exp.unknown}); {exp.reason}"
        return out
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
        risky = [show_name(g) for g in refused_given] if mode == "safe_globals" else []
        calls = [show_name(g) for g in callable_given] if mode == "safe_globals" else []
        if risky:
            out["outcome"] = "unsafe"
            out["summary"] = (f"unsafe: {why}; it would load only because --safe-global allowlists "
                              f"{', '.join(risky)}: DANGEROUS, never allowlist it")
            return out
        out["outcome"] = "loads"
        out["summary"] = f"loads ({why})" + (
            f"; only because --safe-global allowlists {', '.join(calls)}, which is not a class: the pickle "
            "calls it (the library requires UnsafeCallable for it)" if calls else "")
        return out
    out["outcome"] = "rejected"
    names = ", ".join(show_name(g) for g in exp.missing)
    raised = (f"'Unsupported global: GLOBAL {show_name(exp.missing[0])}'" if len(exp.missing) == 1
              else "'Unsupported global: GLOBAL <name>' for the first one it meets")
    out["summary"] = f"rejected: {why}; not allowlisted: {names} (torch raises _pickle.UnpicklingError: {raised})"
    return out


def format_inspect(r: dict[str, Any]) -> str:
    """The text report.  Names come out through :func:`show_name`, other fields through
    :func:`escape_text`, and every line is escaped once more, so no byte of the input can
    add a line, move the cursor or recolour the terminal."""
    return "\n".join(escape_text(line) for line in _inspect_lines(r))


def _inspect_lines(r: dict[str, Any]) -> list[str]:
    lines = []
    where = escape_text(r["checkpoint"])
    if r["format"] is None:
        lines.append(f"checkpoint: {where}" + (f" ({r['nbytes']} bytes)" if r["nbytes"] is not None else ""))
        lines.append(f"UNREADABLE: {escape_text(r['error'])}")
        lines.append(f"status: {r['status'].upper()} (exit {r['exit_code']})")
        return lines
    t = r["torch"]
    lines.append(f"checkpoint: {where} ({r['nbytes']} bytes, format {r['format']})")
    lines.append(f"torch {t['version']}; torch.load is "
                 + (f"REPLACED by {escape_text(r['torch_load_replaced_by'])} (predictions follow torch's own rules)"
                    if r["torch_load_replaced_by"] else "torch's own"))
    req = r["required_globals"]
    flagged = {d["name"]: f"DANGEROUS: {d['reason']}" for d in r["dangerous"]}
    flagged.update({d["name"]: f"MALFORMED: {d['reason']}" for d in r.get("malformed", [])})
    flagged.update({u["name"]: f"UNKNOWN: {u['reason']}" for u in r["unknown"]})
    flagged.update({u["name"]: f"NOT A CLASS: {u['reason']}" for u in r.get("needs_opt_in", [])})
    if r["format"] == "torchscript":
        lines.append("a TorchScript archive: its code is not a pickle of globals; weights_only does not apply")
    else:
        lines.append(f"globals beyond torch's allowlist ({len(req)}), found without unpickling:"
                     + ("" if req else " none"))
        for g in req:
            lines.append(f"  {show_name(g)}" + (f"    <-- {escape_text(flagged[g])}" if g in flagged else ""))
    sg = r["safe_globals"]
    if sg["given"]:
        lines.append(f"--safe-global: {', '.join(map(show_name, sg['given']))}"
                     + (f" (not needed: {', '.join(map(show_name, sg['unused']))})" if sg["unused"] else ""))
    lines.append("load modes here:")
    for name in MODES:
        lines.append(f"  {name:<19} {escape_text(r['modes'][name]['summary'])}")
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
    if r["status"] == "needs_opt_in":
        lines.append("  - it needs globals that are not classes (NOT A CLASS above): the pickle calls them with "
                     "arguments of its choosing; they are never suggested, and a test may allow one only "
                     "explicitly, with UnsafeCallable('module.name', reason=...), if you trust it")
    if r["error"]:
        lines.append(f"  - {escape_text(r['error'])}")
    if r["dangerous"] or r.get("malformed"):
        lines.append("  - DANGEROUS: do not load this file with weights_only=False, and never allowlist "
                     + ", ".join(show_name(d["name"]) for d in r["dangerous"] + r.get("malformed", [])))
    lines.extend(f"  - {escape_text(note)}" for note in r.get("notes", []) if not note.startswith(
        tuple(f"{show_name(d['name'])}:" for d in r["dangerous"] + r.get("malformed", []))))
    return lines
