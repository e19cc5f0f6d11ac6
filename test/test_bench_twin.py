"""bench/flagship_plain.py stays the flagship's twin: the same tests, green, without the library.

The benchmark reads the flagship's time over this file as the library's share (issue 16), which
is only true while both run the same tests and the twin never imports the library.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BENCH = os.path.join(ROOT, "bench")
FLAGSHIP_DIR = os.path.join(ROOT, "test", "ao", "sparsity")


def _sparse_linear_missing() -> bool:
    try:
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear  # noqa: F401
    except ImportError:
        return True
    return False


def _env() -> dict[str, str]:
    """The children's environment: no switch or device filter (the twin runs the CPU tests, unfiltered)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE_", "PYTORCH_TESTING_DEVICE_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def _ids(directory: str, module: str) -> set[str]:
    """Test method names of *module* as ``unittest`` collects them, from a child process."""
    code = (
        "import sys, unittest; sys.path.insert(0, sys.argv[1]);"
        "suite = unittest.defaultTestLoader.loadTestsFromName(sys.argv[2]);"
        "stack = [suite]; out = []\n"
        "while stack:\n"
        "    s = stack.pop()\n"
        "    if isinstance(s, unittest.TestSuite): stack.extend(s)\n"
        "    else: out.append(s.id().rsplit('.', 1)[1])\n"
        "print(''.join(f'test id: {name}\\n' for name in sorted(out)))"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, directory, module],
        capture_output=True,
        text=True,
        cwd=directory,
        env=_env(),
        timeout=600,
    )
    if proc.returncode != 0:
        raise AssertionError(f"collecting {module} failed:\n{proc.stderr[-3000:]}")
    # Only the marked lines: a torch may print to stdout while the module is imported.
    return {line[len("test id: ") :] for line in proc.stdout.splitlines() if line.startswith("test id: ")}


@unittest.skipIf(_sparse_linear_missing(), "this torch has no sparse quantized Linear (the flagship skips too)")
@unittest.skipUnless(
    hasattr(torch.serialization, "safe_globals"),
    "torch < 2.5 has no safe_globals context: the flagship skips that mode, the twin would not",
)
class TestFlagshipPlainTwin(unittest.TestCase):
    def test_same_tests_as_the_flagship(self) -> None:
        flagship = _ids(FLAGSHIP_DIR, "test_qlinear_packed_params")
        twin = _ids(BENCH, "flagship_plain")
        self.assertEqual(len(twin), 20, sorted(twin))
        self.assertEqual(twin, flagship)

    def test_green_without_the_library(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "unittest", "-v", "flagship_plain"],
            capture_output=True,
            text=True,
            cwd=BENCH,
            env=_env(),
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        self.assertIn("Ran 20 tests", proc.stderr)
        self.assertNotIn("skipped", proc.stderr)


@unittest.skipUnless(
    hasattr(torch.serialization, "safe_globals"),
    "torch < 2.5 has no safe_globals context: the library skips that mode, the twin would not",
)
class TestThreeTestsPlainTwin(unittest.TestCase):
    """bench/three_tests_plain.py stays the twin of bench/three_tests.py (issue 37's 3-test file)."""

    def test_same_tests_both_green_the_twin_without_the_library(self) -> None:
        self.assertEqual(_ids(BENCH, "three_tests"), _ids(BENCH, "three_tests_plain"))
        self.assertEqual(len(_ids(BENCH, "three_tests")), 3)
        for module in ("three_tests", "three_tests_plain"):
            with self.subTest(module=module):
                proc = subprocess.run(
                    [sys.executable, "-m", "unittest", "-v", module],
                    capture_output=True,
                    text=True,
                    cwd=BENCH,
                    env=_env(),
                    timeout=600,
                )
                self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
                self.assertIn("Ran 3 tests", proc.stderr)
                self.assertNotIn("skipped", proc.stderr)
