"""The pytest plugin: an expected rejection is a visible pass in ``-v``, ``-rA`` and JUnit XML.

Each test runs pytest in a child process on a small generated test file (in a temporary folder),
once with ``-p torch_serial_testing.pytest_plugin`` (the module, as a source tree loads it)
and once through the ``pytest11`` entry point: the entry point setup.cfg declares is written into a
temporary ``.dist-info`` on the child's path, so pytest's own entry-point loading is what finds the
plugin, whether or not the library is installed (in CI it is also installed: pytest loads the
plugin once, by name).
"""

from __future__ import annotations

import configparser
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest
import xml.etree.ElementTree as ET

import torch

from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY
from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PLUGIN = "torch_serial_testing.pytest_plugin"

CASES = textwrap.dedent("""
    import unittest

    import torch

    from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


    class Net(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)


    class TestNet(SerializationRoundTripTestCase, unittest.TestCase):
        load_modes = ("default", "weights_only_false")
        devices = ("cpu",)

        def test_module(self, device):
            self.round_trip(Net())

        def test_sub(self, device):
            for k in (1, 2):
                with self.subTest(k=k):
                    self.round_trip(Net())
            self.round_trip({"a": torch.ones(1)}, safe_globals=())


    instantiate_round_trip_tests(TestNet, globals())


    class TestPlain(unittest.TestCase):
        def test_plain(self):
            pass
""")

PLAIN = textwrap.dedent("""
    import sys


    def test_no_torch_imported():
        assert "torch" not in sys.modules, "the plugin imported torch"
        loaded = sorted(m for m in sys.modules if m.startswith("torch_serial_testing."))
        # no load machinery, nothing of the tools
        assert not [m for m in loaded if m.startswith("torch_serial_testing.tools")], loaded
        for machinery in ("loading", "prediction", "checkpoint", "walker", "unpickler"):
            assert f"torch_serial_testing.{machinery}" not in sys.modules, loaded
""")


def _declared_entry_point() -> str:
    """``name = module`` of the pytest11 entry point setup.cfg declares (one line)."""
    cfg = configparser.ConfigParser()
    cfg.read(os.path.join(ROOT, "setup.cfg"), encoding="utf-8")
    lines = [line.strip() for line in cfg["options.entry_points"]["pytest11"].splitlines() if line.strip()]
    mine = [line for line in lines if line.split("=", 1)[0].strip() == "torch_serial_testing"]
    if len(mine) != 1:
        raise AssertionError(f"setup.cfg declares no single pytest11 entry 'torch_serial_testing': {lines}")
    return mine[0]


class TestPytestPlugin(unittest.TestCase):
    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.tmp = tmp.name

    def pytest(self, source: str, *args: str, path_first: tuple[str, ...] = ()) -> tuple[str, str]:
        """Run pytest on *source* as test_cases.py; (stdout, JUnit XML text)."""
        with open(os.path.join(self.tmp, "test_cases.py"), "w", encoding="utf-8") as fh:
            fh.write(source)
        xml = os.path.join(self.tmp, "junit.xml")
        env = child_env(path_first=(self.tmp, *path_first))
        env.pop("PYTEST_ADDOPTS", None)
        cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "-v", f"--junitxml={xml}", *args]
        proc = subprocess.run(
            [*cmd, "test_cases.py"], cwd=self.tmp, env=env, capture_output=True, text=True, timeout=300
        )
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        with open(xml, encoding="utf-8") as fh:
            return proc.stdout, fh.read()

    def check_visible(self, out: str, xml: str) -> None:
        if not DEFAULT_WEIGHTS_ONLY:  # the cases' default-mode tests expect torch >= 2.6's rejection
            self.skipTest(f"a bare torch.load is a full load on torch {torch.__version__}: no rejection to show")
        lines = out.splitlines()
        rejected = "PASSED (rejected as predicted: default (weights_only=True "
        mixed = "PASSED (2 of 3 round trips rejected as predicted: default (weights_only=True "
        self.assertNotIn("rejected as expected", out)  # said once: "rejected as predicted", not twice
        # the -v line (with -n: "[gw0] [ 20%] WORD nodeid", else "nodeid WORD") and the -rA line ("WORD nodeid")
        for word, test in ((rejected, "test_module_default_cpu"), (mixed, "test_sub_default_cpu")):
            shown = [line for line in lines if word in line and f"::TestNetCPU::{test}" in line]
            self.assertEqual(len(shown), 2, (word, test, out))
            self.assertTrue(any(line.startswith(word) and line.endswith(test) for line in shown), out)
        self.assertTrue(any("in subTest (k=1), (k=2))" in line for line in lines), out)
        for node in ("TestNetCPU::test_module_weights_only_false_cpu", "TestPlain::test_plain"):
            self.assertIn(f"PASSED test_cases.py::{node}\n", out)  # -rA: a plain pass
            self.assertFalse(any(node in line and "rejected" in line for line in lines), out)

        cases = {c.get("name"): c for c in ET.fromstring(xml).iter("testcase")}
        for name, status in (("test_module_default_cpu", "rejected as predicted"), ("test_sub_default_cpu", "2 of 3")):
            case = cases[name]
            self.assertEqual([child.tag for child in case], ["properties"], "a pass: no <skipped>, no <failure>")
            props = {p.get("name"): p.get("value") for p in case.iter("property")}
            self.assertEqual(len(list(case.iter("property"))), 2, "one status, once (not once per subTest)")
            self.assertTrue(props["torch_serial_testing.status"].startswith(status), props)
            self.assertIn("not allowlisted", props["torch_serial_testing.rejections"])
        for name in ("test_module_weights_only_false_cpu", "test_plain"):
            self.assertEqual(list(cases[name]), [], f"{name} loaded (or never loaded): no properties")

    def test_plugin_module_under_xdist(self) -> None:
        out, xml = self.pytest(CASES, "-p", PLUGIN, "-n", "2")
        self.check_visible(out, xml)

    def install_entry_point(self) -> None:
        """A ``.dist-info`` in the child's path declaring setup.cfg's pytest11 entry point."""
        name, _, value = _declared_entry_point().partition("=")
        self.assertEqual(value.strip(), PLUGIN)
        dist = os.path.join(self.tmp, "entry_point_probe-0.dist-info")
        os.mkdir(dist)
        with open(os.path.join(dist, "METADATA"), "w", encoding="utf-8") as fh:
            fh.write("Metadata-Version: 2.1\nName: entry-point-probe\nVersion: 0\n")
        with open(os.path.join(dist, "entry_points.txt"), "w", encoding="utf-8") as fh:
            fh.write(f"[pytest11]\n{name.strip()} = {value.strip()}\n")

    def test_entry_point_loads_the_plugin(self) -> None:
        self.install_entry_point()
        out, xml = self.pytest(CASES, "-n", "0")
        self.check_visible(out, xml)
        out, xml = self.pytest(CASES, "-n", "0", "-p", "no:torch_serial_testing")
        self.assertNotIn("rejected as predicted", out + xml)

    def test_module_and_entry_point_together_load_it_once(self) -> None:
        self.install_entry_point()  # installed, and named with -p as in a source tree: no double registration
        out, xml = self.pytest(CASES, "-n", "0", "-p", PLUGIN)
        self.check_visible(out, xml)

    def test_costs_nothing_where_unused(self) -> None:
        # this plugin alone: the audit's (another entry point, where the library is installed) is the tools'
        out, xml = self.pytest(PLAIN, "-p", PLUGIN, "-p", "no:torch_serial_testing_audit", "-n", "0")
        self.assertIn("PASSED test_cases.py::test_no_torch_imported", out)
        self.assertNotIn("<properties>", xml)


if __name__ == "__main__":
    unittest.main()
