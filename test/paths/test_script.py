"""``torch_serial_testing.paths.script``: TorchScript round trips, and ``torch.load`` of a TorchScript archive.

Each check runs a generated test of a small class and reads its result and records.  The mutations (a
``torch.jit.load`` or ``torch.load`` that does something else than torch does) show that each assertion can fail."""

from __future__ import annotations

import io
import os
import re
import unittest
import warnings
from typing import Any, Callable
from unittest import mock

import torch
import torch.ao.nn.quantized as nnq

from test.helpers.roundtrip_fixtures import MODE_SKIPS, REFUSES_BOTH_SWITCHES
from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
from torch_serial_testing.errors import ConflictingEnvironmentError, RoundTripConfigError, UnexpectedLoadOutcome
from torch_serial_testing.outcomes import records
from torch_serial_testing.paths import script
from torch_serial_testing.paths.script import REFUSED_WEIGHTS_ONLY, TorchScriptRoundTrips, torchscript_refusal
from torch_serial_testing.tools import facts

FORCE_WO, FORCE_NO_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
DEPRECATED = (r"`torch\.jit\.\w+` is deprecated", r".*quantized tensor creation.*", r".*dispatching to 'torch\.jit.*")


class Plus(torch.nn.Module):
    def __init__(self, k: float = 1.0) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.k = k

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) + self.k


class Shift(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 1


class OtherShift(torch.nn.Module):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + 2


def scripted(module: torch.nn.Module) -> Any:
    return torch.jit.script(module)


def qlinear(seed: int) -> Any:
    torch.manual_seed(seed)
    weight = torch.quantize_per_tensor(torch.rand(2, 3), 0.1, 4, torch.qint8)
    q = nnq.Linear(3, 2)
    q.set_weight_bias(weight, torch.ones(2))
    q.scale = 0.05
    return q


def generated(*mixins: type) -> Any:
    """The generated class (a test per load mode) of a small class with *mixins*; kept out of module namespaces,
    where unittest's loader would run its tests on their own."""

    class Case(*mixins, TorchScriptRoundTrips, SerializationRoundTripTestCase, unittest.TestCase):  # type: ignore[misc]
        devices = ("cpu",)
        ignore_warnings = DEPRECATED
        body: Callable[[Any], Any] = staticmethod(lambda test: None)

        def setUp(self) -> None:
            SerializationRoundTripTestCase.setUp(self)
            self.addCleanup(lambda: Case.seen.__setitem__(self.id(), records(self)))  # also after a rejection

        def test_body(self, device: str) -> None:
            type(self).body(self)

    Case.seen = {}  # type: ignore[attr-defined]
    Case.__module__ = __name__
    scope: dict[str, Any] = {"__name__": __name__}
    instantiate_round_trip_tests(Case, scope)
    return scope["CaseCPU"]


_CASES = {(): generated()}


def run(body: Callable[[Any], Any], mode: str = "weights_only_false", mixins: tuple = ()) -> tuple[Any, list, Any]:
    """Run *body(test)* as the generated test of *mode*: (result, the test's records, what *body* returned)."""
    if (case := _CASES.get(mixins)) is None:
        case = _CASES[mixins] = generated(*mixins)
    returned = []
    case.body = staticmethod(lambda test: returned.append(body(test)))
    case.seen.clear()
    test = case(f"test_body_{mode}_cpu")
    result = unittest.TestResult()
    test.run(result)
    return result, case.seen.get(test.id(), []), returned[0] if returned else None


def failure(result: unittest.TestResult) -> str:
    return "\n".join(text for _, text in result.errors + result.failures)


class TestProbe(unittest.TestCase):
    def test_the_refusal_is_torchs_own_words_for_a_real_archive(self) -> None:
        buf = io.BytesIO()
        torch.jit.save(scripted(Shift()), buf)
        refusal = torchscript_refusal()
        if refusal is None:  # torch 2.4: handed to torch.jit.load whatever weights_only says
            self.assertIsInstance(torch.load(io.BytesIO(buf.getvalue()), weights_only=True), torch.jit.ScriptModule)
            return
        with self.assertRaises(RuntimeError) as caught, warnings.catch_warnings():
            warnings.filterwarnings("ignore", ".*dispatching to 'torch.jit.load'", UserWarning)  # torch's, on purpose
            torch.load(io.BytesIO(buf.getvalue()), weights_only=True)
        self.assertEqual(str(caught.exception), refusal)
        self.assertTrue(refusal.startswith(facts.torchscript_refusal()))  # the tools' probe: the message, trimmed

    def test_the_probe_reads_neither_switch_and_restores_them(self) -> None:
        known = torchscript_refusal()
        with mock.patch.dict(os.environ, {FORCE_NO_WO: "1"}), mock.patch.object(script, "_torchscript_refusal", []):
            self.assertEqual(torchscript_refusal(), known)
            self.assertEqual(os.environ.get(FORCE_NO_WO), "1")
            self.assertNotIn(FORCE_WO, os.environ)


class TestRoundTripJit(unittest.TestCase):
    def test_scripted_and_traced_modules_load_equal_and_are_recorded(self) -> None:
        x = torch.randn(4, 3)

        def body(test: Any) -> Any:
            module = Plus()
            return [test.round_trip_jit(m, [(x,), (x * 2,)]) for m in (scripted(module), torch.jit.trace(module, x))]

        result, recs, loaded = run(body)
        self.assertTrue(result.wasSuccessful(), failure(result))
        self.assertTrue(all(isinstance(m, torch.jit.ScriptModule) for m in loaded))
        self.assertEqual([(r.kind, r.mode, r.loaded) for r in recs], [("torch.jit.load", None, True)] * 2)
        self.assertIn("outputs on 2 example inputs", recs[0].summary)

    def test_a_copy_with_other_weights_fails_naming_the_parameter(self) -> None:
        other = scripted(Plus())
        result, _, _ = run(lambda test: test.round_trip_jit(scripted(Plus()), [(torch.ones(1, 3),)]))
        self.assertTrue(result.wasSuccessful(), failure(result))
        with mock.patch("torch.jit.load", return_value=other):
            result, _, _ = run(lambda test: test.round_trip_jit(scripted(Plus()), [(torch.ones(1, 3),)]))
        self.assertEqual(len(result.failures), 1, failure(result))
        self.assertIn("round trip mismatch at ['state_dict()']['lin.weight']", failure(result))

    def test_a_copy_with_other_code_fails_naming_the_code(self) -> None:
        with mock.patch("torch.jit.load", return_value=scripted(OtherShift())):
            result, _, _ = run(lambda test: test.round_trip_jit(scripted(Shift())))
        self.assertIn("round trip mismatch at ['code']['']", failure(result))

    def test_quantized_state_is_compared_through_the_outputs(self) -> None:
        # A scripted quantized Linear keeps its weights in a TorchScript object: no state_dict() entry.
        x_q = torch.quantize_per_tensor(torch.rand(2, 3), 0.2, 10, torch.quint8)
        self.assertEqual(scripted(qlinear(0)).state_dict(), {})
        result, _, _ = run(lambda test: test.round_trip_jit(scripted(qlinear(0)), [(x_q,)]))
        self.assertTrue(result.wasSuccessful(), failure(result))
        with mock.patch("torch.jit.load", return_value=scripted(qlinear(1))):
            result, _, _ = run(lambda test: test.round_trip_jit(scripted(qlinear(0)), [(x_q,)]))
        self.assertIn("round trip mismatch at ['outputs'][0]", failure(result))

    def test_bad_arguments_say_the_fix(self) -> None:
        for args, words in (
            ((Plus(),), "takes a TorchScript module, got Plus: pass torch.jit.script(module)"),
            ((scripted(Shift()), torch.ones(1)), "is a list of argument tuples, one per call, e.g. [(x,)]"),
            ((scripted(Shift()), [torch.ones(1)]), "example_inputs[0] is a Tensor, not a tuple of arguments"),
            ((b"PK\x03\x04",), "takes a TorchScript module, got bytes"),  # never anybody's bytes
        ):
            for method in ("round_trip_jit", "round_trip_jit_torch_load"):
                with self.subTest(method=method, words=words):
                    result, recs, _ = run(lambda test: getattr(test, method)(*args))
                    self.assertEqual(len(result.errors), 1)
                    self.assertIn(RoundTripConfigError.__name__, failure(result))
                    self.assertIn(words, failure(result))
                    self.assertEqual(recs, [])


class TestDeclaration(unittest.TestCase):
    def test_without_the_mixin_the_class_is_refused_at_creation(self) -> None:
        words = "write class TestX(TorchScriptRoundTrips, SerializationRoundTripTestCase, TestCase)"
        with self.assertRaisesRegex(RoundTripConfigError, re.escape(words)):
            type("TestX", (TorchScriptRoundTrips, unittest.TestCase), {})


class TestTorchLoadOfAnArchive(unittest.TestCase):
    def expect(self, mode: str) -> tuple[bool, bool]:
        """(loads, weights_only) of a bare environment's load in *mode* (no switch set here)."""
        weights_only = {"weights_only_false": False, "safe_globals": True}.get(mode, torch_default())
        return not weights_only or torchscript_refusal() is None, weights_only

    def test_each_mode_is_handed_to_jit_or_refused_as_a_torchscript_archive(self) -> None:
        x = torch.randn(2, 3)
        for mode in ("weights_only_false", "safe_globals", "default"):
            with self.subTest(mode=mode), mock.patch.dict(os.environ):
                for name in (FORCE_WO, FORCE_NO_WO):
                    os.environ.pop(name, None)
                result, recs, loaded = run(lambda test: test.round_trip_jit_torch_load(scripted(Plus()), [(x,)]), mode)
                if mode in MODE_SKIPS:
                    self.assertEqual(len(result.skipped), 1)
                    continue
                self.assertTrue(result.wasSuccessful(), failure(result))
                loads, weights_only = self.expect(mode)
                self.assertEqual(
                    [(r.kind, r.mode, r.loaded, r.weights_only) for r in recs],
                    [("torch.load", mode, loads, weights_only)],
                )
                self.assertNotIn("not allowlisted", recs[0].summary)
                if loads:
                    self.assertIsInstance(loaded, torch.jit.ScriptModule)
                else:
                    self.assertIsNone(loaded)  # the rejection ended the test: a pass
                    self.assertIn(REFUSED_WEIGHTS_ONLY, recs[0].summary)

    def test_the_switches_are_read_on_every_load(self) -> None:
        with mock.patch.dict(os.environ, {FORCE_WO: "1"}):
            os.environ.pop(FORCE_NO_WO, None)
            result, recs, _ = run(lambda test: test.round_trip_jit_torch_load(scripted(Shift())))
        self.assertTrue(result.wasSuccessful(), failure(result))
        refuses = torchscript_refusal() is not None
        self.assertEqual([(r.loaded, r.weights_only) for r in recs], [(not refuses, True)])
        self.assertIn(f"forced by {FORCE_WO}=1 over explicit weights_only=False", recs[0].summary)
        if REFUSES_BOTH_SWITCHES:
            with mock.patch.dict(os.environ, {FORCE_WO: "1", FORCE_NO_WO: "1"}):
                result, recs, _ = run(lambda test: test.round_trip_jit_torch_load(scripted(Shift())))
            self.assertIn(ConflictingEnvironmentError.__name__, failure(result))
            self.assertEqual(recs, [])

    def test_a_torch_that_loads_or_refuses_otherwise_fails(self) -> None:
        if torchscript_refusal() is None:
            self.skipTest("this torch hands a TorchScript archive to torch.jit.load whatever weights_only says")
        module = scripted(Shift())
        for mode, fake, words in (
            ("safe_globals", mock.Mock(return_value=module), "expected torch.load to refuse it"),
            ("weights_only_false", mock.Mock(side_effect=RuntimeError("boom")), "expected torch.load to load it"),
            ("safe_globals", mock.Mock(side_effect=RuntimeError("boom")), "expected torch.load to raise RuntimeError("),
        ):
            if mode in MODE_SKIPS:
                continue
            with self.subTest(mode=mode, words=words), mock.patch("torch.load", fake):
                result, recs, _ = run(lambda test: test.round_trip_jit_torch_load(scripted(Shift())), mode)
            self.assertIn(UnexpectedLoadOutcome.__name__, failure(result))
            self.assertIn(words, failure(result))
            self.assertEqual(recs, [])

    def test_without_a_load_mode_it_says_how_to_get_one(self) -> None:
        def body(test: Any) -> Any:
            test._tst_case = None  # as outside instantiation
            with self.assertRaisesRegex(RoundTripConfigError, "this test has no load mode: pass mode='default'"):
                test.round_trip_jit_torch_load(scripted(Shift()))
            return test.round_trip_jit_torch_load(scripted(Shift()), mode="weights_only_false")

        result, recs, loaded = run(body)
        self.assertTrue(result.wasSuccessful(), failure(result))
        self.assertIsInstance(loaded, torch.jit.ScriptModule)


def torch_default() -> bool:
    from torch_serial_testing.modes import torch_default_weights_only

    return torch_default_weights_only()[0]


if __name__ == "__main__":
    unittest.main()
