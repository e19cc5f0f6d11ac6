"""The ports run under pytorch's ``instantiate_device_type_tests`` (as this suite collects them) and
under the library's ``instantiate_round_trip_tests``: the same test ids, every variant run, under
unittest and pytest."""

import os
import re
import subprocess
import sys
import unittest

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP
from test.helpers.subprocess_env import child_env
from test.ports._instantiate import ENV, PYTORCH_COPIES_METHODS, pytorch_subclasses_the_generic_class

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORTS = ("test_pruning_serialization", "test_lr_scheduler_state", "test_observer_serialization")
FILES = [f"test/ports/{name}.py" for name in PORTS]


def _run(args, instantiation):
    env = child_env({ENV: instantiation, "PYTHONDONTWRITEBYTECODE": "1"}, path_first=(ROOT,))
    proc = subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900, check=False
    )
    return proc


def _mode_skipped(ids):
    """The ids of *ids* whose load mode skips on this torch (safe_globals before torch 2.5), in order."""
    return [i for i in ids if SAFE_GLOBALS_SKIP and "_safe_globals_" in i]


class TestBothInstantiations(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.ids = {}
        cls.pytorch = pytorch_subclasses_the_generic_class()
        for instantiation in ("pytorch", "library"):
            proc = _run(["-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *FILES], instantiation)
            assert proc.returncode == 0, proc.stdout + proc.stderr
            cls.ids[instantiation] = sorted(line for line in proc.stdout.splitlines() if "::" in line)

    def test_same_ids_both_ways(self):
        if not self.pytorch:
            self.skipTest(PYTORCH_COPIES_METHODS)
        self.assertEqual(self.ids["pytorch"], self.ids["library"])
        names = [i.rsplit("::", 1)[1] for i in self.ids["library"]]
        # every variant exists: @swap's both, @parametrize's each, @optims' optimizers, engines, modes
        for expected in (
            "test_nested_helper_state_dict_swap_True_default_cpu",
            "test_nested_helper_state_dict_swap_False_safe_globals_cpu",
            "test_pruning_serialization_state_dict_amount_0_3_weights_only_false_cpu",
            "test_optimizer_and_scheduler_resume_Adam_safe_globals_cpu_float32",
            "test_scheduler_state_dict_kind_multistep_default_cpu",
            "test_observer_state_dict_kind_histogram_qnnpack_cpu",
            "test_fq_serializable_per_channel_True_fbgemm_default_cpu",
        ):
            self.assertIn(expected, names)
        self.assertEqual(len(names), 2 * 3 + 3 * 2 + 3 + 3 * 3 + 2 * 3 + 3 * 2 + 2 * 2 * 3)

    def test_every_variant_runs_under_unittest_with_the_library(self):
        # (-W ignore: a warning printed between a test's name and its status would split its line)
        proc = _run(["-W", "ignore", "-m", "unittest", "-v", *(f"test.ports.{name}" for name in PORTS)], "library")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        # every test, and each once (a subtest's line names its test again; a test's line may start after
        # the outcome the previous test printed)
        ran = sorted(set(re.findall(r"\b(test_\w+) \(test\.ports\.", proc.stderr)))
        self.assertEqual(ran, sorted(i.rsplit("::", 1)[1] for i in self.ids["library"]))
        skipped = sorted(re.findall(r"^(test_\w+) \(.*?\) \.\.\. skipped", proc.stderr, re.MULTILINE))
        self.assertEqual(skipped, _mode_skipped(ran), "skipped here: " + ", ".join(skipped))

    def test_every_variant_runs_under_pytest_with_the_library(self):
        proc = _run(["-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "-n", "0", *FILES], "library")
        self.assertEqual(proc.returncode, 0, proc.stdout[-3000:])
        # with the plugin loaded (installed: its entry point) an expected rejection's -rA line reads
        # "PASSED (rejected as predicted: ...) <nodeid>" or "PASSED (2 of 3 round trips rejected ...) <nodeid>"
        status = r"(?:\((?:\d+ of \d+ round trips )?rejected as predicted: .*\) )?"
        passed = sorted(re.findall(rf"^PASSED {status}(\S+::\S+)$", proc.stdout, re.MULTILINE))
        skipped = set(_mode_skipped(self.ids["library"]))
        self.assertEqual(passed, [i for i in self.ids["library"] if i not in skipped])

    def test_every_variant_runs_under_unittest_with_pytorch(self):
        if not self.pytorch:
            self.skipTest(PYTORCH_COPIES_METHODS)
        proc = _run(["-m", "unittest", *(f"test.ports.{name}" for name in PORTS)], "pytorch")
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn(f"Ran {len(self.ids['pytorch'])} tests", proc.stderr)
        self.assertNotIn("skipped", proc.stderr)


if __name__ == "__main__":
    unittest.main()
