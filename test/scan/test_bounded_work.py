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
import pickletools
import re
import sys
import tempfile
import unittest
from contextlib import redirect_stdout
from typing import Any
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import CheckpointFormatError, model, scan_checkpoint, walker
from torch_serial_testing.model import INT, ScanLimits, scan_limits
from torch_serial_testing.stream import text_int
from torch_serial_testing.tools.cli import main

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


def count_ops(body: bytes) -> dict[str, int]:
    """How many of each opcode *body* holds (by the stdlib's reader; it stops at STOP)."""
    counts: dict[str, int] = {}
    for op, _arg, _pos in pickletools.genops(body):
        counts[op.name] = counts.get(op.name, 0) + 1
    return counts


def shape_values(shape: Any) -> int:
    """The values a BUILD state's shape describes (state_shape's own work)."""
    return 1 + (sum(shape_values(s) for s in shape[1]) if shape[0] == "tuple" else 0)


class TestWorkMultiplied(unittest.TestCase):
    """Issue 40.8: a value made once and fetched again and again from the memo costs the pickle two bytes a
    use; the work the scan does with it per use is counted (BUILD describes its state, keeps a new check),
    so ``max_opcodes`` bounds the time.  The counter is checked against the work the walk really did."""

    def scan_counting(self, body: bytes, limit: int = 10**8) -> tuple[Any, int, int]:
        """(the scan, values its BUILD states described, new BUILD checks it kept)."""
        described, kept = [0], [0]
        shape_of, check = walker.state_shape, model.ScanState.check

        def counted_shape(value: Any, depth: int = 0) -> Any:
            shape = shape_of(value, depth)
            described[0] += shape_values(shape)
            return shape

        def counted_check(state: Any, *args: Any) -> bool:
            new = check(state, *args)
            kept[0] += bool(new) and args[0] == "build"
            return new

        with (
            mock.patch.object(walker, "state_shape", counted_shape),
            mock.patch.object(model.ScanState, "check", counted_check),
            scan_limits(max_opcodes=limit),
        ):
            info = scan_checkpoint(H.torch_zip(body))
        return info, described[0], kept[0]

    def test_every_flood_counts_its_opcodes_and_the_states_it_describes(self):
        for name, make in H.FLOODS.items():
            if name.startswith(("INT", "EXT")):
                continue  # their own tests below
            with self.subTest(name):
                body = make(6_000)
                info, described, kept = self.scan_counting(body)
                ops = count_ops(body)
                opcodes = sum(ops.values()) + 3 * (ops.get("GLOBAL", 0) + ops.get("STACK_GLOBAL", 0))
                self.assertGreaterEqual(info.opcodes_walked, opcodes + described - ops.get("BUILD", 0) + 15 * kept)

    def test_a_shared_nested_state_counts_each_value_at_every_build(self):
        body = H.FLOODS["BINGET+BUILD, nested tuple state"](20_000)
        info, described, _kept = self.scan_counting(body)
        builds = count_ops(body)["BUILD"]
        self.assertEqual(described, 21 * builds)  # 4 tuples of 4 strings, and the tuple holding them
        self.assertGreaterEqual(info.opcodes_walked, 22 * builds)
        with scan_limits(max_opcodes=200_000):  # 40,000 opcodes, but 440,000 units of work
            with self.assertRaisesRegex(CheckpointFormatError, r"max_opcodes=200000"):
                scan_checkpoint(H.torch_zip(body))

    def test_a_new_state_each_build_counts_the_check_it_keeps(self):
        body = H.FLOODS["BUILD, a new state each"](6_000)
        info, _described, kept = self.scan_counting(body)
        builds = count_ops(body)["BUILD"]
        self.assertEqual(kept, builds)  # each a check of its own, kept for the prediction
        self.assertGreaterEqual(info.opcodes_walked, 16 * kept)

    def test_stack_global_counts_four(self):
        body = H.FLOODS["STACK_GLOBAL of long names"](4_000)
        info = scan_checkpoint(H.torch_zip(body))
        ops = count_ops(body)
        self.assertGreaterEqual(info.opcodes_walked, sum(ops.values()) + 3 * ops["STACK_GLOBAL"])

    def test_long_text_integers_are_checked_not_converted(self):
        limits = ScanLimits()
        self.assertIs(text_int(b"9" * 4300, 0x49, 0, limits), INT)  # int() would take quadratic time
        self.assertIs(text_int(b" -1_000" + b"0" * 100 + b"\n", 0x49, 0, limits), INT)
        self.assertEqual(text_int(b"-1_000", 0x49, 0, limits), -1000)
        self.assertEqual(text_int(b"12L", 0x4C, 0, limits), 12)
        for bad in (b"9" * 4299 + b"x", b"1__0" + b"0" * 50, b"0x10", b""):
            with self.assertRaisesRegex(CheckpointFormatError, "an integer that is not a number"):
                text_int(bad, 0x49, 0, limits)
        info = scan_checkpoint(H.torch_zip(H.FLOODS["INT of 4,300 digits"](200)))
        self.assertEqual(info.unsupported_opcodes, ("INT",))

    def test_a_memo_index_longer_than_pickle_reads_is_damaged(self):
        for opcode, ops in (("PUT", b"p" + b"9" * 30 + b"\n"), ("GET", b"N0g" + b"9" * 4300 + b"\n")):
            with self.subTest(opcode):
                with self.assertRaisesRegex(CheckpointFormatError, f"{opcode} with an index that is not an integer"):
                    scan_checkpoint(H.torch_zip(b"\x80\x02N" + ops + b"."))
        info = scan_checkpoint(H.torch_zip(b"\x80\x02Np" + b"9" * 19 + b"\ng" + b"9" * 19 + b"\n."))
        self.assertEqual(info.memo_entries, 1)

    def test_extension_codes_count_toward_max_globals(self):
        body = H.FLOODS["EXT4, distinct codes"]
        with scan_limits(max_globals=500):
            self.assertEqual(len(scan_checkpoint(H.torch_zip(body(1000))).globals), 500)
            with self.assertRaisesRegex(CheckpointFormatError, r"max_globals=500.*scan_limits\(max_globals="):
                scan_checkpoint(H.torch_zip(body(1002)))


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
