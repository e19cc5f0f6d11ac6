"""Issue 27.5: the floods that took the scan 46-73 s under the default ScanLimits are refused.

No time is asserted (``bench/scan_bounds.py`` measures it): the bound is the work the scan counts.
A GLOBAL or INST counts 4 toward ``max_opcodes`` (it costs about as much as four cheap opcodes), a
name repeated is decoded and judged once, and ``max_globals`` caps the distinct names (which the
report lists one by one).  Every cap hit is a one-line CheckpointFormatError naming the cap and
how to raise it, never a pass.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import CheckpointFormatError, scan_checkpoint
from torch_serial_testing.tools.cli import main
from torch_serial_testing.model import ScanLimits, scan_limits

OBJ = H.glob("mymod", "Y") + b")\x81q\x00}q\x010"  # an object, a dict state in memo 1


def binget_build(n: int) -> bytes:
    return H.torch_zip(b"\x80\x02" + OBJ + b"h\x01b" * n + b".")


def global_pop(n: int, distinct: bool = False) -> bytes:
    body = b"".join(H.glob(f"m{i}" if distinct else "m", "n") + b"0" for i in range(n))
    return H.torch_zip(b"\x80\x02" + body + b"N.")


class TestOpcodeBudget(unittest.TestCase):
    def test_defaults_cap_the_issue_floods(self):
        limits = ScanLimits()
        self.assertLessEqual(limits.max_opcodes, 3_000_000)
        self.assertLessEqual(limits.max_globals, 10_000)

    def test_binget_build_flood_refused_at_the_cap(self):
        with scan_limits(max_opcodes=50_000):
            info = scan_checkpoint(binget_build(20_000))  # 40,000 opcodes: under the cap
            self.assertLessEqual(info.opcodes_walked, 50_000)
            with self.assertRaisesRegex(CheckpointFormatError, r"max_opcodes=50000.*scan_limits\(max_opcodes=") as cm:
                scan_checkpoint(binget_build(30_000))
        self.assertEqual(len(str(cm.exception).splitlines()), 1)

    def test_a_global_counts_four(self):
        info = scan_checkpoint(global_pop(1000))
        self.assertGreaterEqual(info.opcodes_walked, 5 * 1000)  # GLOBAL 4 + POP 1
        with scan_limits(max_opcodes=4 * 1024):
            with self.assertRaisesRegex(CheckpointFormatError, "max_opcodes"):
                scan_checkpoint(global_pop(1000))  # 1,000 GLOBALs + 1,000 POPs: 2,000 opcodes, 5,000 units

    def test_a_repeated_name_is_one_global(self):
        info = scan_checkpoint(global_pop(5000))
        self.assertEqual(info.globals, ("m.n",))
        self.assertEqual(info.full_load_globals, ("m.n",))

    def test_distinct_names_capped(self):
        with scan_limits(max_globals=500):
            self.assertEqual(len(scan_checkpoint(global_pop(500, distinct=True)).globals), 500)
            with self.assertRaisesRegex(CheckpointFormatError, r"max_globals=500.*scan_limits\(max_globals="):
                scan_checkpoint(global_pop(501, distinct=True))

    def test_protocol_change_renames_per_protocol(self):
        # The same raw name under protocol 2 and then 3: judged again, as a full unpickle resolves it per
        # protocol (_compat_pickle renames below 3 only).
        body = b"\x80\x02" + H.glob("__builtin__", "set") + b"0\x80\x03" + H.glob("__builtin__", "set") + b"0N."
        info = scan_checkpoint(H.torch_zip(body))
        self.assertEqual(info.full_load_globals, ("__builtin__.set", "builtins.set"))


class TestReportOfManyNames(unittest.TestCase):
    def test_each_flagged_name_listed_once_and_over_the_cap_refused(self):
        body = b"\x80\x02" + b"".join(H.glob("os", f"n{i}") + b"0" for i in range(3000)) + b"N."
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "names.pt")
            with open(path, "wb") as fh:
                fh.write(H.torch_zip(body))
            out = io.StringIO()
            with redirect_stdout(out):
                code = main(["inspect", path])
            self.assertEqual(code, 2)
            text = out.getvalue()
            for i in (0, 1234, 2999):
                self.assertEqual(len(re.findall(rf"^  os\.n{i}\s", text, re.M)), 1, f"os.n{i}")
            with scan_limits(max_globals=1000):
                out = io.StringIO()
                with redirect_stdout(out):
                    code = main(["inspect", "--json", path])
            self.assertEqual(code, 2)
            self.assertIn("max_globals=1000", json.loads(out.getvalue())["error"])


if __name__ == "__main__":
    unittest.main()
