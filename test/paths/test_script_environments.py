"""The TorchScript and torch.export ports under unittest and pytest, in each environment state.

Each test runs ``test_script_ports`` and ``test_export_ports`` once in a child process (``python -m unittest -v``
or ``python -m pytest -v``) with no switch (unittest only: the suite itself runs them under pytest so),
``TORCH_FORCE_WEIGHTS_ONLY_LOAD=1`` or ``TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD=1``, and ``TORCH_SERIAL_TESTING_REPORT`` pointing at a temporary file, then
checks every generated test's records: how it loaded, with which effective ``weights_only``, and why.  The
expectation of every id is derived here from torch's rules (the environment matrix's :func:`torch_rule`) and from
what this torch does with a TorchScript archive weights-only (asked by the tools' own probe, an implementation
independent of the one under test) -- never copied from a run."""

import json
import re
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

import test.loading.test_environment_matrix as matrix
from test.helpers.roundtrip_fixtures import MODE_SKIPS
from test.helpers.subprocess_env import child_env
from torch_serial_testing.dimensions import supported_qengines
from torch_serial_testing.tools.facts import torchscript_refusal

ROOT = Path(__file__).resolve().parent.parent.parent
MODULES = ("test.paths.test_script_ports", "test.paths.test_export_ports")
WO, NO, REPORT = matrix.WO, matrix.NO, matrix.REPORT
MODES = ("weights_only_false", "safe_globals", "default")
ENGINES = ("fbgemm", "qnnpack")
#: This torch refuses a TorchScript archive weights-only (torch >= 2.5); else torch.load hands it to torch.jit.load.
REFUSES_TORCHSCRIPT = torchscript_refusal() is not None


def expected_records():
    """test id -> [(kind, mode, loaded, weights_only, words the summary must hold)] for the tests that run here."""
    script, export = (f"{m}.{c}" for m, c in zip(MODULES, ("TestQuantizedLinearScriptableCPU", "TestSaveLoadCPU")))
    jit = ("torch.jit.load", None, True, None, "torch.jit.load: loaded and compared")
    tests = {f"{export}.test_save_constants_cpu": [("torch.export.load", None, True, None, "loaded and compared")]}
    for engine in (e for e in ENGINES if e in supported_qengines()):
        for bias in (True, False):
            tests[f"{script}.test_linear_api_scriptable_use_bias_{bias}_{engine}_cpu"] = [jit, jit]  # scripted, traced
        for mode in (m for m in MODES if m not in MODE_SKIPS):
            tests[f"{script}.test_linear_torch_load_{engine}_{mode}_cpu"] = [("torch.load", mode, "jit")]
    for mode in (m for m in MODES if m not in MODE_SKIPS):
        zipfile_jit = f"{MODULES[0]}.TestSerializationZipfileActuallyJitCPU.test_serialization_zipfile_actually_jit"
        tests[f"{zipfile_jit}_{mode}_cpu"] = [("torch.load", mode, "jit")]
        tests[f"{export}.test_save_constants_torch_load_{mode}_cpu"] = [("torch.load", mode, "export")]
    return tests


def torch_load_record(mode, archive, env):
    """(loaded, weights_only, torch warns, words) of one torch.load of an archive, from torch's rules."""
    weights_only, warns = matrix.torch_rule(env, mode)
    if archive == "export":
        words = "a torch.export archive is not a torch.save checkpoint (it has no data.pkl)"
        loaded = False
    elif weights_only and REFUSES_TORCHSCRIPT:
        loaded, words = False, "a TorchScript archive: torch.load refuses it weights-only, whatever is allowlisted"
    else:
        loaded = True
        words = "torch.load handed it to torch.jit.load" if REFUSES_TORCHSCRIPT else "whatever weights_only says"
    return loaded, weights_only, warns, words


def run(runner, env_overrides):
    env = child_env({"PYTHONDONTWRITEBYTECODE": "1"}, path_first=(str(ROOT),), drop=("TORCH_FORCE_", REPORT))
    env.update(env_overrides)
    if runner == "unittest":
        args = ["-m", "unittest", "-v", *MODULES]
    else:
        args = ["-m", "pytest", "-v", "-p", "no:cacheprovider", *(m.replace(".", "/") + ".py" for m in MODULES)]
    with tempfile.TemporaryDirectory() as tmp:
        report = Path(tmp) / "report.jsonl"
        env[REPORT] = str(report)
        proc = subprocess.run(
            [sys.executable, *args],
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=600,  # a hang guard only
        )
        lines = report.read_text().splitlines() if report.exists() else []
    return proc, [json.loads(line) for line in lines]


class TestPortsInEachEnvironment(unittest.TestCase):
    maxDiff = None

    def check(self, runner, env):
        proc, records = run(runner, env)
        out = proc.stdout + proc.stderr
        self.assertEqual(proc.returncode, 0, out[-5000:])
        by_test = {}
        for record in records:
            by_test.setdefault(record["test"], []).append(record)
        expected = expected_records()
        self.assertEqual(sorted(by_test), sorted(expected), "tests that reported round trips")
        rejected_tests = 0
        for test_id, wanted in expected.items():
            got = by_test[test_id]
            with self.subTest(test=test_id):
                self.assertEqual(len(got), len(wanted))
                for record, spec in zip(got, wanted):
                    self.assertEqual(record["kind"], spec[0])
                    self.assertEqual(record["mode"], spec[1])
                    if spec[0] == "torch.load":
                        loaded, weights_only, warns, words = torch_load_record(spec[1], spec[2], env)
                    else:
                        (loaded, weights_only, words), warns = spec[2:], False
                    self.assertIs(record["loaded"], loaded, record["summary"])
                    self.assertIs(record["weights_only"], weights_only, record["summary"])
                    self.assertIn(words, record["summary"])
                    if spec[0] == "torch.load":
                        verb = "loaded" if loaded else "rejected"
                        self.assertTrue(record["summary"].startswith(f"{spec[1]}: {verb} as expected ("))
                        self.assertNotIn("not allowlisted", record["summary"])  # never "a global is missing"
                        self.assertIs(record["summary"].endswith("; torch warned)"), warns, record["summary"])
                        if env.get(WO) and spec[1] != "safe_globals":
                            self.assertIn(f"forced by {WO}=", record["summary"])
                rejected_tests += not all(r["loaded"] for r in got)
        if runner == "unittest":
            ran = re.findall(r"^Ran (\d+) tests? in ", out, re.M)
            # every generated test runs (one that cannot run here raises SkipTest, and counts): per engine two
            # jit round trips and one torch.load per mode; the zipfile test per mode; export's one and one per mode
            generated = len(ENGINES) * (2 + len(MODES)) + len(MODES) + 1 + len(MODES)
            self.assertEqual(ran, [str(generated)], out[-3000:])
        else:  # the plugin shows an expected rejection as a pass that says so
            self.assertEqual(len(re.findall(r" PASSED \(rejected as predicted", out)), rejected_tests, out[-5000:])
            self.assertRegex(out, rf"\b{len(expected)} passed\b")

    def test_unittest_default_environment(self):
        self.check("unittest", {})

    def test_unittest_force_weights_only(self):
        self.check("unittest", {WO: "1"})

    def test_unittest_force_no_weights_only(self):
        self.check("unittest", {NO: "1"})

    # pytest in the default environment: the suite itself runs the ports so, in its own process.

    def test_pytest_force_weights_only(self):
        self.check("pytest", {WO: "1"})

    def test_pytest_force_no_weights_only(self):
        self.check("pytest", {NO: "1"})


if __name__ == "__main__":
    unittest.main()
