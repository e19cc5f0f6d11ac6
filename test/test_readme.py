"""README.rst is executable documentation: its example runs, its commands match CI, its API is complete."""

import collections
import os
import re
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch_serial_testing
from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS, MODULE_GLOBALS, default_outcome
from test.helpers.python_compat import verbose_ids, warnings_by_test
from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme():
    with open(os.path.join(ROOT, "README.rst"), encoding="utf-8") as fh:
        return fh.read()


def code_blocks(text, language):
    pattern = re.compile(r"^\.\. code-block:: %s\n\n((?:(?:   .*)?\n)+)" % language, re.M)
    return [textwrap.dedent(m.group(1)) for m in pattern.finditer(text)]


def run_example(name, source, script=False):
    """Write a README example to a fresh directory as NAME.py and run it with ``unittest -v``."""
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, f"{name}.py"), "w") as fh:
            fh.write(source)
        env = child_env(drop=("TORCH_FORCE_", "EXPECTTEST_"))
        args = [f"{name}.py", "-v"] if script else ["-m", "unittest", name, "-v"]
        return subprocess.run([sys.executable, *args], cwd=d, env=env, capture_output=True, text=True)


# Plain-torch twins of the README examples: the same test classes and names, the same saves and
# loads, without the library.  What ``unittest -v`` shows of warnings must be the same for both
# (issue 25: the library quiets nothing and never makes Python forget a warning it showed once).
_TWIN_HELPERS = textwrap.dedent("""
    import io, pickle, unittest, warnings
    import torch

    DEFAULT_WEIGHTS_ONLY = {default_weights_only!r}

    def engine(name):
        class Engine:
            def __enter__(self):
                if name not in torch.backends.quantized.supported_engines:
                    raise unittest.SkipTest(f"quantized engine {{name}} is not supported here")
                self.previous = torch.backends.quantized.engine
                torch.backends.quantized.engine = name

            def __exit__(self, *exc):
                torch.backends.quantized.engine = self.previous
        return Engine()

    def round_trip(test, obj, mode, safe_globals, rejected_by_default):
        '''The library's three torch.load calls; None where the bare load rejects, as predicted.'''
        buf = io.BytesIO()
        torch.save(obj, buf)
        buf.seek(0)
        if mode == "weights_only_false":
            return torch.load(buf, weights_only=False)
        if mode == "safe_globals":
            if not hasattr(torch.serialization, "safe_globals"):
                test.skipTest("torch.serialization.safe_globals is missing")
            with torch.serialization.safe_globals(list(safe_globals)):
                return torch.load(buf, weights_only=True)
        if rejected_by_default and DEFAULT_WEIGHTS_ONLY:
            with test.assertRaises(pickle.UnpicklingError):
                torch.load(buf)
            return None
        return torch.load(buf)

    def generate(cls, name, body, engines=("fbgemm", "qnnpack"), modes=("weights_only_false", "safe_globals", "default")):
        for e in engines:
            for mode in modes:
                def test(self, e=e, mode=mode):
                    with engine(e):
                        body(self, mode)
                setattr(cls, f"{{name}}_{{e}}_{{mode}}_cpu", test)
""")

TINYNET_TWIN = _TWIN_HELPERS + textwrap.dedent("""
    class TinyNet(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.ones(2, 3))

    class TestTinyNetCPU(unittest.TestCase):
        def test_required_globals_cpu(self):
            pass  # never loads

    def full_module(self, mode):
        original = TinyNet()
        loaded = round_trip(self, original, mode, [TinyNet, set], rejected_by_default=True)
        if loaded is not None:
            self.assertTrue(torch.equal(original.weight, loaded.weight))

    def state_dict(self, mode):
        original = TinyNet()
        state = round_trip(self, original.state_dict(), mode, [], rejected_by_default=False)
        fresh = TinyNet()
        fresh.load_state_dict(state)
        self.assertTrue(torch.equal(original.weight, fresh.weight))

    generate(TestTinyNetCPU, "test_round_trip", full_module)
    generate(TestTinyNetCPU, "test_state_dict", state_dict)
""")

QDYNAMIC_TWIN = _TWIN_HELPERS + textwrap.dedent("""
    from torch.ao.nn.quantized.dynamic import Linear as DynamicLinear
    from torch.ao.nn.quantized.modules.linear import LinearPackedParams

    def setUpModule():  # the example's ignore_warnings, for every test of the file (its only class)
        warnings.filterwarnings("ignore", r".*quantized tensor creation functions.*")

    class TestDynamicLinearCPU(unittest.TestCase):
        pass

    def make_module():
        float_linear = torch.nn.Linear(4, 3)
        float_linear.qconfig = torch.ao.quantization.default_dynamic_qconfig
        return DynamicLinear.from_float(float_linear)

    def module(self, mode):
        original = make_module()
        loaded = round_trip(self, original, mode, [DynamicLinear, LinearPackedParams, torch.ScriptObject, set],
                            rejected_by_default=True)
        if loaded is not None:
            self.assertIs(type(loaded), DynamicLinear)
            weight, bias = original._weight_bias()
            weight2, bias2 = loaded._weight_bias()
            self.assertTrue(torch.equal(weight.dequantize(), weight2.dequantize()) and torch.equal(bias, bias2))

    generate(TestDynamicLinearCPU, "test_round_trip", module)
""")


def assert_warnings_as_in_twin(test, name, proc, twin_source):
    """*proc* (a README example run with ``unittest -v``) shows exactly the warnings its plain
    twin shows: each in the same test, at the same location, as often."""
    twin = run_example(name, twin_source.format(default_weights_only=DEFAULT_WEIGHTS_ONLY))
    test.assertEqual(twin.returncode, 0, twin.stderr)
    test.assertEqual(verbose_ids(proc.stderr), verbose_ids(twin.stderr))  # the same tests, in the same order
    shown = warnings_by_test(proc.stderr)
    test.assertEqual(shown, warnings_by_test(twin.stderr), proc.stderr)
    # none of them raised by the library itself
    test.assertNotIn(os.sep + "torch_serial_testing" + os.sep, "".join(w for ws in shown.values() for w in ws))


class TestReadme(unittest.TestCase):
    def test_complete_example_runs(self):
        (example,) = [b for b in code_blocks(readme(), "python") if "test_tinynet.py" in b]
        # The golden record pins the required globals for the torch it was recorded on (current
        # torch); before torch 2.6 the record also holds builtins.set.  Pin this torch's record.
        needed = sorted(["test_tinynet.TinyNet", *MODULE_GLOBALS])
        pinned = '"""\\\ntest_tinynet.TinyNet\n"""'
        self.assertEqual(example.count(pinned), 1, "the README example's golden record changed")
        example = example.replace(pinned, '"""\\\n' + "".join(f"{g}\n" for g in needed) + '"""')
        proc = run_example("test_tinynet", example)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 13 tests", proc.stderr)
        # @no_round_trip_dims: one test_required_globals, with neither a mode nor an engine
        self.assertEqual(
            re.findall(r"^(test_required_globals\w*) \(", proc.stderr, re.M), ["test_required_globals_cpu"]
        )
        # Warnings exactly as in the same tests without the library (none from torch 2.6 on; before,
        # torch's FutureWarning of a bare torch.load, shown once).
        assert_warnings_as_in_twin(self, "test_tinynet", proc, TINYNET_TWIN)
        # Two full-module default round trips: rejected where a bare torch.load is weights-only;
        # two state_dict default round trips: loaded everywhere.
        rejected = 2 if DEFAULT_WEIGHTS_ONLY else 0
        self.assertEqual(proc.stderr.count("default: rejected as expected"), rejected, proc.stderr)
        self.assertEqual(proc.stderr.count("default: loaded as expected"), 4 - rejected, proc.stderr)
        # ... with the exact summaries for this torch (both the same before torch 2.6).
        full, state_dict = default_outcome(needed), default_outcome([])
        for summary, count in collections.Counter([full, full, state_dict, state_dict]).items():
            self.assertEqual(proc.stderr.count(summary), count, proc.stderr)
        self.assertIn("test_round_trip_fbgemm_default_cpu (test_tinynet.TestTinyNetCPU", proc.stderr)

    def test_complete_example_as_a_script_keeps_its_golden_record(self):
        (example,) = [b for b in code_blocks(readme(), "python") if "test_tinynet.py" in b]
        needed = sorted(["test_tinynet.TinyNet", *MODULE_GLOBALS])
        example = example.replace(
            '"""\\\ntest_tinynet.TinyNet\n"""', '"""\\\n' + "".join(f"{g}\n" for g in needed) + '"""'
        )
        example += "\nif __name__ == '__main__':\n    unittest.main()\n"
        proc = run_example("test_tinynet", example, script=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("test_required_globals_cpu (__main__.TestTinyNetCPU", proc.stderr)

    def test_quantized_example_compares_with_allow_subclasses(self):
        (example,) = [b for b in code_blocks(readme(), "python") if "test_qdynamic.py" in b]
        proc = run_example("test_qdynamic", example)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 6 tests", proc.stderr)
        # unittest -v output: outcomes, and exactly the warnings the same tests show without the library
        # (torch's TypedStorage deprecation, once, where torch 2.13 shows it)
        assert_warnings_as_in_twin(self, "test_qdynamic", proc, QDYNAMIC_TWIN)
        if "qnnpack" not in torch_serial_testing.supported_qengines():
            return
        # The option is what makes it pass: without it, the qnnpack tests that load fail as the README says.
        strict = example.replace(
            "self.assertRoundTripEqual(original, loaded, allow_subclasses=True)",
            "self.assertRoundTripEqual(original, loaded)",
        )
        self.assertNotEqual(strict, example)
        proc = run_example("test_qdynamic", strict)
        loading = 2 - (1 if "safe_globals" in MODE_SKIPS else 0) - (0 if DEFAULT_WEIGHTS_ONLY else -1)
        skipped = 2 * len(MODE_SKIPS)  # a load mode this torch lacks, for each engine
        self.assertIn(f"FAILED (failures={loading}" + (f", skipped={skipped})" if skipped else ")"), proc.stderr)
        self.assertIn(
            "round trip mismatch at .state_dict()['_packed_params._packed_params'][1]: tensor class "
            "Tensor != expected Parameter",
            proc.stderr,
        )

    def test_quick_start_is_a_venv_then_two_commands_and_ci_runs_them(self):
        venv, console = code_blocks(readme(), "console")[:2]
        self.assertEqual(venv.strip(), "python3 -m venv .venv && . .venv/bin/activate")
        commands = [line for line in console.splitlines() if line.strip()]
        self.assertEqual(len(commands), 2)
        with open(os.path.join(ROOT, ".ci", "run"), encoding="utf-8") as fh:
            ci = fh.read()
        self.assertIn("\npython3 -m venv .ci-venv\n", ci)  # a fresh venv, as the Quick start's
        self.assertIn("\n" + commands[1] + "\n", ci)
        self.assertIn('pip install --quiet "torch==2.13.0"', ci)
        self.assertIn('pip install --quiet -e ".[test]"', ci)
        self.assertIn('"torch==2.13.0" -e ".[test]"', commands[0])

    def test_renders_without_warnings(self):
        try:
            import docutils.core
        except ImportError:
            self.skipTest("docutils is not installed (pip install -e '.[test]')")
        import io

        errors = io.StringIO()
        # Parsing reports every problem; no writer is needed (and publish_string's writer_name
        # argument is deprecated since docutils 0.22).
        docutils.core.publish_doctree(readme(), settings_overrides={"report_level": 2, "warning_stream": errors})
        self.assertEqual(errors.getvalue(), "")

    def test_benchmark_results_are_the_committed_ones(self):
        with open(os.path.join(ROOT, "bench", "RESULTS.rst"), encoding="utf-8") as fh:
            self.assertIn(fh.read(), readme())

    def test_every_public_name_is_documented(self):
        text = readme()
        missing = [name for name in torch_serial_testing.__all__ if f"``{name}" not in text]
        self.assertEqual(missing, [])


if __name__ == "__main__":
    unittest.main()
