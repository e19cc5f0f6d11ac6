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
from roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS, MODULE_GLOBALS, default_outcome
from subprocess_env import child_env

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
        self.assertEqual(re.findall(r"^(test_required_globals\w*) \(", proc.stderr, re.M), ["test_required_globals_cpu"])
        self.assertNotIn("Warning", proc.stderr)
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
        example = example.replace('"""\\\ntest_tinynet.TinyNet\n"""', '"""\\\n' + "".join(f"{g}\n" for g in needed) + '"""')
        example += "\nif __name__ == '__main__':\n    unittest.main()\n"
        proc = run_example("test_tinynet", example, script=True)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("test_required_globals_cpu (__main__.TestTinyNetCPU", proc.stderr)

    def test_quantized_example_compares_with_allow_subclasses(self):
        (example,) = [b for b in code_blocks(readme(), "python") if "test_qdynamic.py" in b]
        proc = run_example("test_qdynamic", example)
        self.assertEqual(proc.returncode, 0, proc.stderr)
        self.assertIn("Ran 6 tests", proc.stderr)
        self.assertNotIn("Warning", proc.stderr)  # unittest -v output: outcomes only
        if "qnnpack" not in torch_serial_testing.supported_qengines():
            return
        # The option is what makes it pass: without it, the qnnpack tests that load fail as the README says.
        strict = example.replace("self.assertRoundTripEqual(original, loaded, allow_subclasses=True)",
                                 "self.assertRoundTripEqual(original, loaded)")
        self.assertNotEqual(strict, example)
        proc = run_example("test_qdynamic", strict)
        loading = 2 - (1 if "safe_globals" in MODE_SKIPS else 0) - (0 if DEFAULT_WEIGHTS_ONLY else -1)
        skipped = 2 * len(MODE_SKIPS)  # a load mode this torch lacks, for each engine
        self.assertIn(f"FAILED (failures={loading}" + (f", skipped={skipped})" if skipped else ")"), proc.stderr)
        self.assertIn("round trip mismatch at .state_dict()['_packed_params._packed_params'][1]: tensor class "
                      "Tensor != expected Parameter", proc.stderr)

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
