"""``pytest --serial-audit``: the same records as the command, in one process and under xdist."""

from __future__ import annotations

import subprocess
import sys
import unittest

from torch_serial_testing.tools.audit.summary import VERDICTS, verdict

from .runs import BEFORE_THE_DEFAULT, PLUGIN, pytest_audit
from .test_audit_cli import SEED, SEED_TESTS

FILES = (f"{SEED}.py", "optim_state_dict.py")


def essence(loads: list[dict]) -> list[tuple]:
    """What must not depend on how the run is split: test, site, needs, verdict, fix."""
    return sorted(
        (r["test"], r["site"], tuple(r["needs"]), verdict(r), r["fix"]["kind"], r["fix"]["verified"]) for r in loads
    )


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestPlugin(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.serial = pytest_audit("-n", "0", "-W", "ignore", *FILES)
        cls.xdist = pytest_audit("-n", "2", "-W", "ignore", *FILES)

    def test_the_seed_under_pytest(self) -> None:
        run = self.serial
        self.assertEqual(run.code, 1, run.stdout[-3000:])
        self.assertIn("3 failed, 2 passed", run.stdout)
        seed = [r for r in run.loads() if SEED in r["test"]]
        self.assertEqual(sorted(r["test"].rsplit("::", 1)[-1] for r in seed), sorted(SEED_TESTS))
        for r in seed:
            self.assertEqual(verdict(r), "default")
            self.assertEqual(len(r["needs"]), 3)
            self.assertEqual((r["fix"]["kind"], r["fix"]["verified"]), ("safe_globals", True))
        passing = [r for r in run.loads() if "optim_state_dict" in r["test"]]
        self.assertEqual([r["needs"] for r in passing], [[], []])
        self.assertIn("torch_serial_testing audit", run.stdout)
        self.assertIn(VERDICTS["default"], run.stdout)
        self.assertEqual(sorted(run.outcomes().values()), ["failed"] * 3 + ["passed"] * 2)
        self.assertEqual(len([line for line in (run.markdown or "").splitlines() if line.startswith("| `")]), 5)

    def test_xdist_gives_the_same(self) -> None:
        self.assertEqual(self.xdist.code, self.serial.code, self.xdist.stdout[-3000:])
        self.assertEqual(essence(self.xdist.loads()), essence(self.serial.loads()))
        self.assertEqual(sorted(self.xdist.outcomes().items()), sorted(self.serial.outcomes().items()))
        self.assertIn(VERDICTS["default"], self.xdist.stdout)


class TestPluginCost(unittest.TestCase):
    def test_importing_the_plugin_imports_no_torch(self) -> None:
        code = f"import sys, {PLUGIN}; assert 'torch' not in sys.modules, 'torch imported'; print('ok')"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        self.assertEqual(proc.stdout.strip(), "ok", proc.stderr)

    def test_not_enabled_nothing_is_written_or_printed(self) -> None:
        from .runs import run

        proc = run(
            [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "optim_state_dict.py"]
        )
        self.assertEqual(proc.returncode, 0, proc.stdout[-2000:])
        self.assertNotIn("torch_serial_testing audit", proc.stdout)


class TestPluginInstalled(unittest.TestCase):
    """Both of setup.cfg's pytest11 entry points installed (as ``pip install`` does) and a plugin also named
    with ``-p`` (as in a source tree): pluggy refuses one module registered twice, so each plugin skips
    its entry point when already loaded by name."""

    def test_entry_points_and_p_together(self) -> None:
        import configparser
        import os
        import tempfile

        from test.helpers.subprocess_env import child_env

        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        cfg = configparser.ConfigParser()
        cfg.read(os.path.join(root, "setup.cfg"), encoding="utf-8")
        entries = [line.strip() for line in cfg["options.entry_points"]["pytest11"].splitlines() if line.strip()]
        self.assertIn(f"torch_serial_testing_audit = {PLUGIN}", entries)
        with tempfile.TemporaryDirectory() as tmp:
            dist = os.path.join(tmp, "entry_point_probe-0.dist-info")
            os.mkdir(dist)
            with open(os.path.join(dist, "METADATA"), "w", encoding="utf-8") as fh:
                fh.write("Metadata-Version: 2.1\nName: entry-point-probe\nVersion: 0\n")
            with open(os.path.join(dist, "entry_points.txt"), "w", encoding="utf-8") as fh:
                fh.write("[pytest11]\n" + "\n".join(entries) + "\n")
            with open(os.path.join(tmp, "test_one.py"), "w", encoding="utf-8") as fh:
                fh.write("def test_one():\n    pass\n")
            env = child_env(path_first=(tmp,))
            env.pop("PYTEST_ADDOPTS", None)
            for extra in ([], ["-p", PLUGIN], ["-p", "torch_serial_testing.pytest_plugin", "-p", PLUGIN]):
                cmd = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *extra, "--help"]
                proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=300)
                self.assertEqual(proc.returncode, 0, (extra, proc.stdout[-2000:], proc.stderr[-2000:]))
                self.assertEqual(proc.stdout.count("--serial-audit=") + proc.stdout.count("--serial-audit "), 1, extra)


if __name__ == "__main__":
    unittest.main()
