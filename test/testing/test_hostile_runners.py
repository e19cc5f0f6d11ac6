"""Hostile tests under real runners: ``python -m unittest``, ``pytest`` and ``pytest -n 2``.

Two generated test files each hold hostile tests (a "force weights_only=False" shim on torch.load,
a payload added to torch's built-in allowlist, ``torch.jit.CompilationUnit`` registered) and, sorted
after them, a test that loads a foreign checkpoint whose pickle calls a payload.  Every hostile test
fails as a leak; every later test passes, sees torch's own functions and tables, and the payload
(which only writes a marker file into a temporary folder) never runs -- in every runner.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import unittest
import xml.etree.ElementTree as ET

from test.helpers.hostile_tests import PAYLOAD_DIR_ENV
from test.helpers.roundtrip_fixtures import MODE_SKIPS, WEIGHTS_ONLY_BARE_ENV
from test.helpers.subprocess_env import child_env

UNITTEST_LINE = re.compile(r"^(?:(FAIL|ERROR): )?(test_\w+) \(([\w.]+)\)")
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

MODULE = """
import unittest

import torch

from torch_serial_testing import Checkpoint, SerializationRoundTripTestCase, load
from torch_serial_testing.serialization import torch_load_replacement
from test.helpers import hostile_tests as ht

WOU = torch._weights_only_unpickler


class TestHostile{tag}(SerializationRoundTripTestCase, unittest.TestCase):
    def test_1_replaces_torch_load(self):
        torch.load = ht.wrapped_force_full_load_shim(torch.load)

    def test_2_adds_to_the_allowlist(self):
        WOU._get_allowed_globals()[ht.PAYLOAD_NAME] = ht.payload

    def test_3_registers_compilation_unit(self):
        torch.serialization.add_safe_globals([torch.jit.CompilationUnit])

    def test_4_replaces_the_unpickler_load(self):
        WOU.load = ht.force_full_load_shim(torch.serialization.load)

    def test_9_next_is_safe(self):
        self.assertIsNone(torch_load_replacement())
        self.assertNotIn(ht.PAYLOAD_NAME, WOU._get_allowed_globals())
        self.assertNotIn(torch.jit.CompilationUnit, torch.serialization.get_safe_globals())
        for mode in {modes!r}:  # the weights-only modes that run on this torch
            result = load(Checkpoint.from_bytes(ht.payload_checkpoint()), mode)
            self.assertFalse(result.loaded)
        self.assertEqual(ht.RAN, [])
"""

HOSTILE = ("test_1_replaces_torch_load", "test_2_adds_to_the_allowlist", "test_3_registers_compilation_unit")
HOSTILE += ("test_4_replaces_the_unpickler_load",)


class TestHostileTestsUnderRunners(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory(prefix="tst-hostile-")
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name
        self.payload_dir = os.path.join(self.tmp, "payload")
        os.mkdir(self.payload_dir)
        self.tests = os.path.join(self.tmp, "tests")
        os.mkdir(self.tests)
        for tag in ("A", "B"):
            with open(os.path.join(self.tests, f"test_hostile_{tag.lower()}.py"), "w") as fh:
                fh.write(
                    MODULE.format(tag=tag, modes=tuple(m for m in ("default", "safe_globals") if m not in MODE_SKIPS))
                )
        # a bare load is weights-only, as since torch 2.6 (a full load of foreign bytes is refused outright)
        self.env = child_env(
            {PAYLOAD_DIR_ENV: self.payload_dir, **WEIGHTS_ONLY_BARE_ENV}, path_first=(self.tests, ROOT)
        )

    def run_runner(self, *args: str) -> subprocess.CompletedProcess[str]:
        proc = subprocess.run(
            [sys.executable, *args],
            capture_output=True,
            text=True,
            cwd=self.tests,
            env=self.env,
            timeout=600,
            stdin=subprocess.DEVNULL,
        )
        self.assertEqual(os.listdir(self.payload_dir), [], "the payload ran")
        return proc

    def expected(self) -> dict[str, str]:
        return {
            f"TestHostile{tag}.{name}": ("failed" if name in HOSTILE else "passed")
            for tag in ("A", "B")
            for name in (*HOSTILE, "test_9_next_is_safe")
        }

    def test_unittest(self) -> None:
        proc = self.run_runner("-m", "unittest", "-v", "test_hostile_a", "test_hostile_b")
        self.assertEqual(proc.returncode, 1, proc.stderr[-3000:])
        got: dict[str, str] = {}
        for line in proc.stderr.splitlines():
            # "name (module.Class.name) ... ok" and "FAIL: name (...)" on Python >= 3.11;
            # before 3.11 the parenthesis holds "module.Class" only
            match = UNITTEST_LINE.match(line)
            if match:
                kind, name, qualified = match.groups()
                parts = qualified.split(".")
                key = f"{parts[-2] if parts[-1] == name else parts[-1]}.{name}"
                if kind:
                    got[key] = "failed"
                elif " ... " in line:
                    got.setdefault(key, "passed")
        self.assertEqual(got, self.expected(), proc.stderr[-3000:])
        self.assertEqual(proc.stderr.count("leaked global state (now restored)"), len(HOSTILE) * 2)

    def check_pytest(self, *extra: str) -> None:
        xml = os.path.join(self.tmp, "junit.xml")
        proc = self.run_runner(
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            f"--junitxml={xml}",
            *extra,
            "test_hostile_a.py",
            "test_hostile_b.py",
        )
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:] + proc.stderr[-3000:])
        got: dict[str, str] = {}
        for case in ET.parse(xml).getroot().iter("testcase"):
            outcome = "failed" if case.find("failure") is not None or case.find("error") is not None else "passed"
            key = f"{case.get('classname', '').rsplit('.', 1)[-1]}.{case.get('name')}"
            got[key] = outcome if key not in got or outcome == "passed" else got[key]
        self.assertEqual(got, self.expected(), proc.stdout[-3000:])
        self.assertIn("leaked global state (now restored)", open(xml).read())

    def test_pytest(self) -> None:
        self.check_pytest("-n", "0")

    def test_pytest_xdist(self) -> None:
        self.check_pytest("-n", "2", "--dist", "loadfile")


if __name__ == "__main__":
    unittest.main()
