"""``python -m torch_serial_testing {doctor,inspect,vendor,audit}``: why does ``torch.load`` do that *here*?

Subcommands: :mod:`.doctor` (this torch and its environment), :mod:`.inspection` (what each load mode
would do with a checkpoint, never unpickled), :mod:`.vendor` (copy the package into pytorch's
``test/``), :mod:`.audit_cmd` (run a test command, report its every ``torch.load``); exit codes and
the JSON schema: :mod:`.contract`.  torch is imported only once a subcommand runs, so ``--help`` and
usage errors are instant.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import textwrap
from typing import Callable, NoReturn, Optional, Sequence

from ...errors import escape_text
from .contract import EXIT_OK, EXIT_USAGE, exit_codes_help
from .terminal import terminal_width

__all__ = ["main", "build_parser"]

_DOCTOR_JSON_HELP = (
    "--json keys (schema 1): schema, command, status (ok | attention | error), exit_code, problems, "
    "torch{version,cuda,hip,git_version,debug}, torch_load_replaced_by, "
    "default_weights_only{value,reason,warns,torch_default,torch_default_reason}, "
    "environment{TORCH_FORCE_WEIGHTS_ONLY_LOAD, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD, "
    "TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT, TORCH_DEVICE_BACKEND_AUTOLOAD: {raw,value,effect}}, "
    "backend_entry_points, safe_globals, safe_globals_torch_own (null: unknown), quantized_engines{supported,current}, "
    "devices{available,privateuse1_backend}"
)

_INSPECT_JSON_HELP = (
    "--json keys (schema 1): schema, command, status (loads | needs_allowlist | needs_opt_in | "
    "needs_trusted_loader | unverified | dangerous | unloadable | unreadable | import_failed | "
    "environment_error | skipped: a link in a folder, not followed), "
    "exit_code, checkpoint, nbytes, format, error, globals, required_globals, dangerous[{name,reason}], "
    "malformed[{name,reason}], unknown[{name,reason}], unverified[{name,reason,module}], "
    "needs_opt_in[{name,reason}], notes, safe_globals{given,unused}, imported, "
    "modes{weights_only_false,safe_globals,default: "
    "{weights_only, outcome (loads | rejected | unsafe | error), missing, summary}}, snippet, "
    "torch{version,cuda,hip,git_version,debug}, torch_load_replaced_by\n\n"
    "--jsonl: one such object a line per checkpoint.\n\n"
    "Never unpickles the input and never calls torch.load on it."
)


def _paragraphs(text: str, width: int) -> str:
    return "\n\n".join(
        textwrap.fill(p, width, subsequent_indent="  ", break_on_hyphens=False, break_long_words=False)
        for p in text.split("\n\n")
    )


class _Parser(argparse.ArgumentParser):
    """argparse, but usage errors exit with 3 (argparse's own 2 means 'dangerous input' here)."""

    def error(self, message: str) -> NoReturn:
        self.print_usage(sys.stderr)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def _prog() -> str:
    argv0 = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else ""
    return "python -m torch_serial_testing" if argv0 in ("-c", "") or argv0.endswith(".py") else argv0


def _help_width() -> int:
    """--help's text width: the terminal's (80 in a pipe), at most 100 (argparse's own margin: 2)."""
    return min(100, terminal_width() - 2)


def build_parser() -> argparse.ArgumentParser:
    fmt = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog=_prog(),
        description="Triage torch.load: why does it accept or reject a checkpoint here?",
        epilog=exit_codes_help(["doctor", "inspect", "vendor"], _help_width()),
        formatter_class=fmt,
    )
    from ... import __version__

    parser.add_argument(
        "--version",
        action="version",
        version=f"torch_serial_testing {__version__}",
        help="print the library's version and exit (see `doctor` for torch's)",
    )
    sub = parser.add_subparsers(dest="command", metavar="{doctor,inspect,vendor,audit}", required=True)

    def command(name: str, summary: str, description: str, json_help: str = "") -> argparse.ArgumentParser:
        return sub.add_parser(
            name,
            help=summary,
            description=textwrap.fill(description, _help_width()),
            epilog=exit_codes_help([name], _help_width())
            + (f"\n{_paragraphs(json_help, _help_width())}\n" if json_help else ""),
            formatter_class=fmt,
        )

    doc = command(
        "doctor",
        "this interpreter's torch, torch.load default, environment switches, engines, devices",
        "Report this interpreter's torch build, whether torch.load is torch's own, the weights_only default "
        "of a bare torch.load and why, the TORCH_FORCE_WEIGHTS_ONLY_LOAD / TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD / "
        "TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT / TORCH_DEVICE_BACKEND_AUTOLOAD switches, registered safe globals, "
        "quantized engines and devices. Nothing is loaded beyond torch itself.",
        _DOCTOR_JSON_HELP,
    )
    doc.add_argument("--json", action="store_true", help="print one JSON object (keys below)")
    ins = command(
        "inspect",
        "what torch.load would do with a checkpoint here, without unpickling it",
        "Scan CHECKPOINT's pickle opcodes (never unpickling it, never calling torch.load on it) and report its "
        "format, the globals it needs beyond torch's allowlist, what each load mode would do here, and a "
        "ready-to-paste safe_globals snippet.",
        _INSPECT_JSON_HELP,
    )
    ins.add_argument(
        "checkpoints",
        metavar="CHECKPOINT",
        nargs="+",
        help="a checkpoint file, a folder (every file in it, links leading out of it not followed), or - "
        "for stdin; several: a line per file and the worst exit code",
    )
    ins.add_argument(
        "--safe-global",
        dest="safe_globals",
        metavar="NAME",
        action="append",
        default=[],
        help="a 'module.Name' you would allowlist (repeatable); matched as a string, never imported",
    )
    ins.add_argument(
        "--import",
        dest="imports",
        metavar="MODULE",
        action="append",
        default=[],
        help="import MODULE first (repeatable), so that the classes it defines can be verified; only "
        "what you name is imported, never what the checkpoint names; a failed import exits 2",
    )
    ins.add_argument("-v", "--verbose", action="store_true", help="every reason, torch's error text and note")
    as_json = ins.add_mutually_exclusive_group()
    as_json.add_argument("--json", action="store_true", help="print one JSON object (keys below): one checkpoint only")
    as_json.add_argument(
        "--jsonl", action="store_true", help="print one such JSON object a line per checkpoint (JSON Lines, for CI)"
    )
    from .vendor import AGGREGATOR, FLAGSHIP

    ven = command(
        "vendor",
        "copy this package into a pytorch checkout's test/ (optionally with the flagship test)",
        "Copy torch_serial_testing into PYTORCH_CHECKOUT/test/torch_serial_testing/ (not installed: every "
        "pytorch test runner imports it from test/). Idempotent. Does not import torch.",
    )
    ven.add_argument(
        "checkout", metavar="PYTORCH_CHECKOUT", help="root of a pytorch checkout (the folder holding test/)"
    )
    ven.add_argument(
        "--with-flagship",
        action="store_true",
        help=f"also copy test/{FLAGSHIP} and add the import lines to test/{AGGREGATOR}",
    )
    ven.add_argument("--check", action="store_true", help="write nothing; exit 1 if the checkout's copy is not current")
    from .audit_cmd import add_parser as add_audit

    add_audit(command)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    """Run the CLI; returns the exit code (see the module docstring)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # --help (0) or a usage error (3)
        return e.code if isinstance(e.code, int) else EXIT_USAGE
    if args.command == "audit":
        from .audit_cmd import run as run_audit

        return run_audit(args)
    if args.command == "vendor":
        from .vendor import run as run_vendor

        return run_vendor(args)
    text: Callable[[dict], str]
    if args.command == "doctor":
        from .doctor import doctor_report, format_doctor

        report, text = doctor_report(), format_doctor
    else:
        targets = args.checkpoints
        if targets.count("-") > 1:
            return _usage(parser, "inspect: - (stdin) can be given once")
        if args.jsonl or len(targets) > 1 or any(t != "-" and os.path.isdir(t) for t in targets):
            if args.json:
                return _usage(parser, "inspect: --json prints one object for one checkpoint; for several, use --jsonl")
            return _inspect_many(parser.prog, args)
        from .inspection import format_inspect, inspect_report

        report = inspect_report(targets[0], args.safe_globals, imports=args.imports)
        text = functools.partial(format_inspect, verbose=args.verbose)
    try:
        if args.json:
            sys.stdout.write(json.dumps(report, indent=2) + "\n")
        elif report["command"] == "inspect" and report["status"] == "import_failed":
            sys.stderr.write(f"{parser.prog} inspect: {escape_text(report['error'])}\n")  # one line
        else:  # an unreadable input's report is only its error: to stderr (stdout stays empty)
            unreadable = report["command"] == "inspect" and report["status"] == "unreadable"
            out = sys.stderr if unreadable else sys.stdout
            out.write(text(report) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`
        pass
    return int(report["exit_code"])


def _usage(parser: argparse.ArgumentParser, message: str) -> int:
    parser.print_usage(sys.stderr)
    sys.stderr.write(f"{parser.prog}: error: {message}\n")
    return EXIT_USAGE


def _inspect_many(prog: str, args: argparse.Namespace) -> int:
    """``inspect`` of several checkpoints or folders: a line (``--jsonl``: an object) per file as it is
    done, then the totals; the exit code is the worst of them."""
    from .inspect_text import format_inspect, summary_line, totals_line
    from .inspection import inspect_many

    worst, statuses = EXIT_OK, []
    try:
        for report in inspect_many(args.checkpoints, args.safe_globals, args.imports):
            worst = max(worst, int(report["exit_code"]))
            if report["status"] == "import_failed":
                sys.stderr.write(f"{prog} inspect: {escape_text(report['error'])}\n")
                return worst
            statuses.append(report["status"])
            if args.jsonl:
                out = json.dumps(report)
            else:
                out = format_inspect(report, verbose=True) + "\n" if args.verbose else summary_line(report)
            sys.stdout.write(out + "\n")
            sys.stdout.flush()
        if not args.jsonl:
            sys.stdout.write(totals_line(statuses, worst) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:  # `... | head`
        pass
    return worst
