"""``inspect``: what ``torch.load`` would do with a checkpoint here, without unpickling it.

Names a checkpoint holds are data: judged by :mod:`..policy.trust` (which never imports them),
shown escaped, and suggested in a snippet only when verified classes.  A name whose module is not
imported is *unverified* (not dangerous): ``--import MODULE`` imports what the user names, never what
the checkpoint names.  A snippet is printed only when it holds everything the file needs (so it
loads it); the text form is :mod:`.inspect_text`.

Many checkpoints in one call (:func:`inspect_many`): files, ``-`` and folders, in one process (one
``import torch``).  A folder is walked without following links out of it: a link to a file inside
the folder is inspected, a link to a folder is never walked, and a link leading out of the folder is
reported ``skipped`` (exit 1; name it to inspect what it points to).  Every file keeps the checks of
a single one (regular files only).
"""

from __future__ import annotations

import os
import sys
from typing import Any, Iterator, Optional, Sequence

from ...errors import show_name
from .contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, SCHEMA_VERSION, torch_info

MODES = ("weights_only_false", "safe_globals", "default")
#: loading.prediction.undecided's reason: torch could not be asked what weights_only the call gets.
_UNDECIDED = "what torch.load decides here is unknown"

__all__ = ["inspect_report", "inspect_many", "format_inspect", "import_modules"]


def import_modules(modules: Sequence[str]) -> Optional[str]:
    """Import the modules the user named with ``--import`` (never a name from a checkpoint), in
    order; the one-line error of the first that fails, or None."""
    import importlib

    for module in modules:
        try:
            importlib.import_module(module)
        except (Exception, SystemExit) as e:  # noqa: BLE001 - the user's module: any failure is one line
            detail = str(e).splitlines()[0] if str(e) else ""
            hint = " (is its folder on PYTHONPATH, or the current directory?)" if isinstance(e, ImportError) else ""
            return f"--import {module} failed: {type(e).__name__}" + (f": {detail}" if detail else "") + hint
    return None


def inspect_report(
    checkpoint: str,
    safe_globals: Sequence[str] = (),
    data: Optional[bytes] = None,
    environ: Optional[dict[str, str]] = None,
    imports: Sequence[str] = (),
) -> dict[str, Any]:
    """The facts ``inspect`` prints, as the documented JSON object (never unpickles *data*).
    *imports*: modules to import first (``--import``), so that their classes can be verified."""
    given = list(dict.fromkeys(safe_globals))
    report = _blank_report(checkpoint, given, imports)
    failed = import_modules(report["imported"])
    if failed:
        report.update(status="import_failed", error=failed)
        return report
    return _inspect_into(report, checkpoint, given, data, environ)


def _blank_report(checkpoint: str, given: list[str], imports: Sequence[str]) -> dict[str, Any]:
    """The report of *checkpoint* before it is read: status "unreadable" (exit 2) until it is."""
    from ...serialization import torch_load_replacement

    return {
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
        "unverified": [],
        "needs_opt_in": [],
        "notes": [],
        "safe_globals": {"given": given, "unused": []},
        "imported": list(dict.fromkeys(imports)),
        "modes": {},
        "snippet": None,
        "torch": torch_info(),
        "torch_load_replaced_by": torch_load_replacement(),
    }


def _inspect_into(
    report: dict[str, Any], checkpoint: str, given: list[str], data: Optional[bytes], environ: Optional[dict[str, str]]
) -> dict[str, Any]:
    from ..formats import FileCheckpoint as Checkpoint
    from ...declarations import SafeGlobal
    from ...errors import CheckpointFormatError, ConflictingEnvironmentError
    from ...loading import mode_skip_reason
    from ...modes import LoadMode
    from ...prediction import needed_globals, predict
    from ...registry import torch_allowlist
    from ..policy.snippet import numpy_recipe, refusal_notes, safe_globals_snippet
    from ..policy.trust import judge_name

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
    required = needed_globals(info, allowed)  # GLOBALs and BUILD's types: what required_globals() says
    verdicts = {g: judge_name(g, allowed) for g in required}

    def listed(kind: str, not_imported: bool = False) -> list[dict[str, str]]:
        return [
            {"name": g, "reason": v.reason}
            for g, v in verdicts.items()
            if v.kind == kind and v.not_imported == not_imported
        ]

    dangerous, malformed, opt_in = listed("dangerous"), listed("malformed"), listed("callable")
    unverified = [dict(d, module=d["name"].rpartition(".")[0]) for d in listed("dangerous", not_imported=True)]
    unknown = listed("absent") + listed("alias")
    flagged = {g for g, v in verdicts.items() if v.kind in ("dangerous", "malformed", "absent", "alias")}
    # A gadget behind a rename of a *full* unpickle (pickle's _compat_pickle, torch's load_module_mapping)
    # is flagged under the name it resolves to.
    for full in info.full_load_globals:  # sorted
        if full not in verdicts and full not in allowed:
            verdict = judge_name(full, allowed)
            if verdict.kind in ("dangerous", "malformed") and not verdict.not_imported:
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
        unverified=unverified,
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
            (unverified, "unverified"),
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
        "unverified": EXIT_ATTENTION,
    }.get(status, EXIT_DANGEROUS)
    suggest = [g for g, v in verdicts.items() if v.suggestible]
    # A snippet only when it holds every needed global, so that it loads the file: verified classes,
    # the verified functions the user named with --safe-global, and numpy's array reconstructor (the
    # numpy recipe, marked in the snippet); no other function is ever suggested.
    opt = callable_given + [n for n in numpy_recipe(list(verdicts)) if n not in callable_given]
    complete = all(v.suggestible or g in opt for g, v in verdicts.items())
    if status in ("needs_allowlist", "loads", "needs_opt_in") and (suggest or opt) and complete:
        report["snippet"] = safe_globals_snippet(suggest, opt_in=opt)
    report["notes"] = refusal_notes(required, allowed) if required else []
    return report


def inspect_many(
    targets: Sequence[str],
    safe_globals: Sequence[str] = (),
    imports: Sequence[str] = (),
    environ: Optional[dict[str, str]] = None,
) -> Iterator[dict[str, Any]]:
    """A report per checkpoint of *targets* (files, ``-``, folders walked as the module docstring says),
    in order, in this one process.  The *imports* are imported first, once: a failure is the one report
    (status "import_failed")."""
    given = list(dict.fromkeys(safe_globals))
    failed = import_modules(list(dict.fromkeys(imports)))
    if failed:
        yield dict(_blank_report(targets[0] if targets else "", given, imports), status="import_failed", error=failed)
        return
    for target in targets:
        if target == "-" or not os.path.isdir(target):
            yield _inspect_into(_blank_report(target, given, imports), target, given, None, environ)
            continue
        found = False
        for path, skipped in _walk(target):
            found = True
            report = _blank_report(path, given, imports)
            if skipped is None:
                yield _inspect_into(report, path, given, None, environ)
            else:
                code, why = skipped
                yield dict(
                    report, status="skipped" if code < EXIT_DANGEROUS else "unreadable", exit_code=code, error=why
                )
        if not found:
            yield dict(
                _blank_report(target, given, imports),
                error=f"{target!r} is a folder holding no file: nothing to inspect",
            )


def _walk(top: str) -> Iterator[tuple[str, Optional[tuple[int, str]]]]:
    """(path, None) for each file under *top* to inspect, or (path, (exit code, why)) for a link not followed;
    sorted, folder by folder; a link is never walked into, a folder that cannot be listed is reported."""
    root = os.path.realpath(top)
    errors: list[OSError] = []
    for folder, dirs, files in os.walk(top, followlinks=False, onerror=errors.append):
        dirs.sort()
        for name in sorted(files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]):
            path = os.path.join(folder, name)
            if not os.path.islink(path):
                yield path, None
                continue
            target = os.path.realpath(path)
            inside = os.path.commonpath([root, target]) == root
            if inside and not os.path.isdir(target):
                yield path, None  # a file of this folder, under another name: read as named
            elif inside:
                yield path, (EXIT_OK, f"a link to the folder {target!r} inside the one walked: walked there, not here")
            else:
                yield (
                    path,
                    (
                        EXIT_ATTENTION,
                        f"a link leading out of the folder walked (to {target!r}): not followed; name it to inspect "
                        "what it points to",
                    ),
                )
        while errors:
            e = errors.pop(0)
            yield (e.filename or top), (EXIT_DANGEROUS, f"cannot list this folder: {e.strerror or e}")


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
                f"{', '.join(risky)}: DANGEROUS or unverified, never allowlist it"
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


def format_inspect(r: dict[str, Any], verbose: bool = False, width: Optional[int] = None) -> str:
    """The text report (see :func:`.inspect_text.format_inspect`)."""
    from .inspect_text import format_inspect as text

    return text(r, verbose=verbose, width=width)
