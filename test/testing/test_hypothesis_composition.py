"""hypothesis's ``@given`` around a round trip: every example runs, an expected rejection is no failure.

An expected rejection ends only the example it happened in, as a pass; hypothesis never sees an
exception, so it prints no "reproduce with @seed" and runs all its examples.  A real failure in an
example is still hypothesis's to shrink and report.
"""

from __future__ import annotations

import contextlib
import io
import os
import unittest
from typing import Any

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests

try:
    from hypothesis import given, settings
    from hypothesis import strategies as st
except ImportError:  # pragma: no cover - hypothesis is in the test extra
    given = None

EXAMPLES = 12


class Sized(torch.nn.Module):
    def __init__(self, n: int) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(n, 2)


def _generated(fail_above: int = 0) -> tuple[Any, list[Any]]:
    calls: list[Any] = []

    class TestGiven(SerializationRoundTripTestCase, unittest.TestCase):
        load_modes = ("default", "weights_only_false")
        devices = ("cpu",)

        @settings(max_examples=EXAMPLES, database=None, deadline=None, derandomize=True)
        @given(n=st.integers(1, 10_000))
        def test_sized(self, device: str, n: int) -> None:
            calls.append((self.load_mode.value, n))
            if fail_above and n > fail_above:
                self.fail(f"n={n} is too big")
            loaded = self.round_trip(Sized(n))
            self.assertEqual(loaded.lin.in_features, n)

    TestGiven.__module__ = __name__
    scope: dict[str, Any] = {"__name__": __name__}
    instantiate_round_trip_tests(TestGiven, scope)
    return scope["TestGivenCPU"], calls


def _run(test: unittest.TestCase) -> tuple[unittest.TestResult, str]:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        result = unittest.TextTestRunner(stream=out, verbosity=2).run(test)
    return result, out.getvalue()


@unittest.skipIf(given is None, "hypothesis is not installed (pip install -e .[test] brings it)")
class TestHypothesisComposition(unittest.TestCase):
    def setUp(self) -> None:
        from torch_serial_testing.modes import torch_default_weights_only

        forced = sorted(k for k in os.environ if k.startswith("TORCH_FORCE_"))
        if forced or not torch_default_weights_only()[0]:
            self.skipTest(f"default loads are not weights-only here ({forced or 'torch < 2.6'}): no rejection")

    def test_every_example_runs_and_a_rejection_is_no_failure(self) -> None:
        cls, calls = _generated()
        for mode in ("default", "weights_only_false"):
            with self.subTest(mode=mode):
                calls.clear()
                result, out = _run(cls(f"test_sized_{mode}_cpu"))
                self.assertTrue(result.wasSuccessful(), out)
                self.assertEqual(len(calls), EXAMPLES, out)
                self.assertNotIn("@seed", out)
                self.assertNotIn("Falsifying", out)
                if mode == "default":
                    self.assertIn("default: rejected as expected (", out)

    def test_a_real_failure_is_still_reported(self) -> None:
        cls, calls = _generated(fail_above=50)
        result, out = _run(cls("test_sized_default_cpu"))
        self.assertEqual(len(result.failures), 1, out)
        report = result.failures[0][1]
        self.assertIn("n=51 is too big", report)  # hypothesis shrank it to the smallest failing example


if __name__ == "__main__":
    unittest.main()
