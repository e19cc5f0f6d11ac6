"""``python -m torch_serial_testing audit [--report F] [--markdown F] [--fail-on ...] -- COMMAND...``.

Runs COMMAND with every ``torch.load``/``torch.save`` of its Python processes observed (child
processes and xdist workers inherit the environment that starts :mod:`..audit.bootstrap`), prints a
summary per test to stderr, and exits with COMMAND's status, or 1 when COMMAND passed but a load
matched ``--fail-on``.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from typing import Any, Callable

__all__ = ["add_parser", "run", "child_environment"]

_DESCRIPTION = (
    "Run COMMAND (e.g. python -m unittest test_x, python -m pytest -n 2 ...) with every torch.load of its Python "
    "processes observed, without changing any outcome. One JSONL record per load: the test, the call site, "
    "weights_only as passed and as in effect, the switches, whether it loaded, the error, the globals it needs "
    "(static scan), where its bytes came from, and a fix verified by a weights-only trial load of the same bytes."
)
_EPILOG = """\
exit status: COMMAND's own; 1 when COMMAND exited 0 but a load matched --fail-on; 3 usage error.
--fail-on choices: default (fails only because of the weights_only default), force-no (passes only
  because of TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD), weights-only (any weights-only rejection, or a load that
  passes only by a switch, an older torch's default or a replaced torch.load), full-load (an explicit
  weights_only=False that needs globals), error, any.
record keys: event (load|save|test), test, site, weights_only_arg, effective_weights_only, switches,
  loaded, error, needs, provenance{kind: saved_in_process|repository_file|unknown, ...},
  fix{kind: safe_globals|weights_only_false|none, snippet, verified}
"""


def add_parser(command: Callable[..., argparse.ArgumentParser]) -> argparse.ArgumentParser:
    from ..audit.summary import FAIL_ON

    aud = command("audit", "run any test command and report every torch.load, with a verified fix", _DESCRIPTION)
    aud.epilog = _EPILOG
    aud.add_argument(
        "--report", metavar="FILE.jsonl", help="keep the JSONL records here (emptied first; a symbolic link is refused)"
    )
    aud.add_argument(
        "--markdown", metavar="FILE", help="also write an issue-ready Markdown table here (a symbolic link is refused)"
    )
    aud.add_argument(
        "--fail-on",
        metavar="WHAT",
        action="append",
        default=[],
        choices=sorted(FAIL_ON),
        help="exit 1 when COMMAND passed but a load has this verdict (repeatable)",
    )
    aud.add_argument("--quiet", action="store_true", help="no summary on stderr")
    aud.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- COMMAND...", help="the command to run")
    return aud


def child_environment(report: str, environ: Any = None) -> dict[str, str]:
    """*environ* (default ``os.environ``) plus what starts the audit in every Python child."""
    from .. import audit

    env = dict(os.environ if environ is None else environ)
    here = os.path.dirname(os.path.abspath(audit.__file__))
    bootstrap = os.path.join(here, "bootstrap")
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = bootstrap + (os.pathsep + old if old else "")
    env[audit.REPORT_ENV] = os.path.abspath(report)
    env[audit.ROOT_ENV] = os.path.dirname(os.path.dirname(os.path.dirname(here)))  # the folder holding the package
    return env


def run(args: argparse.Namespace) -> int:
    from ..audit.observe import ReportPathError, write_file
    from ..audit.summary import format_markdown, format_text, matches, read_report
    from .contract import EXIT_USAGE

    cmd = list(args.cmd)
    if cmd and cmd[0] == "--":
        cmd = cmd[1:]
    if not cmd:
        sys.stderr.write("audit: give the command to run after --, e.g. audit -- python -m unittest test_x\n")
        return EXIT_USAGE
    with tempfile.TemporaryDirectory(prefix="tst-audit-") as tmp:
        report = args.report or os.path.join(tmp, "audit.jsonl")
        try:
            if args.markdown and os.path.islink(args.markdown):
                raise ReportPathError(args.markdown)
            write_file(report, "")  # emptied, never through a link
        except ReportPathError as e:
            sys.stderr.write(f"audit: {e}\n")
            return EXIT_USAGE
        try:
            code = subprocess.call(cmd, env=child_environment(report))
        except FileNotFoundError as e:
            sys.stderr.write(f"audit: cannot run {cmd[0]!r}: {e.strerror}\n")
            return EXIT_USAGE
        records = read_report(report)
        if args.markdown:
            try:
                write_file(args.markdown, format_markdown(records))
            except ReportPathError as e:  # a link made while COMMAND ran
                sys.stderr.write(f"audit: Markdown table NOT written: {e}\n")
        if not args.quiet:
            sys.stderr.write(format_text(records, args.report) + "\n")
    if code < 0:  # killed by a signal: the status a shell reports
        code = 128 - code
    if code == 0 and matches(records, args.fail_on):
        return 1
    return code
