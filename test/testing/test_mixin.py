"""The SerializationRoundTripTestCase mixin: round trips, allowlist checks, reporting, bad input."""

import functools
import io
import json
import os
import tempfile
import textwrap
import unittest
from unittest import mock

import torch

from test.helpers.roundtrip_fixtures import (
    DEFAULT_WEIGHTS_ONLY,
    MODE_SKIPS,
    MODULE_GLOBALS,
    RUNNABLE_MODES,
    SAFE_GLOBALS_SKIP,
    SEED_GLOBALS,
    TINY_GLOBALS,
    TINY_SAFE_GLOBALS,
    WEIGHTS_ONLY_BARE_ENV,
    WRAPPER_GLOBALS,
    TinyNet,
    Wrapper,
    default_outcome,
    tiny_qlinear,
)
from torch_serial_testing import LoadMode, RoundTripConfigError, SerializationRoundTripTestCase, UnsafeCallable
from torch_serial_testing.outcomes import REPORT_ENV
from torch_serial_testing.checkpoint import Checkpoint
from torch_serial_testing.registry import allowlisted

from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the project root


def tst_scan(obj):
    return Checkpoint.save(obj).info.globals


def run_inner(*classes, verbosity=2):
    """Run mixin classes defined inside a test; return (result, verbose output)."""
    stream = io.StringIO()
    suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    with mock.patch.dict(os.environ, env, clear=True):
        result = unittest.TextTestRunner(stream=stream, verbosity=verbosity).run(suite)
    return result, stream.getvalue()


class TestRoundTrip(unittest.TestCase):
    def test_each_mode_explicitly(self):
        seen = {}

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = TINY_SAFE_GLOBALS

            def test_modes(self):
                for mode in LoadMode:
                    original = TinyNet()
                    with self.subTest(mode=mode.value):
                        loaded = self.round_trip(original, mode=mode)
                        seen[mode] = loaded
                        self.assertRoundTripEqual(original, loaded)

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        # A bare load of a full TinyNet loads only where a bare torch.load is not weights-only;
        # the safe_globals mode loads where torch has its context (>= 2.5), else its subtest skips.
        expected_loaded = {LoadMode.WEIGHTS_ONLY_FALSE, LoadMode.SAFE_GLOBALS} & set(RUNNABLE_MODES)
        if not DEFAULT_WEIGHTS_ONLY:
            expected_loaded.add(LoadMode.DEFAULT)
        self.assertEqual(set(seen), expected_loaded)
        self.assertIn(default_outcome(TINY_GLOBALS), out)
        self.assertEqual([reason for _, reason in result.skipped], list(MODE_SKIPS.values()))
        if SAFE_GLOBALS_SKIP:
            self.assertNotIn("safe_globals: loaded as expected", out)
        else:
            self.assertIn("safe_globals: loaded as expected (weights_only=True explicit)", out)

    def test_rejection_ends_test_as_pass_and_skips_later_checks(self):
        after = []

        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_default(self):
                # Where a bare torch.load is not weights-only by default (torch < 2.6), force it.
                with mock.patch.dict(os.environ, WEIGHTS_ONLY_BARE_ENV):
                    self.round_trip(TinyNet(), mode="default")
                after.append("ran")  # never reached: the load was rejected as expected

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        self.assertIn("default: rejected as expected", out)
        self.assertEqual(after, [])

    def test_mode_is_required_outside_instantiation(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_no_mode(self):
                with self.assertRaisesRegex(RoundTripConfigError, "pass mode=LoadMode.DEFAULT"):
                    self.round_trip(TinyNet())

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)

    def test_missing_safe_globals_listed_at_once_with_snippet(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (TinyNet,)

            def test_wrapper(self):
                self.round_trip(Wrapper(), mode="safe_globals")

        result, out = run_inner(Inner)
        if SAFE_GLOBALS_SKIP:  # no safe_globals context in this torch: the mode skips before judging
            self.assertEqual([r for _, r in result.skipped], [SAFE_GLOBALS_SKIP], out)
            self.assertEqual(result.failures, [])
            return
        self.assertEqual(len(result.failures), 1, out)
        message = result.failures[0][1]
        missing = [
            g for g in WRAPPER_GLOBALS if g != "test.helpers.roundtrip_fixtures.TinyNet"
        ]  # + builtins.set before 2.6
        # The message names the class attribute to fix (issue 13 point 2), not just "safe_globals".
        self.assertIn(
            f"AllowlistError: Inner.safe_globals misses {len(missing)} global(s) the checkpoint "
            f"needs: {', '.join(missing)}\n",
            message,
        )
        self.assertIn(
            f"class Inner(...):\n    safe_globals = ({', '.join(g.rsplit('.', 1)[1] for g in WRAPPER_GLOBALS)})",
            message,
        )
        self.assertIn("from test.helpers.roundtrip_fixtures import TinyNet", message)
        self.assertIn("from torch.nn.modules.linear import Linear", message)
        self.assertNotIn("from builtins", message)  # builtins (set, before torch 2.6) need no import
        refs = ", ".join(g.rsplit(".", 1)[1] for g in WRAPPER_GLOBALS)  # TinyNet, Wrapper, Linear (set first)
        self.assertIn(f"with torch.serialization.safe_globals([{refs}]):", message)

    def test_over_trust_fails_unless_relaxed(self):
        class Strict(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (*TINY_SAFE_GLOBALS, Wrapper)

            def test_tiny(self):
                self.round_trip(TinyNet(), mode="safe_globals")

        class Relaxed(Strict):
            allow_unneeded_safe_globals = True

        class Portable(SerializationRoundTripTestCase, unittest.TestCase):
            # builtins.set is on torch's allowlist only since torch 2.6; declaring it is not over-trust.
            safe_globals = (TinyNet, set)

            def test_tiny(self):
                self.round_trip(TinyNet(), mode="safe_globals")

        self.assertIn("builtins.set", tst_scan(TinyNet()))
        result, out = run_inner(Strict, Relaxed, Portable)
        if SAFE_GLOBALS_SKIP:  # no safe_globals context in this torch: every case skips, none judged
            self.assertEqual([r for _, r in result.skipped], [SAFE_GLOBALS_SKIP] * 3, out)
            return
        self.assertEqual(len(result.failures), 1, out)
        self.assertIn(
            "over-trusts: the checkpoint does not need test.helpers.roundtrip_fixtures.Wrapper", result.failures[0][1]
        )
        self.assertEqual(result.testsRun, 3)

    def test_state_dict_form(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def make_module(self):
                return TinyNet()

            def test_sd(self):
                for mode in LoadMode:
                    # A subtest per mode: one that skips here (safe_globals before torch 2.5) ends only itself.
                    with self.subTest(mode=mode.value):
                        original = self.make_module()
                        with torch.no_grad():
                            original.weight.add_(1)
                        loaded = self.round_trip_state_dict(original, mode=mode)
                        self.assertIsNot(loaded, original)
                        self.assertRoundTripEqual(original.state_dict(), loaded.state_dict())

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)
        # A state_dict needs no global beyond torch's allowlist: every mode that runs here loads it.
        for mode in LoadMode:
            if mode in RUNNABLE_MODES:
                self.assertIn(f"{mode.value}: loaded as expected", out)
            else:
                self.assertNotIn(f"{mode.value}: ", out)
        self.assertEqual([reason for _, reason in result.skipped], list(MODE_SKIPS.values()))

    def test_factory_must_return_module(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def make_module(self):
                return {"not": "a module"}

            def test_sd(self):
                with self.assertRaisesRegex(RoundTripConfigError, "returned dict, not a torch.nn.Module"):
                    self.round_trip_state_dict(mode="default")

        result, out = run_inner(Inner)
        self.assertTrue(result.wasSuccessful(), out)

    def test_report_file(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = TINY_SAFE_GLOBALS

            def test_all(self):
                for mode in LoadMode:
                    with self.subTest(mode=mode.value):
                        self.round_trip(TinyNet(), mode=mode)

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "report.jsonl")
            with mock.patch.dict(os.environ, {REPORT_ENV: path}):
                run_inner(Inner)
            with open(path) as fh:
                records = [json.loads(line) for line in fh]
        # One record per round trip that ran: none for a mode that skips here (safe_globals before torch 2.5).
        expected = [("weights_only_false", True), ("safe_globals", True), ("default", not DEFAULT_WEIGHTS_ONLY)]
        self.assertEqual(
            [(r["mode"], r["loaded"]) for r in records],
            [(mode, loaded) for mode, loaded in expected if mode not in MODE_SKIPS],
        )
        self.assertTrue(all(r["test"].endswith("Inner.test_all") for r in records))

    def test_an_empty_golden_record_in_either_form(self):
        # A checkpoint that needs nothing: "" (0.1.0's form), or the one empty line records pinned before.
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_empty_string(self):
                self.assertRequiredGlobalsExpectedInline({"w": torch.ones(2)}, "")

            def test_one_empty_line(self):
                self.assertRequiredGlobalsExpectedInline(
                    {"w": torch.ones(2)},
                    """\

""",
                )

            def test_two_empty_lines_fail(self):
                self.assertRequiredGlobalsExpectedInline({"w": torch.ones(2)}, "\n\n")

        with mock.patch.dict(os.environ, {"EXPECTTEST_ACCEPT": ""}):
            result, out = run_inner(Inner)
        self.assertEqual(result.testsRun, 3)
        self.assertEqual(result.errors, [], out)
        self.assertEqual([t.id().rsplit(".", 1)[1] for t, _ in result.failures], ["test_two_empty_lines_fail"], out)

    def test_seed_module_expected_inline(self):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_pinned(self):
                # Before torch 2.6 the record starts with builtins.set (not on torch's allowlist there).
                module_lines = "".join(f"{g}\n" for g in MODULE_GLOBALS)
                self.assertRequiredGlobalsExpectedInline(
                    tiny_qlinear(),
                    module_lines
                    + """\
torch.ScriptObject
torch.ao.nn.sparse.quantized.dynamic.linear.Linear
torch.ao.nn.sparse.quantized.linear.LinearPackedParams
""",
                )

            def test_wrong_pin_fails(self):
                self.assertRequiredGlobalsExpectedInline(
                    TinyNet(),
                    """\
something.Else
""",
                )

        with mock.patch.dict(os.environ, {"EXPECTTEST_ACCEPT": ""}):
            result, out = run_inner(Inner)
        self.assertEqual(result.testsRun, 2)
        self.assertEqual([t.id().rsplit(".", 1)[1] for t, _ in result.failures], ["test_wrong_pin_fails"], out)
        self.assertIn("EXPECTTEST_ACCEPT=1", result.failures[0][1])
        self.assertEqual(SEED_GLOBALS, sorted(SEED_GLOBALS))


class TestExpectAccept(unittest.TestCase):
    def test_accept_rewrites_golden_record(self):
        source = textwrap.dedent('''
            import unittest
            from test.helpers.roundtrip_fixtures import TinyNet
            from torch_serial_testing import SerializationRoundTripTestCase

            class TestPin(SerializationRoundTripTestCase, unittest.TestCase):
                def test_pin(self):
                    self.assertRequiredGlobalsExpectedInline(TinyNet(), """\\
            wrong
            """)
            ''')
        import subprocess
        import sys

        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "test_pin.py")
            with open(path, "w") as fh:
                fh.write(source)
            env = child_env({"EXPECTTEST_ACCEPT": "1"}, path_first=(ROOT,), drop=())
            proc = subprocess.run(
                [sys.executable, "-m", "unittest", "test_pin"], cwd=d, env=env, capture_output=True, text=True
            )
            self.assertEqual(proc.returncode, 0, proc.stderr)
            with open(path) as fh:
                self.assertIn("".join(f"{g}\n" for g in TINY_GLOBALS), fh.read())  # the record for this torch


class TestSnippet(unittest.TestCase):
    """Snippets are printed for files the user did not produce: the tools' business, not the facade's."""

    def test_the_facade_names_the_tools(self):
        import torch_serial_testing

        for name in ("safe_globals_snippet", "refusal_notes", "judge_global", "dangerous_reason"):
            with self.subTest(name), self.assertRaises(AttributeError) as cm:
                getattr(torch_serial_testing, name)
            self.assertEqual(
                str(cm.exception),
                f"{name} judges checkpoints from strangers and lives in the tools since 0.2.0: "
                f"from torch_serial_testing.tools import {name}",
            )

    def test_context_or_process_wide_form(self):
        from torch_serial_testing.tools import safe_globals_snippet

        with_context = safe_globals_snippet(
            ["test.helpers.roundtrip_fixtures.TinyNet", "torch.ScriptObject"], context=True
        )
        self.assertIn(
            "with torch.serialization.safe_globals([TinyNet, torch.ScriptObject]):\n"
            "    obj = torch.load(f, weights_only=True)",
            with_context,
        )
        without = safe_globals_snippet(["test.helpers.roundtrip_fixtures.TinyNet"], context=False)
        self.assertIn(
            "torch.serialization.add_safe_globals([TinyNet])\nobj = torch.load(f, weights_only=True)", without
        )
        self.assertNotIn("with torch.serialization.safe_globals", without)
        detected = safe_globals_snippet(["test.helpers.roundtrip_fixtures.TinyNet"])
        self.assertEqual(
            detected,
            with_context.replace(", torch.ScriptObject", "")
            if hasattr(torch.serialization, "safe_globals")
            else without,
        )


class TestClassCreationErrors(unittest.TestCase):
    def test_unimportable_global(self):
        with self.assertRaisesRegex(RoundTripConfigError, "'nowhere.Missing' is not importable"):
            type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": ("nowhere.Missing",)})

    def test_string_global_resolves(self):
        cls = type(
            "Ok",
            (SerializationRoundTripTestCase, unittest.TestCase),
            {"safe_globals": ("test.helpers.roundtrip_fixtures.TinyNet",)},
        )
        self.assertIs(cls._tst_safe_globals[0].obj, TinyNet)

    def test_what_can_never_be_a_safe_global_is_refused(self):
        # The small check on an author's declaration: known code-running callables (by their own
        # identity, whatever name they are declared under), modules, objects not importable under the
        # name they pickle by.  The full trust policy is the tools' (inspect, audit), never applied here.
        runs_code = "runs code or reaches the system when a pickle calls it"
        cases = [
            (
                os.system,
                f"refusing to allowlist {os.system.__module__}.system: {os.system.__module__}.system {runs_code}",
            ),
            (eval, f"refusing to allowlist builtins.eval: builtins.eval {runs_code}"),
            ("builtins.exec", f"refusing to allowlist builtins.exec: builtins.exec {runs_code}"),
            (getattr, f"refusing to allowlist builtins.getattr: builtins.getattr {runs_code}"),
            ("subprocess.Popen", f"refusing to allowlist subprocess.Popen: subprocess.Popen {runs_code}"),
            (functools.partial, f"refusing to allowlist functools.partial: functools.partial {runs_code}"),
            (torch.load, f"refusing to allowlist torch.serialization.load: torch.serialization.load {runs_code}"),
            ((eval, "x.Safe"), f"refusing to allowlist x.Safe: builtins.eval {runs_code}"),
            (
                UnsafeCallable(eval, reason="it is needed"),
                f"refusing to allowlist builtins.eval: builtins.eval {runs_code}",
            ),
            (
                "torch.nn",
                "refusing to allowlist torch.nn: it is the module torch.nn: a pickle names globals in modules, "
                "never a module itself",
            ),
            (
                NotUnderItsName,
                f"refusing to allowlist {__name__}.Elsewhere: safe global '{__name__}.Elsewhere' is not importable; "
                "fix the spelling ('package.module.Name') or declare the object itself",
            ),
            (
                AnAlias,
                f"refusing to allowlist {__name__}.TheOriginal: {__name__}.TheOriginal resolves to another object: "
                "a pickle names it by its module and qualified name, so declare it as (TheOriginal, '<the name the "
                "checkpoint uses>')",
            ),
        ]
        for bad, message in cases:
            with self.subTest(bad=bad), self.assertRaises(RoundTripConfigError) as cm:
                type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": (bad,)})
            self.assertEqual(str(cm.exception), message)

    def test_any_class_or_function_may_be_declared(self):
        # Trusted as torch trusts them: classes of the author's and of torch's (torch.testing's TwoTensor,
        # torch.jit.CompilationUnit included), plain functions, (object, 'module.Name') pairs as stated.
        from torch.testing._internal.two_tensor import TwoTensor

        declared = (
            TwoTensor,
            torch.jit.CompilationUnit,
            tst_scan,
            (TinyNet, "elsewhere.TinyNet"),
            UnsafeCallable(torch.nn.functional.relu, reason="a hook"),
        )
        cls = type("Ok", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": declared})
        self.assertEqual(
            [(sg.name, sg.explicit_name) for sg in cls._tst_safe_globals],
            [
                ("torch.testing._internal.two_tensor.TwoTensor", False),
                ("torch.jit.CompilationUnit", False),
                (f"{__name__}.tst_scan", False),
                ("elsewhere.TinyNet", True),
                ("torch.nn.functional.relu", False),
            ],
        )
        self.assertEqual(cls._tst_safe_globals[3].torch_entry, (TinyNet, "elsewhere.TinyNet"))
        self.assertEqual(cls._tst_safe_globals[4].unsafe_reason, "a hook")

    def test_safe_globals_must_be_a_sequence(self):
        with self.assertRaisesRegex(RoundTripConfigError, "must be a tuple or list"):
            type(
                "Bad",
                (SerializationRoundTripTestCase, unittest.TestCase),
                {"safe_globals": "test.helpers.roundtrip_fixtures.TinyNet"},
            )

    def test_unknown_mode(self):
        with self.assertRaisesRegex(RoundTripConfigError, "unknown load mode 'pickle'"):
            type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"load_modes": ("pickle",)})

    def test_make_module_not_callable(self):
        with self.assertRaisesRegex(RoundTripConfigError, "make_module must be a method"):
            type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"make_module": 3})


class TheOriginal:
    pass


#: Pickled as ``TheOriginal`` (its qualified name), declared under this one: resolves to another object.
AnAlias = type("TheOriginal", (), {"__module__": __name__})


class NotUnderItsName:
    pass


NotUnderItsName.__qualname__ = "Elsewhere"  # pickled as <module>.Elsewhere, which does not exist


def torch_refusal(obj, allow):
    """torch's message refusing *obj* (saved here) weights-only with *allow* allowlisted; None if it loads."""
    import warnings

    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with allowlisted(list(allow)):  # the safe_globals context, or the registry before torch 2.5
                torch.load(buf, weights_only=True)
    except Exception as e:  # noqa: BLE001 - torch's answer
        return str(e)
    return None


class TestWeightsOnlyBlocker(unittest.TestCase):
    """A checkpoint no allowlist can make load weights-only: the safe_globals mode fails at once with
    torch's reason; the other modes keep their predicted outcomes (issue 12)."""

    def test_safe_globals_mode_fails_with_torchs_reason(self):
        import collections

        cases = {
            # torch 2.8 makes no SETITEM target check: there it loads once allowlisted
            "defaultdict": (
                lambda: {"d": collections.defaultdict(list, x=[1])},
                (collections.defaultdict, list),
                "Can only SETITEM for dict",
                lambda loaded: loaded["d"]["x"] == [1],
            ),
            # the APPEND(S) target check is in every torch with a weights-only unpickler; APPENDS
            # says "Can only extend lists" except on torch 2.14.1 ("Can only append to lists")
            "deque": (
                lambda: {"d": collections.deque([1, 2])},
                (collections.deque,),
                "lists, but got <class 'collections.deque'>",
                lambda loaded: list(loaded["d"]) == [1, 2],
            ),
        }
        for kind, (make, needs, reason, check) in cases.items():
            with self.subTest(kind):
                if SAFE_GLOBALS_SKIP is None:
                    refusal = torch_refusal(make(), needs)
                    if refusal is None:
                        self.skipTest(
                            f"torch {torch.__version__} loads a {kind} weights-only once its globals "
                            "are allowlisted (its unpickler makes no such check)"
                        )
                    self.assertIn(reason, refusal)
                    # the library must name torch's whole reason, in this torch's words
                    at = refusal.index(reason)
                    start = refusal.rfind("Can only", 0, at + len("Can only"))
                    end = refusal.find("\n", at)
                    self.assertGreaterEqual(start, 0, refusal)
                    reason = refusal[start : end if end >= 0 else len(refusal)].strip()
                self._run_blocked(make, reason, check)

    def _run_blocked(self, make, reason, check):
        class Inner(SerializationRoundTripTestCase, unittest.TestCase):
            def test_blocked(self):
                self.round_trip(make(), mode="safe_globals", safe_globals=())

            def test_full_load_still_loads(self):
                self.assertTrue(check(self.round_trip(make(), mode="weights_only_false")))

        result, out = run_inner(Inner)
        if SAFE_GLOBALS_SKIP:
            self.assertEqual(len(result.skipped), 1, out)
            return
        self.assertEqual(len(result.failures), 1, out)
        message = result.failures[0][1]
        self.assertIn("test_blocked", str(result.failures[0][0]))
        self.assertIn("cannot load weights-only, whatever is allowlisted", message)
        self.assertIn(reason, message)  # torch's own reason
        self.assertIn("round_trip_dims(load_modes=", message)
        self.assertEqual(result.errors, [])


if __name__ == "__main__":
    unittest.main()
