"""What one load remembers for the next, and what it must not: a test file loads the same module
again and again, so a load reuses what nothing has changed since -- and re-reads all the rest."""

import collections
import gc
import os
import sys
import types
import unittest
from unittest import mock

import torch

import torch_serial_testing as tst
from test.helpers.roundtrip_fixtures import TINY_SAFE_GLOBALS, WEIGHTS_ONLY_BARE_ENV, TinyNet, clean_env
from torch_serial_testing import Checkpoint, LoadMode, loading, modes
from torch_serial_testing.declarations import SafeGlobal, as_safe_globals, normalize_safe_globals
from torch_serial_testing.errors import RoundTripConfigError
from torch_serial_testing.registry import allowlisted
from torch_serial_testing.tools.facts import WeightsOnlySwitches

WO, NO_WO = modes.FORCE_WO, modes.FORCE_NO_WO


class TestSwitchValues(unittest.TestCase):
    """switch_values reads what os.environ.get reads, on every call."""

    def test_os_environ_read_fresh_every_time(self):
        for wo, no in [(None, None), ("1", None), (None, "yes"), ("", "0"), ("1", "1")]:
            env = {k: v for k, v in ((WO, wo), (NO_WO, no)) if v is not None}
            with self.subTest(env=env), clean_env(**env):
                raw = modes.switch_values()
                # Unset is None; a set value is its (platform-encoded) text, whatever it says.
                self.assertEqual([v is None for v in raw], [wo is None, no is None])
                decoded = [v.decode() if isinstance(v, bytes) else v for v in raw]
                self.assertEqual(decoded, [os.environ.get(WO), os.environ.get(NO_WO)])

    def test_switches_read_as_text(self):
        # The values read once are decoded as os.environ decodes them (messages quote them).
        for value in ["1", "yes", "caf\u00e9", ""]:
            with self.subTest(value=value), clean_env(**{WO: value, NO_WO: value}):
                raw = WeightsOnlySwitches.from_environ().raw
                self.assertEqual(raw, {WO: value, NO_WO: value})
                self.assertEqual(raw, WeightsOnlySwitches.from_environ(dict(os.environ)).raw)

    def test_any_mapping(self):
        self.assertEqual(modes.switch_values({WO: "y"}), ("y", None))
        self.assertEqual(modes.switch_values({}), (None, None))
        self.assertEqual(modes.switch_values({NO_WO: "true", "OTHER": "1"}), (None, "true"))


class TestDecisionFollowsTheEnvironment(unittest.TestCase):
    """The same mode and checkpoint, loaded again after something changed: predicted anew."""

    def test_switch_changes_between_loads(self):
        ckpt = Checkpoint.save(TinyNet())
        with clean_env():
            base = tst.predict("weights_only_false", ckpt)
        with clean_env(**{WO: "1"}):
            forced = tst.predict("weights_only_false", ckpt)
            self.assertTrue(forced.weights_only)
            self.assertFalse(forced.loads)
            self.assertFalse(tst.load(ckpt, "weights_only_false", TINY_SAFE_GLOBALS).loaded)
        with clean_env(**{WO: "0"}):  # set but not truthy: torch ignores it
            self.assertEqual(tst.predict("weights_only_false", ckpt), base)
        with clean_env():
            self.assertEqual(tst.predict("weights_only_false", ckpt), base)
            self.assertTrue(tst.load(ckpt, "weights_only_false").loaded)

    def test_force_no_presence_is_observed(self):
        # Any value of TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD makes the load watch for torch's warning.
        with clean_env():
            self.assertFalse(modes.decide(LoadMode.DEFAULT, None).force_no_set)
        with clean_env(**{NO_WO: ""}):
            self.assertTrue(modes.decide(LoadMode.DEFAULT, None).force_no_set)
        self.assertTrue(modes.decide(LoadMode.DEFAULT, {NO_WO: "0"}).force_no_set)

    def test_torch_load_replaced_between_loads(self):
        ckpt = Checkpoint.save({"t": torch.ones(2)})
        real = torch.load

        def wrapped_load(*args, **kwargs):
            return real(*args, **kwargs)

        with clean_env():
            self.assertIsNone(tst.load(ckpt, "default").expectation.replaced_by)
            with mock.patch.object(torch, "load", wrapped_load):
                self.assertIn("wrapped_load", tst.load(ckpt, "default").expectation.replaced_by)
            self.assertIsNone(tst.load(ckpt, "default").expectation.replaced_by)

    def test_torch_default_changed_between_loads(self):
        ckpt = Checkpoint.save({"t": torch.ones(2)})
        with clean_env():
            before = tst.predict("default", ckpt)
            if hasattr(torch.serialization, "_default_to_weights_only"):
                with mock.patch.object(torch.serialization, "_default_to_weights_only", lambda pickle_module: False):
                    changed = tst.predict("default", ckpt)
                self.assertFalse(changed.weights_only)
                self.assertIn("fbcode", changed.reason)
            with mock.patch.object(torch, "__version__", "2.5.1"):
                if not hasattr(torch.serialization, "_default_to_weights_only"):
                    self.assertFalse(tst.predict("default", ckpt).weights_only)
            self.assertEqual(tst.predict("default", ckpt), before)

    def test_unchanged_inputs_give_the_same_prediction_object(self):
        # Remembered while nothing it depends on changed: the same decision and expectation objects.
        ckpt = Checkpoint.save(TinyNet())
        with clean_env(**WEIGHTS_ONLY_BARE_ENV):  # a weights-only prediction (a full load's: by its decision)
            first, second = tst.predict("default", ckpt), tst.predict("default", ckpt)
            self.assertIs(first, second)
            self.assertIs(modes.decide(LoadMode.DEFAULT), modes.decide(LoadMode.DEFAULT))
        with clean_env(**{NO_WO: "1"}):
            self.assertIsNot(tst.predict("default", ckpt), first)
            self.assertFalse(tst.predict("default", ckpt).weights_only)

    def test_a_full_memory_is_not_forgotten_before_a_hit(self):
        # The expectations are forgotten all at once when many are remembered: never between a look-up and its
        # hit, so a prediction just made is found again whatever the fill level (each level in turn).
        from torch_serial_testing import prediction

        ckpt = Checkpoint.save(TinyNet())
        with clean_env(**WEIGHTS_ONLY_BARE_ENV):
            for filled in range(56, 72):
                with self.subTest(filled=filled), mock.patch.dict(prediction._expected, clear=True):
                    prediction._expected.update({("filler", i): None for i in range(filled)})
                    self.assertIs(tst.predict("default", ckpt), tst.predict("default", ckpt))

    def test_a_module_imported_between_loads_is_predicted_anew(self):
        # The expectation depends on which classes are imported (container targets): any import forgets it.
        ckpt = Checkpoint.save(TinyNet())
        with clean_env(**WEIGHTS_ONLY_BARE_ENV):
            first = tst.predict("default", ckpt)
            name = "tst_fresh_module_for_the_memo"
            sys.modules[name] = types.ModuleType(name)
            try:
                again = tst.predict("default", ckpt)
            finally:
                del sys.modules[name]
        self.assertIsNot(again, first)
        self.assertEqual(again, first)

    def test_fresh_bytes_each_load_follow_the_registry(self):
        # Each round trip saves anew (byte-identical): what is remembered for those bytes follows the registry.
        with clean_env(**{WO: "1"}):
            self.assertFalse(tst.round_trip(TinyNet(), "default").loaded)
            with allowlisted(TINY_SAFE_GLOBALS):
                self.assertTrue(tst.round_trip(TinyNet(), "default").loaded)
            self.assertFalse(tst.round_trip(TinyNet(), "default").loaded)

    def test_fresh_bytes_each_load_follow_the_scan_limits(self):
        with clean_env(**{WO: "1"}):
            self.assertFalse(tst.round_trip(TinyNet(), "default").loaded)
            with tst.scan_limits(max_opcodes=5), self.assertRaisesRegex(tst.CheckpointFormatError, "max_opcodes"):
                tst.round_trip(TinyNet(), "default")
            self.assertFalse(tst.round_trip(TinyNet(), "default").loaded)

    def test_registry_changed_between_loads(self):
        ckpt = Checkpoint.save(TinyNet())
        with clean_env(**{WO: "1"}):
            rejected = tst.predict("default", ckpt)
            self.assertFalse(rejected.loads)
            with allowlisted(TINY_SAFE_GLOBALS):
                self.assertTrue(tst.predict("default", ckpt).loads)
            self.assertEqual(tst.predict("default", ckpt), rejected)


class Rebound:
    """A class a module attribute may be rebound to another object of between loads."""


#: The refusal of os.system, under the name it pickles by (posix.system, nt.system on Windows).
SYSTEM = f"{os.system.__module__}.system"
SYSTEM_REFUSED = f"refusing to allowlist {SYSTEM}: {SYSTEM} runs code or reaches the system when a pickle calls it"


class TestDeclarationsReadEveryLoad(unittest.TestCase):
    """A declaration the author passes is read again on every load (a name resolves to what its module
    holds now): remembered only while the same objects are declared and each name still resolves to the
    same object; the very tuple normalize_safe_globals returned (the mixin's class attribute, read when
    the class was created) is handed back as it is."""

    def test_its_own_result_is_handed_back(self):
        first = as_safe_globals((TinyNet, "collections.OrderedDict"))
        self.assertIs(as_safe_globals(first), first)
        copy = tuple(list(first))  # the same entries in another tuple: read again
        self.assertIsNot(copy, first)
        again = as_safe_globals(copy)
        self.assertIsNot(again, copy)
        self.assertEqual(again, first)

    def test_read_only_where_the_mode_uses_it(self):
        # A declaration that can never be safe is refused by the safe_globals mode, which hands it to torch;
        # weights_only_false and the bare load never pass it on, and torch decides them without it.
        ckpt = Checkpoint.save(TinyNet())
        with clean_env():
            with self.assertRaises(RoundTripConfigError) as cm:
                tst.load(ckpt, "safe_globals", (os.system,))
            self.assertEqual(str(cm.exception), SYSTEM_REFUSED)
            self.assertTrue(tst.load(ckpt, "weights_only_false", (os.system,)).loaded)
            bare = tst.load(ckpt, "default", (os.system,))
            self.assertEqual(bare.loaded, tst.load(ckpt, "default").loaded)
            self.assertEqual(bare.expectation, tst.load(ckpt, "default").expectation)

    def test_same_declaration_same_entries(self):
        self.assertIs(as_safe_globals, normalize_safe_globals)
        declared = (TinyNet, "collections.OrderedDict")
        first, second = as_safe_globals(declared), as_safe_globals(declared)
        self.assertEqual(first, second)
        self.assertEqual(
            first,
            (
                SafeGlobal(TinyNet, "test.helpers.roundtrip_fixtures.TinyNet"),
                SafeGlobal(collections.OrderedDict, "collections.OrderedDict"),
            ),
        )
        # what the mixin hands every load (entries normalized at class creation) comes back equal
        self.assertEqual(as_safe_globals(first), first)

    def test_a_name_is_resolved_again_on_every_load(self):
        # A tuple is not remembered by identity: the name resolves to what the module holds now.
        declared = (f"{__name__}.Rebound",)
        self.assertEqual(as_safe_globals(declared), (SafeGlobal(Rebound, f"{__name__}.Rebound"),))
        other = type("Rebound", (), {"__module__": __name__, "__qualname__": "Rebound"})
        with mock.patch.object(sys.modules[__name__], "Rebound", other):
            self.assertEqual(as_safe_globals(declared), (SafeGlobal(other, f"{__name__}.Rebound"),))
        self.assertEqual(as_safe_globals(declared), (SafeGlobal(Rebound, f"{__name__}.Rebound"),))

    def test_an_object_is_looked_up_again_on_every_load(self):
        # Remembered entries are handed back only while each name still resolves to the declared object.
        declared = (Rebound,)
        self.assertEqual(as_safe_globals(declared), (SafeGlobal(Rebound, f"{__name__}.Rebound"),))
        other = type("Rebound", (), {"__module__": __name__, "__qualname__": "Rebound"})
        with mock.patch.object(sys.modules[__name__], "Rebound", other):
            with self.assertRaisesRegex(RoundTripConfigError, "resolves to another object"):
                as_safe_globals(declared)
        self.assertEqual(as_safe_globals(declared), (SafeGlobal(Rebound, f"{__name__}.Rebound"),))

    def test_equal_entries_of_other_objects_are_read_again(self):
        # Entries equal to remembered ones but not the same objects are not handed the remembered result.
        class Same(type):
            def __eq__(cls, other):
                return isinstance(other, Same)

            __hash__ = type.__hash__

        first = Same("Rebound", (), {"__module__": __name__, "__qualname__": "Rebound"})
        second = Same("Rebound", (), {"__module__": __name__, "__qualname__": "Rebound"})
        with mock.patch.object(sys.modules[__name__], "Rebound", first):
            self.assertIs(as_safe_globals((first,))[0].obj, first)
            with self.assertRaisesRegex(RoundTripConfigError, "resolves to another object"):
                as_safe_globals((second,))

    def test_refused_tuple_refused_every_time(self):
        declared = (os.system,)
        for _ in range(3):
            with self.assertRaises(RoundTripConfigError) as cm:
                as_safe_globals(declared)
            self.assertEqual(str(cm.exception), SYSTEM_REFUSED)

    def test_normalized_entries_are_checked_again(self):
        # An entry already in the normalized form is judged like any other.
        with self.assertRaises(RoundTripConfigError) as cm:
            as_safe_globals((SafeGlobal(os.system, SYSTEM),))
        self.assertEqual(str(cm.exception), SYSTEM_REFUSED)

    def test_a_list_is_read_again(self):
        declared = [TinyNet]
        self.assertEqual(as_safe_globals(declared), (SafeGlobal(TinyNet, "test.helpers.roundtrip_fixtures.TinyNet"),))
        declared.append(os.system)  # a list can change between loads: judged again
        with self.assertRaises(RoundTripConfigError) as cm:
            as_safe_globals(declared)
        self.assertEqual(str(cm.exception), SYSTEM_REFUSED)

    def test_a_load_reads_the_declaration_it_is_given(self):
        # Two loads of one checkpoint with one list, changed in between: the second load uses the change.
        ckpt = Checkpoint.save(TinyNet())
        declared = list(TINY_SAFE_GLOBALS)
        with clean_env():
            self.assertTrue(tst.load(ckpt, "safe_globals", declared).loaded)
            declared.append(os.system)
            with self.assertRaises(RoundTripConfigError) as cm:
                tst.load(ckpt, "safe_globals", declared)
        self.assertEqual(str(cm.exception), SYSTEM_REFUSED)


class TestRejectionLeavesNoCycle(unittest.TestCase):
    """A rejected load's error holds no frames: freed at once, not by the garbage collector."""

    def _garbage_of(self, fn):
        gc.collect()
        enabled = gc.isenabled()
        gc.disable()
        gc.set_debug(gc.DEBUG_SAVEALL)
        try:
            fn()
            gc.collect()
            return list(gc.garbage)
        finally:
            gc.set_debug(0)
            gc.garbage.clear()
            if enabled:
                gc.enable()

    def test_rejection_is_freed_by_reference_counting(self):
        seen = {}

        def rejected_round_trip():
            result = tst.round_trip(TinyNet(), LoadMode.DEFAULT)
            seen["loaded"], seen["error"] = result.loaded, result.error
            seen["message"], seen["traceback"] = str(result.error), result.error.__traceback__
            seen["context"] = result.error.__context__
            seen.pop("error")
            seen.pop("context")

        with clean_env(**{WO: "1"}):
            garbage = self._garbage_of(rejected_round_trip)
        self.assertFalse(seen["loaded"])
        self.assertIn("test.helpers.roundtrip_fixtures.TinyNet", seen["message"])  # the message is torch's, kept
        self.assertIsNone(seen["traceback"])
        leaked = [type(o).__name__ for o in garbage if isinstance(o, (types.FrameType, BaseException, Checkpoint))]
        self.assertEqual(leaked, [])

    def test_chained_exceptions_are_detached_too(self):
        inner = ValueError("inner")
        outer = RuntimeError("outer")
        try:
            try:
                raise inner
            except ValueError:
                raise outer from inner
        except RuntimeError:
            pass
        inner.__context__ = outer  # a cycle in the chain must not loop
        loading._drop_tracebacks(outer)
        self.assertIsNone(outer.__traceback__)
        self.assertIsNone(inner.__traceback__)
        self.assertIs(outer.__cause__, inner)


if __name__ == "__main__":
    unittest.main()
