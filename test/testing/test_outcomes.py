"""What a test's round trips leave behind: the verbose unittest line, the records, the JSONL report."""

from __future__ import annotations

import io
import json
import os
import tempfile
import unittest
from unittest import mock

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.outcomes import REPORT_ENV, RoundTripRecord, records, rejection_status


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)


def _generated() -> dict[str, type]:
    class TestNet(SerializationRoundTripTestCase, unittest.TestCase):
        load_modes = ("default", "weights_only_false")
        devices = ("cpu",)

        def test_sub(self, device: str) -> None:
            for k in (1, 2):
                with self.subTest(k=k):
                    self.round_trip(Net())
            with self.subTest("plain dict"):
                self.round_trip({"a": torch.ones(1)}, safe_globals=())
            self.__class__.seen = records(self)

    TestNet.__module__ = __name__  # Net is importable from here: the full load builds it
    scope: dict[str, type] = {"__name__": __name__}  # type: ignore[dict-item]
    instantiate_round_trip_tests(TestNet, scope)
    return scope


def _run(test: unittest.TestCase) -> tuple[unittest.TestResult, str]:
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=2).run(test)
    return result, stream.getvalue()


class TestOutcomes(unittest.TestCase):
    def setUp(self) -> None:
        if torch.serialization.load.__module__ != "torch.serialization":
            self.skipTest("torch.load is replaced here: its rejection wording is the replacement's")
        from torch_serial_testing.modes import torch_default_weights_only

        forced = sorted(k for k in os.environ if k.startswith("TORCH_FORCE_"))
        if forced or not torch_default_weights_only()[0]:
            self.skipTest(f"default loads are not weights-only here ({forced or 'torch < 2.6'}): no rejection to show")
        self.cls = _generated()["TestNetCPU"]

    def test_unittest_verbose_line_names_the_rejection(self) -> None:
        result, out = _run(self.cls("test_sub_default_cpu"))
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn("default: rejected as expected (", out)
        self.assertIn("not allowlisted", out)
        self.assertIn("default: loaded as expected (", out)
        self.assertTrue(out.splitlines()[0].endswith(" ... ok"), out)

    def test_records_and_jsonl_name_the_subtest(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "report.jsonl")
            with mock.patch.dict(os.environ, {REPORT_ENV: path}):
                result, out = _run(self.cls("test_sub_default_cpu"))
            self.assertTrue(result.wasSuccessful(), out)
            with open(path, encoding="utf-8") as fh:
                lines = [json.loads(line) for line in fh]
        self.assertEqual(
            [(r["subtest"], r["mode"], r["loaded"], r["kind"]) for r in lines],
            [
                ("(k=1)", "default", False, "torch.load"),
                ("(k=2)", "default", False, "torch.load"),
                ("[plain dict]", "default", True, "torch.load"),
            ],
        )
        self.assertTrue(all(r["test"].endswith("TestNetCPU.test_sub_default_cpu") for r in lines), lines)
        self.assertEqual([r.subtest for r in self.cls.seen], ["(k=1)", "(k=2)", "[plain dict]"])
        status, reasons = rejection_status(self.cls.seen) or ("", "")
        self.assertEqual(status, "2 of 3 round trips rejected as predicted")
        self.assertTrue(reasons.endswith(" in subTest (k=1), (k=2)"), reasons)
        self.assertEqual(reasons.count("default ("), 1, "one distinct refusal, named once")
        self.assertNotIn("rejected as expected", reasons)  # the status says "rejected" once


class _NoSubTestSupport(unittest.TestResult):
    """A result without ``addSubTest``, as pytest < 9 gives: unittest then sets no ``_subtest``."""

    @property
    def addSubTest(self) -> None:  # type: ignore[override]  # noqa: N802 - unittest API
        raise AttributeError("addSubTest")


class TestSubtestNames(unittest.TestCase):
    """A record names its subTest as unittest describes it, whether or not the result supports subTests."""

    def labels(self, result: unittest.TestResult) -> list[object]:
        class TestNested(SerializationRoundTripTestCase, unittest.TestCase):
            load_modes = ("weights_only_false",)
            devices = ("cpu",)

            def test_nested(self, device: str) -> None:
                with self.subTest("outer", a=1):
                    with self.subTest(b="x", a=2):
                        self.round_trip({"t": torch.ones(1)})
                    self.round_trip({"t": torch.ones(1)})
                with self.subTest():
                    self.round_trip({"t": torch.ones(1)})
                self.round_trip({"t": torch.ones(1)})
                self.__class__.seen = records(self)

        scope: dict[str, type] = {"__name__": __name__}  # type: ignore[dict-item]
        instantiate_round_trip_tests(TestNested, scope)
        cls = scope["TestNestedCPU"]
        cls("test_nested_weights_only_false_cpu").run(result)
        self.assertEqual((result.errors, result.failures), ([], []))
        return [r.subtest for r in cls.seen]  # type: ignore[attr-defined]

    def test_same_names_without_subtest_support(self) -> None:
        expected = ["(b='x', a=2)", "[outer] (a=1)", "(<subtest>)", None]
        self.assertEqual(self.labels(unittest.TestResult()), expected)  # unittest's own descriptions
        self.assertEqual(self.labels(_NoSubTestSupport()), expected)


class TestRejectionStatus(unittest.TestCase):
    def record(self, loaded: bool, summary: str = "default: rejected as expected (x)") -> RoundTripRecord:
        return RoundTripRecord("torch.load", "default", loaded, True, summary, None)

    def test_no_rejection_no_status(self) -> None:
        self.assertIsNone(rejection_status([]))
        self.assertIsNone(rejection_status([self.record(True, "default: loaded as expected (x)")]))

    def test_rejection_only(self) -> None:
        self.assertEqual(
            rejection_status([self.record(False), self.record(False)]),
            ("rejected as predicted", "default (x)"),
        )


if __name__ == "__main__":
    unittest.main()
