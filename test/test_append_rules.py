"""APPEND / APPENDS target checks: read from the running torch's source, replayed like torch.

torch 2.4 to 2.13 and 2.15 refuse APPEND(S) onto anything but exactly a ``list`` (APPENDS
saying "Can only extend lists"); torch 2.14.1 lets an allowlisted ``list`` subclass through and
words both refusals "Can only append to lists".  The model derives which target each opcode
accepts and its message from torch's code (``torch_unpickler_rules.append_rules_from_source``);
these tests compare it with a real ``torch.load`` for every opcode x target kind x way of
allowlisting, and replay other torches' rules on this one.
"""

from __future__ import annotations

import collections
import io
import itertools
import pickletools
import textwrap
import traceback
import unittest
import warnings
from typing import Any
from unittest import mock

import torch

from torch_serial_testing import Checkpoint, predict
from torch_serial_testing.scan import walker as pickle_scan
from torch_serial_testing.torch_facts import unpickler as torch_unpickler_rules
from torch_serial_testing.scan import model as unpickler_model
from torch_serial_testing.torch_facts.registry import restore_registry, snapshot_registry
from torch_serial_testing.torch_facts.unpickler import APPEND_TARGETS, AppendRule, ContainerRules, append_rules_from_source


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


# Excerpts of torch/_weights_only_unpickler.py: 2.13.0's (and 2.15.0's) inline checks, 2.14.1's method.
TORCH_213 = textwrap.dedent('''
    class Unpickler:
        def load(self):
            while True:
                if key[0] == BUILD[0]:
                    pass
                elif key[0] == APPEND[0]:
                    item = self.stack.pop()
                    list_obj = self.stack[-1]
                    if type(list_obj) is not list:
                        raise UnpicklingError(
                            f"Can only append to lists, but got {type(list_obj)}"
                        )
                    list_obj.append(item)
                elif key[0] == APPENDS[0]:
                    items = self.pop_mark()
                    list_obj = self.stack[-1]
                    if type(list_obj) is not list:
                        raise UnpicklingError(
                            f"Can only extend lists, but got {type(list_obj)}"
                        )
                    list_obj.extend(items)
''')
TORCH_2141 = textwrap.dedent('''
    class Unpickler:
        def load(self):
            while True:
                if key[0] == BUILD[0]:
                    pass
                elif key[0] == APPEND[0]:
                    item = self.stack.pop()
                    list_obj = self.stack[-1]
                    self._check_append_target(list_obj)
                    list_obj.append(item)
                elif key[0] == APPENDS[0]:
                    items = self.pop_mark()
                    list_obj = self.stack[-1]
                    self._check_append_target(list_obj)
                    list_obj.extend(items)

        def _check_append_target(self, list_obj):
            if type(list_obj) is not list and not (
                isinstance(list_obj, list)
                and type(list_obj) in _get_user_allowed_globals().values()
            ):
                raise UnpicklingError(f"Can only append to lists, but got {type(list_obj)}")
''')
EVERY_OTHER = frozenset(APPEND_TARGETS[1:])


class TestAppendRulesFromSource(unittest.TestCase):
    def test_torch_213_and_215(self) -> None:
        rules = append_rules_from_source(TORCH_213)
        self.assertEqual(rules["APPEND"], AppendRule(EVERY_OTHER, "Can only append to lists, but got "))
        self.assertEqual(rules["APPENDS"], AppendRule(EVERY_OTHER, "Can only extend lists, but got "))

    def test_torch_2141(self) -> None:
        rules = append_rules_from_source(TORCH_2141)
        expected = AppendRule(EVERY_OTHER - {"allowlisted_list_subclass"}, "Can only append to lists, but got ")
        self.assertEqual(rules, {"APPEND": expected, "APPENDS": expected})

    def test_a_check_written_self_stack_style(self) -> None:
        source = TORCH_2141.replace("type(list_obj) is not list and", "type(self.stack[-1]) not in [list] and")
        self.assertEqual(append_rules_from_source(source)["APPEND"].refused, EVERY_OTHER - {"allowlisted_list_subclass"})

    def test_what_cannot_be_read_is_not_guessed(self) -> None:
        hostile = TORCH_2141.replace("isinstance(list_obj, list)", "__import__('os').system('false')")
        self.assertIsNone(append_rules_from_source(hostile))
        self.assertIsNone(append_rules_from_source(TORCH_213.replace("elif key[0] == APPENDS[0]:", "elif x:")))
        self.assertIsNone(append_rules_from_source(TORCH_213.replace("is not list", "is list")))  # refuses a list
        self.assertIsNone(append_rules_from_source(TORCH_213.replace('f"Can only extend', '"Can only extend')))
        self.assertIsNone(append_rules_from_source("x = ("))

    def test_unreadable_source_keeps_torch_213s_rules(self) -> None:
        torch_unpickler_rules.container_rules.cache_clear()
        self.addCleanup(torch_unpickler_rules.container_rules.cache_clear)
        with mock.patch("torch_serial_testing.torch_unpickler_rules.source_of", return_value="x = ("):
            rules = torch_unpickler_rules.container_rules()
        self.assertEqual((rules.append, rules.appends), (ContainerRules.append, ContainerRules.appends))
        self.assertEqual(rules.appends.message, "Can only extend lists, but got ")

    def test_this_torch(self) -> None:
        from torch import _weights_only_unpickler as wou

        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_source import source_of

        rules = append_rules_from_source(source_of(wou))
        self.assertIsNotNone(rules, "this torch's APPEND/APPENDS checks were not understood")
        self.assertEqual(
            (rules["APPEND"], rules["APPENDS"]),
            (torch_unpickler_rules.container_rules().append, torch_unpickler_rules.container_rules().appends),
        )


def excerpt_module(source: str, name: str) -> Any:
    """*source* imported as a module from a file of its own, so its functions have source to read."""
    import importlib.util
    import os
    import tempfile

    directory = tempfile.mkdtemp(prefix="tst-excerpt-")
    path = os.path.join(directory, f"{name}.py")
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(source)
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class TestRulesReadFromLoadAlone(unittest.TestCase):
    """``container_rules`` parses ``Unpickler.load`` (and a method its branch calls) instead of the
    whole module: the same rules as the module path, on every torch shape, or the module path."""

    def test_each_torch_shape(self) -> None:
        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_append_rules import UnpicklerMethods, append_rules_from_tree
        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_source import function_tree

        for label, source in (("2.13", TORCH_213), ("2.14.1", TORCH_2141)):
            with self.subTest(torch=label):
                module = excerpt_module(source, f"wou_excerpt_{label.replace('.', '_')}")
                tree = function_tree(module.Unpickler.load)
                self.assertIsNotNone(tree)
                from_load = append_rules_from_tree(tree, UnpicklerMethods(module.Unpickler))
                self.assertIsNotNone(from_load)
                self.assertEqual(from_load, append_rules_from_source(source))

    def test_a_method_that_is_not_there_is_not_guessed(self) -> None:
        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_append_rules import UnpicklerMethods, append_rules_from_tree
        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_source import function_tree

        module = excerpt_module(TORCH_2141.replace("def _check_append_target", "def _renamed"), "wou_excerpt_renamed")
        methods = UnpicklerMethods(module.Unpickler)
        self.assertNotIn("_check_append_target", methods)
        self.assertIn("_renamed", methods)
        self.assertEqual(list(methods), ["load", "_renamed"])
        self.assertIsNone(append_rules_from_tree(function_tree(module.Unpickler.load), methods))

    def test_this_torch_load_alone_and_module_agree(self) -> None:
        from torch import _weights_only_unpickler as wou

        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_append_rules import UnpicklerMethods, append_rules_from_tree
        from torch_serial_testing.UNKNOWN_UNKNOWN_torch_source import function_tree, source_of
        from torch_serial_testing.torch_facts.unpickler import persid_refused_from_source, persid_refused_from_tree

        tree = function_tree(wou.Unpickler.load)
        module_source = source_of(wou)
        self.assertEqual(persid_refused_from_tree(tree), persid_refused_from_source(module_source))
        self.assertIsNotNone(persid_refused_from_tree(tree), "this torch's persistent-id check is not in load")
        self.assertEqual(
            append_rules_from_tree(tree, UnpicklerMethods(wou.Unpickler)), append_rules_from_source(module_source)
        )

    def test_falls_back_to_the_module_when_load_does_not_tell(self) -> None:
        # A torch whose checks sit in a module-level function load does not call: load alone
        # tells nothing, so the module is read too, and its rules are the ones found.
        moved = textwrap.dedent('''
            def elsewhere(list_obj, key):
                if key[0] == APPEND[0]:
                    if type(list_obj) is not list:
                        raise UnpicklingError(f"Can only append to lists, but got {type(list_obj)}")
                elif key[0] == APPENDS[0]:
                    if type(list_obj) is not list:
                        raise UnpicklingError(f"Can only extend lists, but got {type(list_obj)}")


            class Unpickler:
                def load(self):
                    while True:
                        if key[0] == BUILD[0]:
                            pass
        ''')
        module = excerpt_module(moved, "wou_excerpt_moved")
        calls = []

        def reader(fn: Any) -> str:
            from torch_serial_testing.UNKNOWN_UNKNOWN_torch_source import source_of

            calls.append(getattr(fn, "__name__", fn))
            return source_of(fn)

        torch_unpickler_rules.container_rules.cache_clear()
        self.addCleanup(torch_unpickler_rules.container_rules.cache_clear)
        with mock.patch("torch._weights_only_unpickler", module, create=True), \
                mock.patch.object(torch_unpickler_rules, "source_of", side_effect=reader):
            rules = torch_unpickler_rules.container_rules()
        self.assertIn("load", calls)
        self.assertIn("wou_excerpt_moved", calls)  # the module was read too: load alone did not tell
        self.assertEqual(rules.append, AppendRule(EVERY_OTHER, "Can only append to lists, but got "))
        self.assertEqual(rules.appends, AppendRule(EVERY_OTHER, "Can only extend lists, but got "))


class TestOtherTorchsRulesReplayedHere(unittest.TestCase):
    """Predictions follow the rules read, whichever torch runs: 2.13's and 2.14.1's on this one."""

    def rules_of(self, source: str) -> ContainerRules:
        found = append_rules_from_source(source)
        return ContainerRules(append=found["APPEND"], appends=found["APPENDS"])

    tags = itertools.count(1000)

    def predict_under(self, source: str, obj: Any, allow: list[Any]) -> Any:
        # scans are remembered by bytes: each scan under other rules gets bytes of its own
        tag = next(self.tags)
        rules = self.rules_of(source)
        with mock.patch.object(unpickler_model, "container_rules", return_value=rules), \
                mock.patch.object(pickle_scan, "container_rules", return_value=rules):
            ckpt = Checkpoint.from_bytes(saved(obj, tag))
            return ckpt.info, predict("safe_globals", ckpt, allow)

    def test_an_allowlisted_list_subclass(self) -> None:
        for n in (1, 2):
            info, exp = self.predict_under(TORCH_2141, Items([1] * n), [Items])
            self.assertTrue(exp.loads, exp.summary())
            self.assertIsNone(info.weights_only_blocker)
            info, exp = self.predict_under(TORCH_2141, Items([1] * n), [])
            self.assertFalse(exp.loads)
            self.assertIn(f"{__name__}.Items", exp.missing)
            info, exp = self.predict_under(TORCH_213, Items([1] * n), [Items])
            self.assertFalse(exp.loads)
            word = "append to" if n == 1 else "extend"
            self.assertEqual(info.weights_only_blocker, f"Can only {word} lists, but got <class '{__name__}.Items'>")
            self.assertEqual(exp.rejection, info.weights_only_blocker)

    def test_a_deque_and_an_allowlisted_non_list(self) -> None:
        for obj, cls in ((collections.deque([1, 2]), collections.deque), (make("bag", 2), Bag)):
            shown = f"<class '{cls.__module__}.{cls.__qualname__}'>"
            info, exp = self.predict_under(TORCH_2141, obj, [cls])
            self.assertEqual(info.weights_only_blocker, f"Can only append to lists, but got {shown}")
            self.assertFalse(exp.loads)
            info, exp = self.predict_under(TORCH_213, obj, [cls])
            self.assertEqual(info.weights_only_blocker, f"Can only extend lists, but got {shown}")


if __name__ == "__main__":
    unittest.main()
