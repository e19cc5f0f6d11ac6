"""Round trips through a file path (``mmap=True``, other ``torch.load`` keywords) and through pickle."""

from __future__ import annotations

import glob
import re
import io
import os
import pickle
import tempfile
import unittest
from typing import Any, Optional
from unittest import mock

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.errors import ConflictingEnvironmentError, RoundTripConfigError
from torch_serial_testing.loading import pickle_round_trip
from torch_serial_testing.outcomes import records

from test.helpers.roundtrip_fixtures import REFUSES_BOTH_SWITCHES

FORCE_WO, FORCE_NO_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)


def _leftovers() -> set[str]:
    return set(glob.glob(os.path.join(tempfile.gettempdir(), "tst-checkpoint-*")))


def _mapped_checkpoints() -> Optional[int]:
    """How many memory mappings of the library's temporary checkpoint files exist (None: not Linux)."""
    try:
        with open("/proc/self/maps", encoding="utf-8", errors="replace") as fh:
            return sum("tst-checkpoint-" in line for line in fh)
    except OSError:
        return None


def _generated() -> Any:
    class TestKinds(SerializationRoundTripTestCase, unittest.TestCase):
        safe_globals = (Net, torch.nn.Linear)
        devices = ("cpu",)

        def setUp(self) -> None:
            SerializationRoundTripTestCase.setUp(self)  # not super(): generated classes copy the generic one
            self.addCleanup(lambda: self.seen.__setitem__(self.id(), records(self)))  # also after a rejection

        def test_file(self, device: str) -> None:
            module = Net()
            loaded = self.round_trip_file(module)  # ends here where torch refuses (default mode)
            self.assertRoundTripEqual(module.state_dict(), loaded.state_dict())

        def test_mmap(self, device: str) -> None:
            state = {"w": torch.arange(6.0).reshape(2, 3), "b": torch.ones(2)}
            before = _mapped_checkpoints()
            loaded = self.round_trip_file(state, safe_globals=(), mmap=True)
            self.assertRoundTripEqual(state, loaded)
            if before is not None:  # Linux: the tensors are mapped from the (since removed) file
                self.assertGreater(_mapped_checkpoints(), before)

        def test_pickle(self, device: str) -> None:
            module = Net()
            q = torch.quantize_per_tensor(torch.ones(4), 0.5, 1, torch.quint8)
            obj = {"module": module, "t": torch.arange(3), "q": q, "p": torch.nn.Parameter(torch.zeros(2))}
            loaded = self.round_trip_pickle(obj)
            self.assertRoundTripEqual(module.state_dict(), loaded["module"].state_dict())
            self.assertRoundTripEqual(obj["t"], loaded["t"])
            self.assertTrue(torch.equal(q.int_repr(), loaded["q"].int_repr()))
            self.assertIsInstance(loaded["p"], torch.nn.Parameter)

    TestKinds.seen = {}  # type: ignore[attr-defined]
    TestKinds.__module__ = __name__
    scope: dict[str, Any] = {"__name__": __name__}
    instantiate_round_trip_tests(TestKinds, scope)
    return scope["TestKindsCPU"]


def _run(cls: Any, prefix: str) -> tuple[unittest.TestResult, str]:
    suite = unittest.TestSuite(
        t for t in unittest.defaultTestLoader.loadTestsFromTestCase(cls) if t.id().rsplit(".", 1)[1].startswith(prefix)
    )
    stream = io.StringIO()
    result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    return result, stream.getvalue()


class TestFileRoundTrips(unittest.TestCase):
    def setUp(self) -> None:
        self.before = _leftovers()
        self.cls = _generated()

    def tearDown(self) -> None:
        self.assertEqual(_leftovers() - self.before, set(), "temporary checkpoint files left behind")

    def test_every_mode_through_a_path(self) -> None:
        result, out = _run(self.cls, "test_file_")
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(result.testsRun, len(self.cls.seen), out)
        skipped = {test.id() for test, _ in result.skipped}  # (the safe_globals mode, before torch 2.5)
        for test_id, recs in self.cls.seen.items():
            self.assertEqual([r.kind for r in recs], [] if test_id in skipped else ["torch.load(path)"], test_id)
        self.assertIn("weights_only_false: loaded as expected", out)

    def test_mmap(self) -> None:
        result, out = _run(self.cls, "test_mmap_")
        self.assertTrue(result.wasSuccessful(), out)
        kinds = {r.kind for recs in self.cls.seen.values() for r in recs}
        self.assertEqual(kinds, {"torch.load(path, mmap=True)"})
        self.assertTrue(all(r.loaded for recs in self.cls.seen.values() for r in recs))

    def test_unsupported_load_keywords_fail_naming_the_fix(self) -> None:
        test = self.cls("test_file_weights_only_false_cpu")
        test.round_trip_outcomes = []
        for kwargs, words in (
            ({"pickle_module": pickle}, "not supported by round trips (supported: mmap)"),
            ({"encoding": "latin1"}, "only apply to weights_only=False loads"),
            ({"weights_only": True}, "it is the load mode"),
        ):
            with self.subTest(kwargs=kwargs), self.assertRaisesRegex(RoundTripConfigError, re.escape(words)):
                test.round_trip_file({"a": torch.ones(1)}, mode="weights_only_false", **kwargs)


class TestPickleRoundTrips(unittest.TestCase):
    def test_pickle_in_every_mode_is_recorded(self) -> None:
        cls = _generated()
        result, out = _run(cls, "test_pickle_")
        self.assertTrue(result.wasSuccessful(), out)
        self.assertGreater(len(cls.seen), 0)
        skipped = {test.id() for test, _ in result.skipped}  # (the safe_globals mode, before torch 2.5)
        for test_id, recs in cls.seen.items():
            expected = [] if test_id in skipped else [("pickle.loads", None, True)]
            self.assertEqual([(r.kind, r.mode, r.loaded) for r in recs], expected, test_id)
        self.assertIn("pickle.loads: loaded as expected (its storages through torch.load: ", out)

    def test_switches_reach_pickle_loads(self) -> None:
        obj = {"t": torch.arange(4.0)}
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        with mock.patch.dict(os.environ, env, clear=True):
            plain = pickle_round_trip(obj)
            self.assertFalse(plain.weights_only)
            with mock.patch.dict(os.environ, {FORCE_WO: "1"}):
                forced = pickle_round_trip(obj)
            self.assertTrue(forced.weights_only, forced.summary)
            self.assertIn(FORCE_WO, forced.summary)
            self.assertTrue(torch.equal(forced.value["t"], obj["t"]))
            with mock.patch.dict(os.environ, {FORCE_WO: "1", FORCE_NO_WO: "1"}):
                if REFUSES_BOTH_SWITCHES:
                    with self.assertRaisesRegex(ConflictingEnvironmentError, "both set"):
                        pickle_round_trip(obj)
                else:  # torch < 2.6 does not read the second switch: the first one forces weights_only
                    self.assertTrue(pickle_round_trip(obj).weights_only)
                # no storage, no torch.load: the conflict does not matter to pickle
                self.assertEqual(pickle_round_trip({"a": 1}).value, {"a": 1})


if __name__ == "__main__":
    unittest.main()
