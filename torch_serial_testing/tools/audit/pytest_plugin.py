"""pytest option ``--serial-audit[=FILE]``: the audit of every ``torch.load`` in the run, with its summary.

Registered as the ``torch_serial_testing_audit`` pytest11 entry point (or ``-p
torch_serial_testing.audit.pytest_plugin``).  Costs nothing unless enabled: importing this module
imports neither torch nor the audit's observer.  Enabled, each process (the controller and every xdist
worker, which get the same option) patches ``torch`` once a test imports it; the records go to FILE
(default ``serial-audit.jsonl``), the controller writes each test's outcome and prints the summary at the
end (``--serial-audit-markdown FILE`` also writes the Markdown table).  Under ``python -m
torch_serial_testing audit -- pytest ...`` the plugin only adds the outcomes (the command prints).
"""

from __future__ import annotations

import os
from typing import Any, Optional

import pytest

from ...pytest_plugin import entry_point_guard
from . import REPORT_ENV

DEFAULT_REPORT = "serial-audit.jsonl"
#: The ``pytest11`` entry point's name (setup.cfg).
ENTRY_POINT = "torch_serial_testing_audit"

pytest_plugin_registered = entry_point_guard(__name__, ENTRY_POINT)


def pytest_addoption(parser: Any) -> None:
    group = parser.getgroup("serial-audit", "torch_serial_testing audit of torch.load calls")
    group.addoption(
        "--serial-audit",
        dest="serial_audit",
        nargs="?",
        const=DEFAULT_REPORT,
        default=None,
        metavar="FILE",
        help=f"record every torch.load/torch.save of the run as JSONL in FILE (default {DEFAULT_REPORT}; "
        "a symbolic link there is refused) with the globals it needs and a verified fix, and print a summary "
        "per test",
    )
    group.addoption(
        "--serial-audit-markdown",
        dest="serial_audit_markdown",
        default=None,
        metavar="FILE",
        help="with --serial-audit: also write an issue-ready Markdown table to FILE (a symbolic link is refused)",
    )


class _Audit:
    def __init__(self, report: str, controller: bool, summary: bool, markdown: Optional[str]) -> None:
        self.report = report
        self.controller = controller
        self.summary = summary
        self.markdown = markdown

    def pytest_runtest_logreport(self, report: Any) -> None:
        if not self.controller:
            return  # xdist workers' reports reach the controller, which writes them once
        outcome = None
        if report.when == "call" or (report.when == "setup" and not report.passed):
            outcome = report.outcome if report.when == "call" or report.skipped else "error"
            if hasattr(report, "wasxfail"):
                outcome = "xfailed" if report.skipped else "xpassed"
        if outcome is not None:
            from .observe import write_record

            write_record({"event": "test", "test": report.nodeid, "outcome": outcome})

    def pytest_terminal_summary(self, terminalreporter: Any) -> None:
        if not (self.controller and self.summary):
            return
        from .summary import format_markdown, format_text, read_report

        records = read_report(self.report) if os.path.exists(self.report) else []
        terminalreporter.section("torch_serial_testing audit")
        for line in format_text(records, self.report).splitlines():
            terminalreporter.write_line(line)
        if self.markdown:
            from .observe import ReportPathError, write_file

            try:
                write_file(self.markdown, format_markdown(records))
            except ReportPathError as e:
                terminalreporter.write_line(f"Markdown table NOT written: {e}", red=True)
            else:
                terminalreporter.write_line(f"Markdown table: {self.markdown}")


def pytest_configure(config: Any) -> None:
    wanted = config.getoption("serial_audit", None)
    inherited = os.environ.get(REPORT_ENV)
    if wanted is None and not inherited:
        return
    controller = not hasattr(config, "workerinput")
    from .hooks import start
    from .observe import ReportPathError, write_file

    if wanted is None:  # under `audit -- pytest ...`: the bootstrap observes; add the outcomes
        report = os.path.abspath(str(inherited))
    else:
        report = os.path.abspath(wanted) if controller else str(config.workerinput.get("serial_audit_report", wanted))
        if controller:
            markdown = config.getoption("serial_audit_markdown", None)
            try:
                if markdown and os.path.islink(markdown):
                    raise ReportPathError(markdown)
                write_file(report, "")  # emptied, never through a link
            except ReportPathError as e:
                raise pytest.UsageError(f"--serial-audit: {e}") from None
            os.environ[REPORT_ENV] = report  # subprocesses of the tests inherit it (with the bootstrap, observed)
        start(report)
    config.pluginmanager.register(
        _Audit(report, controller, wanted is not None, config.getoption("serial_audit_markdown", None)),
        "torch_serial_testing_audit_session",
    )


@pytest.hookimpl(optionalhook=True)
def pytest_configure_node(node: Any) -> None:  # xdist: the controller's absolute report path for a worker
    report = os.environ.get(REPORT_ENV)
    if report:
        node.workerinput["serial_audit_report"] = report
