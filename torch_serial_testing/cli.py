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
    ready-to-paste snippet: imports of verified classes and one ``safe_globals``
    call, nothing else.  Each global is judged by the trust policy
    (:mod:`torch_serial_testing.trust`, never importing what the checkpoint
    names): denylisted or unverifiable globals are flagged DANGEROUS, malformed
    names MALFORMED (shown escaped), functions and other non-classes NOT A CLASS;
    none of them is ever suggested.
    ``--safe-global`` names are plain strings matched against the required
    names; nothing is imported for them.

``vendor PYTORCH_CHECKOUT [--with-flagship] [--check]``
    Copies this package into a pytorch checkout's ``test/`` (see
    ``torch_serial_testing/vendor.py``; never imports torch).  Exit codes: 0
    done or current, 1 ``--check`` found it not current, 2 not a checkout, 3 usage.

``--version`` prints the library's version (``doctor`` reports torch's).  An
unreadable ``inspect`` input is reported once, on stderr, with exit code 2.

Exit codes (doctor and inspect)
-----------------------------
=====  ==================================================================================
0      inspect: loads weights-only here (with the ``--safe-global`` names given).
       doctor: environment OK -- ``torch.load`` does what its call site says.
1      inspect: needs action first -- allowlisting the listed classes, an explicit
       ``UnsafeCallable`` opt-in for a needed global that is not a class, or
       (TorchScript, legacy ``.tar``) a loader that is only for trusted files.
       doctor: attention -- something changes what ``torch.load`` does: a
       ``TORCH_FORCE_*`` switch active or set to a spelling torch ignores, an
       environment variable named almost like one of the four switches, ``torch.load``
       replaced by a backend, a bare ``torch.load`` not weights-only, or
       ``TORCH_DEVICE_BACKEND_AUTOLOAD`` set to anything but ``0``/``1`` or disabling
       installed backends.
2      inspect: dangerous or unloadable input -- a DANGEROUS global (denylisted, or one
       the trust policy cannot tell apart from one), a malformed name, a global this torch
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

inspect: ``status`` "loads" | "needs_allowlist" | "needs_opt_in" |
"needs_trusted_loader" | "dangerous" | "unloadable" | "unreadable" |
"environment_error"; ``checkpoint``
(the argument); ``nbytes`` (int or null); ``format`` ("zip" | "torchscript" |
"legacy" | "tar" | null); ``error`` (string or null: why it is unreadable or
every load fails); ``globals`` (every global the pickle names);
``required_globals`` (those beyond torch's allowlist); ``dangerous``
(denylisted, or the policy cannot tell what it is), ``malformed`` (not a dotted
Python name), ``unknown`` (absent here) and ``needs_opt_in`` (verified, but not a
class) (lists of {``name``, ``reason``}); ``notes`` (one line per global the
snippet leaves out, and why); ``safe_globals`` ({``given``,
``unused``}); ``modes`` (object keyed by weights_only_false, safe_globals,
default, each {``weights_only``: bool or null, ``outcome``: "loads" | "rejected"
| "unsafe" | "error", ``missing``: list, ``summary``: the text line});
``snippet`` (string or null).
"""

from __future__ import annotations

import argparse
import json
import os
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
  1  inspect: needs allowlisting, an explicit opt-in for a global that is not a class, or
              (TorchScript / legacy .tar) a loader only for trusted files
     doctor:  attention: a TORCH_FORCE_* switch is active or misspelled, torch.load is
  1  inspect: needs allowlisting (or, TorchScript / legacy .tar, a loader only for trusted files)
     doctor:  attention: a TORCH_FORCE_* switch is active or misspelled (value or name), torch.load is
              replaced, a bare torch.load is not weights-only, or backend autoload is off
              for installed backends / set to something other than 0 or 1
  2  inspect: DANGEROUS or malformed global, global this torch lacks, unreadable / truncated / not a
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
--json keys (schema 1): schema, command, status (loads|needs_allowlist|needs_opt_in|
  needs_trusted_loader|dangerous|unloadable|unreadable|environment_error), exit_code, checkpoint,
  nbytes, format, error, globals, required_globals, dangerous[{name,reason}],
  malformed[{name,reason}], unknown[{name,reason}], needs_opt_in[{name,reason}], notes,
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
    from . import __version__

    parser.add_argument("--version", action="version", version=f"torch_serial_testing {__version__}",
                        help="print the library's version and exit (see `doctor` for torch's)")
    sub = parser.add_subparsers(dest="command", metavar="{doctor,inspect,vendor}", required=True)
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
    from .vendor import add_parser as add_vendor_parser

    add_vendor_parser(sub, fmt)
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



# -- entry point -------------------------------------------------------------------------------


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (3)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command == "vendor":
        from .vendor import run as run_vendor

        return run_vendor(args)
    if args.command == "doctor":
        from .doctor import doctor_report, format_doctor

        report = doctor_report()
        text = format_doctor
    else:
        from .inspection import format_inspect, inspect_report

        report = inspect_report(args.checkpoint, args.safe_globals)
        text = format_inspect
    try:
        if args.json:
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        elif report["command"] == "inspect" and report["status"] == "unreadable":
            # Nothing to report but the error: it goes to stderr, once (stdout stays empty).
            sys.stderr.write(text(report) + "\n")
        else:
            sys.stdout.write(text(report) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`
        pass
    return int(report["exit_code"])


def __getattr__(name: str) -> Any:
    """``doctor_report`` / ``inspect_report`` live in their own modules; imported on use."""
    if name == "doctor_report":
        from .doctor import doctor_report

        return doctor_report
    if name == "inspect_report":
        from .inspection import inspect_report

        return inspect_report
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
