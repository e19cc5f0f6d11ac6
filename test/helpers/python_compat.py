"""Facts about the running Python's unittest that the suite's expectations depend on.

Measured, not read from the version where a probe can tell: CPython 3.12.1 left tests skipped by a decorator out of
``testsRun`` (and so out of "Ran N tests"); 3.12.2 restored the count.  The verbose runner's
test ids changed format in 3.11; the parsers below read either.
"""

from __future__ import annotations

import io
import re
import unittest


def _unittest_counts_skipped_tests() -> bool:
    class _Probe(unittest.TestCase):
        @unittest.skip("probe")
        def test_skipped(self) -> None:
            pass

    result = unittest.TextTestRunner(stream=io.StringIO(), verbosity=0).run(
        unittest.defaultTestLoader.loadTestsFromTestCase(_Probe)
    )
    return result.testsRun == 1


UNITTEST_COUNTS_SKIPPED_TESTS = _unittest_counts_skipped_tests()


def expected_tests_run(total: int, skipped: int) -> int:
    """What ``testsRun`` / "Ran N tests" reports for *total* tests of which *skipped* skip by a
    decorator (``unittest.skip``...: ``__unittest_skip__``); a test that raises ``SkipTest`` while
    it runs (``self.skipTest``) counts on every Python."""
    return total if UNITTEST_COUNTS_SKIPPED_TESTS else total - skipped


def decorator_skipped(cls: type) -> int:
    """How many of *cls*'s tests skip by a decorator on the method or the class (see above)."""
    tests = unittest.defaultTestLoader.loadTestsFromTestCase(cls)
    return sum(
        1
        for test in tests
        if getattr(cls, "__unittest_skip__", False)
        or getattr(getattr(cls, test._testMethodName), "__unittest_skip__", False)
    )


#: One test's header in ``unittest -v`` output, with groups ``name`` and ``owner``:
#: ``test_x (module.Class.test_x)`` since Python 3.11, ``test_x (module.Class)`` before.
VERBOSE_HEADER = r"(?P<name>test\w+) \((?P<owner>[\w.]+?)(?:\.(?P=name))?\)"
#: Where a header starts: at a line start, or (before Python 3.11, after a test whose subtests
#: failed, which ends its line with nothing) right after the previous test's " ... ".
VERBOSE_HEADER_START = r"(?:^|(?<=\.\.\. ))"


def verbose_headers(out: str) -> list[tuple[str, re.Match[str]]]:
    """(full test id ``module.Class.test_x``, match) for each test header ``unittest -v`` printed."""
    return [
        (f"{m.group('owner')}.{m.group('name')}", m)
        for m in re.finditer(VERBOSE_HEADER_START + VERBOSE_HEADER, out, re.M)
    ]


def verbose_ids(out: str) -> list[str]:
    """Every test id ``unittest -v`` printed, in order, in either Python's format."""
    return [test_id for test_id, _ in verbose_headers(out)]


def failure_ids(out: str) -> list[str]:
    """The ids of the ``FAIL:`` / ``ERROR:`` blocks of a unittest run, in either Python's format."""
    return [
        f"{m.group('owner')}.{m.group('name')}" for m in re.finditer(r"^(?:FAIL|ERROR): " + VERBOSE_HEADER, out, re.M)
    ]


#: A warning as ``warnings.showwarning`` prints it: ``file:line: Category: message`` (then the source
#: line, indented).  In ``unittest -v`` output it starts a line or follows a header's " ... ".
WARNING_LINE = r"(?:^|(?<=\.\.\. ))(?P<where>[^\s:](?:(?!\.\.\. )[^:\n])*:\d+): (?P<category>\w+): (?P<message>[^\n]*)"


#: torch < 2.6 warns at every bare ``torch.load`` call (the ``default`` mode), located at that call: the
#: library's load for a library test, the test's own line for its plain twin -- the same call, made in
#: different files -- so :func:`warnings_by_test` names its location :data:`BARE_LOAD_CALL` on both sides.
BARE_LOAD_WARNING = "You are using `torch.load` with `weights_only=False` (the current default value)"
BARE_LOAD_CALL = "<the bare torch.load call>"


def warnings_by_test(out: str, key: str = "class") -> dict[str, list[str]]:
    """The warnings a ``unittest -v`` run printed, by the test they were printed in, in order.

    Keys are ``Class.test_x`` (*key* ``"class"``) or ``test_x`` (*key* ``"name"``); warnings printed
    before the first test are under ``""``.  Each warning is ``file:line: Category: message``.
    Only tests that printed a warning appear.
    """
    headers = verbose_headers(out)
    spans = [("", 0)] + [
        (test_id.split(".")[-1] if key == "name" else ".".join(test_id.split(".")[-2:]), m.end())
        for test_id, m in headers
    ]
    found: dict[str, list[str]] = {}
    for i, (test, start) in enumerate(spans):
        end = headers[i][1].start() if i < len(headers) else len(out)
        for m in re.finditer(WARNING_LINE, out[start:end], re.M):
            where = BARE_LOAD_CALL if m.group("message").startswith(BARE_LOAD_WARNING) else m.group("where")
            found.setdefault(test, []).append(f"{where}: {m.group('category')}: {m.group('message')}")
    return found
