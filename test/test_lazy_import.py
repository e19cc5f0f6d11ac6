"""``import torch_serial_testing`` imports the authoring API only; the rest comes on first use.

No timing here: which modules a fresh process has imported is the structural fact behind a
cheap import (bench/run.py measures the time).
"""

from __future__ import annotations

import json
import subprocess
import sys
import unittest

ROUND_TRIP_MACHINERY = (
    "archive", "checkpoint", "comparison", "load_modes", "pickle_scan", "prediction", "replaced_loader",
    "switches", "thread_warnings", "torch_source", "torch_unpickler_rules", "unpickler_model",
)


def _run(code: str) -> dict:
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        raise AssertionError(proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


class LazyImportTest(unittest.TestCase):
    def test_import_and_class_definition_leave_the_machinery_unimported(self) -> None:
        got = _run(
            "import json, sys, unittest\n"
            "import torch_serial_testing as tst\n"
            "class TestX(tst.SerializationRoundTripTestCase, unittest.TestCase):\n"
            "    safe_globals = (set,)\n"
            "    def test_x(self, device):\n"
            "        pass\n"
            "tst.instantiate_round_trip_tests(TestX, globals())\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('torch_serial_testing.'))))\n"
        )
        loaded = {m.split(".", 1)[1] for m in got}
        self.assertIn("case", loaded)
        self.assertEqual(sorted(loaded & set(ROUND_TRIP_MACHINERY)), [])

    def test_public_names_resolve_on_first_use(self) -> None:
        got = _run(
            "import json, torch_serial_testing as tst\n"
            "from torch_serial_testing import *\n"
            "missing = [n for n in tst.__all__ if n not in dir(tst)]\n"
            "import torch_serial_testing.checkpoint\n"  # a later submodule import must not rebind scan_limits
            "print(json.dumps({'missing': missing, 'round_trip': round_trip.__module__,\n"
            "                  'Checkpoint': tst.Checkpoint.__module__, 'scan_limits': callable(tst.scan_limits),\n"
            "                  'scan_limits_is_function': type(tst.scan_limits).__name__,\n"
            "                  'load_modes': tst.load_modes.__name__}))\n"
        )
        self.assertEqual(got["missing"], [])
        self.assertEqual(got["round_trip"], "torch_serial_testing.load_modes")
        self.assertEqual(got["Checkpoint"], "torch_serial_testing.checkpoint")
        self.assertEqual(got["scan_limits_is_function"], "function")
        self.assertEqual(got["load_modes"], "torch_serial_testing.load_modes")  # old submodule attributes work

    def test_unknown_attribute_is_an_attribute_error(self) -> None:
        import torch_serial_testing as tst

        with self.assertRaisesRegex(AttributeError, "no attribute 'not_a_name'"):
            tst.not_a_name  # noqa: B018


if __name__ == "__main__":
    unittest.main()
