"""``import torch_serial_testing`` imports the authoring API only; the rest comes on first use.

No timing here: which modules a fresh process has imported is the structural fact behind a
cheap import (bench/run.py measures the time).
"""

from __future__ import annotations

import json
import subprocess
import sys
import unittest

#: The round-trip machinery (module names below ``torch_serial_testing.``): the static scan (the
#: checkpoint, the walker, its stream reader and model), the unpickler rules it replays, the
#: prediction and the load, the comparison.  And none of the tools, ever.
ROUND_TRIP_MACHINERY = (
    "checkpoint",
    "walker",
    "stream",
    "model",
    "unpickler",
    "prediction",
    "loading",
    "comparison",
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
        self.assertIn("instantiation", loaded)
        self.assertEqual(sorted(loaded & set(ROUND_TRIP_MACHINERY)), [])
        self.assertEqual(sorted(m for m in loaded if m == "tools" or m.startswith("tools.")), [])

    def test_first_round_trip_imports_the_machinery(self) -> None:
        # the counterpart: the machinery listed above is what a round trip really uses
        got = _run(
            "import json, sys\n"
            "import torch_serial_testing as tst\n"
            "tst.round_trip({'a': 1}, 'default')\n"
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('torch_serial_testing.'))))\n"
        )
        loaded = {m.split(".", 1)[1] for m in got}
        for module in ROUND_TRIP_MACHINERY:
            if module != "comparison":  # imported by the first comparison
                self.assertIn(module, loaded)
        # a round trip imports nothing of the tools (issue 37: the core never imports them)
        self.assertEqual(sorted(m for m in loaded if m == "tools" or m.startswith("tools.")), [])

    def test_public_names_resolve_on_first_use(self) -> None:
        got = _run(
            "import json, torch_serial_testing as tst\n"
            "from torch_serial_testing import *\n"
            "missing = [n for n in tst.__all__ if n not in dir(tst)]\n"
            "import torch_serial_testing.checkpoint, torch_serial_testing.model\n"
            "import torch_serial_testing.loading\n"  # later submodule imports must not rebind public names
            "old = {}\n"
            "for name in ('load_modes', 'allowlist', 'pickle_scan', 'judge_global', 'dangerous_reason'):\n"
            "    try:\n"
            "        getattr(tst, name)\n"
            "    except AttributeError as e:\n"
            "        old[name] = str(e)\n"
            "    else:\n"
            "        old[name] = None\n"
            "print(json.dumps({'missing': missing, 'round_trip': round_trip.__module__,\n"
            "                  'load': type(tst.load).__name__, 'load_module': tst.load.__module__,\n"
            "                  'Checkpoint': tst.Checkpoint.__module__, 'scan_limits': callable(tst.scan_limits),\n"
            "                  'scan_limits_is_function': type(tst.scan_limits).__name__,\n"
            "                  'predict': tst.predict.__module__, 'comparison': tst.assert_round_trip_equal.__module__,\n"
            "                  'cached': 'predict' in vars(tst), 'old': old}))\n"
        )
        self.assertEqual(got["missing"], [])
        self.assertEqual(got["round_trip"], "torch_serial_testing.loading")
        self.assertEqual(got["load"], "function")
        self.assertEqual(got["load_module"], "torch_serial_testing.loading")
        self.assertEqual(got["Checkpoint"], "torch_serial_testing.checkpoint")
        self.assertTrue(got["scan_limits"])
        self.assertEqual(got["scan_limits_is_function"], "function")
        self.assertEqual(got["predict"], "torch_serial_testing.prediction")
        self.assertEqual(got["comparison"], "torch_serial_testing.comparison")
        self.assertTrue(got["cached"])  # resolved once, then a plain module attribute
        # Names of layouts gone by design are a plain AttributeError; the names that judge checkpoints
        # from strangers say where they live now (the tools, which the core never imports).
        for name in ("load_modes", "allowlist", "pickle_scan"):
            self.assertEqual(got["old"][name], f"module 'torch_serial_testing' has no attribute {name!r}", name)
        for name in ("judge_global", "dangerous_reason"):
            self.assertEqual(
                got["old"][name],
                f"{name} judges checkpoints from strangers and lives in the tools since 0.2.0: "
                f"from torch_serial_testing.tools import {name}",
            )

    def test_unknown_attribute_is_an_attribute_error(self) -> None:
        import torch_serial_testing as tst

        with self.assertRaisesRegex(AttributeError, "no attribute 'not_a_name'"):
            tst.not_a_name  # noqa: B018


if __name__ == "__main__":
    unittest.main()
