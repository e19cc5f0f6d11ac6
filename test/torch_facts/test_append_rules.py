"""APPEND / APPENDS target checks: asked of the running torch, replayed like torch.

torch 2.4 to 2.13 and 2.15 refuse APPEND(S) onto anything but exactly a ``list`` (APPENDS
saying "Can only extend lists"); torch 2.14.1 lets an allowlisted ``list`` subclass through and
words both refusals "Can only append to lists".  The model learns which target each opcode
accepts and its message by probing torch's unpickler (``torch_serial_testing.unpickler.unpickler_rules``);
these tests compare it with a real ``torch.load`` for every opcode x target kind x way of
allowlisting, read a torch 2.14.1-like stand-in unpickler through the probes, and replay other
torches' rules (rules objects) on this one.
"""

from __future__ import annotations

import collections
import io
import itertools
import pickle
import pickletools
import traceback
import unittest
import warnings
from typing import Any

import torch

import torch_serial_testing as tst
from test.helpers.other_torches import APPEND_TARGETS, Torch2141Append, simulated_rules, unpickler_standin
from torch_serial_testing import Checkpoint, predict
from torch_serial_testing.errors import UnexpectedLoadOutcome
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.registry import restore_registry, snapshot_registry
from torch_serial_testing.unpickler import ContainerRule, unpickler_rules


class Items(list):
    """A list subclass (torch 2.14.1 appends to it once it is allowlisted)."""


class Bag:
    """No list, but pickled with list items (``__reduce__`` returns an item iterator): APPEND(S) onto it."""

    def __init__(self) -> None:
        self.items: list[Any] = []

    def append(self, item: Any) -> None:
        self.items.append(item)

    def extend(self, items: Any) -> None:
        self.items.extend(items)

    def __reduce__(self) -> Any:
        return (Bag, (), None, iter(self.items))


def make(kind: str, n: int) -> Any:
    """A target of *kind* holding *n* items: pickle appends 1 item with APPEND, more with APPENDS."""
    items = list(range(1, n + 1))
    if kind == "list":
        return items
    if kind == "stack_summary":  # a list subclass torch 2.14 registers process-wide itself
        return traceback.StackSummary.from_list([("f.py", i, "fn", "x = 1") for i in items])
    if kind == "list_subclass":
        return Items(items)
    if kind == "deque":
        return collections.deque(items)
    bag = Bag()
    bag.extend(items)
    return bag


#: Each kind of target and what allowlisting it takes (None: a list, nothing to allowlist).
CLASSES = {
    "list": None,
    "list_subclass": [Items],
    "stack_summary": [traceback.StackSummary, traceback.FrameSummary],
    "deque": [collections.deque],
    "bag": [Bag],
}


def saved(obj: Any, tag: int) -> bytes:
    buf = io.BytesIO()
    torch.save({"x": obj, "tag": tag}, buf)  # the tag makes each checkpoint's bytes its own
    return buf.getvalue()


def opcodes_of(data: bytes) -> set[str]:
    import zipfile

    with zipfile.ZipFile(io.BytesIO(data)) as z:
        pkl = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
    return {op.name for op, _arg, _pos in pickletools.genops(pkl)}


def torch_answer(data: bytes, allow: list[Any], registry: bool) -> tuple[bool, str]:
    snap = snapshot_registry()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if registry:
                torch.serialization.add_safe_globals(allow)
                torch.load(io.BytesIO(data), weights_only=True)
            else:
                with torch.serialization.safe_globals(allow):
                    torch.load(io.BytesIO(data), weights_only=True)
        return True, ""
    except Exception as e:  # noqa: BLE001 - torch's answer
        return False, str(e)
    finally:
        restore_registry(snap)


def predicted(data: bytes, allow: list[Any], registry: bool) -> Any:
    if not registry:
        return predict("safe_globals", Checkpoint.from_bytes(data), allow)
    snap = snapshot_registry()
    try:
        torch.serialization.add_safe_globals(allow)
        return predict("safe_globals", Checkpoint.from_bytes(data), [])
    finally:
        restore_registry(snap)


@unittest.skipUnless(hasattr(torch.serialization, "safe_globals"), "torch < 2.5 has no safe_globals context")
class TestModelAgreesWithTorchOnAppendTargets(unittest.TestCase):
    def test_every_opcode_target_and_allowlisting(self) -> None:
        tag = 0
        compared = 0
        for kind, cls in CLASSES.items():
            for n, opcode in ((1, "APPEND"), (2, "APPENDS")):
                for how in ("nothing", "safe_globals", "registry"):
                    if how != "nothing" and cls is None:
                        continue
                    tag += 1
                    data = saved(make(kind, n), tag)
                    self.assertIn(opcode, opcodes_of(data))
                    allow = [] if how == "nothing" else list(cls)
                    with self.subTest(kind=kind, opcode=opcode, allowlisted=how):
                        exp = predicted(data, allow, how == "registry")
                        loaded, message = torch_answer(data, allow, how == "registry")
                        compared += 1
                        self.assertEqual(exp.loads, loaded, f"{exp.summary()} / torch: {message[-300:]}")
                        if not loaded:
                            self.assertIsNotNone(exp.rejection)
                            self.assertIn(exp.rejection, message)
                        if how == "nothing":
                            continue
                        # allowlisted: torch refuses exactly when no allowlist helps, for the blocker's reason
                        blocker = Checkpoint.from_bytes(data).info.weights_only_blocker
                        self.assertEqual(blocker is None, loaded, f"blocker {blocker!r} / torch: {message[-300:]}")
                        if blocker is not None and exp.rejection == blocker:
                            self.assertIn(blocker, message)
                        elif blocker is not None:
                            # an earlier check fails first on this torch: 2.4/2.5's BUILD of the
                            # slotted FrameSummary items, before the APPEND onto their StackSummary
                            self.assertNotEqual(exp.error_type, "UnpicklingError")
                            self.assertIn(exp.rejection, message)
        self.assertEqual(compared, 26)

    def test_a_deque_is_refused_whatever_is_allowlisted(self) -> None:
        # every torch: collections.deque is no list, allowlisted or not
        for n, tag in ((1, 101), (2, 102)):
            data = saved(collections.deque(range(n)), tag)
            blocker = Checkpoint.from_bytes(data).info.weights_only_blocker
            self.assertIsNotNone(blocker)
            loaded, message = torch_answer(data, [collections.deque], False)
            self.assertFalse(loaded)
            self.assertIn(f"but got {collections.deque!r}", blocker)
            self.assertIn(blocker, message)


EVERY_OTHER = frozenset(APPEND_TARGETS[1:])
#: torch 2.4 to 2.13 and 2.15: exactly a list, APPENDS worded "extend".
RULES_213 = {
    "APPEND": ContainerRule(EVERY_OTHER, "Can only append to lists, but got "),
    "APPENDS": ContainerRule(EVERY_OTHER, "Can only extend lists, but got "),
}
#: torch 2.14.1: an allowlisted list subclass too, both worded "append to".
RULE_2141 = ContainerRule(EVERY_OTHER - {"allowlisted_list_subclass"}, "Can only append to lists, but got ")
RULES_2141 = {"APPEND": RULE_2141, "APPENDS": RULE_2141}


def append_rules() -> dict[str, Any]:
    rules = unpickler_rules()
    return {op: rules.containers[op] for op in ("APPEND", "APPENDS")}


class _RefusesAList(Torch2141Append):
    """Says no to APPEND onto exactly a list: not a check the model can replay."""

    def load(self) -> Any:
        value = super().load()
        if type(value) is list and value:
            raise pickle.UnpicklingError(f"Can only append to lists, but got {type(value)}")
        return value


class _Untyped(Torch2141Append):
    """Refuses without naming the target's type."""

    def load(self) -> Any:
        try:
            return super().load()
        except pickle.UnpicklingError as e:
            if str(e).startswith("Can only append"):
                raise pickle.UnpicklingError(str(e).split(", but got")[0]) from None
            raise


class _WordsEachKindItsOwnWay(Torch2141Append):
    """Refuses an allowlisted non-list in other words than a non-allowlisted one."""

    def load(self) -> Any:
        try:
            return super().load()
        except pickle.UnpicklingError as e:
            target = self.stack[-1] if self.stack else None
            if (
                str(e).startswith("Can only append")
                and type(target) in torch._weights_only_unpickler._get_user_allowed_globals().values()
            ):
                raise pickle.UnpicklingError(str(e).replace("Can only", "Only")) from None
            raise


class _CheckInAMethod(torch._weights_only_unpickler.Unpickler):
    """torch 2.13's check, raised from a method of its own (as 2.14.1 has _check_append_target)."""

    def load(self) -> Any:
        try:
            return super().load()
        except pickle.UnpicklingError as e:
            if not str(e).startswith(("Can only append to lists", "Can only extend lists")):
                raise
            self._tst_check_target(self.stack[-1], str(e).split(" lists")[0])
            raise

    def _tst_check_target(self, target: Any, words: str) -> None:  # not torch 2.14.1's own method's name
        raise pickle.UnpicklingError(f"{words} lists, but got {type(target)}")


class TestAppendRulesProbed(unittest.TestCase):
    def test_this_torch(self) -> None:
        rules = append_rules()
        self.assertIn(rules, (RULES_213, RULES_2141))
        # which of the two this torch is, a real load of an allowlisted list subclass says
        loaded, message = torch_answer(
            saved(Items([1, 2]), 0), [Items], not hasattr(torch.serialization, "safe_globals")
        )
        self.assertEqual(rules == RULES_2141, loaded, message)

    def test_torch_2141(self) -> None:
        with unpickler_standin(Torch2141Append):
            self.assertEqual(append_rules(), RULES_2141)
        self.assertIn(append_rules(), (RULES_213, RULES_2141))

    def test_where_the_check_lives_does_not_matter(self) -> None:
        # A check inline in load or in a method load calls: the same behaviour, the same rules.
        expected = append_rules()
        with unpickler_standin(_CheckInAMethod):
            self.assertEqual(append_rules(), expected)

    def test_what_cannot_be_read_is_not_guessed(self) -> None:
        for standin, reason in (
            (_RefusesAList, "refused APPEND onto a plain list"),
            (_Untyped, "does not end with the type it refused"),
            (_WordsEachKindItsOwnWay, "refuses APPEND targets with different messages"),
        ):
            with self.subTest(standin.__name__), unpickler_standin(standin):
                with self.assertRaisesRegex(ProbeFailed, reason):
                    unpickler_rules()

    def test_unreadable_rules_make_the_prediction_unknown(self) -> None:
        # Formerly an unreadable check kept torch 2.13's rules; now no rule is guessed: the
        # prediction is unknown and the load says so, with what torch did.
        checkpoint = Checkpoint.save({"x": Items([1, 2]), "tag": "unreadable"})
        with unpickler_standin(_Untyped):
            exp = predict("safe_globals", checkpoint, [Items])
            self.assertFalse(exp.loads)
            self.assertIn("does not end with the type it refused", exp.unknown)
            self.assertIsNone(checkpoint.info.weights_only_blocker)
            self.assertEqual([c.kind for c in checkpoint.info.checks], ["unknown"])
            if hasattr(torch.serialization, "safe_globals"):
                with self.assertRaisesRegex(
                    UnexpectedLoadOutcome,
                    r"^safe_globals: cannot predict this load here "
                    r"\(torch's message 'Can only append to lists' does not end with the type "
                    r"it refused .*\); torch loaded it$",
                ):
                    tst.load(checkpoint, "safe_globals", [Items])


class TestOtherTorchsRulesReplayedHere(unittest.TestCase):
    """Predictions follow the rules given to the model: 2.13's and 2.14.1's, on this torch."""

    tags = itertools.count(1000)

    def predict_under(self, rules: dict[str, Any], obj: Any, allow: list[Any]) -> Any:
        # scans are remembered by bytes: each scan under other rules gets bytes of its own
        tag = next(self.tags)
        with simulated_rules(containers={**unpickler_rules().containers, **rules}):
            ckpt = Checkpoint.from_bytes(saved(obj, tag))
            return ckpt.info, predict("safe_globals", ckpt, allow)

    def test_an_allowlisted_list_subclass(self) -> None:
        for n in (1, 2):
            info, exp = self.predict_under(RULES_2141, Items([1] * n), [Items])
            self.assertTrue(exp.loads, exp.summary())
            self.assertIsNone(info.weights_only_blocker)
            info, exp = self.predict_under(RULES_2141, Items([1] * n), [])
            self.assertFalse(exp.loads)
            self.assertIn(f"{__name__}.Items", exp.missing)
            info, exp = self.predict_under(RULES_213, Items([1] * n), [Items])
            self.assertFalse(exp.loads)
            word = "append to" if n == 1 else "extend"
            self.assertEqual(info.weights_only_blocker, f"Can only {word} lists, but got <class '{__name__}.Items'>")
            self.assertEqual(exp.rejection, info.weights_only_blocker)

    def test_a_deque_and_an_allowlisted_non_list(self) -> None:
        for obj, cls in ((collections.deque([1, 2]), collections.deque), (make("bag", 2), Bag)):
            shown = f"<class '{cls.__module__}.{cls.__qualname__}'>"
            info, exp = self.predict_under(RULES_2141, obj, [cls])
            self.assertEqual(info.weights_only_blocker, f"Can only append to lists, but got {shown}")
            self.assertFalse(exp.loads)
            info, exp = self.predict_under(RULES_213, obj, [cls])
            self.assertEqual(info.weights_only_blocker, f"Can only extend lists, but got {shown}")

    def test_a_torch_without_append_checks(self) -> None:
        # a rules object with no APPEND(S) check: nothing blocks a deque, its global decides
        info, exp = self.predict_under(
            {"APPEND": None, "APPENDS": None}, collections.deque([1, 2]), [collections.deque]
        )
        self.assertIsNone(info.weights_only_blocker)
        self.assertTrue(exp.loads, exp.summary())


if __name__ == "__main__":
    unittest.main()
