"""pytest plugin: a test that passed because torch refused a load, as predicted, stays a pass and says so.

Registered through the ``pytest11`` entry point ``torch_serial_testing`` (``-p torch_serial_testing.pytest_plugin``
from a source tree).  ``pytest -v``/``-rA`` show ``PASSED (rejected as predicted: default (weights_only=True since
torch 2.6; ...))`` or ``PASSED (1 of 3 round trips rejected as predicted: ...)``; JUnit XML gets the properties
``torch_serial_testing.status`` and ``.rejections`` on a plain pass (no ``<skipped>``: CI counts it as run and
passed).  Importing this module imports nothing but pytest; the library only for a test that ran round trips."""

from __future__ import annotations

import sys
from contextlib import suppress
from typing import Any, Callable, Generator, Optional

import pytest

ENTRY_POINT = "torch_serial_testing"  # setup.cfg's: ``-p no:torch_serial_testing`` turns the plugin off
STATUS_ATTRIBUTE = "torch_serial_testing_status"  # a plain attribute survives pytest-xdist's transport
PROPERTY_PREFIX = "torch_serial_testing."


def _instance(item: Any) -> Any:
    """The unittest ``TestCase`` instance an item runs (pytest >= 8: ``instance``; 7: ``_testcase``)."""
    for name in ("instance", "_testcase"):
        with suppress(Exception):  # a plugin's item type whose property raises: not ours
            if (value := getattr(item, name, None)) is not None:
                return value
    return None


def entry_point_guard(module: str, entry_point: str) -> Callable[[Any, Any], None]:
    """A ``pytest_plugin_registered`` hook blocking *entry_point* once plugin *module* is loaded by name (``-p``,
    read first) where the library is also installed: pluggy refuses to register the same module twice."""

    def pytest_plugin_registered(plugin: Any, manager: Any) -> None:
        ours = plugin is sys.modules.get(module) and manager.get_name(plugin) != entry_point
        if ours and manager.get_plugin(entry_point) is None and not manager.is_blocked(entry_point):
            manager.set_blocked(entry_point)

    return pytest_plugin_registered


pytest_plugin_registered = entry_point_guard(__name__, ENTRY_POINT)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: Any, call: Any) -> Generator[None, Any, None]:
    outcome = yield
    if call.when != "call" or not getattr(instance := _instance(item), "__dict__", {}).get("_tst_records"):
        return  # not the call, not a round-trip test, or no load ran: nothing to import, nothing to say
    from .outcomes import records, rejection_status

    if (found := rejection_status(records(instance))) is None:
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
