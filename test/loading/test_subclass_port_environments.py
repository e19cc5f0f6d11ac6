"""The subclass port (``test/ports/test_subclass_serialization.py``) under unittest in the three environment states
(no switch, ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, ``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1``) and once under pytest.

Each run is a subprocess writing the round-trip report (``TORCH_SERIAL_TESTING_REPORT``); every test must pass
(the mixin asserts each load against torch's own outcome), and each reported load's effective ``weights_only``
must be what torch's precedence gives for its mode in that environment (derived, not copied from a run)."""

import json
import os
import re
import subprocess
import sys
import tempfile
import unittest

from test.helpers.roundtrip_fixtures import MODE_SKIPS
from test.helpers.subprocess_env import child_env
from test.test_flagship_environments import FORCE_NO_WO, FORCE_WO, REPORT_ENV, effective_weights_only

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PORT = "test.ports.test_subclass_serialization"
MODES = ("weights_only_false", "safe_globals", "default")
TESTS = 46
#: the port's tests of a mode this torch lacks (the safe_globals mode before torch 2.5): 15 tests run per mode, and
#: one, test_safe_globals_undeclared_is_rejected_as_torch_does, in none
SKIPPED = 15 * len(MODE_SKIPS)


def run(args, extra_env):
    env = child_env(drop=("TORCH_FORCE_", REPORT_ENV, "EXPECTTEST_ACCEPT"), path_first=(ROOT,))
    env.update(extra_env)
    with tempfile.TemporaryDirectory() as tmp:
        env[REPORT_ENV] = report = os.path.join(tmp, "report.jsonl")
        proc = subprocess.run(
            [sys.executable, "-W", "ignore", *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=900
        )
        records = [json.loads(line) for line in open(report)] if os.path.exists(report) else []
    return proc, records


class TestSubclassPortEnvironments(unittest.TestCase):
    def check(self, proc, records, env):
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-4000:])
        self.assertTrue(records, "no round trip reported")
        modes = set()
        for record in records:
            mode = record["mode"]
            if mode not in MODES:  # pickle.loads and the like: no load mode of their own
                continue
            modes.add(mode)
            with self.subTest(test=record["test"], mode=mode):
                self.assertIs(record["weights_only"], effective_weights_only(mode, env), record["summary"])
                self.assertRegex(record["summary"], rf"^{mode}: (loaded|rejected) as expected \(")
        self.assertEqual(modes, set(MODES) - set(MODE_SKIPS))

    def test_three_environment_states_under_unittest(self):
        for env in ({}, {FORCE_NO_WO: "1"}, {FORCE_WO: "1"}):
            with self.subTest(env=env):
                proc, records = run(["-m", "unittest", "-v", PORT], env)
                self.check(proc, records, env)
                ran = re.findall(r"^Ran (\d+) tests? in ", proc.stderr, re.M)
                self.assertEqual(ran, [str(TESTS)], proc.stderr[-3000:])
                if env.get(FORCE_WO):  # the full-load mode is forced weights-only: undeclared subclasses rejected
                    self.assertTrue(any(not r["loaded"] and r["mode"] == "weights_only_false" for r in records))

    def test_under_pytest(self):
        proc, records = run(
            ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "0", PORT.replace(".", "/") + ".py"], {}
        )
        self.check(proc, records, {})
        # every test passes, but those of a load mode this torch lacks (skipped, saying so)
        passed = f"{TESTS - SKIPPED} passed" + (f", {SKIPPED} skipped" if SKIPPED else "")
        self.assertRegex(proc.stdout, rf"\b{passed}\b")


if __name__ == "__main__":
    unittest.main()
