"""``python -m torch_serial_testing``: why does ``torch.load`` do that *here*?

Two subcommands, both built on argparse and importing nothing beyond torch
itself (torch is imported only once a subcommand runs, so ``--help`` and usage
errors are instant):

``doctor [--json]``
    This interpreter's torch: version and build, whether ``torch.load`` is
    torch's own or patched by a backend, the ``weights_only`` default of a bare
    ``torch.load`` and why, the four switches of torch's "Miscellaneous
    Environment Variables" (raw value and effect), the safe globals registered
    process-wide, the quantized engines and the available devices.

``inspect CHECKPOINT [--safe-global NAME ...] [--json]``
    CHECKPOINT is a path or ``-`` for stdin (read fully into memory).  Reports
    the format, the globals the checkpoint needs beyond torch's allowlist --
    found by reading pickle opcodes, **never by unpickling**; ``torch.load`` is
    never called on the input -- what each load mode would do here, and a
    ready-to-paste ``safe_globals`` snippet.  Globals no allowlist should contain
    (``os.*``, ``eval``, ``getattr``, ``subprocess.*``, unresolved
    ``STACK_GLOBAL``, ...) are flagged DANGEROUS and never suggested.
    ``--safe-global`` names are plain strings matched against the required
    names; nothing is imported for them.

Exit codes (both subcommands)
-----------------------------
=====  ==================================================================================
0      inspect: loads weights-only here (with the ``--safe-global`` names given).
       doctor: environment OK -- ``torch.load`` does what its call site says.
1      inspect: needs action first -- allowlisting the listed globals, or (TorchScript,
       legacy ``.tar``) a loader that is only for trusted files.
       doctor: attention -- something changes what ``torch.load`` does: a
       ``TORCH_FORCE_*`` switch active or set to a spelling torch ignores, ``torch.load``
       replaced by a backend, a bare ``torch.load`` not weights-only, or
       ``TORCH_DEVICE_BACKEND_AUTOLOAD`` set to anything but ``0``/``1`` or disabling
       installed backends.
2      inspect: dangerous or unloadable input -- a DANGEROUS global, a global this torch
       does not have, unreadable / truncated / not a checkpoint, or both
       ``TORCH_FORCE_*`` switches set (every ``torch.load`` raises RuntimeError).
       doctor: error -- both ``TORCH_FORCE_*`` switches set.
3      usage error (bad arguments, unknown subcommand).
=====  ==================================================================================

JSON (``--json``; schema 1; keys are stable, values ``null`` when unknown)
--------------------------------------------------------------------------
Common: ``schema`` (int, 1), ``command`` ("doctor"/"inspect"), ``status``
(string, see below), ``exit_code`` (int, as above), ``torch`` ({``version``,
``cuda``, ``hip``, ``git_version``, ``debug``}), ``torch_load_replaced_by``
(string or null).

doctor: ``status`` "ok" | "attention" | "error"; ``problems`` (list of strings:
why status is not "ok"); ``default_weights_only`` ({``value``: bool or null when
every load fails, ``reason``, ``warns``: bool, ``torch_default``: bool,
``torch_default_reason``}); ``environment`` (object keyed by
TORCH_FORCE_WEIGHTS_ONLY_LOAD, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT, TORCH_DEVICE_BACKEND_AUTOLOAD, each
{``raw``: string or null, ``value``: the value torch uses -- bool for the three
switches, float seconds (or "inf"/"nan") for the wait limit --, ``effect``:
string}); ``backend_entry_points`` (list of "name = target" in entry-point group
``torch.backends``); ``safe_globals`` (sorted names registered process-wide);
``quantized_engines`` ({``supported``: list, ``current``: string}); ``devices``
({``available``: list, ``privateuse1_backend``: string or null}).

inspect: ``status`` "loads" | "needs_allowlist" | "needs_trusted_loader" |
"dangerous" | "unloadable" | "unreadable" | "environment_error"; ``checkpoint``
(the argument); ``nbytes`` (int or null); ``format`` ("zip" | "torchscript" |
"legacy" | "tar" | null); ``error`` (string or null: why it is unreadable or
every load fails); ``globals`` (every global the pickle names);
``required_globals`` (those beyond torch's allowlist); ``dangerous`` and
``unknown`` (lists of {``name``, ``reason``}); ``safe_globals`` ({``given``,
``unused``}); ``modes`` (object keyed by weights_only_false, safe_globals,
default, each {``weights_only``: bool or null, ``outcome``: "loads" | "rejected"
| "unsafe" | "error", ``missing``: list, ``summary``: the text line});
``snippet`` (string or null).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import textwrap
from typing import Any, NoReturn, Optional, Sequence

__all__ = ["main", "doctor_report", "inspect_report", "SCHEMA_VERSION", "EXIT_OK", "EXIT_ATTENTION",
           "EXIT_DANGEROUS", "EXIT_USAGE"]

SCHEMA_VERSION = 1
EXIT_OK = 0
EXIT_ATTENTION = 1
EXIT_DANGEROUS = 2
EXIT_USAGE = 3

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
WAIT_LIMIT = "TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT"
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
ENV_VARS = (FORCE_WO, FORCE_NO_WO, WAIT_LIMIT, AUTOLOAD)
_FALSY = ("", "0", "n", "no", "false", "off")
MODES = ("weights_only_false", "safe_globals", "default")

_EXIT_HELP = """\
exit codes:
  0  inspect: loads weights-only here (with the --safe-global names given)
     doctor:  environment OK (torch.load does what its call site says)
  1  inspect: needs allowlisting (or, TorchScript / legacy .tar, a loader only for trusted files)
     doctor:  attention: a TORCH_FORCE_* switch is active or misspelled, torch.load is
              replaced, a bare torch.load is not weights-only, or backend autoload is off
              for installed backends / set to something other than 0 or 1
  2  inspect: DANGEROUS global, global this torch lacks, unreadable / truncated / not a
              checkpoint, or both TORCH_FORCE_* switches set (every torch.load fails)
     doctor:  both TORCH_FORCE_* switches set (every torch.load raises RuntimeError)
  3  usage error
"""

_DOCTOR_JSON_HELP = """\
--json keys (schema 1): schema, command, status (ok|attention|error), exit_code, problems,
  torch{version,cuda,hip,git_version,debug}, torch_load_replaced_by,
  default_weights_only{value,reason,warns,torch_default,torch_default_reason},
  environment{TORCH_FORCE_WEIGHTS_ONLY_LOAD, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
  TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT, TORCH_DEVICE_BACKEND_AUTOLOAD: {raw,value,effect}},
  backend_entry_points, safe_globals, quantized_engines{supported,current},
  devices{available,privateuse1_backend}
"""

_INSPECT_JSON_HELP = """\
--json keys (schema 1): schema, command, status (loads|needs_allowlist|needs_trusted_loader|
  dangerous|unloadable|unreadable|environment_error), exit_code, checkpoint, nbytes, format,
  error, globals, required_globals, dangerous[{name,reason}], unknown[{name,reason}],
  safe_globals{given,unused}, modes{weights_only_false,safe_globals,default:
  {weights_only,outcome (loads|rejected|unsafe|error),missing,summary}}, snippet,
  torch{version,cuda,hip,git_version,debug}, torch_load_replaced_by

Never unpickles the input and never calls torch.load on it.
"""


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit with 3 (argparse's own 2 means 'dangerous input' here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _prog() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    if argv0 in ("__main__.py", "-c", "") or argv0.endswith(".py"):
        return "python -m torch_serial_testing"
    return argv0


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=_prog(),
        description="Triage torch.load: why does it accept or reject a checkpoint here?",
        epilog=_EXIT_HELP,
        formatter_class=fmt,
    )
    sub = parser.add_subparsers(dest="command", metavar="{doctor,inspect}", required=True)
    doc = sub.add_parser(
        "doctor",
        help="this interpreter's torch, torch.load default, environment switches, engines, devices",
        description=textwrap.fill((
            "Report this interpreter's torch build, whether torch.load is torch's own, the "
            "weights_only default of a bare torch.load and why, the TORCH_FORCE_WEIGHTS_ONLY_LOAD / "
            "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD / TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT / "
            "TORCH_DEVICE_BACKEND_AUTOLOAD switches, registered safe globals, quantized engines "
            "and devices. Nothing is loaded beyond torch itself."
        ), 88),
        epilog=_EXIT_HELP + "\n" + _DOCTOR_JSON_HELP,
        formatter_class=fmt,
    )
    doc.add_argument("--json", action="store_true", help="print one JSON object (keys below)")
    ins = sub.add_parser(
        "inspect",
        help="what torch.load would do with a checkpoint here, without unpickling it",
        description=textwrap.fill((
            "Scan CHECKPOINT's pickle opcodes (never unpickling it, never calling torch.load on it) "
            "and report its format, the globals it needs beyond torch's allowlist, what each load "
            "mode would do here, and a ready-to-paste safe_globals snippet."
        ), 88),
        epilog=_EXIT_HELP + "\n" + _INSPECT_JSON_HELP,
        formatter_class=fmt,
    )
    ins.add_argument("checkpoint", metavar="CHECKPOINT", help="a checkpoint file, or - to read stdin")
    ins.add_argument(
        "--safe-global",
        dest="safe_globals",
        metavar="NAME",
        action="append",
        default=[],
        help="a 'module.Name' you would allowlist (repeatable); matched as a string, never imported",
    )
    ins.add_argument("--json", action="store_true", help="print one JSON object (keys below)")
    return parser


# -- shared ------------------------------------------------------------------------------------


def _torch_info() -> dict[str, Any]:
    import torch

    version = getattr(torch, "version", None)
    return {
        "version": torch.__version__,
        "cuda": getattr(version, "cuda", None),
        "hip": getattr(version, "hip", None),
        "git_version": getattr(version, "git_version", None),
        "debug": getattr(version, "debug", None),
    }


# C's atof: leading whitespace, then the longest float prefix; anything else reads as 0.
_ATOF = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE)


def _atof(raw: str) -> float:
    m = _ATOF.match(raw)
    return float(m.group(1)) if m else 0.0


def _json_float(x: float) -> Any:
    return x if math.isfinite(x) else ("nan" if math.isnan(x) else "inf")


# -- doctor ------------------------------------------------------------------------------------


def _force_effect(name: str, raw: Optional[str], both: bool, problems: list[str]) -> tuple[bool, str]:
    from .load_modes import torch_reads_force_no_weights_only

    from .load_modes import is_truthy

    active = is_truthy(raw)
    if raw is None:
        return False, "unset: no effect"
    if name == FORCE_NO_WO and not torch_reads_force_no_weights_only():
        problems.append(f"{name}={raw!r} is ignored: this torch's torch.load does not read it (torch < 2.6)")
        return False, "ignored: this torch's torch.load does not read it (it was added in torch 2.6)"
    if not active:
        if raw.strip().lower() not in _FALSY:
            problems.append(
                f"{name}={raw!r} is ignored: torch only reads 1, y, yes, true (any case) as set"
            )
            return False, (
                f"ignored: {raw!r} is not one of torch's truthy spellings (1, y, yes, true; any case)"
            )
        return False, f"off ({raw!r} is not truthy): no effect"
    if both:
        return True, "active, and so is the other TORCH_FORCE_* switch: every torch.load raises RuntimeError"
    if name == FORCE_WO:
        problems.append(
            f"{name}={raw} forces weights_only=True on every torch.load, even an explicit "
            "weights_only=False: files needing globals beyond the allowlist fail with 'Unsupported global'"
        )
        return True, (
            "active: every torch.load runs weights_only=True, even where the call site passes "
            "weights_only=False explicitly"
        )
    problems.append(
        f"{name}={raw} makes a torch.load without weights_only fully unpickle (runs arbitrary code "
        "from the file) and warn"
    )
    return True, (
        "active: a torch.load that does not pass weights_only runs weights_only=False (full "
        "unpickling, executes arbitrary code from the file) with a UserWarning; an explicit "
        "weights_only=True/False is obeyed"
    )


def _wait_limit_effect(raw: Optional[str]) -> tuple[Any, str]:
    if raw is None:
        return 10.0, (
            "unset: at exit, waits up to 10 s (the default) for autograd worker threads to shut down "
            "(only when no backward is running)"
        )
    seconds = _atof(raw)
    if math.isnan(seconds) or seconds <= 0:
        if math.isnan(seconds):
            why = "NaN is not > 0"
        else:
            why = f"{seconds:g} <= 0" if _ATOF.match(raw) else f"{raw!r} reads as 0 (C atof)"
        return _json_float(seconds), f"{why}: does not wait for autograd worker threads at exit"
    return _json_float(seconds), (
        f"at exit, waits up to {seconds:g} s for autograd worker threads to shut down "
        "(only when no backward is running)"
    )


def _backend_entry_points() -> list[str]:
    try:
        from importlib.metadata import entry_points

        eps = entry_points(group="torch.backends")
    except Exception:  # noqa: BLE001 - a broken metadata install is not the user's question
        return []
    return sorted(f"{ep.name} = {ep.value}" for ep in eps)


def _autoload_effect(raw: Optional[str], eps: list[str], problems: list[str]) -> tuple[bool, str]:
    enabled = (raw if raw is not None else "1") == "1"
    installed = ", ".join(eps) if eps else "none installed"
    if enabled:
        origin = "unset, default '1'" if raw is None else "'1'"
        return True, (
            f"enabled ({origin}): `import torch` imported the out-of-tree backends of entry-point group "
            f"'torch.backends': {installed}"
        )
    if raw != "0":
        problems.append(
            f"{AUTOLOAD}={raw!r} disables backend autoload: torch enables it only for exactly '1'"
        )
    why = "'0'" if raw == "0" else f"{raw!r} is not exactly '1'"
    if eps:
        problems.append(
            f"{AUTOLOAD}={raw!r}: installed backends were not imported ({installed}); their devices "
            "and any torch.load patch are absent unless imported explicitly"
        )
        return False, f"disabled ({why}): `import torch` did NOT import the installed backends: {installed}"
    return False, (f"disabled ({why}): `import torch` imports no out-of-tree backend; none is installed "
                   "in entry-point group 'torch.backends', so no effect here")


def doctor_report(environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The facts ``doctor`` prints, as the documented JSON object."""
    import torch

    from .allowlist import dangerous_reason, registered_globals
    from .devices import available_device_types, privateuse1_backend
    from .engines import supported_qengines
    from .load_modes import WeightsOnlySwitches, torch_default_weights_only, torch_load_replacement

    env = os.environ if environ is None else environ
    problems: list[str] = []
    errors: list[str] = []
    switches = WeightsOnlySwitches.from_environ(env)
    raw = {name: env.get(name) for name in ENV_VARS}

    environment: dict[str, dict[str, Any]] = {}
    for name in (FORCE_WO, FORCE_NO_WO):
        value, effect = _force_effect(name, raw[name], switches.conflict, problems)
        environment[name] = {"raw": raw[name], "value": value, "effect": effect}
    seconds, effect = _wait_limit_effect(raw[WAIT_LIMIT])
    environment[WAIT_LIMIT] = {"raw": raw[WAIT_LIMIT], "value": seconds, "effect": effect}
    eps = _backend_entry_points()
    enabled, effect = _autoload_effect(raw[AUTOLOAD], eps, problems)
    environment[AUTOLOAD] = {"raw": raw[AUTOLOAD], "value": enabled, "effect": effect}

    torch_default, torch_why = torch_default_weights_only()
    if switches.conflict:
        errors.append(switches.conflict_message())
        wo: dict[str, Any] = {"value": None, "reason": "both TORCH_FORCE_* switches are set: every torch.load "
                              "raises RuntimeError", "warns": False}
    elif switches.force_weights_only:
        wo = {"value": True, "reason": f"forced by {FORCE_WO}={raw[FORCE_WO]}", "warns": False}
    elif switches.force_no_weights_only:
        wo = {"value": False, "reason": f"forced by {FORCE_NO_WO}={raw[FORCE_NO_WO]} (torch warns)",
              "warns": True}
    else:
        wo = {"value": torch_default, "reason": f"torch's default {torch_why}", "warns": False}
        if not torch_default:
            problems.append(f"a bare torch.load is weights_only=False here ({torch_why}): it fully unpickles")
    wo["torch_default"] = torch_default
    wo["torch_default_reason"] = torch_why

    replaced = torch_load_replacement()
    if replaced:
        problems.append(f"torch.load is replaced by {replaced}: its behaviour may differ from torch's rules")

    safe = sorted(registered_globals())
    for name in safe:
        reason = dangerous_reason(name)
        if reason:
            problems.append(f"registered safe global {name} is DANGEROUS: {reason}")

    status = "error" if errors else ("attention" if problems else "ok")
    code = {"ok": EXIT_OK, "attention": EXIT_ATTENTION, "error": EXIT_DANGEROUS}[status]
    return {
        "schema": SCHEMA_VERSION,
        "command": "doctor",
        "status": status,
        "exit_code": code,
        "problems": errors + problems,
        "torch": _torch_info(),
        "torch_load_replaced_by": replaced,
        "default_weights_only": wo,
        "environment": environment,
        "backend_entry_points": eps,
        "safe_globals": safe,
        "quantized_engines": {"supported": list(supported_qengines()),
                              "current": torch.backends.quantized.engine},
        "devices": {"available": list(available_device_types()), "privateuse1_backend": privateuse1_backend()},
    }


def _format_doctor(r: dict[str, Any]) -> str:
    t = r["torch"]
    wo = r["default_weights_only"]
    lines = [
        f"torch {t['version']}  (cuda {t['cuda']}, hip {t['hip']}, git {t['git_version']}, debug {t['debug']})",
        "torch.load: " + (f"REPLACED by {r['torch_load_replaced_by']}" if r["torch_load_replaced_by"]
                          else "torch's own (torch.serialization.load)"),
    ]
    if wo["value"] is None:
        lines.append(f"bare torch.load(f): FAILS -- {wo['reason']}")
    else:
        lines.append(f"bare torch.load(f): weights_only={wo['value']} -- {wo['reason']}")
    lines.append(f"  torch's own default here: weights_only={wo['torch_default']} ({wo['torch_default_reason']})")
    if wo["value"]:
        lines.append(
            "  so a checkpoint naming a global beyond the allowlist fails with "
            "'_pickle.UnpicklingError: ... Unsupported global: GLOBAL <name>'; "
            "run `inspect CHECKPOINT` for the names and the fix"
        )
    lines.append("environment:")
    for name, e in r["environment"].items():
        shown = "unset" if e["raw"] is None else repr(e["raw"])
        lines.append(f"  {name}={shown}")
        lines.append(f"      {e['effect']}")
    lines.append(f"safe globals registered process-wide: {', '.join(r['safe_globals']) or 'none'}")
    q = r["quantized_engines"]
    lines.append(f"quantized engines: {', '.join(q['supported']) or 'none'} (current: {q['current']})")
    d = r["devices"]
    lines.append(
        f"devices: {', '.join(d['available'])}; privateuse1 backend: {d['privateuse1_backend'] or 'none registered'}"
    )
    lines.append(f"status: {r['status'].upper()} (exit {r['exit_code']})")
    lines.extend(f"  - {p}" for p in r["problems"])
    return "\n".join(lines)


# -- inspect -----------------------------------------------------------------------------------


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


def _format_inspect(r: dict[str, Any]) -> str:
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


# -- entry point -------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (3)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command == "doctor":
        report = doctor_report()
        text = _format_doctor
    else:
        report = inspect_report(args.checkpoint, args.safe_globals)
        text = _format_inspect
    try:
        if args.json:
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        else:
            out = text(report)
            sys.stdout.write(out + "\n")
            if report["command"] == "inspect" and report["status"] == "unreadable":
                sys.stderr.write(f"error: {report['error']}\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`
        pass
    return int(report["exit_code"])
