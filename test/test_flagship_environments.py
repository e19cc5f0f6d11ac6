"""The flagship port (test/ao/sparsity/test_qlinear_packed_params.py) under each weights-only environment.

Each test runs the flagship file once in a subprocess (``python -m unittest -v``)
with one combination of the two ``TORCH_FORCE_*`` switches and
``TORCH_SERIAL_TESTING_REPORT`` pointing at a temporary file, then checks per
generated test id what happened: which round trips loaded, which were rejected,
how many tests ran, the exit code.  The expected outcome of every id is
derived below from the load mode, the environment and what the checkpoint
needs -- not copied from a run.
"""

import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from torch_serial_testing.registry import torch_allowlist
from torch_serial_testing.modes import torch_default_weights_only

from test.helpers.roundtrip_fixtures import MODE_SKIPS, READS_FORCE_NO_WEIGHTS_ONLY
from test.helpers.python_compat import expected_tests_run
from test.helpers.subprocess_env import child_env

ROOT = Path(__file__).resolve().parent.parent
FLAGSHIP_DIR = ROOT / "test" / "ao" / "sparsity"
FLAGSHIP_MODULE = "test_qlinear_packed_params"
GENERATED_CLASS = "TestQlinearPackedParamsCPU"

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"

MODES = ("weights_only_false", "safe_globals", "default")
ENGINES = ("fbgemm", "qnnpack")
WEIGHT_CASES = 3  # per_tensor_small, per_channel_small, per_tensor_large
# What a full-module checkpoint of the sparse Linear needs beyond torch's allowlist (sorted, as
# the rejection summaries list them): its classes and torch.ScriptObject on every torch, plus
# builtins.set (nn.Module._non_persistent_buffers_set) where torch's allowlist lacks it (< 2.6).
MODULE_GLOBALS = tuple(
    sorted(
        {
            "torch.ScriptObject",
            "torch.ao.nn.sparse.quantized.dynamic.linear.Linear",
            "torch.ao.nn.sparse.quantized.linear.LinearPackedParams",
        }
        | ({"builtins.set"} - torch_allowlist())
    )
)
# Whether torch.load reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6); before, it
# is ignored: no forced full load, no warning, and no error when both switches are set
# (observed on a real torch.load).
TORCH_READS_FORCE_NO = READS_FORCE_NO_WEIGHTS_ONLY
# A bare torch.load here without any switch, and why (weights-only since torch 2.6).
TORCH_DEFAULT, TORCH_DEFAULT_WHY = torch_default_weights_only()


def both_forced_is_an_error(env):
    return bool(env.get(FORCE_WO) and env.get(FORCE_NO_WO)) and TORCH_READS_FORCE_NO


def effective_weights_only(mode, env):
    """torch.load's precedence: force-on beats everything, then an explicit argument, then force-off."""
    if env.get(FORCE_WO):
        return True
    if mode == "weights_only_false":
        return False
    if mode == "safe_globals":
        return True
    if env.get(FORCE_NO_WO) and TORCH_READS_FORCE_NO:
        return False
    return TORCH_DEFAULT


def round_trip_tests():
    """test id -> (what it saves: 'module' or 'state_dict', load mode, round trips per run)."""
    tests = {}
    for mode in MODES:
        for engine in ENGINES:
            tests[f"test_qlinear_packed_params_{engine}_{mode}_cpu"] = ("module", mode, WEIGHT_CASES)
            tests[f"test_qlinear_packed_params_state_dict_{engine}_{mode}_cpu"] = ("state_dict", mode, WEIGHT_CASES)
        for save, load in ((a, b) for a in ENGINES for b in ENGINES if a != b):
            tests[f"test_qlinear_packed_params_cross_compatibility_{save}_to_{load}_{mode}_cpu"] = ("module", mode, 1)
    return {f"{FLAGSHIP_MODULE}.{GENERATED_CLASS}.{name}": spec for name, spec in tests.items()}


def skipped_tests():
    """test id -> the library's skip reason, for the round-trip tests whose mode this torch cannot run
    (the safe_globals mode before torch 2.5): they skip in every environment and report nothing."""
    return {test_id: MODE_SKIPS[mode] for test_id, (_, mode, _) in round_trip_tests().items() if mode in MODE_SKIPS}


def running_tests():
    """The round-trip tests that run here: test id -> (saved, mode, round trips per run)."""
    return {test_id: spec for test_id, spec in round_trip_tests().items() if spec[1] not in MODE_SKIPS}


NO_LOAD_TESTS = tuple(
    f"{FLAGSHIP_MODULE}.TestQlinearPackedParamsCheckpointFacts.{name}"  # a plain class: no mode, engine or device
    for name in ("test_required_globals", "test_full_module_state_dict_load_is_broken_in_torch")
)


def expected_load(saved, mode, env):
    """(loads, weights_only) for one round trip."""
    weights_only = effective_weights_only(mode, env)
    # A state_dict needs nothing beyond torch's allowlist; the module needs MODULE_GLOBALS,
    # which only the safe_globals mode declares (set included where torch needs it).
    loads = not weights_only or saved == "state_dict" or mode == "safe_globals"
    return loads, weights_only


def id_in_verbose_output(test_id):
    """A regex for how unittest -v names *test_id*: ``test_x (module.Class.test_x)`` since Python
    3.11, ``test_x (module.Class)`` before."""
    owner, name = test_id.rsplit(".", 1)
    return rf"{re.escape(name)} \({re.escape(owner)}(?:\.{re.escape(name)})?\)"


def ids_in_verbose_output(out, prefix=r"(?:^|\.\.\. )"):
    """Every test id unittest -v printed (after *prefix*), in either Python's format.  Before 3.11 a
    test whose subtests failed ends its line with nothing, so the next id follows its " ... "."""
    ids = set()
    for name, owner in re.findall(prefix + r"(test\w+) \(([\w.]+)\)", out, re.M):
        ids.add(owner if owner.endswith("." + name) else f"{owner}.{name}")
    return ids


def run_flagship(extra_env):
    env = child_env(drop=("TORCH_FORCE_", REPORT_ENV, "EXPECTTEST_ACCEPT"))
    env.update(extra_env)
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env[REPORT_ENV] = str(report)
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", FLAGSHIP_MODULE],
            cwd=FLAGSHIP_DIR,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=900,  # a hang guard only
        )
        records = [json.loads(line) for line in report.read_text().splitlines()] if report.exists() else []
    return proc, records


class TestFlagshipEnvironments(unittest.TestCase):
    maxDiff = None

    def run_and_check_ids(self, extra_env):
        proc, records = run_flagship(extra_env)
        out = proc.stdout + proc.stderr
        self.addTypeEqualityFunc(str, self.assertMultiLineEqual)
        ran = re.findall(r"^Ran (\d+) tests? in ", out, re.M)
        expected_ids = set(round_trip_tests()) | set(NO_LOAD_TESTS)
        self.assertEqual(ran, [str(expected_tests_run(len(expected_ids), len(skipped_tests())))], out[-3000:])
        self.assertEqual(ids_in_verbose_output(out), expected_ids)
        # A test whose mode this torch cannot run says so next to its id (verbose output may put
        # the docstring's first line in between), with the library's exact reason.
        for test_id, reason in skipped_tests().items():
            self.assertRegex(
                out, rf"{id_in_verbose_output(test_id)}(?:\n[^\n]*)? \.\.\. skipped {re.escape(repr(reason))}\n"
            )
        self.assertEqual(len(re.findall(r" \.\.\. skipped ", out)), len(skipped_tests()), out[-5000:])
        return proc, records, out

    def check_environment(self, extra_env):
        proc, records, out = self.run_and_check_ids(extra_env)
        self.assertEqual(proc.returncode, 0, out[-5000:])
        skipped = len(skipped_tests())
        self.assertRegex(out, rf"\nOK \(skipped={skipped}\)\n" if skipped else r"\nOK\n")
        by_test = {}
        for record in records:
            by_test.setdefault(record["test"], []).append(record)
        expected = running_tests()
        self.assertEqual(set(by_test), set(expected), "tests that reported round trips")
        for test_id, (saved, mode, count) in expected.items():
            with self.subTest(test=test_id):
                loads, weights_only = expected_load(saved, mode, extra_env)
                got = by_test[test_id]
                self.assertEqual(len(got), count)
                for record in got:
                    self.assertEqual(record["mode"], mode)
                    self.assertIs(record["loaded"], loads, record["summary"])
                    self.assertIs(record["weights_only"], weights_only, record["summary"])
                    verb = "loaded" if loads else "rejected"
                    self.assertTrue(record["summary"].startswith(f"{mode}: {verb} as expected ("), record["summary"])
                    if not loads:
                        self.assertIn(f"{', '.join(MODULE_GLOBALS)} not allowlisted", record["summary"])
                    if extra_env.get(FORCE_WO) and mode != "safe_globals":
                        self.assertIn(f"forced by {FORCE_WO}=", record["summary"])
                    # verbose output shows the outcome next to the test
                    self.assertIn(record["summary"] + " ... ", out)
        return records

    def test_default_environment(self):
        records = self.check_environment({})
        # the seed failure of the upstream test (bare torch.load), now an asserted, explained rejection
        rejected = {r["summary"] for r in records if not r["loaded"]}
        if TORCH_DEFAULT:
            self.assertEqual(
                rejected,
                {
                    f"default: rejected as expected (weights_only=True {TORCH_DEFAULT_WHY}; "
                    f"{', '.join(MODULE_GLOBALS)} not allowlisted)"
                },
            )
        else:  # torch < 2.6: a bare torch.load fully unpickles, so nothing is rejected
            self.assertEqual(rejected, set())

    def test_force_no_weights_only(self):
        records = self.check_environment({FORCE_NO_WO: "1"})
        self.assertTrue(all(r["loaded"] for r in records))

    def test_force_weights_only(self):
        records = self.check_environment({FORCE_WO: "1"})
        self.assertTrue(any(not r["loaded"] and r["mode"] == "weights_only_false" for r in records))

    def test_both_forced_fail_with_one_clear_message(self):
        env = {FORCE_WO: "1", FORCE_NO_WO: "1"}
        if not both_forced_is_an_error(env):
            # A torch that ignores TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (< 2.6) raises nothing: every
            # load runs weights-only, exactly as with TORCH_FORCE_WEIGHTS_ONLY_LOAD alone.
            records = self.check_environment(env)
            self.assertTrue(all(r["weights_only"] for r in records))
            self.assertTrue(any(not r["loaded"] and r["mode"] == "weights_only_false" for r in records))
            return
        proc, records, out = self.run_and_check_ids(env)
        self.assertEqual(proc.returncode, 1, out[-5000:])
        self.assertEqual(records, [], "no load may be attempted when both switches are set")
        message = (
            f"{FORCE_WO}=1 and {FORCE_NO_WO}=1 are both set: torch.load raises RuntimeError on every "
            "load. Unset one of them."
        )
        # Every failure report (one per failing test or subtest) carries that message.
        blocks = [b for b in re.split(r"^={50,}\n", out, flags=re.M) if re.match(r"(ERROR|FAIL): ", b)]
        self.assertTrue(blocks, out[-5000:])
        failed = set()
        for block in blocks:
            (test_id,) = ids_in_verbose_output(block.split("\n", 1)[0], prefix=r"^(?:ERROR|FAIL): ")
            failed.add(test_id)
            self.assertIn(message, block)
        self.assertEqual(failed, set(running_tests()))
        for test_id in NO_LOAD_TESTS:
            self.assertRegex(out, rf"{id_in_verbose_output(test_id)} \.\.\. ok\n")
        self.assertRegex(out, r"\nFAILED \(")


if __name__ == "__main__":
    unittest.main()
