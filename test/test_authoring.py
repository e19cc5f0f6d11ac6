"""What test authors hit writing their own round-trip tests from the README (issue 13).

Each class pins one point: declaration errors that name the right attribute and show the
class-attribute line, local classes, ``set`` for every module, the environment conflict
winning, a clear message for a class never instantiated, stable golden records under
``python test_x.py``, an ``ExpectedRejection`` that ``except Exception`` cannot swallow,
``return_state``, subtests inside generators and warnings in ``unittest -v`` output.
"""

import io
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
from unittest import mock

import torch

from roundtrip_fixtures import (
    MODULE_GLOBALS,
    MODULE_SAFE_GLOBALS,
    REFUSES_BOTH_SWITCHES,
    SAFE_GLOBALS_SKIP,
    TINY_SAFE_GLOBALS,
    WEIGHTS_ONLY_BARE_ENV,
    TinyNet,
)
from torch_serial_testing import (
    ExpectedRejection,
    LoadMode,
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    supported_qengines,
)

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)


class ExtraConfig:
    """A plain object a module keeps as extra state: its state_dict then needs this global."""

    def __init__(self, level=3):
        self.level = level

    def __eq__(self, other):
        return type(other) is ExtraConfig and other.level == self.level


class WithExtra(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2))
        self.config = ExtraConfig()

    def get_extra_state(self):
        return self.config

    def set_extra_state(self, state):
        self.config = state


def run_inner(*classes, env=None):
    """Run test classes defined inside a test, with exactly *env* as the TORCH_FORCE_* switches."""
    stream = io.StringIO()
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
    clean = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    clean.update(env or {})
    with mock.patch.dict(os.environ, clean, clear=True):
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(suite)
    return result, stream.getvalue()


def only_problem(test, result, out):
    """The one failure or error of *result*, as its traceback text."""
    problems = result.failures + result.errors
    test.assertEqual(len(problems), 1, out)
    return problems[0][1]


def python(args, cwd, env=None):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE_", "EXPECTTEST_"))}
    full["PYTHONPATH"] = os.pathsep.join([HERE, ROOT])
    full.update(env or {})
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full, capture_output=True, text=True)


@unittest.skipIf(SAFE_GLOBALS_SKIP, SAFE_GLOBALS_SKIP)
class TestDeclarationErrors(unittest.TestCase):
    """AllowlistError names the declaration to fix and shows its class-attribute line."""

    def test_state_dict_error_names_state_dict_safe_globals(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (WithExtra, ExtraConfig, *MODULE_SAFE_GLOBALS)  # lists ExtraConfig ...

            def test_sd(self):
                self.round_trip_state_dict(WithExtra(), factory=WithExtra, mode="safe_globals")

        message = only_problem(self, *run_inner(Inner))
        name = f"{__name__}.ExtraConfig"
        # ... but the state_dict round trip is judged against state_dict_safe_globals, and says so.
        self.assertIn(f"AllowlistError: Inner.state_dict_safe_globals misses 1 global(s) the checkpoint "
                      f"needs: {name}\n", message)
        self.assertNotIn("Inner.safe_globals", message)
        self.assertIn("class Inner(...):\n    state_dict_safe_globals = (ExtraConfig,)\n", message)
        self.assertIn(f"from {__name__} import ExtraConfig", message)
        self.assertIn("with torch.serialization.safe_globals([ExtraConfig]):", message)  # outside a class

    def test_state_dict_safe_globals_make_it_load(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            state_dict_safe_globals = (ExtraConfig,)

            def test_sd(self):
                original = WithExtra()
                original.config = ExtraConfig(7)
                fresh = self.round_trip_state_dict(original, factory=WithExtra, mode="safe_globals")
                self.assertEqual(fresh.config, ExtraConfig(7))

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn("safe_globals: loaded as expected", out)

    def test_class_attribute_line_for_missing_safe_globals(self):
        class TestFoo(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals")

        message = only_problem(self, *run_inner(TestFoo))
        refs = ", ".join(g.rsplit(".", 1)[1] for g in sorted(["roundtrip_fixtures.TinyNet", *MODULE_GLOBALS]))
        self.assertIn("TestFoo.safe_globals misses", message)
        self.assertIn(f"class TestFoo(...):\n    safe_globals = ({refs}{',' if ', ' not in refs else ''})\n", message)

    def test_over_trust_of_a_plain_dict_says_pass_empty_safe_globals(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = TINY_SAFE_GLOBALS  # for the module; this test saves a plain dict

            def test_dict(self):
                self.round_trip({"step": 3, "weight": torch.ones(2)}, mode="safe_globals")

            def test_dict_fixed(self):
                loaded = self.round_trip({"step": 3}, mode="safe_globals", safe_globals=())
                self.assertEqual(loaded, {"step": 3})

        result, out = run_inner(Inner)
        message = only_problem(self, result, out)
        self.assertIn("Inner.safe_globals over-trusts: the checkpoint does not need roundtrip_fixtures.TinyNet",
                      message)
        self.assertIn("saves a dict, not a module: pass safe_globals=()", message)
        # What is left of the declaration: () -- or (set,) before torch 2.6, where builtins.set is not
        # on torch's allowlist yet (declaring it is never over-trust: torch allowlists it later).
        kept = "".join(f"{g.rsplit('.', 1)[1]}," for g in MODULE_GLOBALS)
        self.assertIn(f"class Inner(...):\n    safe_globals = ({kept})\n", message)

    def test_call_argument_error_shows_the_call(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals", safe_globals=MODULE_SAFE_GLOBALS)

        message = only_problem(self, *run_inner(Inner))
        self.assertIn("the safe_globals= argument of round_trip() misses 1 global(s) the checkpoint needs: "
                      "roundtrip_fixtures.TinyNet", message)
        self.assertIn("self.round_trip(..., safe_globals=(", message)


class TestLocalClasses(unittest.TestCase):
    def test_declaring_a_local_class_fails_at_class_creation(self):
        class Local(torch.nn.Module):
            pass

        with self.assertRaisesRegex(RoundTripConfigError, r"safe_globals lists .*<locals>\.Local, which is not "
                                    r"importable.*Move the class to module level"):
            class Inner(SerializationRoundTripTestCase, unittest.TestCase):
                safe_globals = (Local,)

        with self.assertRaisesRegex(RoundTripConfigError, "state_dict_safe_globals lists .*<locals>"):
            class Inner2(SerializationRoundTripTestCase, unittest.TestCase):
                state_dict_safe_globals = (Local,)

    def test_declaring_a_local_class_in_a_call_fails(self):
        class Local(torch.nn.Module):
            pass

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals", safe_globals=(Local,))

        message = only_problem(self, *run_inner(Inner))
        self.assertIn("RoundTripConfigError: safe_globals= lists", message)
        self.assertIn("module level", message)

    def test_saving_a_local_class_says_what_to_do(self):
        class Local(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.ones(1))

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self):
                for mode in LoadMode:
                    with self.subTest(mode=mode.value):
                        self.round_trip(Local(), mode=mode)

        result, out = run_inner(Inner)
        self.assertEqual(len(result.errors), len(LoadMode), out)  # one clear error per mode
        message = result.errors[0][1]
        # pickle's own words for the class, as this Python says them ("Can't pickle local object"
        # before 3.13, "Can't get local object" since)
        pickle_error = pickle_refusal(Local())
        self.assertIn("local object", pickle_error)
        self.assertIn(f"RoundTripConfigError: torch.save failed: {pickle_error}", message)
        self.assertIn("Move the class to module level -- checkpointed classes belong in an importable module",
                      message)


def pickle_refusal(obj):
    """``Type: message`` of the exception torch.save raises for *obj* (pickle's own refusal)."""
    import io as _io

    try:
        torch.save(obj, _io.BytesIO())
    except Exception as e:  # noqa: BLE001 - what this Python's pickle says
        return f"{type(e).__name__}: {str(e).splitlines()[0]}"
    raise AssertionError(f"torch.save accepted {obj!r}")


@unittest.skipIf(SAFE_GLOBALS_SKIP, SAFE_GLOBALS_SKIP)
class TestSetForEveryModule(unittest.TestCase):
    """Declaring ``set`` is never over-trust, also for modules whose checkpoint does not name it."""

    @unittest.skipUnless("fbgemm" in supported_qengines(), "fbgemm is not supported by this torch build")
    def test_quantized_conv2d_with_set(self):
        from torch.ao.nn.quantized import Conv2d

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (Conv2d, set)

            def test_conv(self):
                from torch_serial_testing import override_qengine

                with override_qengine("fbgemm"):
                    conv = Conv2d(2, 2, 1)
                    self.assertNotIn("builtins.set", self.save_checkpoint(conv).info.globals)
                    loaded = self.round_trip(conv, mode="safe_globals")
                    self.assertRoundTripEqual(conv.weight(), loaded.weight())
                    self.assertRoundTripEqual(conv.bias(), loaded.bias())

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn("safe_globals: loaded as expected", out)

    def test_other_unneeded_globals_are_still_over_trust(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (*TINY_SAFE_GLOBALS, set, ExtraConfig) if set not in TINY_SAFE_GLOBALS else (
                *TINY_SAFE_GLOBALS, ExtraConfig)

            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals")

        message = only_problem(self, *run_inner(Inner))
        self.assertIn(f"over-trusts: the checkpoint does not need {__name__}.ExtraConfig.", message)


@unittest.skipUnless(REFUSES_BOTH_SWITCHES, "this torch does not refuse loads with both TORCH_FORCE_* set")
class TestConflictWins(unittest.TestCase):
    def test_conflict_reported_over_a_bad_declaration(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (ExtraConfig,)  # wrong for TinyNet: both missing and over-trusted

            def test_rt(self):
                for mode in LoadMode:
                    with self.subTest(mode=mode.value):
                        self.round_trip(TinyNet(), mode=mode)

        env = {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
        result, out = run_inner(Inner, env=env)
        problems = [text for _, text in result.failures + result.errors]
        self.assertEqual(len(problems), len(LoadMode) - (1 if SAFE_GLOBALS_SKIP else 0), out)
        for text in problems:
            self.assertIn("ConflictingEnvironmentError: TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 and "
                          "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 are both set", text)
            self.assertNotIn("AllowlistError", text)


class TestNotInstantiated(unittest.TestCase):
    def test_generic_test_run_directly_says_how_to_instantiate(self):
        class TestFoo(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self, device):
                self.round_trip(TinyNet().to(device))

        message = only_problem(self, *run_inner(TestFoo))
        self.assertNotIn("missing 1 required positional argument", message)
        self.assertIn("RoundTripConfigError: TestFoo.test_rt is a generic round-trip test (it takes 'device')",
                      message)
        self.assertIn("instantiate_round_trip_tests(TestFoo, globals())", message)

    def test_in_a_real_file(self):
        source = textwrap.dedent("""
            import unittest
            from roundtrip_fixtures import TinyNet
            from torch_serial_testing import SerializationRoundTripTestCase

            class TestForgotten(SerializationRoundTripTestCase, unittest.TestCase):
                def test_rt(self, device):
                    self.round_trip(TinyNet())
        """)
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_forgotten.py"), "w") as fh:
                fh.write(source)
            proc = python(["-m", "unittest", "test_forgotten", "-v"], d)
        self.assertNotEqual(proc.returncode, 0)
        self.assertIn("instantiate_round_trip_tests(TestForgotten, globals())", proc.stderr)
        self.assertNotIn("required positional argument", proc.stderr)


class TestGoldenRecordAsScript(unittest.TestCase):
    """A golden record is the same whether the file runs as a script or as a module."""

    SOURCE = textwrap.dedent('''
        import unittest
        import torch
        from torch_serial_testing import SerializationRoundTripTestCase

        class Scaler(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.scale = torch.nn.Parameter(torch.ones(1))

        class Config:
            pass

        class TestScaler(SerializationRoundTripTestCase, unittest.TestCase):
            def test_required_globals(self):
                self.assertRequiredGlobalsExpectedInline(Scaler(), RECORD)

            def test_plain_data(self):
                self.assertRequiredGlobalsExpectedInline({"w": torch.ones(1)}, """""")

        if __name__ == "__main__":
            unittest.main()
    ''')

    def _write(self, d, record):
        path = os.path.join(d, "test_float_modules.py")
        with open(path, "w") as fh:
            fh.write(self.SOURCE.replace("RECORD", record))
        return path

    def test_script_and_module_agree(self):
        names = sorted(["test_float_modules.Scaler", *MODULE_GLOBALS])
        record = '"""\\\n' + "".join(f"{n}\n" for n in names) + '"""'
        with tempfile.TemporaryDirectory() as d:
            self._write(d, record)
            as_module = python(["-m", "unittest", "test_float_modules", "-v"], d)
            as_script = python(["test_float_modules.py", "-v"], d)
            from_elsewhere = python([os.path.join(d, "test_float_modules.py"), "-v"], ROOT)
        for proc in (as_module, as_script, from_elsewhere):
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("Ran 2 tests", proc.stderr)

    def test_accept_in_script_mode_records_the_module_name(self):
        with tempfile.TemporaryDirectory() as d:
            path = self._write(d, '""""""')
            proc = python(["test_float_modules.py"], d, env={"EXPECTTEST_ACCEPT": "1"})
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(path) as fh:
                source = fh.read()
        self.assertIn("test_float_modules.Scaler\n", source)
        self.assertNotIn("__main__.Scaler", source)


class TestExpectedRejectionCannotBeSwallowed(unittest.TestCase):
    def test_except_exception_and_assert_raises_exception(self):
        reached = []

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_except(self):
                try:
                    self.round_trip(TinyNet(), mode="default")
                except Exception:  # noqa: BLE001 - what the point is about
                    reached.append("except")
                reached.append("after try")

            def test_assert_raises(self):
                with self.assertRaises(Exception):
                    self.round_trip(TinyNet(), mode="default")
                reached.append("after assertRaises")

        result, out = run_inner(Inner, env=WEIGHTS_ONLY_BARE_ENV)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(out.count("default: rejected as expected"), 2, out)
        self.assertEqual(reached, [])
        self.assertFalse(issubclass(ExpectedRejection, Exception))
        self.assertTrue(issubclass(ExpectedRejection, BaseException))

    def test_escaping_outside_a_test_is_an_error_not_a_pass(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def setUp(self):
                super().setUp()
                self.round_trip(TinyNet(), mode="default")  # not a test body: nothing ends it as a pass

            def test_x(self):
                pass

        result, out = run_inner(Inner, env=WEIGHTS_ONLY_BARE_ENV)
        self.assertEqual(len(result.errors), 1, out)
        self.assertIn("ExpectedRejection", result.errors[0][1])


class TestStateDictBack(unittest.TestCase):
    def test_return_state(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_sd(self):
                for mode in LoadMode:
                    with self.subTest(mode=mode.value):
                        original = TinyNet()
                        fresh, state = self.round_trip_state_dict(original, factory=TinyNet, mode=mode,
                                                                  return_state=True)
                        self.assertIsInstance(fresh, TinyNet)
                        self.assertEqual(sorted(state), sorted(original.state_dict()))
                        self.assertRoundTripEqual(original.state_dict(), state)
                        self.assertIsNot(state["weight"], original.weight)

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(out.count("loaded as expected"), 3 - (1 if SAFE_GLOBALS_SKIP else 0), out)


class TestSubtestsInGenerators(unittest.TestCase):
    CASES = ("a", "b", "c")

    def test_rejection_inside_a_yielding_subtest_ends_only_that_subtest(self):
        ran = []

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def loaded_cases(self):
                for name in TestSubtestsInGenerators.CASES:
                    with self.subTest(case=name):
                        ran.append(name)
                        yield self.round_trip(TinyNet(), mode="default")

            def test_gen(self):
                for loaded in self.loaded_cases():
                    self.assertIsInstance(loaded, TinyNet)

        result, out = run_inner(Inner, env=WEIGHTS_ONLY_BARE_ENV)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(ran, list(self.CASES))

    def test_closing_the_generator_early_is_not_an_error(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def cases(self):
                for name in TestSubtestsInGenerators.CASES:
                    with self.subTest(case=name):
                        yield name

            def test_break(self):
                for name in self.cases():
                    break

        with mock.patch("sys.unraisablehook") as unraisable:
            result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertNotIn("GeneratorExit", out)
        unraisable.assert_not_called()  # no "generator ignored GeneratorExit"

    def test_rejection_outside_the_with_block_is_a_clear_error(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def cases(self):
                for name in TestSubtestsInGenerators.CASES:
                    with self.subTest(case=name):
                        yield name

            def test_gen(self):
                for name in self.cases():
                    self.round_trip(TinyNet(), mode="default")

        with mock.patch("sys.unraisablehook") as unraisable:
            result, out = run_inner(Inner, env=WEIGHTS_ONLY_BARE_ENV)
        message = only_problem(self, result, out)
        self.assertIn("outside the `with self.subTest(case='a')` block", message)
        self.assertIn("remaining subtests would silently not run", message)
        unraisable.assert_not_called()


class TestUnittestVerboseOutput(unittest.TestCase):
    """``python -m unittest -v`` shows outcomes, not torch's internal deprecation warnings."""

    SOURCE = textwrap.dedent("""
        import unittest, warnings
        import torch
        from roundtrip_fixtures import tiny_qlinear
        from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
        from torch.ao.nn.sparse.quantized.linear import LinearPackedParams

        class TestQuiet(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (Linear, LinearPackedParams, torch.ScriptObject, set)
            devices = ("cpu",)
            qengines = ("qnnpack",)  # tiny_qlinear is packed by qnnpack
            load_modes = ("weights_only_false", "safe_globals")
            with warnings.catch_warnings():  # creating it warns; only what saving and loading provoke counts
                warnings.simplefilter("ignore")
                MODULE = tiny_qlinear()

            def test_module(self, device):
                self.round_trip(self.MODULE)

            def test_state_dict(self, device):
                self.round_trip(self.MODULE._packed_params.state_dict(), safe_globals=())

        class TestOwnWarnings(SerializationRoundTripTestCase, unittest.TestCase):
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_user_warning(self, device):
                warnings.warn("a warning from the user's own code")
                self.round_trip(torch.ones(2))

        class TestIgnored(TestOwnWarnings):  # runs first (sorted): its filter must not outlive its tests
            ignore_warnings = (r"a warning from the user's own code, ignored",)

            def test_user_warning(self, device):
                warnings.warn("a warning from the user's own code, ignored")
                self.round_trip(torch.ones(2))

        instantiate_round_trip_tests(TestQuiet, globals())
        instantiate_round_trip_tests(TestOwnWarnings, globals())
        instantiate_round_trip_tests(TestIgnored, globals())
    """)

    def test_library_warnings_quiet_user_warnings_shown(self):
        with tempfile.TemporaryDirectory() as d:
            with open(os.path.join(d, "test_quiet.py"), "w") as fh:
                fh.write(self.SOURCE)
            proc = python(["-m", "unittest", "test_quiet", "-v"], d)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("TypedStorage is deprecated", proc.stderr)
        self.assertNotIn("quantized tensor creation functions", proc.stderr)  # saving/loading quantized
        # the user's own warning shows, in its test; one a class declares in ignore_warnings does not
        self.assertEqual(proc.stderr.count("UserWarning: a warning from the user's own code"), 1, proc.stderr)
        own = proc.stderr.split("test_user_warning_weights_only_false_cpu (test_quiet.TestOwnWarningsCPU")[1]
        self.assertIn("UserWarning: a warning from the user's own code\n", own.split(" ... ok")[0])

    def test_flagship_verbose_output_has_no_warnings(self):
        proc = python(["-m", "unittest", "test_qlinear_packed_params", "-v"], os.path.join(HERE, "ao", "sparsity"))
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertNotIn("Warning", proc.stderr)


if __name__ == "__main__":
    unittest.main()
