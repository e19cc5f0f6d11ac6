"""The multi-rank ports (:mod:`test.paths.test_distributed_ports`) under unittest and pytest, in each environment
state (no switch, ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1``, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), each run a child
process reporting its loads (``TORCH_SERIAL_TESTING_REPORT``, written by each test's parent process for every load
of every rank).  What each load does is derived from the mode and the switches: torch allowlists DTensor's classes
and a sharded state dict needs nothing more, so every load loads, weights-only or not as torch decides.  The
two four-rank tests run in every state under unittest, and under pytest in the default state (two cores: each of
them starts four processes).  A port this torch cannot run (no public DTensor, ``_StridedShard`` or FSDP2, as the
ports' own probes say) is expected skipped, with the ports' reason, and to load nothing."""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest
from collections import Counter

from test.helpers.subprocess_env import child_env
from test.paths.test_distributed_ports import NO_DTENSOR, NO_FSDP2, NO_STRIDED_SHARD
from torch_serial_testing.paths.distributed import unavailable

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE, FILE = "test.paths.test_distributed_ports", "test/paths/test_distributed_ports.py"
WO, NO_WO, REPORT = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_SERIAL_TESTING_REPORT"
MODES = ("weights_only_false", "safe_globals", "default")
PLACEMENTS_1D = 5
#: test id -> how many loads each rank makes in each mode (a test generated per mode makes one, in its own), and
#: why it skips on this torch (the ports' probe) or None
TESTS = {
    **{f"TestDTensorSaveLoadCPU.test_dtensor_save_load_world_size_2_{m}_cpu": (2, {m: 1}, NO_DTENSOR) for m in MODES},
    "TestDTensorPlacementsCPU.test_every_placement_1d_world_size_2_cpu": (
        2, dict.fromkeys(MODES, PLACEMENTS_1D), NO_STRIDED_SHARD
    ),
    "TestShardedStateDictCPU.test_model_and_optimizer_state_dict_world_size_2_cpu": (
        2, dict.fromkeys(MODES, 1), NO_FSDP2
    ),
}  # fmt: skip
FOUR = {
    "TestDTensorPlacementsCPU.test_placements_2d_world_size_4_cpu": (4, dict.fromkeys(MODES, 4), NO_STRIDED_SHARD),
    "TestDCPReshard.test_saved_by_two_loaded_by_four_and_one_world_size_4": (4, {}, NO_DTENSOR),  # DCP: no torch.load
}


def weights_only(mode, env):
    return bool(env.get(WO)) or mode == "safe_globals" or (mode == "default" and not env.get(NO_WO))


def run(runner, env, four):
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.jsonl")
        child = child_env({**env, REPORT: report, "PYTHONDONTWRITEBYTECODE": "1"}, path_first=(ROOT,))
        if runner == "unittest":
            args = ["-m", "unittest", "-v", *([] if four else ["-k", "world_size_2"]), MODULE]
        else:
            args = ["-m", "pytest", "-v", "-rs", "-p", "no:cacheprovider", *([] if four else ["-k", "world_size_2"]),
                    FILE]  # fmt: skip
        proc = subprocess.run([sys.executable, *args], cwd=ROOT, env=child, capture_output=True, text=True,
                              timeout=3600)  # fmt: skip
        records = [json.loads(line) for line in open(report)] if os.path.exists(report) else []
    return proc, records


@unittest.skipIf(unavailable(), unavailable() or "")
class TestDistributedPortsEnvironments(unittest.TestCase):
    maxDiff = None

    def check(self, runner, env, four=False):
        tests = {**TESTS, **(FOUR if four else {})}
        proc, records = run(runner, env, four)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        skips = {test_id: why for test_id, (_n, _loads, why) in tests.items() if why}
        outcomes = {"passed": len(tests) - len(skips), "skipped": len(skips)}
        if runner == "unittest":  # "Ran 7 tests" counts the skipped ones; "OK (skipped=2)"
            ran = re.findall(r"^Ran (\d+) tests", out, re.M) + re.findall(r"^OK(?: \(skipped=(\d+)\))?$", out, re.M)
            self.assertEqual(ran, [str(len(tests)), str(len(skips) or "")], out[-3000:])
        else:
            ran = {what: re.findall(rf"\b(\d+) {what}\b", out) for what in outcomes}
            self.assertEqual(ran, {what: [str(n)] if n else [] for what, n in outcomes.items()}, out[-3000:])
        for test_id, why in skips.items():  # skipped before any rank started, saying what this torch lacks
            cls, name = test_id.split(".")
            unittest_line = rf"{name} \(\S+\.{cls}\.{name}\) \.\.\. skipped"
            self.assertRegex(out, unittest_line if runner == "unittest" else rf"::{cls}::{name} SKIPPED", out[-3000:])
            self.assertIn(why, out)
        self.assertNotIn("skipped in every rank", out)  # the parent skipped it: no rank was started
        loads = {}
        for r in records:
            loads.setdefault(r["test"].rsplit(".", 2)[-2] + "." + r["test"].rsplit(".", 1)[-1], []).append(r)
        for test_id, (world_size, per_mode, why) in tests.items():
            got = loads.pop(test_id, [])
            if why:
                self.assertEqual(got, [], f"{test_id} skipped here, yet loaded")
                continue
            counted = Counter((int(r["summary"].split(":")[0].split()[1]), r["mode"]) for r in got)
            expected = Counter({(rank, m): n for rank in range(world_size) for m, n in per_mode.items()})
            self.assertEqual(counted, expected, test_id)
            for record in got:
                mode = record["mode"]
                self.assertEqual(record["kind"], "torch.load")
                self.assertIs(record["loaded"], True, record["summary"])
                self.assertIs(record["weights_only"], weights_only(mode, env), record["summary"])
                self.assertRegex(record["summary"], rf"^rank \d( \(.*\))?: {mode}: loaded as expected \(")
                if env.get(WO) and mode != "safe_globals":
                    self.assertIn(f"forced by {WO}=1", record["summary"])
        self.assertEqual(loads, {}, "loads of tests not expected to load")

    def test_unittest_default_environment(self):
        self.check("unittest", {}, four=True)

    def test_unittest_force_weights_only(self):
        self.check("unittest", {WO: "1"}, four=True)

    def test_unittest_force_no_weights_only(self):
        self.check("unittest", {NO_WO: "1"}, four=True)

    def test_pytest_default_environment(self):
        self.check("pytest", {}, four=True)

    def test_pytest_force_weights_only(self):
        self.check("pytest", {WO: "1"})

    def test_pytest_force_no_weights_only(self):
        self.check("pytest", {NO_WO: "1"})


if __name__ == "__main__":
    unittest.main()
