"""The suite's own temporary-directory check (test/conftest.py), run on small pytest sessions.

A copy of the conftest runs in a child pytest on a generated test file: what a test leaves in the
temporary directory fails the run and is named; a folder a torch module holds as a module-level
``TemporaryDirectory`` (removed by its finalizer at interpreter exit, after the check) does not,
while the same folder held by any other module still does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest

from test.helpers.subprocess_env import child_env

HERE = os.path.dirname(os.path.abspath(__file__))

HOLDS = textwrap.dedent("""
    import sys
    import tempfile
    import types


    def test_holds():
        module = types.ModuleType({module!r})
        module.folder = tempfile.TemporaryDirectory()  # removed when the interpreter exits
        sys.modules[module.__name__] = module
""")

LEAVES = textwrap.dedent("""
    import os
    import tempfile


    def test_leaves():
        with open(os.path.join(tempfile.gettempdir(), "left-behind.txt"), "w") as fh:
            fh.write("x")
""")


class TestTemporaryDirectoryCheck(unittest.TestCase):
    def pytest(self, source: str) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory() as tmp:
            shutil.copy(os.path.join(HERE, "conftest.py"), tmp)
            open(os.path.join(tmp, "slow_tests.txt"), "w").close()
            with open(os.path.join(tmp, "test_case.py"), "w", encoding="utf-8") as fh:
                fh.write(source)
            env = child_env()
            env.pop("PYTEST_ADDOPTS", None)
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", "test_case.py"]
            proc = subprocess.run(cmd, cwd=tmp, env=env, capture_output=True, text=True, timeout=120)
            self.assertEqual(sorted(os.listdir(tmp)), ["conftest.py", "slow_tests.txt", "test_case.py"], proc.stdout)
        return proc

    def test_what_a_test_leaves_fails_the_run(self) -> None:
        proc = self.pytest(LEAVES)
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("the test run left 1 entries in its temporary directory: left-behind.txt", proc.stdout)

    def test_a_folder_torch_holds_until_exit_is_torchs(self) -> None:
        proc = self.pytest(HOLDS.format(module="torch._tst_holds_a_folder"))
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)
        self.assertNotIn("left", proc.stdout)

    def test_the_same_folder_held_by_another_module_fails_the_run(self) -> None:
        proc = self.pytest(HOLDS.format(module="torchlike._tst_holds_a_folder"))
        self.assertEqual(proc.returncode, 1, proc.stdout + proc.stderr)
        self.assertIn("the test run left 1 entries in its temporary directory: tmp", proc.stdout)


if __name__ == "__main__":
    unittest.main()
