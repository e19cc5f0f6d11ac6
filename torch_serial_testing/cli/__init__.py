"""``python -m torch_serial_testing``: why does ``torch.load`` do that *here*?

Subcommands, built on argparse (torch is imported only once a subcommand runs, so ``--help``
and usage errors are instant):

``doctor [--json]``
    This interpreter's torch, whether ``torch.load`` is torch's own, the ``weights_only``
    default of a bare ``torch.load`` and why, the four environment switches, the registered
    safe globals, engines and devices (:mod:`.doctor`).
``inspect CHECKPOINT [--safe-global NAME ...] [--json]``
    What each load mode would do with a checkpoint here, found by reading its pickle opcodes,
    never by unpickling it, and a ready-to-paste snippet of verified classes (:mod:`.inspection`).
``vendor PYTORCH_CHECKOUT [--with-flagship] [--check]``
    Copy this package into a pytorch checkout's ``test/`` (:mod:`.vendor`).

Exit codes and the JSON schema: :mod:`.contract`.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import textwrap
from typing import Any, NoReturn, Optional, Sequence

from .contract import EXIT_USAGE, exit_codes_help

__all__ = ["main", "build_parser"]

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
        epilog=exit_codes_help(["doctor", "inspect", "vendor"]),
        formatter_class=fmt,
    )
    from .. import __version__

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
        epilog=exit_codes_help(["doctor"]) + "\n" + _DOCTOR_JSON_HELP,
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
        epilog=exit_codes_help(["inspect"]) + "\n" + _INSPECT_JSON_HELP,
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
