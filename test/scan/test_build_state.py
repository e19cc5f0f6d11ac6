"""BUILD of an allowlisted class: the model predicts exactly what this torch's BUILD does with the state.

torch 2.4 and 2.5 apply every state with ``inst.__dict__.update(state)``: a class with ``__slots__``
raises AttributeError, a ``(dict_or_None, slotstate)`` pair TypeError or ValueError, a non-dict
state whatever ``dict.update`` says -- through ``torch.load`` as they are, not as UnpicklingError.
torch 2.6 on does what pickle does.  Each case is saved, predicted and really loaded with its class
allowlisted; prediction and torch must agree on the outcome, the exception type and the message.
"""

from __future__ import annotations

import contextlib
import copyreg
import os
import pickle
import unittest
from unittest import mock

import torch

import torch_serial_testing as tst
from torch_serial_testing import Checkpoint, predict
from torch_serial_testing import prediction
from torch_serial_testing.registry import allowlisted
from torch_serial_testing.model import build_failure, state_shape
from torch_serial_testing.errors import UnexpectedLoadOutcome
from torch_serial_testing.unpickler import BuildRules, unpickler_rules
from torch_serial_testing.tools import FileCheckpoint

from test.helpers.other_torches import Torch24Build, simulated_rules, unpickler_standin
from test.helpers.roundtrip_fixtures import assert_mode_skips_here


def build_rules() -> BuildRules:
    """This torch's BUILD rules, as its unpickler answered the probes."""
    return unpickler_rules().build


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a = 1
        self.b = torch.ones(2)


class SlottedChild(Slotted):
    """Slots from its base, a ``__dict__`` of its own: state is ``(dict or None, slotstate)``."""


class SlottedWithSetstate:
    __slots__ = ("a",)

    def __init__(self) -> None:
        self.a = torch.arange(3.0)

    def __getstate__(self) -> dict:
        return {"a": self.a}

    def __setstate__(self, state: dict) -> None:
        self.a = state["a"]


class Plain:
    def __init__(self) -> None:
        self.w = torch.zeros(1)


class CustomState:
    """Pickled with whatever ``__getstate__`` returns; no ``__setstate__``."""

    def __init__(self, state: object) -> None:
        self.state = state

    def __getstate__(self) -> object:
        return self.state

    def __reduce_ex__(self, protocol: int) -> tuple:
        return (copyreg.__newobj__, (CustomState,), self.state)


class SlottedCustomState:
    __slots__ = ("state",)

    def __init__(self, state: object) -> None:
        self.state = state

    def __reduce_ex__(self, protocol: int) -> tuple:
        return (copyreg.__newobj__, (SlottedCustomState,), self.state)


def _child(**extra: object) -> SlottedChild:
    obj = SlottedChild()
    for k, v in extra.items():
        setattr(obj, k, v)
    return obj


CASES = {
    "slots_only": Slotted,
    "slots_and_empty_dict": lambda: _child(),
    "slots_and_dict_of_1": lambda: _child(x=1),
    "slots_and_dict_of_2": lambda: _child(x=1, y=2),
    "slots_and_dict_of_3": lambda: _child(x=1, y=2, z=3),
    "slots_with_setstate": SlottedWithSetstate,
    "plain_dict_state": Plain,
    "state_str": lambda: CustomState("ab"),
    "state_empty_str": lambda: CustomState(""),
    "state_int_zero": lambda: CustomState(0),
    "state_int": lambda: CustomState(7),
    "state_pair_of_str": lambda: CustomState(("ab", {"x": 1})),
    "state_pair_none_str": lambda: CustomState((None, "xy")),
    "state_pair_of_pairs": lambda: CustomState((("k", 1), ("j", 2))),
    "state_long_str": lambda: CustomState("s" * 500),
    "slotted_empty_dict_state": lambda: SlottedCustomState({}),
    "slotted_dict_state": lambda: SlottedCustomState({"state": 1}),
    "slotted_none_slot_pair": lambda: SlottedCustomState((None, {"state": 2})),
}


def _torch_outcome(data: bytes, cls: type) -> tuple[bool, str, str]:
    """(loaded, exception type, message) of a real weights-only torch.load with *cls* allowlisted."""
    import io

    try:
        with allowlisted([cls]):
            torch.load(io.BytesIO(data), weights_only=True)
    except Exception as e:  # noqa: BLE001 - the outcome is the data
        return False, type(e).__name__, str(e)
    return True, "", ""


class TestModelAgreesWithTorch(unittest.TestCase):
    def test_every_case(self) -> None:
        self._every_case()

    def test_every_case_on_a_torch_24_like_build(self) -> None:
        """torch 2.4/2.5's BUILD, by a stand-in unpickler: the probes read it, the model predicts it."""
        with unpickler_standin(Torch24Build):
            self.assertEqual(build_rules(), TestRulesAndShapes.OLD)
            failures = self._every_case()
        self.assertGreater(failures, 10)  # most of the cases fail there

    def _every_case(self) -> int:
        failures = 0
        for name, factory in CASES.items():
            obj = factory()
            cls = type(obj)
            for zip_format in (True, False):
                with self.subTest(name, zip_format=zip_format):
                    data = _save(obj, zip_format)
                    # the core reads torch.save's zip archive; a legacy stream is read by the tools
                    wrap = Checkpoint.from_bytes if zip_format else FileCheckpoint.from_bytes
                    exp = predict("safe_globals", wrap(data), [cls])
                    loaded, etype, message = _torch_outcome(data, cls)
                    self.assertEqual(exp.loads, loaded, f"predicted {exp.rejection!r}; torch: {etype}: {message}")
                    if not loaded:
                        failures += 1
                        self.assertEqual((exp.error_type, exp.rejection), (etype, message))
                        self.assertIn("this torch's BUILD cannot apply the pickled state of", exp.blocker)
        return failures

    def test_slotted_class_fails_exactly_where_build_has_no_slot_state(self) -> None:
        exp = predict("safe_globals", Checkpoint.save(Slotted()), [Slotted])
        if build_rules().splits_slotstate:
            self.assertTrue(exp.loads)
        else:  # torch 2.4, 2.5
            self.assertEqual(exp.error_type, "AttributeError")
            self.assertEqual(exp.rejection, "'Slotted' object has no attribute '__dict__'")

    def test_the_load_path_asserts_the_predicted_failure(self) -> None:
        """load() passes on the predicted failure, whatever its type, and says why."""
        self._load_path(Checkpoint.save(Slotted()))
        with unpickler_standin(Torch24Build):  # and where BUILD fails (torch 2.4, 2.5)
            self._load_path(Checkpoint.save([Slotted()]))

    def _load_path(self, checkpoint: Checkpoint) -> None:
        if assert_mode_skips_here(self, "safe_globals", lambda: tst.load(checkpoint, "safe_globals", [Slotted])):
            return
        result = tst.load(checkpoint, "safe_globals", [Slotted])
        self.assertEqual(result.loaded, build_rules().splits_slotstate)
        self.assertEqual(result.loaded, result.expectation.loads)
        if not result.loaded:
            self.assertIsInstance(result.error, AttributeError)
            self.assertIn(
                f"this torch's BUILD cannot apply the pickled state of {Slotted.__module__}.Slotted "
                "(it raises AttributeError: 'Slotted' object has no attribute '__dict__')",
                result.summary,
            )

    def test_the_default_mode_forced_weights_only(self) -> None:
        """Every torch (2.4 too, which has no safe_globals mode): the bare load made weights-only by
        TORCH_FORCE_WEIGHTS_ONLY_LOAD, the class allowlisted process-wide."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
        for name in ("slots_only", "slots_and_dict_of_1", "state_int", "plain_dict_state"):
            obj = CASES[name]()
            with self.subTest(name), mock.patch.dict(os.environ, env, clear=True), allowlisted([type(obj)]):
                checkpoint = Checkpoint.save(obj)
                exp = predict("default", checkpoint)
                self.assertTrue(exp.weights_only)
                result = tst.load(checkpoint, "default")
                self.assertEqual(result.loaded, exp.loads)
                if not result.loaded:
                    self.assertEqual((type(result.error).__name__, str(result.error)), (exp.error_type, exp.rejection))
                    self.assertIn("this torch's BUILD cannot apply the pickled state of", result.summary)


class TestLoadPathJudgesTheType(unittest.TestCase):
    """A failure of another type or wording than predicted is never taken for the predicted one.

    Loads in the default mode made weights-only by TORCH_FORCE_WEIGHTS_ONLY_LOAD, the class
    allowlisted process-wide: the same judgement as the safe_globals mode, on every torch.
    """

    OLD = BuildRules(calls_setstate=True, splits_slotstate=False, skips_falsy_state=False, torch_types_buildable=False)

    @contextlib.contextmanager
    def _with_rules(self, rules: BuildRules):
        """Predict with *rules* instead of this torch's."""
        with simulated_rules(build=rules):
            yield

    def _loader_raising(self, error: BaseException):
        def fake_load(*args, **kwargs):
            raise error

        return mock.patch.object(torch, "load", fake_load)

    def _load(self, obj: object) -> None:
        env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        env["TORCH_FORCE_WEIGHTS_ONLY_LOAD"] = "1"
        checkpoint = Checkpoint.save(obj)
        with mock.patch.dict(os.environ, env, clear=True), allowlisted([type(obj)]):
            tst.load(checkpoint, "default")

    def test_unpickling_error_where_attribute_error_is_predicted(self) -> None:
        with (
            self._with_rules(self.OLD),
            self._loader_raising(pickle.UnpicklingError("'Slotted' object has no attribute '__dict__'")),
        ):
            with self.assertRaisesRegex(
                UnexpectedLoadOutcome,
                "rejected with UnpicklingError, but this torch is predicted to raise AttributeError",
            ):
                self._load(Slotted())

    def test_other_message_of_the_predicted_type(self) -> None:
        with self._with_rules(self.OLD), self._loader_raising(AttributeError("something else")):
            with self.assertRaisesRegex(
                UnexpectedLoadOutcome,
                "rejected with AttributeError as predicted, but not "
                "saying \"'Slotted' object has no attribute '__dict__'\"",
            ):
                self._load(Slotted())

    def test_attribute_error_where_a_load_is_predicted(self) -> None:
        with self._loader_raising(AttributeError("'Plain' object has no attribute '__dict__'")):
            with self.assertRaisesRegex(
                UnexpectedLoadOutcome, "expected to be loaded .*torch.load raised AttributeError"
            ):
                self._load(Plain())

    def test_the_other_torchs_rules_fail_loudly(self) -> None:
        """Predicting with the BUILD rules of the other torch generation is caught by the real load."""
        if build_rules().splits_slotstate:  # torch 2.6 on: the old rules predict a failure that never comes
            with self._with_rules(self.OLD):
                with self.assertRaisesRegex(UnexpectedLoadOutcome, "expected rejection .*torch loaded it"):
                    self._load(Slotted())
        else:  # torch 2.4, 2.5: the new rules predict a load, torch raises
            with self._with_rules(BuildRules()):
                with self.assertRaisesRegex(
                    UnexpectedLoadOutcome,
                    "expected to be loaded .*torch.load raised "
                    "AttributeError: 'Slotted' object has no attribute '__dict__'",
                ):
                    self._load(Slotted())


class TestRulesAndShapes(unittest.TestCase):
    NEW = BuildRules()
    OLD = BuildRules(calls_setstate=True, splits_slotstate=False, skips_falsy_state=False, torch_types_buildable=False)

    def test_rules_asked_of_torch(self) -> None:
        """The running torch's BUILD is one of the two generations, as its real BUILD says: a slotted
        instance's ``(None, slotstate)`` loads from torch 2.6 on and fails on 2.4/2.5."""
        self.assertIn(build_rules(), (self.NEW, self.OLD))
        loaded, etype, _message = _torch_outcome(_save(Slotted(), True), Slotted)
        self.assertEqual(build_rules() == self.NEW, loaded, etype)

    def test_a_torch_24_like_build_is_read(self) -> None:
        with unpickler_standin(Torch24Build):
            self.assertEqual(build_rules(), self.OLD)
        self.assertIn(build_rules(), (self.NEW, self.OLD))

    def test_scanned_shapes(self) -> None:
        def shape(obj: object) -> object:
            info = Checkpoint.save(obj).info
            return [c.shape for c in info.checks if c.kind == "build"]

        self.assertEqual(shape(Slotted()), [("tuple", (("none",), ("dict", 2)))])
        self.assertEqual(shape(_child(x=1, y=2, z=3)), [("tuple", (("dict", 3), ("dict", 2)))])
        self.assertEqual(shape(CustomState("ab")), [("value", "ab")])
        self.assertEqual(shape(CustomState(True)), [("type", "builtins.bool")])
        self.assertEqual(shape({"t": torch.ones(1)}), [])  # nothing built but tensors
        # The same class in the same shape is one check; another shape is another.
        self.assertEqual(len(shape([Slotted(), Slotted(), _child(x=1)])), 2)
        self.assertEqual(state_shape(("a", 1, None)), ("tuple", (("value", "a"), ("value", 1), ("type", None))))

    def test_build_failure_per_rules(self) -> None:
        pair = ("tuple", (("none",), ("dict", 2)))
        self.assertIsNone(build_failure(Slotted, pair, self.NEW))
        self.assertEqual(
            build_failure(Slotted, pair, self.OLD), ("AttributeError", "'Slotted' object has no attribute '__dict__'")
        )
        self.assertEqual(
            build_failure(SlottedChild, pair, self.OLD),
            ("TypeError", "cannot convert dictionary update sequence element #0 to a sequence"),
        )
        self.assertEqual(
            build_failure(SlottedChild, ("tuple", (("dict", 3), ("dict", 2))), self.OLD),
            ("ValueError", "dictionary update sequence element #0 has length 3; 2 is required"),
        )
        self.assertIsNone(build_failure(SlottedWithSetstate, ("dict", 1), self.OLD))  # its own __setstate__
        self.assertIsNone(build_failure(Plain, ("dict", None), self.OLD))
        # Falsy states: skipped by the new BUILD, fed to dict.update by the old.
        self.assertIsNone(build_failure(CustomState, ("value", 0), self.NEW))
        self.assertEqual(
            build_failure(CustomState, ("value", 0), self.OLD), ("TypeError", "'int' object is not iterable")
        )
        self.assertEqual(
            build_failure(SlottedCustomState, ("dict", 0), self.OLD),
            ("AttributeError", "'SlottedCustomState' object has no attribute '__dict__'"),
        )
        self.assertEqual(
            build_failure(CustomState, ("tuple", (("none",), ("value", "xy"))), self.NEW),
            ("AttributeError", "'str' object has no attribute 'items'"),
        )

    def test_what_cannot_be_told_stays_a_load(self) -> None:
        """A state whose contents decide (a list, a dict of unknown size in a pair), a C type, a class
        with its own attribute lookup: no failure is predicted."""
        self.assertIsNone(build_failure(CustomState, ("type", "builtins.list"), self.OLD))
        self.assertIsNone(build_failure(SlottedChild, ("tuple", (("dict", None), ("dict", 2))), self.OLD))
        self.assertIsNone(build_failure(torch.Size, ("none",), self.OLD))

        class Lookup:
            __slots__ = ("a",)

            def __getattr__(self, name: str) -> object:
                return {}

        self.assertIsNone(build_failure(Lookup, ("none",), self.OLD))
        # A dict of unknown size is fine as the whole state, whatever its size.
        self.assertEqual(
            build_failure(SlottedCustomState, ("dict", None), self.OLD),
            ("AttributeError", "'SlottedCustomState' object has no attribute '__dict__'"),
        )
        self.assertIsNone(build_failure(CustomState, ("dict", None), self.OLD))

    def test_old_torch_builds_only_user_allowlisted_types(self) -> None:
        """torch before 2.6 refuses BUILD on a torch-allowlisted class it was not told about again."""
        import dataclasses

        old = dataclasses.replace(unpickler_rules(), build=self.OLD)
        allowed = prediction._allowed(((Plain, f"{Plain.__module__}.Plain"),), old)
        self.assertIn("torch.Size", allowed.names)
        self.assertNotIn("torch.Size", allowed.types)
        self.assertIn(f"{Plain.__module__}.Plain", allowed.types)
        self.assertIs(allowed.classes[f"{Plain.__module__}.Plain"], Plain)
        new = dataclasses.replace(unpickler_rules(), build=self.NEW)
        self.assertIn("torch.Size", prediction._allowed((), new).types)
        # and torch itself: BUILD on a torch.Size instance, refused only by the old BUILD
        from test.helpers.other_torches import torch_zip_of

        data = torch_zip_of(b"\x80\x02ctorch\nSize\n)R}b.")
        for standin, loads in ((None, build_rules().torch_types_buildable), (Torch24Build, False)):
            with self.subTest(standin=standin), unpickler_standin(standin) if standin else contextlib.nullcontext():
                exp = predict("safe_globals", Checkpoint.from_bytes(data))
                loaded, _etype, message = _torch_outcome(data, Plain)
                self.assertEqual((exp.loads, loaded), (loads, loads), message)
                if not loads:
                    self.assertIn(exp.rejection, message)


def _save(obj: object, zip_format: bool) -> bytes:
    import io

    buf = io.BytesIO()
    torch.save(obj, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


if __name__ == "__main__":
    unittest.main()
