"""pytest plugin: a test that passed because torch refused a load, as predicted, says so.

Registered through the ``pytest11`` entry point ``torch_serial_testing`` (``-p
torch_serial_testing.testing.pytest_plugin`` loads it from a source tree).  Such a test stays a
*pass* -- torch did what it should and the library checked the refusal -- and shows it:

* ``pytest -v`` and ``-rA``: ``PASSED (rejected as predicted: default: rejected as expected (...))``,
  or ``PASSED (1 of 3 round trips rejected as predicted: ...)`` when some loads succeeded;
* JUnit XML (``--junitxml``): ``<property name="torch_serial_testing.status" value="rejected as
  predicted"/>`` and ``torch_serial_testing.rejections`` (the reasons) in the test case's properties;
  the test case itself is a plain pass (no ``<skipped>``), so CI counts it as run and passed.

Importing this module imports nothing but pytest; the library is imported only for a test that ran
round trips.  Tests that do not use the library are untouched.
"""

from __future__ import annotations

import sys
from typing import Any, Callable, Generator, Optional

import pytest

#: The ``pytest11`` entry point's name (setup.cfg): ``-p no:torch_serial_testing`` turns the plugin off.
ENTRY_POINT = "torch_serial_testing"

#: Where a report carries the status text (a plain attribute: it survives pytest-xdist's transport).
STATUS_ATTRIBUTE = "torch_serial_testing_status"

PROPERTY_PREFIX = "torch_serial_testing."


def _instance(item: Any) -> Any:
    """The unittest ``TestCase`` instance an item runs (pytest >= 8: ``instance``; 7: ``_testcase``)."""
    for name in ("instance", "_testcase"):
        try:
            value = getattr(item, name, None)
        except Exception:  # noqa: BLE001 - a plugin's item type whose property raises: not ours
            value = None
        if value is not None:
            return value
    return None


def entry_point_guard(module: str, entry_point: str) -> Callable[[Any, Any], None]:
    """A ``pytest_plugin_registered`` hook for plugin *module*: loaded by module name (``-p module``,
    read before entry points) where the library is also installed, the *entry_point* would register the
    same module a second time, which pluggy refuses, so the entry point is skipped."""

    def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
        if plugin is sys.modules.get(module) and manager.get_name(plugin) != entry_point:
            if manager.get_plugin(entry_point) is None and not manager.is_blocked(entry_point):
                manager.set_blocked(entry_point)

    return pytest_plugin_registered


pytest_plugin_registered = entry_point_guard(__name__, ENTRY_POINT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    if call.when != "call":
        return
    instance = _instance(item)
    if not getattr(instance, "__dict__", {}).get("_tst_records"):
        return  # not a round-trip test, or no load ran: nothing to import, nothing to say
    from .outcomes import records, rejection_status

    found = rejection_status(records(instance))
    if found is None:
        return
    status, reasons = found
    report = outcome.get_result()
    properties = [(PROPERTY_PREFIX + "status", status), (PROPERTY_PREFIX + "rejections", reasons)]
    # JUnit XML writes the properties of the test's last report (teardown), copied from the item.  A
    # subTest's report (pytest >= 9) is made here too: the latest count replaces the earlier one.
    for props in (item.user_properties, report.user_properties):
        props[:] = [p for p in props if not str(p[0]).startswith(PROPERTY_PREFIX)] + properties
    if report.passed:
        setattr(report, STATUS_ATTRIBUTE, f"{status}: {reasons}")


def pytest_report_teststatus(report: Any, config: Any) -> Optional[tuple[str, str, tuple[str, dict[str, bool]]]]:
    text = getattr(report, STATUS_ATTRIBUTE, None)
    if not text or report.when != "call" or not report.passed or hasattr(report, "context"):
        return None  # a subTest's report (pytest >= 9 SubtestReport has a context) keeps its own word
    return "passed", ".", (f"PASSED ({text})", {"green": True})
