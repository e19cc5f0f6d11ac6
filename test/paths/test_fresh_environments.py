"""The fresh-interpreter ports (:mod:`test.paths.test_fresh_ports`) under unittest and pytest, in each environment
state (no switch, ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1``, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``), each run a child
process reporting its loads (``TORCH_SERIAL_TESTING_REPORT``).  What each load does is derived from the mode and
the switches: a weights-only load in a fresh interpreter lacking the import fails the load (the test asserts that
failure, so no record), every other fresh load loads; on a torch that trusts no jagged nested tensor class itself
(2.4, 2.15), a weights-only load the class's declaration does not reach is a predicted rejection, reported.  A test
whose mode this torch cannot run (the ``safe_globals`` mode before torch 2.5) skips with the library's reason and
reports nothing."""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from test.helpers.roundtrip_fixtures import MODE_SKIPS
from test.helpers.subprocess_env import child_env
from test.helpers.torch_trust import NJT_GLOBALS, torch_trusts
from test.paths.test_fresh_ports import jagged, names_a_dynamo_global
from test.test_flagship_environments import effective_weights_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODULE = "test.paths.test_fresh_ports"
WO, NO_WO, REPORT = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD", "TORCH_SERIAL_TESTING_REPORT"
MODES = ("weights_only_false", "safe_globals", "default")
FRESH = "torch.load in a fresh interpreter"
#: test name -> the imports of its fresh load, and whether they lack what the checkpoint needs (a jagged tensor
#: needs torch._dynamo where its pickle names a global of it: before torch 2.15)
TESTS = {
    "TestFreshLoadNJTCPU.test_load_njt_weights_only_should_import_True": ("torch, torch._dynamo", False),
    "TestFreshLoadNJTCPU.test_load_njt_weights_only_should_import_False": ("torch", names_a_dynamo_global(jagged())),
    "TestFreshLoadPackageSubclassCPU.test_subclass_loads_where_its_package_is_imported": (
        "torch, test.paths.aolike",
        False,
    ),
    "TestFreshLoadPackageSubclassCPU.test_subclass_refused_without_its_package": ("torch", True),
}


def run(runner, env):
    with tempfile.TemporaryDirectory() as tmp:
        report = os.path.join(tmp, "report.jsonl")
        child = child_env({**env, REPORT: report, "PYTHONDONTWRITEBYTECODE": "1"}, path_first=(ROOT,))
        args = ["-m", "unittest", "-v", MODULE] if runner == "unittest" else ["-m", "pytest", "-v", "-rs", "-p",
                "no:cacheprovider", "test/paths/test_fresh_ports.py"]  # fmt: skip
        proc = subprocess.run(
            [sys.executable, *args], cwd=ROOT, env=child, capture_output=True, text=True, timeout=1800
        )
        records = [json.loads(line) for line in open(report)] if os.path.exists(report) else []
    return proc, records


class TestFreshPortsEnvironments(unittest.TestCase):
    maxDiff = None

    def check(self, runner, env):
        proc, records = run(runner, env)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        # the tests whose mode this torch cannot run: each skips with the library's reason
        skipped = {f"{name}_{mode}_cpu": MODE_SKIPS[mode] for name in TESTS for mode in MODES if mode in MODE_SKIPS}
        total, skips = len(TESTS) * len(MODES), [str(len(skipped))] if skipped else []
        if runner == "unittest":  # a skipped test ran, as unittest counts
            self.assertEqual(re.findall(r"^Ran (\d+) tests", out, re.M), [str(total)], out[-3000:])
            self.assertEqual(re.findall(r"^OK \(skipped=(\d+)\)$", out, re.M), skips, out[-3000:])
        else:
            self.assertEqual(re.findall(r"(\d+) passed", out), [str(total - len(skipped))], out[-3000:])
            self.assertEqual(re.findall(r"(\d+) skipped", out), skips, out[-3000:])
        for reason in set(skipped.values()):  # the library's reason, in both runners' output
            self.assertIn(reason, out)
        fresh = {}
        for r in records:
            if r["kind"].startswith(FRESH):
                fresh.setdefault(r["test"].rsplit(".", 2)[-2] + "." + r["test"].rsplit(".", 1)[-1], []).append(r)
        expected = set()
        for name, (imports, lacking) in TESTS.items():
            for mode in MODES:
                test_id = f"{name}_{mode}_cpu"
                if test_id in skipped:
                    self.assertNotIn(test_id, fresh, "skipped: no load")
                    continue
                # torch 2.4 and 2.15 trust no NestedTensor themselves: a weights-only load the declaration does
                # not reach is refused in every process, a predicted rejection (reported), not a missing import
                everywhere = "NJT" in name and effective_weights_only(mode, env) and mode != "safe_globals"
                refused = everywhere and not torch_trusts(*NJT_GLOBALS)
                if lacking and effective_weights_only(mode, env) and not refused:
                    self.assertNotIn(test_id, fresh, "refused by the fresh interpreter: the test asserts the failure")
                    continue
                expected.add(test_id)
                (record,) = fresh[test_id]
                self.assertEqual(record["kind"], f"{FRESH} ({imports})")
                self.assertIs(record["loaded"], not refused, record["summary"])
                self.assertIs(record["weights_only"], effective_weights_only(mode, env), record["summary"])
                outcome = "rejected" if refused else "loaded"
                self.assertTrue(record["summary"].startswith(f"{mode}: {outcome} as expected ("), record["summary"])
                self.assertTrue(record["summary"].endswith(f" in a fresh interpreter importing {imports}"))
                if env.get(WO) and mode != "safe_globals":
                    self.assertIn(f"forced by {WO}=1", record["summary"])
        self.assertEqual(set(fresh), expected)

    def test_unittest_default_environment(self):
        self.check("unittest", {})

    def test_unittest_force_weights_only(self):
        self.check("unittest", {WO: "1"})

    def test_unittest_force_no_weights_only(self):
        self.check("unittest", {NO_WO: "1"})

    def test_pytest_default_environment(self):
        self.check("pytest", {})

    def test_pytest_force_weights_only(self):
        self.check("pytest", {WO: "1"})

    def test_pytest_force_no_weights_only(self):
        self.check("pytest", {NO_WO: "1"})


if __name__ == "__main__":
    unittest.main()
