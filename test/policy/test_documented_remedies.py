"""Not stricter than torch where torch documents the remedy (issue 27.8): the globals torch's own
weights-only error names for a checkpoint of numpy scalars (numpy's scalar reconstructor,
``numpy.dtype``, the numpy dtype classes) are accepted, suggested and named with their source; the
names are asked of torch, never listed by the library.
"""

from __future__ import annotations

import os
import sys
import unittest
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import numpy as np  # noqa: E402  (torch imports numpy already)

from torch_serial_testing import Checkpoint, SerializationRoundTripTestCase, UnsafeCallable, required_globals
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing.unpickler import Outcome, ProbeFailed
from torch_serial_testing.tools.cli.contract import EXIT_ATTENTION, EXIT_OK
from torch_serial_testing.tools.cli.inspection import inspect_report
from torch_serial_testing.tools.policy import remedies
from torch_serial_testing.tools.policy.trust import judge_global, judge_name

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP  # noqa: E402

#: What numpy's own pickling names (numpy 1: numpy.core..., numpy 2: numpy._core...): read from numpy.
SCALAR = np.float64(0.5).__reduce__()[0]
SCALAR_NAME = f"{SCALAR.__module__}.{SCALAR.__qualname__}"
DTYPE_CLASS = type(np.dtype("float64"))
STATE = {"loss": np.float64(0.25), "step": np.int64(3), "ok": np.bool_(True), "dtype": np.dtype("float32")}


def _name(obj: object) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"  # type: ignore[attr-defined]


def _needed() -> tuple:
    """Every object the STATE checkpoint needs, as torch names them (the probe's answer)."""
    remedy = remedies.numpy_scalar_remedy()
    return tuple(remedy[n] for n in required_globals(STATE))


class TestTheRemedyIsAskedOfTorch(unittest.TestCase):
    def test_probe_names_what_numpy_pickles(self) -> None:
        remedy = remedies.numpy_scalar_remedy()
        self.assertIs(remedy[SCALAR_NAME], SCALAR)
        self.assertIs(remedy["numpy.dtype"], np.dtype)
        self.assertIs(remedy[_name(DTYPE_CLASS)], DTYPE_CLASS)
        self.assertIs(remedy[_name(type(np.dtype("int8")))], type(np.dtype("int8")))
        # nothing beyond what torch named: no arrays' reconstructor, no ndarray
        self.assertNotIn("numpy.ndarray", remedy)
        self.assertFalse(any(n.endswith("._reconstruct") for n in remedy))

    def test_a_torch_that_names_no_remedy_fails_the_probe_loudly(self) -> None:
        saved = dict(remedies._known)
        self.addCleanup(lambda: (remedies._known.clear(), remedies._known.update(saved)))
        remedies._known.clear()
        import pickle

        silent = Outcome(error=pickle.UnpicklingError("Weights only load failed."))
        with mock.patch.object(remedies, "unpickle", return_value=silent):
            with self.assertRaisesRegex(ProbeFailed, "without naming a remedy"):
                remedies.numpy_scalar_remedy()


class TestDocumentedRemediesAreAccepted(unittest.TestCase):
    def test_verdicts_name_the_source(self) -> None:
        verdict = judge_name(SCALAR_NAME)
        self.assertEqual(verdict.kind, "documented")
        self.assertTrue(verdict.suggestible)
        self.assertIn("torch documents it", verdict.reason)
        for cls in (np.dtype, DTYPE_CLASS):
            with self.subTest(cls=cls):
                verdict = judge_name(_name(cls))
                self.assertEqual(verdict.kind, "class")
                self.assertIn("torch documents it", verdict.reason)

    def test_declared_without_an_opt_in(self) -> None:
        self.assertIsNone(judge_global(SCALAR))
        accepted = normalize_safe_globals([SCALAR, np.dtype, DTYPE_CLASS, np.ndarray])
        self.assertEqual([sg.obj for sg in accepted], [SCALAR, np.dtype, DTYPE_CLASS, np.ndarray])
        (sg,) = normalize_safe_globals([UnsafeCallable(SCALAR, reason="still fine")])
        self.assertIs(sg.obj, SCALAR)

    def test_only_the_documented_object_under_its_name(self) -> None:
        # the documented name does not lend its trust to another object, nor the object to another name
        self.assertIsNotNone(judge_global(np.add, SCALAR_NAME))
        self.assertIsNotNone(judge_global(SCALAR, "numpy.dtype"))
        reconstruct = np.ndarray.__reduce__(np.arange(1))[0]
        self.assertEqual(judge_name(_name(reconstruct)).kind, "callable")

    def test_inspect_suggests_them_and_loads_with_them(self) -> None:
        data = Checkpoint.save(STATE).rewound().getvalue()
        r = inspect_report("np.pt", [], data=data)
        self.assertEqual((r["status"], r["exit_code"]), ("needs_allowlist", EXIT_ATTENTION))
        self.assertIn(SCALAR_NAME, r["required_globals"])
        self.assertIn("import scalar", r["snippet"])
        self.assertEqual(r["needs_opt_in"], [])
        if SAFE_GLOBALS_SKIP:
            return
        r = inspect_report("np.pt", required_globals(STATE), data=data)
        self.assertEqual((r["status"], r["exit_code"]), ("loads", EXIT_OK))

    def test_round_trip_of_a_numpy_scalar_checkpoint(self) -> None:
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        needed = _needed()

        class NumpyScalars(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = needed

            def runTest(self) -> None:  # noqa: N802
                pass

        probe = NumpyScalars()
        probe.setUp()
        try:
            loaded = probe.round_trip(STATE, mode="safe_globals")
        finally:
            probe.doCleanups()
        self.assertEqual(loaded, STATE)
        self.assertIs(type(loaded["loss"]), np.float64)


if __name__ == "__main__":
    unittest.main()
