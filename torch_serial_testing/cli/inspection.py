"""``inspect``: what ``torch.load`` would do with a checkpoint here, without unpickling it.

Names a checkpoint holds are data: judged by :mod:`..policy.trust` (which never imports them),
shown escaped, and suggested in a snippet only when verified classes.
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


def inspect_report(
    checkpoint: str,
    safe_globals: Sequence[str] = (),
    data: Optional[bytes] = None,
    environ: Optional[dict[str, str]] = None,
) -> dict[str, Any]:
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
    try:  # foreign bytes, only ever scanned here; a file is read by record, never whole
        if data is not None:
            ckpt = Checkpoint.from_bytes(data)
        elif checkpoint == "-":
            ckpt = Checkpoint.from_stream(sys.stdin.buffer)
        else:
            ckpt = Checkpoint.from_path(checkpoint)  # regular files only (a FIFO, /dev/zero: refused)
    except OSError as e:
        report["error"] = f"cannot read {checkpoint!r}: {e.strerror or e}"
        return report
    except CheckpointFormatError as e:
        report["error"] = str(e)
        return report
    report["nbytes"] = ckpt.nbytes
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

    dangerous, malformed, opt_in = listed("dangerous"), listed("malformed"), listed("callable")
    unknown = listed("absent") + listed("alias")
    flagged = {g for g, v in verdicts.items() if v.kind in ("dangerous", "malformed", "absent", "alias")}
    # A gadget behind a rename of a *full* unpickle (pickle's _compat_pickle, torch's load_module_mapping)
    # is flagged under the name it resolves to.
    for full in info.full_load_globals:  # sorted
        if full not in verdicts and full not in allowed:
            verdict = judge_name(full, allowed)
            if verdict.kind in ("dangerous", "malformed"):
                dangerous.append(
                    {
                        "name": full,
                        "reason": f"a full unpickle of this file resolves a global as "
                        f"{show_name(full)}: {verdict.reason}",
                    }
                )
    blocker = info.weights_only_blocker
    refused_given = [g for g in given if g in flagged]  # a load "because" of them would be unsafe
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
            modes[mode.value] = {
                "weights_only": None,
                "outcome": "error",
                "missing": [],
                "summary": "error: RuntimeError on every torch.load: " + conflict,
            }
            continue
        outcome, summary = _outcome(mode.value, exp, info.format, refused_given, callable_given)
        unavailable = mode_skip_reason(mode)
        if unavailable:
            summary += f" [{unavailable}: the same allowlist works with torch.serialization.add_safe_globals]"
        modes[mode.value] = {
            "weights_only": None if exp.unknown and exp.reason == _UNDECIDED else exp.weights_only,
            "missing": list(exp.missing),
            "outcome": outcome,
            "summary": summary,
        }
        unpredictable = unpredictable or exp.unknown
    report["modes"] = modes

    if conflict:
        report["error"] = conflict
    elif unpredictable:  # never a guess: this torch could not be asked what it does
        report["error"] = f"cannot predict what torch.load does here: {unpredictable}"
    elif blocker:
        report["error"] = f"no allowlist makes it load weights-only here: {blocker}"
    status = next(
        s
        for applies, s in (  # the first that applies
            (conflict, "environment_error"),
            (dangerous or malformed, "dangerous"),
            (unpredictable, "environment_error"),
            (info.format in ("torchscript", "tar"), "needs_trusted_loader"),  # never weights-only: trusted files only
            (unknown or blocker, "unloadable"),
            (opt_in, "needs_opt_in"),
            (modes["safe_globals"]["outcome"] == "loads", "loads"),
            (True, "needs_allowlist"),
        )
        if applies
    )
    report["status"] = status
    report["exit_code"] = {
        "loads": EXIT_OK,
        "needs_allowlist": EXIT_ATTENTION,
        "needs_opt_in": EXIT_ATTENTION,
        "needs_trusted_loader": EXIT_ATTENTION,
    }.get(status, EXIT_DANGEROUS)
    suggest = [g for g, v in verdicts.items() if v.suggestible]
    if status in ("needs_allowlist", "loads", "needs_opt_in") and suggest:
        report["snippet"] = safe_globals_snippet(suggest)
    report["notes"] = refusal_notes(required, allowed) if required else []
    return report


def _outcome(mode: str, exp: Any, fmt: str, refused_given: list[str], callable_given: list[str]) -> tuple[str, str]:
    """A mode's outcome and its summary line."""
    if exp.unknown:  # a probe of this torch failed: no outcome is claimed
        return "error", f"error: cannot predict this load here ({exp.unknown}); {exp.reason}"
    why = exp.reason + ("; torch warns (UserWarning)" if exp.warns else "")
    if not exp.weights_only:
        target = (
            "hands the archive to torch.jit.load, which runs its TorchScript code"
            if fmt == "torchscript"
            else "would execute arbitrary pickle code from the file"
        )
        return "unsafe", f"unsafe: {why}: {target}; this tool never does it (only for trusted files)"
    if fmt == "torchscript":
        return "rejected", (
            f"rejected: {why}: torch.load refuses TorchScript archives weights-only "
            "(RuntimeError); torch.jit.load loads them, only for trusted files"
        )
    if fmt == "tar":
        return "rejected", (
            f"rejected: {why}: torch.load cannot read the legacy .tar format weights-only "
            "(RuntimeError); re-save it from a trusted environment"
        )
    if exp.loads:
        risky = [show_name(g) for g in refused_given] if mode == "safe_globals" else []
        calls = [show_name(g) for g in callable_given] if mode == "safe_globals" else []
        if risky:
            return "unsafe", (
                f"unsafe: {why}; it would load only because --safe-global allowlists "
                f"{', '.join(risky)}: DANGEROUS, never allowlist it"
            )
        return "loads", f"loads ({why})" + (
            f"; only because --safe-global allowlists {', '.join(calls)}, which is not a class: the pickle "
            "calls it (the library requires UnsafeCallable for it)"
            if calls
            else ""
        )
    names = ", ".join(show_name(g) for g in exp.missing)
    raised = (
        f"'Unsupported global: GLOBAL {show_name(exp.missing[0])}'"
        if len(exp.missing) == 1
        else "'Unsupported global: GLOBAL <name>' for the first one it meets"
    )
    return "rejected", f"rejected: {why}; not allowlisted: {names} (torch raises _pickle.UnpicklingError: {raised})"


def format_inspect(r: dict[str, Any]) -> str:
    """The text report: names through :func:`show_name`, other fields through :func:`escape_text`, every
    line escaped once more, so no byte of the input can add a line, move the cursor or recolour the terminal."""
    return "\n".join(escape_text(line) for line in _inspect_lines(r))


def _inspect_lines(r: dict[str, Any]) -> list[str]:
    where = escape_text(r["checkpoint"])
    status = f"status: {r['status'].upper()} (exit {r['exit_code']})"
    if r["format"] is None:
        return [
            f"checkpoint: {where}" + (f" ({r['nbytes']} bytes)" if r["nbytes"] is not None else ""),
            f"UNREADABLE: {escape_text(r['error'])}",
            status,
        ]
    replaced = r["torch_load_replaced_by"]
    lines = [
        f"checkpoint: {where} ({r['nbytes']} bytes, format {r['format']})",
        f"torch {r['torch']['version']}; torch.load is "
        + (
            f"REPLACED by {escape_text(replaced)} (predictions follow torch's own rules)" if replaced else "torch's own"
        ),
    ]
    req = r["required_globals"]
    labels = (
        ("dangerous", "DANGEROUS"),
        ("malformed", "MALFORMED"),
        ("unknown", "UNKNOWN"),
        ("needs_opt_in", "NOT A CLASS"),
    )
    flagged = {d["name"]: f"{label}: {d['reason']}" for key, label in labels for d in r.get(key, [])}
    if r["format"] == "torchscript":
        lines.append("a TorchScript archive: its code is not a pickle of globals; weights_only does not apply")
    else:
        lines.append(
            f"globals beyond torch's allowlist ({len(req)}), found without unpickling:" + ("" if req else " none")
        )
        for g in req:
            lines.append(f"  {show_name(g)}" + (f"    <-- {escape_text(flagged[g])}" if g in flagged else ""))
    sg = r["safe_globals"]
    if sg["given"]:
        lines.append(
            f"--safe-global: {', '.join(map(show_name, sg['given']))}"
            + (f" (not needed: {', '.join(map(show_name, sg['unused']))})" if sg["unused"] else "")
        )
    lines.append("load modes here:")
    lines += [f"  {name:<19} {escape_text(r['modes'][name]['summary'])}" for name in MODES]
    if r["snippet"]:
        lines.append("to load it weights-only, only if you trust these classes:")
        lines.extend(f"    {line}" if line else "" for line in r["snippet"].splitlines())
    lines.append(status)
    default = r["modes"]["default"]
    if r["status"] == "needs_allowlist" and default["outcome"] == "rejected":
        lines.append(
            f"  - answer: a bare torch.load here is {default['summary'].split('; ')[0][len('rejected: ') :]}, "
            f"and this checkpoint needs {len(r['required_globals'])} global(s) beyond torch's allowlist: "
            "allowlist them as above if you trust them, or pass weights_only=False for a trusted file only"
        )
    if r["status"] == "needs_opt_in":
        lines.append(
            "  - it needs globals that are not classes (NOT A CLASS above): the pickle calls them with "
            "arguments of its choosing; they are never suggested, and a test may allow one only "
            "explicitly, with UnsafeCallable('module.name', reason=...), if you trust it"
        )
    if r["error"]:
        lines.append(f"  - {escape_text(r['error'])}")
    refused = [show_name(d["name"]) for d in r["dangerous"] + r.get("malformed", [])]
    if refused:
        lines.append(
            "  - DANGEROUS: do not load this file with weights_only=False, and never allowlist " + ", ".join(refused)
        )
    said = tuple(f"{name}:" for name in refused)  # made once: per note it made the report quadratic
    lines.extend(f"  - {escape_text(note)}" for note in r.get("notes", []) if not note.startswith(said))
    return lines
