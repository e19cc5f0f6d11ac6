"""Load modes: torch's weights_only rules, predictions, and real torch agreeing with them."""

import pickle
import unittest
import warnings
from unittest import mock

import torch

import torch_serial_testing as tst
from test.helpers.isolation_fixtures import only_torchs_registrations
from test.helpers.roundtrip_fixtures import (
    clean_env,
    torch_sets,
    DEFAULT_REASON,
    DEFAULT_WEIGHTS_ONLY,
    DEFAULT_WHY,
    READS_FORCE_NO_WEIGHTS_ONLY,
    REFUSES_BOTH_SWITCHES,
    SAFE_GLOBALS_SKIP,
    TINY_GLOBALS,
    TINY_SAFE_GLOBALS,
    WEIGHTS_ONLY_BARE_ENV,
    TinyNet,
    assert_mode_skips_here,
    default_outcome,
)
from test.helpers.other_torches import RaisingUnpickler, load_standin, switch_reader, unpickler_standin
from torch_serial_testing import Checkpoint, LoadMode, loading, modes, predict, prediction
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing.errors import ConflictingEnvironmentError, RoundTripConfigError, UnexpectedLoadOutcome
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.registry import preserved_registry
from torch_serial_testing.serialization import torch_load_replacement
from torch_serial_testing.tools.facts import WeightsOnlySwitches

WO, NO_WO = modes.FORCE_WO, modes.FORCE_NO_WO
TINY = normalize_safe_globals(TINY_SAFE_GLOBALS)  # TinyNet, and set where torch's allowlist lacks it


def forgotten_predictions():
    """What the prediction remembers (its expectations) forgotten for a ``with`` block: a
    test that replaces one of its inputs gets predictions made from the replacement."""
    return mock.patch.dict(prediction._expected, clear=True)


class TestLoadModeNames(unittest.TestCase):
    def test_values_are_stable_snake_case(self):
        self.assertEqual([m.value for m in LoadMode], ["weights_only_false", "safe_globals", "default"])

    def test_explicit_arguments(self):
        self.assertIs(LoadMode.WEIGHTS_ONLY_FALSE.explicit_weights_only, False)
        self.assertIs(LoadMode.SAFE_GLOBALS.explicit_weights_only, True)
        self.assertIsNone(LoadMode.DEFAULT.explicit_weights_only)

    def test_parse(self):
        self.assertIs(LoadMode.parse("default"), LoadMode.DEFAULT)
        self.assertIs(LoadMode.parse("SAFE_GLOBALS"), LoadMode.SAFE_GLOBALS)
        self.assertIs(LoadMode.parse(LoadMode.WEIGHTS_ONLY_FALSE), LoadMode.WEIGHTS_ONLY_FALSE)
        with self.assertRaisesRegex(
            RoundTripConfigError, "unknown load mode 'weights_only'.*weights_only_false, safe_globals, default"
        ):
            LoadMode.parse("weights_only")


class TestSwitches(unittest.TestCase):
    def test_truthy_spellings_match_torch(self):
        for value in ["1", "y", "yes", "true", "Y", "YES", "True", "TRUE", "yEs"]:
            with self.subTest(value=value):
                # as torch.load itself reads it (2.13 lower-cases, 2.6-2.12 compare as written)
                self.assertIs(WeightsOnlySwitches.from_environ({WO: value}).force_weights_only, torch_sets(WO, value))
                # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD counts only where torch reads it (torch >= 2.6).
                self.assertIs(
                    WeightsOnlySwitches.from_environ({NO_WO: value}).force_no_weights_only,
                    READS_FORCE_NO_WEIGHTS_ONLY and torch_sets(NO_WO, value),
                )
        self.assertTrue(torch_sets(WO, "1") and torch_sets(WO, "true"))  # the probe sees the plain spellings
        for value in ["0", "", "false", "no", "n", "2", " 1", "on"]:
            with self.subTest(value=value):
                self.assertFalse(WeightsOnlySwitches.from_environ({WO: value}).force_weights_only)
                self.assertFalse(WeightsOnlySwitches.from_environ({NO_WO: value}).force_no_weights_only)

    def _predict(self, mode, environ):
        return predict(mode, Checkpoint.save(TinyNet()), TINY, environ=environ)

    def test_defaults(self):
        # The expectation is what a real bare torch.load does here (observed in roundtrip_fixtures).
        self.assertEqual(modes.torch_default_weights_only(), (DEFAULT_WEIGHTS_ONLY, DEFAULT_WHY))
        exp = self._predict("default", {})
        missing = tuple(TINY_GLOBALS) if DEFAULT_WEIGHTS_ONLY else ()
        self.assertEqual(
            (exp.weights_only, exp.loads, exp.missing), (DEFAULT_WEIGHTS_ONLY, not DEFAULT_WEIGHTS_ONLY, missing)
        )
        self.assertEqual(exp.summary(), default_outcome(TINY_GLOBALS))
        forced = self._predict("default", {WO: "1"})
        self.assertEqual(
            forced.summary(),
            f"default: rejected as expected (weights_only=True forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=1; "
            f"{', '.join(TINY_GLOBALS)} not allowlisted)",
        )
        self.assertTrue(self._predict("weights_only_false", {}).loads)
        self.assertTrue(self._predict("safe_globals", {}).loads)

    def test_force_weights_only_beats_explicit_false(self):
        exp = self._predict("weights_only_false", {WO: "yes"})
        self.assertEqual((exp.weights_only, exp.loads), (True, False))
        self.assertIn("forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=yes over explicit weights_only=False", exp.reason)
        self.assertTrue(self._predict("safe_globals", {WO: "1"}).loads)

    def test_force_no_weights_only_only_when_not_passed(self):
        exp = self._predict("default", {NO_WO: "true"})
        if READS_FORCE_NO_WEIGHTS_ONLY:
            expected = (False, True, True, "weights_only=False forced by TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=true")
        else:  # this torch does not read the switch (torch < 2.6): its default decides, silently
            expected = (DEFAULT_WEIGHTS_ONLY, not DEFAULT_WEIGHTS_ONLY, False, DEFAULT_REASON)
        self.assertEqual((exp.weights_only, exp.loads, exp.warns, exp.reason), expected)
        exp = self._predict("safe_globals", {NO_WO: "1"})
        self.assertEqual((exp.weights_only, exp.warns), (True, False))

    def test_both_set_is_one_clear_error(self):
        for mode in LoadMode:
            if not REFUSES_BOTH_SWITCHES:
                # This torch reads only TORCH_FORCE_WEIGHTS_ONLY_LOAD (torch < 2.6), which then wins.
                with self.subTest(mode=mode):
                    exp = self._predict(mode, {WO: "1", NO_WO: "y"})
                    self.assertEqual((exp.weights_only, exp.warns), (True, False))
                    self.assertIn("weights_only=True forced by TORCH_FORCE_WEIGHTS_ONLY_LOAD=1", exp.reason)
                continue
            with self.subTest(mode=mode), self.assertRaises(ConflictingEnvironmentError) as cm:
                self._predict(mode, {WO: "1", NO_WO: "y"})
            self.assertIn("TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 and TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=y", str(cm.exception))

    def test_registered_globals_count(self):
        ckpt = Checkpoint.save(TinyNet())
        with preserved_registry():
            torch.serialization.add_safe_globals(list(TINY_SAFE_GLOBALS))
            self.assertTrue(predict("default", ckpt, environ=WEIGHTS_ONLY_BARE_ENV).loads)
        self.assertFalse(predict("default", ckpt, environ=WEIGHTS_ONLY_BARE_ENV).loads)

    def test_the_default_is_asked_of_torch_never_of_its_version(self):
        # Formerly a torch without _default_to_weights_only made the version decide; now the
        # default is what a bare torch.load of the canary does, and the version only words why.
        with (
            load_standin(switch_reader(reads_no=False, default=False)),
            mock.patch.object(torch, "__version__", "2.5.1"),
        ):
            self.assertEqual(modes.torch_default_weights_only(), (False, "the default before torch 2.6 (torch 2.5.1)"))
        with load_standin(switch_reader(default=True)), mock.patch.object(torch, "__version__", "2.5.1"):
            self.assertEqual(modes.torch_default_weights_only(), (True, "since torch 2.6"))
        # a torch.load that cannot run without the function it calls: no default is guessed
        if hasattr(torch.serialization, "_default_to_weights_only"):
            with mock.patch.object(torch.serialization, "_default_to_weights_only", None), clean_env():
                with self.assertRaisesRegex(ProbeFailed, "canary raised TypeError"):
                    modes.torch_default_weights_only()
                exp = self._predict("default", {})
                self.assertFalse(exp.loads)
                self.assertIn("canary raised TypeError", exp.unknown)


class TestOpcodes(unittest.TestCase):
    def test_torch_saves_only_opcodes_the_weights_only_unpickler_reads(self):
        from test.helpers.roundtrip_fixtures import Wrapper, tiny_qlinear

        for obj in (TinyNet(), Wrapper(), tiny_qlinear(), {"b": b"bytes", "s": {1, 2}, "c": 1j, "f": 1.5, "n": None}):
            with self.subTest(type(obj).__name__):
                self.assertEqual(Checkpoint.save(obj).info.unsupported_opcodes, ())

    def test_opcode_set_asked_of_torch_without_fallback(self):
        from test.helpers.other_torches import torch_zip_of
        from torch_serial_testing.unpickler import unpickler_rules

        opcodes = unpickler_rules().opcodes
        self.assertTrue({"GLOBAL", "REDUCE", "BINPERSID", "STOP"} <= opcodes)
        self.assertNotIn("STACK_GLOBAL", opcodes)
        stack_global = torch_zip_of(b"\x80\x02X\x02\x00\x00\x00osX\x06\x00\x00\x00getcwd\x93.")
        self.assertEqual(tst.scan_checkpoint(stack_global).unsupported_opcodes, ("STACK_GLOBAL",))
        # an unpickler the probes cannot run: no opcode set is assumed (formerly torch 2.13's was)
        with unpickler_standin(RaisingUnpickler):
            info = tst.scan_checkpoint(stack_global)
            self.assertEqual(info.unsupported_opcodes, ())
            self.assertEqual([c.kind for c in info.checks], ["unknown"])
            self.assertIsNone(info.weights_only_blocker)
            self.assertIn("could not be probed", info.checks[0].message)


class TestRealTorchAgrees(unittest.TestCase):
    """The library's load asserts its prediction against real torch in every env state."""

    ENV_STATES = [{}, {WO: "1"}, {NO_WO: "1"}, {WO: "TRUE"}, {NO_WO: "Yes"}, {WO: "0"}, {NO_WO: ""}]

    def setUp(self):
        only_torchs_registrations(self)

    def test_every_mode_in_every_env_state(self):
        for env in self.ENV_STATES:
            for mode in LoadMode:
                with self.subTest(env=env, mode=mode.value), clean_env(**env):
                    if assert_mode_skips_here(self, mode, lambda: tst.round_trip(TinyNet(), mode, TINY)):
                        continue  # safe_globals before torch 2.5: skipped with the reason, nothing loaded
                    expected = predict(mode, Checkpoint.save(TinyNet()), TINY)
                    result = tst.round_trip(TinyNet(), mode, TINY)
                    self.assertEqual(result.loaded, expected.loads)
                    if result.loaded:
                        self.assertIsInstance(result.value, TinyNet)
                        tst.assert_round_trip_equal(TinyNet(), result.value)
                    else:
                        self.assertIsInstance(result.error, pickle.UnpicklingError)
                        self.assertIn("test.helpers.roundtrip_fixtures.TinyNet", str(result.error))

    def test_force_no_warning_is_checked_and_swallowed(self):
        with clean_env(**{NO_WO: "1"}), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = tst.round_trip(TinyNet(), "default")
        self.assertTrue(result.loaded)
        # torch warns (and the library expects it to) only where torch reads the switch (torch >= 2.6).
        self.assertIs(result.expectation.warns, READS_FORCE_NO_WEIGHTS_ONLY)
        self.assertFalse([w for w in caught if "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD" in str(w.message)])

    def test_unexpected_success_fails(self):
        # A prediction of rejection that torch does not honour is reported, not hidden.
        ckpt = Checkpoint.save({"t": torch.ones(2)})
        # (the model believes torch's allowlist empty, and torch's refusal of each global is asked of
        # torch itself: both are replaced)
        refusal = "Unsupported global: GLOBAL {} was not an allowed global by default.".format
        with (
            clean_env(**WEIGHTS_ONLY_BARE_ENV),
            mock.patch.object(prediction, "torch_allowlist_view", lambda: (frozenset(), frozenset(), {})),
            mock.patch.object(prediction, "global_refusal", refusal),
            forgotten_predictions(),
        ):
            with self.assertRaisesRegex(UnexpectedLoadOutcome, "unexpected success"):
                loading.load(ckpt, "default")

    def test_unexpected_rejection_fails(self):
        ckpt = Checkpoint.save(TinyNet())
        with (
            clean_env(**WEIGHTS_ONLY_BARE_ENV),
            mock.patch.object(prediction, "registered_globals", lambda: frozenset(TINY_GLOBALS)),
            forgotten_predictions(),
        ):
            with self.assertRaisesRegex(UnexpectedLoadOutcome, r"expected to load .*torch rejected it"):
                loading.load(ckpt, "default")

    def test_replaced_torch_load_is_reported(self):
        real = torch.load

        def patched_load(*args, **kwargs):
            return real(*args, **kwargs)

        with clean_env(), mock.patch.object(torch, "load", patched_load):
            self.assertIn("patched_load", torch_load_replacement())
            result = tst.round_trip(TinyNet(), "default")
            self.assertIn("torch.load is replaced by", result.summary)

        def lenient_load(f, *args, **kwargs):
            kwargs["weights_only"] = False
            return real(f, *args, **kwargs)

        # A mode torch's rules make weights-only without forcing it (that would override lenient_load):
        # `default` since torch 2.6, else `safe_globals` where torch has its context (>= 2.5).
        if DEFAULT_WEIGHTS_ONLY or not SAFE_GLOBALS_SKIP:
            mode = "default" if DEFAULT_WEIGHTS_ONLY else "safe_globals"
            with clean_env(), mock.patch.object(torch, "load", lenient_load):
                # Judged by its outcome, never skipped: loading what torch's rules reject is a failure.
                with self.assertRaisesRegex(
                    UnexpectedLoadOutcome,
                    rf"^{mode}: torch.load is replaced by \S*lenient_load, and it did not do what torch's own "
                    r"rules require: expected rejection .*unexpected success",
                ):
                    tst.round_trip(TinyNet(), mode)
        else:
            # No such mode runs here (torch < 2.5): the safe_globals mode skips for its own reason,
            # before torch.load is called.
            with clean_env(), mock.patch.object(torch, "load", lenient_load):
                with self.assertRaises(unittest.SkipTest) as cm:
                    tst.round_trip(TinyNet(), "safe_globals")
            self.assertEqual(str(cm.exception), SAFE_GLOBALS_SKIP)

        # The other direction, on every torch: a replacement that makes the predicted full load
        # weights-only rejects what torch's own rules say loads -- a failure, not a skip.
        def strict_load(f, *args, **kwargs):
            kwargs["weights_only"] = True
            return real(f, *args, **kwargs)

        with clean_env(), mock.patch.object(torch, "load", strict_load):
            with self.assertRaisesRegex(
                UnexpectedLoadOutcome,
                r"^weights_only_false: torch.load is replaced by \S*strict_load, and it did not do what "
                r"torch's own rules require: expected to load .*torch rejected it",
            ):
                tst.round_trip(TinyNet(), "weights_only_false")
        self.assertIsNone(torch_load_replacement())

    def test_map_location(self):
        result = tst.round_trip({"t": torch.ones(2)}, "default", map_location="cpu")
        self.assertEqual(result.value["t"].device.type, "cpu")

    def test_non_buffers_are_named(self):
        with self.assertRaisesRegex(TypeError, "expected a checkpoint buffer .* got int"):
            tst.scan_checkpoint(42)
        with self.assertRaisesRegex(TypeError, "expects bytes, got str"):
            Checkpoint.from_bytes("not bytes")  # type: ignore[arg-type]
        with self.assertRaisesRegex(TypeError, "expected a checkpoint buffer .* got object"):
            Checkpoint.from_buffer(object())

    def test_load_takes_a_checkpoint(self):
        with self.assertRaisesRegex(TypeError, "Checkpoint.from_bytes"):
            loading.load(b"bytes", "default")  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
