"""What test authors hit writing their own round-trip tests from the README (issue 13).

Each class pins one point: declaration errors that name the right attribute and show the
class-attribute line, local classes, ``set`` for every module, the environment conflict
winning, a clear message for a class never instantiated, stable golden records under
``python test_x.py``, an ``ExpectedRejection`` that ``except Exception`` cannot swallow,
``return_state``, subtests inside generators and warnings in ``unittest -v`` output.
"""

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
import warnings
from unittest import mock

import torch

from test.helpers.python_compat import failure_ids, verbose_ids, warnings_by_test
from test.helpers.roundtrip_fixtures import (
    MODULE_GLOBALS,
    MODULE_SAFE_GLOBALS,
    REFUSES_BOTH_SWITCHES,
    SAFE_GLOBALS_SKIP,
    TINY_GLOBALS,
    TINY_SAFE_GLOBALS,
    WEIGHTS_ONLY_BARE_ENV,
    TinyNet,
)
from test.helpers.subprocess_env import child_env
from torch_serial_testing import (
    ExpectedRejection,
    LoadMode,
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    supported_qengines,
)

TEST_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ROOT = os.path.dirname(TEST_DIR)


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
    full["PYTHONPATH"] = os.pathsep.join([TEST_DIR, ROOT])
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
        self.assertIn(
            f"AllowlistError: Inner.state_dict_safe_globals misses 1 global(s) the checkpoint needs: {name}\n", message
        )
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
        refs = ", ".join(
            g.rsplit(".", 1)[1] for g in sorted(["test.helpers.roundtrip_fixtures.TinyNet", *MODULE_GLOBALS])
        )
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
        self.assertIn(
            "Inner.safe_globals over-trusts: the checkpoint does not need test.helpers.roundtrip_fixtures.TinyNet",
            message,
        )
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
        self.assertIn(
            "the safe_globals= argument of round_trip() misses 1 global(s) the checkpoint needs: "
            "test.helpers.roundtrip_fixtures.TinyNet",
            message,
        )
        self.assertIn("self.round_trip(..., safe_globals=(", message)

    def test_missing_and_unneeded_in_one_error_with_the_one_fix(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (ExtraConfig, *MODULE_SAFE_GLOBALS)  # misses TinyNet, over-trusts ExtraConfig

            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals")

        message = only_problem(self, *run_inner(Inner))  # one: the over-trust is not reported again at cleanup
        refs = ", ".join(n.rsplit(".", 1)[1] for n in sorted(TINY_GLOBALS, key=lambda n: not n.startswith("builtins.")))
        self.assertEqual(
            message[message.index("AllowlistError: ") :],
            "AllowlistError: Inner.safe_globals misses 1 global(s) the checkpoint needs: "
            f"test.helpers.roundtrip_fixtures.TinyNet and over-trusts 1 it does not need: {__name__}.ExtraConfig\n"
            "The exact declaration (declare only what you trust):\n\n"
            "import torch\nfrom test.helpers.roundtrip_fixtures import TinyNet\n\n"
            f"class Inner(...):\n    safe_globals = ({refs}{',' if ', ' not in refs else ''})\n\n"
            "(outside a test class, the same globals in a torch.load call:)\n"
            "import torch\nfrom test.helpers.roundtrip_fixtures import TinyNet\n\n"
            f"with torch.serialization.safe_globals([{refs}]):\n    obj = torch.load(f, weights_only=True)\n",
        )

    def test_a_calls_missing_and_unneeded_globals_in_one_error(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self):
                self.round_trip(TinyNet(), mode="safe_globals", safe_globals=(ExtraConfig, torch.nn.Linear))

        message = only_problem(self, *run_inner(Inner))
        self.assertIn(
            f"AllowlistError: the safe_globals= argument of round_trip() misses {len(TINY_GLOBALS)} global(s) the "
            f"checkpoint needs: {', '.join(TINY_GLOBALS)} and over-trusts 2 it does not need: "
            f"{__name__}.ExtraConfig, torch.nn.modules.linear.Linear\n",
            message,
        )
        refs = ", ".join(n.rsplit(".", 1)[1] for n in sorted(TINY_GLOBALS, key=lambda n: not n.startswith("builtins.")))
        self.assertIn(f"\nself.round_trip(..., safe_globals=({refs}{',' if ', ' not in refs else ''}))\n", message)

    def test_a_declaration_is_judged_only_where_the_safe_globals_mode_uses_it(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (ExtraConfig,)  # needed by no checkpoint below

            def test_weights_only_false(self):
                self.round_trip(torch.ones(2), mode="weights_only_false")
                self.round_trip(torch.ones(2), mode="weights_only_false", safe_globals=(ExtraConfig,))

            def test_default(self):
                self.round_trip(torch.ones(2), mode="default")

            def test_safe_globals(self):
                self.round_trip(torch.ones(2), mode="safe_globals")

        result, out = run_inner(Inner)
        message = only_problem(self, result, out)
        self.assertEqual(result.failures[0][0].id().rsplit(".", 1)[1], "test_safe_globals")
        self.assertIn(
            f"AllowlistError: Inner.safe_globals over-trusts: the checkpoint does not need {__name__}.ExtraConfig.\n",
            message,
        )
        self.assertRegex(out, r"test_default \(.*\) \.\.\. default: loaded as expected \([^)]*\) \.\.\. ok\n")
        self.assertRegex(
            out,
            r"test_weights_only_false \(.*\) \.\.\. weights_only_false: loaded as expected "
            r"\(weights_only=False explicit\) \.\.\. ok\n",
        )


class TestLocalClasses(unittest.TestCase):
    def test_declaring_a_local_class_fails_at_class_creation(self):
        class Local(torch.nn.Module):
            pass

        with self.assertRaisesRegex(
            RoundTripConfigError,
            r"safe_globals lists .*<locals>\.Local, which is not "
            r"importable.*Move the class to module level",
        ):

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
        self.assertIn("Move the class to module level -- checkpointed classes belong in an importable module", message)


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
            safe_globals = (
                (*TINY_SAFE_GLOBALS, set, ExtraConfig)
                if set not in TINY_SAFE_GLOBALS
                else (*TINY_SAFE_GLOBALS, ExtraConfig)
            )

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
            self.assertIn(
                "ConflictingEnvironmentError: TORCH_FORCE_WEIGHTS_ONLY_LOAD=1 and "
                "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1 are both set",
                text,
            )
            self.assertNotIn("AllowlistError", text)


class TestNotInstantiated(unittest.TestCase):
    def test_generic_test_run_directly_says_how_to_instantiate(self):
        class TestFoo(SerializationRoundTripTestCase, unittest.TestCase):
            def test_rt(self, device):
                self.round_trip(TinyNet().to(device))

        message = only_problem(self, *run_inner(TestFoo))
        self.assertNotIn("missing 1 required positional argument", message)
        self.assertIn("RoundTripConfigError: TestFoo.test_rt is a generic round-trip test (it takes 'device')", message)
        self.assertIn("instantiate_round_trip_tests(TestFoo, globals())", message)

    def test_in_a_real_file(self):
        source = textwrap.dedent("""
            import unittest
            from test.helpers.roundtrip_fixtures import TinyNet
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
                        fresh, state = self.round_trip_state_dict(
                            original, factory=TinyNet, mode=mode, return_state=True
                        )
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


class TestIgnoreWarnings(unittest.TestCase):
    """``ignore_warnings`` in-process: its patterns during its tests only, nothing else."""

    def test_patterns_ignored_during_the_class_tests_only(self):
        def say(text):  # one location for every warning below
            warnings.warn(text, UserWarning)

        class Ignoring(SerializationRoundTripTestCase, unittest.TestCase):
            ignore_warnings = (r"ignored by ignoring\b", r"ALSO IGNORED")  # regexes, case-insensitive

            def test_a(self):
                say("ignored by ignoring, in its test")
                say("also ignored, in its test")
                say("shown by ignoring, in its test")

            def test_b(self):
                say("ignored by ignoring, in its other test")

        class Plain(SerializationRoundTripTestCase, unittest.TestCase):
            def test_c(self):
                say("ignored by ignoring, in another class's test")

        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result, out = run_inner(Ignoring, Plain)
            say("ignored by ignoring, outside any test")
            entries = [f for f in warnings.filters if "torch_serial_testing" in repr(f[1])]
        self.assertTrue(result.wasSuccessful(), out)
        self.assertEqual(
            [str(w.message) for w in caught],
            [
                "shown by ignoring, in its test",
                "ignored by ignoring, in another class's test",
                "ignored by ignoring, outside any test",
            ],
        )
        self.assertLessEqual(len(entries), 1)  # one filter entry, however many tests ignored

    def test_a_string_is_refused_at_class_creation(self):
        with self.assertRaisesRegex(
            RoundTripConfigError,
            r"^Inner\.ignore_warnings must be a tuple of message "
            r"regexes, e\.g\. \(r'TypedStorage',\)$",
        ):

            class Inner(SerializationRoundTripTestCase, unittest.TestCase):
                ignore_warnings = r"TypedStorage"


class TestUnittestVerboseOutput(unittest.TestCase):
    """``python -m unittest -v`` shows a warning exactly as it shows it without the library.

    The library never changes the warnings filters around a test (``catch_warnings`` and
    ``filterwarnings`` make Python forget which warnings it already showed once per location),
    and it quiets nothing: torch's own warnings of saving and loading show as often as in a
    plain-torch twin of the same tests, a warning shown once stays shown once however many round
    trips provoke it again (issue 25), and ``ignore_warnings`` ignores exactly its class's
    patterns, during its tests only (also under ``-W error``, where everything else raises).
    """

    # Shared by both test files, so a warning it raises has one location in both runs.
    USER_CODE = textwrap.dedent('''
        import atexit, json, unittest, warnings
        import torch

        class Legacy(torch.nn.Module):
            """Warns whenever it is unpickled: the user's own deprecation, provoked by every load."""

            def __init__(self):
                super().__init__()
                self.weight = torch.nn.Parameter(torch.ones(2))

            def __setstate__(self, state):
                warnings.warn("Legacy checkpoints are deprecated", DeprecationWarning)
                super().__setstate__(state)

        def user_warning(text):
            warnings.warn(text, UserWarning)

        def old_helper():
            warnings.warn("old_helper is deprecated", UserWarning)

        def quantized_module():
            """A sparse quantized Linear packed by qnnpack; creating it warns, which does not count."""
            from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

            previous = torch.backends.quantized.engine
            torch.backends.quantized.engine = "qnnpack"
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    w = torch.quantize_per_tensor(torch.tensor([[0.0, 0, 0, 0, 2, 2, 2, 2]] * 3), 2.0, 0, torch.qint8)
                    lin = Linear(3, 8, 1, 4, bias=True, dtype=torch.qint8)
                    lin.set_weight_bias(w, torch.full((3,), 1.0), 1, 4)
            finally:
                torch.backends.quantized.engine = previous
            return lin

        # Every change of the warnings filters while a test runs (setUp to the last cleanup) is
        # noted: Python forgets what it showed once whenever the filters change.
        SPIED = [n for n in ("_filters_mutated", "_filters_mutated_lock_held") if hasattr(warnings, n)]
        MUTATIONS = []
        _current = [None]

        def _spy(real):
            def mutated(*args, **kwargs):
                if _current[0] is not None:
                    MUTATIONS.append(_current[0])
                return real(*args, **kwargs)
            return mutated

        for _name in SPIED:
            setattr(warnings, _name, _spy(getattr(warnings, _name)))
        _start, _stop = unittest.TestResult.startTest, unittest.TestResult.stopTest

        def _start_test(self, test):
            _current[0] = test.id()
            _start(self, test)

        def _stop_test(self, test):
            _stop(self, test)
            _current[0] = None

        unittest.TestResult.startTest, unittest.TestResult.stopTest = _start_test, _stop_test
        atexit.register(lambda: print("FILTER CHANGES " + json.dumps({"spied": SPIED, "during_tests": MUTATIONS})))
    ''')

    SOURCE = textwrap.dedent('''
        import unittest
        import torch
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
        from torch.ao.nn.sparse.quantized.linear import LinearPackedParams
        from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
        import user_code
        from user_code import Legacy

        class TestQuiet(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (Linear, LinearPackedParams, torch.ScriptObject, set)
            devices = ("cpu",)
            qengines = ("qnnpack",)  # the module is packed by qnnpack
            load_modes = ("weights_only_false", "safe_globals")
            MODULE = user_code.quantized_module()

            def test_module(self, device):
                self.round_trip(self.MODULE)

            def test_state_dict(self, device):
                self.round_trip(self.MODULE._packed_params.state_dict(), safe_globals=())

        class TestIgnored(SerializationRoundTripTestCase, unittest.TestCase):  # runs first (sorted)
            devices = ("cpu",)
            load_modes = ("weights_only_false",)
            ignore_warnings = (r"a warning from the user's own code$",)

            def test_user_warning(self, device):
                user_code.user_warning("a warning from the user's own code")  # this class's pattern: ignored
                user_code.user_warning("another warning from the user's own code")  # not its pattern: shown
                self.round_trip(torch.ones(2))

        class TestOwnWarnings(SerializationRoundTripTestCase, unittest.TestCase):
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_user_warning(self, device):
                # the text and location TestIgnored ignored: shown here, its ignoring ended with its test
                user_code.user_warning("a warning from the user's own code")
                self.round_trip(torch.ones(2))

        class TestRepeated(SerializationRoundTripTestCase, unittest.TestCase):
            """Every round trip provokes the same warning again (and each test another one twice)."""
            safe_globals = (Legacy, set)
            devices = ("cpu",)
            load_modes = ("weights_only_false", "safe_globals")

            def three_round_trips(self):
                user_code.old_helper()
                for _ in range(3):
                    self.round_trip(Legacy())
                user_code.old_helper()

            def test_a(self, device):
                self.three_round_trips()

            def test_b(self, device):
                self.three_round_trips()

            def test_c(self, device):
                self.three_round_trips()

        instantiate_round_trip_tests(TestQuiet, globals())
        instantiate_round_trip_tests(TestIgnored, globals())
        instantiate_round_trip_tests(TestOwnWarnings, globals())
        instantiate_round_trip_tests(TestRepeated, globals())
    ''')

    # The same tests without the library: same classes and test names, the same saves and loads.
    TWIN = textwrap.dedent("""
        import io, unittest, warnings
        import torch
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
        from torch.ao.nn.sparse.quantized.linear import LinearPackedParams
        import user_code
        from user_code import Legacy

        def round_trip(obj, mode, safe_globals=()):
            buf = io.BytesIO()
            torch.save(obj, buf)
            buf.seek(0)
            if mode == "safe_globals":
                with torch.serialization.safe_globals(list(safe_globals)):
                    return torch.load(buf, weights_only=True)
            return torch.load(buf, weights_only=False)

        class qnnpack:
            def __enter__(self):
                self.previous = torch.backends.quantized.engine
                torch.backends.quantized.engine = "qnnpack"

            def __exit__(self, *exc):
                torch.backends.quantized.engine = self.previous

        MODULE = user_code.quantized_module()
        QUANTIZED = [Linear, LinearPackedParams, torch.ScriptObject, set]

        class TestQuietCPU(unittest.TestCase):
            def test_module_qnnpack_weights_only_false_cpu(self):
                with qnnpack():
                    round_trip(MODULE, "weights_only_false")

            def test_module_qnnpack_safe_globals_cpu(self):
                with qnnpack():
                    round_trip(MODULE, "safe_globals", QUANTIZED)

            def test_state_dict_qnnpack_weights_only_false_cpu(self):
                with qnnpack():
                    round_trip(MODULE._packed_params.state_dict(), "weights_only_false")

            def test_state_dict_qnnpack_safe_globals_cpu(self):
                with qnnpack():
                    round_trip(MODULE._packed_params.state_dict(), "safe_globals")

        class TestIgnoredCPU(unittest.TestCase):
            def test_user_warning_weights_only_false_cpu(self):
                with warnings.catch_warnings():  # how plain unittest ignores a warning in one test
                    warnings.filterwarnings("ignore", r"a warning from the user's own code$")
                    user_code.user_warning("a warning from the user's own code")
                    user_code.user_warning("another warning from the user's own code")
                round_trip(torch.ones(2), "weights_only_false")

        class TestOwnWarningsCPU(unittest.TestCase):
            def test_user_warning_weights_only_false_cpu(self):
                user_code.user_warning("a warning from the user's own code")
                round_trip(torch.ones(2), "weights_only_false")

        def three_round_trips(mode):
            user_code.old_helper()
            for _ in range(3):
                round_trip(Legacy(), mode, [Legacy, set])
            user_code.old_helper()

        class TestRepeatedCPU(unittest.TestCase):
            def test_a_weights_only_false_cpu(self):
                three_round_trips("weights_only_false")

            def test_a_safe_globals_cpu(self):
                three_round_trips("safe_globals")

            def test_b_weights_only_false_cpu(self):
                three_round_trips("weights_only_false")

            def test_b_safe_globals_cpu(self):
                three_round_trips("safe_globals")

            def test_c_weights_only_false_cpu(self):
                three_round_trips("weights_only_false")

            def test_c_safe_globals_cpu(self):
                three_round_trips("safe_globals")

        def skip_safe_globals_mode(*classes):  # torch < 2.5 has no such context: the library skips the mode
            for cls in classes:
                for name in [n for n in vars(cls) if "_safe_globals_" in n]:
                    setattr(cls, name, unittest.skip("no safe_globals context")(getattr(cls, name)))

        if not hasattr(torch.serialization, "safe_globals"):
            skip_safe_globals_mode(TestQuietCPU, TestRepeatedCPU)
    """)

    UNDER_ERROR = textwrap.dedent("""
        import unittest
        import torch
        from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests
        import user_code
        from user_code import Legacy

        class TestIgnoredUnderError(SerializationRoundTripTestCase, unittest.TestCase):
            devices = ("cpu",)
            load_modes = ("weights_only_false",)
            ignore_warnings = (r"ignored under -W error$",)

            def test_ignored(self, device):
                user_code.user_warning("ignored under -W error")
                self.round_trip(torch.ones(2))

            def test_other_warning(self, device):
                user_code.user_warning("raised under -W error")

        class TestPlainUnderError(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (Legacy, set)
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_same_text(self, device):
                user_code.user_warning("ignored under -W error")  # not this class's pattern

            def test_warning_inside_a_load(self, device):
                self.round_trip(Legacy())

        instantiate_round_trip_tests(TestIgnoredUnderError, globals())
        instantiate_round_trip_tests(TestPlainUnderError, globals())
    """)

    @staticmethod
    def _env(*path):
        return child_env(path_first=path, drop=("TORCH_FORCE_", "EXPECTTEST_", "PYTORCH_TESTING_DEVICE_"))

    @classmethod
    def _unittest(cls, folder, module, shared, *options):
        proc = subprocess.run(
            [sys.executable, *options, "-m", "unittest", module, "-v"],
            cwd=folder,
            env=cls._env(shared, TEST_DIR),
            capture_output=True,
            text=True,
            timeout=600,
        )
        changes = [line for line in proc.stdout.splitlines() if line.startswith("FILTER CHANGES ")]
        return proc, (json.loads(changes[-1][len("FILTER CHANGES ") :]) if changes else None)

    @classmethod
    def setUpClass(cls):
        root = tempfile.mkdtemp(prefix="tst-warnings-")
        cls.addClassCleanup(shutil.rmtree, root, True)
        shared, library, twin = (os.path.join(root, d) for d in ("shared", "library", "twin"))
        for folder, name, source in (
            (shared, "user_code", cls.USER_CODE),
            (library, "test_quiet", cls.SOURCE),
            (twin, "test_quiet", cls.TWIN),
            (library, "test_werror", cls.UNDER_ERROR),
        ):
            os.makedirs(folder, exist_ok=True)
            with open(os.path.join(folder, f"{name}.py"), "w") as fh:
                fh.write(source)
        cls.library, cls.library_changes = cls._unittest(library, "test_quiet", shared)
        cls.twin, cls.twin_changes = cls._unittest(twin, "test_quiet", shared)
        cls.under_error, _ = cls._unittest(library, "test_werror", shared, "-W", "error")

    def _all(self, proc):
        return [w for ws in warnings_by_test(proc.stderr).values() for w in ws]

    def test_warnings_show_exactly_as_in_the_plain_twin(self):
        for proc in (self.library, self.twin):
            self.assertEqual(proc.returncode, 0, proc.stderr)
            self.assertIn("Ran 12 tests", proc.stderr)
        self.assertEqual(verbose_ids(self.library.stderr), verbose_ids(self.twin.stderr))  # the same tests
        # Each warning in the same test, at the same location, as often: torch's own of saving and
        # loading (TypedStorage, which torch shows once per process) and the user's.
        self.assertEqual(warnings_by_test(self.library.stderr), warnings_by_test(self.twin.stderr), self.library.stderr)
        self.assertNotIn(os.sep + "torch_serial_testing" + os.sep, "".join(self._all(self.library)))

    def test_ignore_warnings_ignores_its_patterns_during_its_tests_only(self):
        shown = warnings_by_test(self.library.stderr)
        own = [w for w in self._all(self.library) if w.endswith("UserWarning: a warning from the user's own code")]
        self.assertEqual(len(own), 1, self.library.stderr)  # shown once: in TestOwnWarnings, not in TestIgnored
        self.assertEqual(
            [
                w
                for w in shown["TestOwnWarningsCPU.test_user_warning_weights_only_false_cpu"]
                if "the user's own code" in w
            ],
            own,
        )
        self.assertEqual(
            [w.split(": ", 1)[1] for w in shown["TestIgnoredCPU.test_user_warning_weights_only_false_cpu"]],
            ["UserWarning: another warning from the user's own code"],
        )  # only its pattern is ignored

    def test_a_warning_shown_once_is_not_shown_again_after_every_round_trip(self):
        # The complaint: the library wrapped each save/load (and each test) in
        # catch_warnings, so a warning plain unittest shows once came back after every round trip.
        # Here 18 loads provoke one warning and 12 calls of a helper another: each shows once.
        for text in ("DeprecationWarning: Legacy checkpoints are deprecated", "UserWarning: old_helper is deprecated"):
            with self.subTest(text):
                self.assertEqual(sum(w.endswith(text) for w in self._all(self.twin)), 1, self.twin.stderr)
                self.assertEqual(sum(w.endswith(text) for w in self._all(self.library)), 1, self.library.stderr)
        # ... in the first test that provokes them (sorted: test_a_safe_globals_cpu, which torch < 2.5 skips)
        first_test = (
            "test_a_safe_globals_cpu"
            if hasattr(torch.serialization, "safe_globals")
            else "test_a_weights_only_false_cpu"
        )
        first = warnings_by_test(self.library.stderr)[f"TestRepeatedCPU.{first_test}"]
        self.assertEqual(
            sorted(w.split(": ", 1)[1] for w in first),
            ["DeprecationWarning: Legacy checkpoints are deprecated", "UserWarning: old_helper is deprecated"],
        )

    def test_the_library_never_changes_the_filters_during_a_test(self):
        if not (self.library_changes and self.library_changes["spied"]):
            self.skipTest("this Python's warnings module has no _filters_mutated to watch")
        self.assertEqual(self.library_changes["during_tests"], [])
        # the watch works: the twin's catch_warnings (its way to ignore a warning in one test) is seen
        self.assertEqual(
            set(self.twin_changes["during_tests"]),
            {"test_quiet.TestIgnoredCPU.test_user_warning_weights_only_false_cpu"},
        )

    def test_under_W_error_other_warnings_still_raise(self):
        out = self.under_error.stderr
        self.assertIn("Ran 4 tests", out)
        self.assertIn("FAILED (errors=3)", out)
        blocks = re.split(r"^(?:FAIL|ERROR): .*$", out, flags=re.M)[1:]
        # each block: its traceback, up to the next separator; its last line is what was raised
        tracebacks = [re.split(r"^(?:=+|-+\nRan \d+ tests? in .*)$", b.strip("-\n"), flags=re.M)[0] for b in blocks]
        raised = {k.split(".", 1)[1]: tb.strip().splitlines()[-1] for k, tb in zip(failure_ids(out), tracebacks)}
        self.assertEqual(
            raised,
            {
                "TestIgnoredUnderErrorCPU.test_other_warning_weights_only_false_cpu": "UserWarning: raised under -W error",
                "TestPlainUnderErrorCPU.test_same_text_weights_only_false_cpu": "UserWarning: ignored under -W error",
                "TestPlainUnderErrorCPU.test_warning_inside_a_load_weights_only_false_cpu": "DeprecationWarning: Legacy checkpoints are deprecated",
            },
            out,
        )
        # the ignored one was ignored: its test passed, round trip included
        self.assertRegex(
            out,
            r"test_ignored_weights_only_false_cpu \(.*\) \.\.\. weights_only_false: loaded as "
            r"expected \(weights_only=False explicit\) \.\.\. ok",
        )

    @unittest.skipUnless(
        hasattr(torch.serialization, "safe_globals"),
        "torch < 2.5 has no safe_globals context: the flagship skips that mode, the twin would not",
    )
    def test_flagship_verbose_output_shows_warnings_as_its_plain_twin(self):
        # bench/flagship_plain.py: the flagship's 20 tests, same names, the same saves and loads in
        # plain torch.  The flagship shows exactly the warnings the twin shows, in the same tests.
        flagship = subprocess.run(
            [sys.executable, "-m", "unittest", "test_qlinear_packed_params", "-v"],
            cwd=os.path.join(TEST_DIR, "ao", "sparsity"),
            env=self._env(TEST_DIR),
            capture_output=True,
            text=True,
            timeout=600,
        )
        twin = subprocess.run(
            [sys.executable, "-m", "unittest", "flagship_plain", "-v"],
            cwd=os.path.join(ROOT, "bench"),
            env=self._env(ROOT),
            capture_output=True,
            text=True,
            timeout=600,
        )
        self.assertEqual(flagship.returncode, 0, flagship.stderr)
        self.assertEqual(twin.returncode, 0, twin.stderr)
        shown = warnings_by_test(flagship.stderr, key="name")
        self.assertEqual(shown, warnings_by_test(twin.stderr, key="name"), flagship.stderr)
        # none of them raised by the library itself
        self.assertNotIn(os.sep + "torch_serial_testing" + os.sep, "".join(w for ws in shown.values() for w in ws))


if __name__ == "__main__":
    unittest.main()
