"""Bounded work: hostile bytes end in CheckpointFormatError or in a scan whose work is bounded.

No time is asserted.  The bounds are work counts the scan reports
(``CheckpointInfo.opcodes_walked``, ``memo_entries``, ``bytes_scanned``), Python memory
traced during the scan, and the caps of :class:`ScanLimits`, each of which ends the
scan with a one-line error naming the cap and how to raise it.
"""

from __future__ import annotations

import os
import struct
import sys
import tracemalloc
import unittest
import zipfile
from typing import Optional

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

from test.helpers import hostile_checkpoints as H  # noqa: E402

from torch_serial_testing import CheckpointFormatError, scan_checkpoint
from torch_serial_testing.model import ScanLimits, default_scan_limits, scan_limits

MB = 1 << 20


def adversarial(body_unit: bytes, head: bytes = b"N", proto: int = 4) -> bytes:
    """A ~1 MB data.pkl: PROTO, *head*, then *body_unit* repeated, then STOP."""
    reps = MB // len(body_unit)
    return H.torch_zip(b"\x80" + bytes([proto]) + head + body_unit * reps + b".")


class TestOneMegabyteFiles(unittest.TestCase):
    def assertBoundedScan(self, data: bytes, max_peak: Optional[int] = None):  # noqa: N802
        """The scan either fails cleanly or finishes with work bounded by the file and the caps.

        With *max_peak*, the Python memory traced during the scan stays under it.
        """
        if max_peak is not None:
            tracemalloc.start()
        try:
            try:
                info = scan_checkpoint(data)
            except CheckpointFormatError as e:
                self.assertEqual(len(str(e).splitlines()), 1)
                info = None
            if max_peak is not None:
                _, peak = tracemalloc.get_traced_memory()
                self.assertLess(peak, max_peak)
        finally:
            if max_peak is not None:
                tracemalloc.stop()
        if info is not None:
            limits = default_scan_limits()
            self.assertLessEqual(info.opcodes_walked, min(len(data), limits.max_opcodes + 1024))
            self.assertLessEqual(info.memo_entries, limits.max_memo_entries)
            self.assertLessEqual(info.bytes_scanned, limits.max_scan_bytes)
        return info

    def test_memoize_flood(self) -> None:
        info = self.assertBoundedScan(adversarial(b"\x94"), max_peak=128 * MB)  # MEMOIZE x 1M
        self.assertIsNotNone(info)
        self.assertGreater(info.memo_entries, 1_000_000 - 10)
        self.assertIn("MEMOIZE", info.unsupported_opcodes)
        with scan_limits(max_memo_entries=10_000):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_memo_entries=10000"):
                scan_checkpoint(adversarial(b"\x94"))

    def test_long_binput_with_distinct_indices(self) -> None:
        body = b"".join(b"r" + struct.pack("<I", i * 7919) for i in range(MB // 5))
        with scan_limits(max_memo_entries=50_000):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_memo_entries"):
                scan_checkpoint(H.torch_zip(b"\x80\x02N" + body + b"."))

    def test_cheap_opcodes(self) -> None:
        info = self.assertBoundedScan(adversarial(b"N0", proto=2))  # NONE, POP
        self.assertIsNotNone(info)
        self.assertGreater(info.opcodes_walked, MB // 2)
        with scan_limits(max_opcodes=100_000):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_opcodes=100000"):
                scan_checkpoint(adversarial(b"N0", proto=2))

    def test_deep_marks_and_long_stacks(self) -> None:
        self.assertBoundedScan(adversarial(b"("), max_peak=64 * MB)  # MARK x 1M, never closed
        self.assertBoundedScan(adversarial(b"N"))  # 1M values left on the stack
        with scan_limits(max_stack_depth=10_000):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_stack_depth=10000"):
                scan_checkpoint(adversarial(b"("))

    def test_dup_get_tuple_growth(self) -> None:
        # Each TUPLE of memo references is small: no quadratic blow-up from shared references.
        body = b"(" + b"h\x00" * 50 + b"tq\x00"
        self.assertBoundedScan(H.torch_zip(b"\x80\x02Nq\x00" + body * (MB // len(body)) + b"."))

    def test_many_dotted_names(self) -> None:
        dotted = ".".join(["a"] * 500)
        glob = b"c" + dotted.encode() + b"\nb\n0"
        info = self.assertBoundedScan(H.torch_zip(b"\x80\x02N" + glob * (MB // len(glob)) + b"."))
        self.assertIsNotNone(info)
        self.assertEqual(info.globals, (dotted + ".b",))
        too_long = "a." * 600 + "b"
        with self.assertRaisesRegex(CheckpointFormatError, r"max_name_length=1024"):
            scan_checkpoint(H.torch_zip(b"\x80\x02c" + too_long.encode() + b"\nc\n."))

    def test_deflated_memo_bomb_is_refused_by_size(self) -> None:
        out = __import__("io").BytesIO()
        with zipfile.ZipFile(out, "w", zipfile.ZIP_DEFLATED) as z:
            z.writestr("archive/data.pkl", b"\x80\x04N" + b"\x94" * 30 * MB + b".")
            z.writestr("archive/version", b"3\n")
        self.assertLess(len(out.getvalue()), 100_000)
        with scan_limits(max_pickle_bytes=4 * MB):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_pickle_bytes"):
                scan_checkpoint(out.getvalue())


class TestMalformedValues(unittest.TestCase):
    def assertOneLineFormatError(self, data: bytes, pattern: str) -> None:  # noqa: N802
        with self.assertRaisesRegex(CheckpointFormatError, pattern) as cm:
            scan_checkpoint(data)
        self.assertEqual(len(str(cm.exception).splitlines()), 1, str(cm.exception))

    def test_huge_text_integer(self) -> None:
        self.assertOneLineFormatError(H.torch_zip(b"I" + b"9" * 5000 + b"\n."), r"integer of 5000 digits")

    def test_lone_surrogate_in_a_global_name(self) -> None:
        module = b"X" + struct.pack("<I", 3) + "\ud800".encode("utf-8", "surrogatepass")
        name = b"X" + struct.pack("<I", 1) + b"x"
        self.assertOneLineFormatError(H.torch_zip(b"\x80\x04" + module + name + b"\x93."), "lone surrogate")

    def test_non_utf8_names_and_strings(self) -> None:
        self.assertOneLineFormatError(H.torch_zip(b"\x80\x02c\xff\xfe\nx\n."), "not UTF-8")
        self.assertOneLineFormatError(H.torch_zip(b"\x80\x02X\x01\x00\x00\x00\xff."), "not UTF-8")

    def test_truncations_and_underflows(self) -> None:
        for body, pattern in (
            (b"\x80\x02X\xff\xff\x00\x00ab", "truncated or damaged"),
            (b"\x80\x02R.", "truncated or damaged"),
            (b"\x80\x02h\x05.", "memo entry 5"),
            (b"\x80\x02N", "ended early"),
            (b"\x80\x02\xff.", "unknown opcode 255"),
            (b"\x80\x09N.", "protocol 9"),
        ):
            with self.subTest(body):
                self.assertOneLineFormatError(H.torch_zip(body), pattern)

    def test_limits_are_validated_and_restored(self) -> None:
        with self.assertRaisesRegex(ValueError, "max_opcodes must be a positive int"):
            ScanLimits(max_opcodes=0)
        before = default_scan_limits()
        with self.assertRaises(RuntimeError):
            with scan_limits(max_opcodes=5):
                self.assertEqual(default_scan_limits().max_opcodes, 5)
                raise RuntimeError("boom")
        self.assertEqual(default_scan_limits(), before)
        small = ScanLimits(max_opcodes=3)
        with self.assertRaisesRegex(CheckpointFormatError, "max_opcodes=3"):
            scan_checkpoint(H.torch_zip(b"\x80\x02" + b"N0" * 2000 + b"N."), limits=small)


if __name__ == "__main__":
    unittest.main()
