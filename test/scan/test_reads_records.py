"""Issue 28 (speed and memory): the scan reads the pickle records, never tensor bytes.

Files and streams are read by the tools (:mod:`torch_serial_testing.tools.formats`), in place; the
core's in-test scan reads the pickle record of the archive :meth:`Checkpoint.save` wrote.

Bytes read are counted through the file object torch's reader and the scan are given, for a
checkpoint of a few KiB and one of 16 MiB of tensor data: the same, and far below the tensors'.
(Time and RSS are measured by ``bench/scan_cost.py``, not asserted here.)
"""

from __future__ import annotations

import io
import os
import tempfile
import unittest

import torch

from torch_serial_testing.checkpoint import Checkpoint
from torch_serial_testing.tools import FileCheckpoint, scan_checkpoint

TENSOR_BYTES = 16 << 20


class CountingBytesIO(io.BytesIO):
    def __init__(self, data: bytes) -> None:
        super().__init__(data)
        self.count = 0

    def read(self, n: int | None = -1) -> bytes:
        b = super().read(n)
        self.count += len(b)
        return b

    def readinto(self, b) -> int:  # type: ignore[override]
        n = super().readinto(b)
        self.count += n
        return n


class CountingFile(io.FileIO):
    count = 0

    def read(self, n: int | None = -1) -> bytes:
        b = super().read(n)
        self.count += len(b or b"")
        return b

    def readinto(self, b) -> int:  # type: ignore[override]
        n = super().readinto(b) or 0
        self.count += n
        return n


def _saved(nbytes: int, zip_format: bool) -> bytes:
    buf = io.BytesIO()
    torch.save({"w": torch.zeros(nbytes // 4), "b": torch.ones(3)}, buf, _use_new_zipfile_serialization=zip_format)
    return buf.getvalue()


class TestReadsOnlyRecords(unittest.TestCase):
    def bytes_read(self, data: bytes) -> int:
        f = CountingBytesIO(data)
        info = scan_checkpoint(f)
        self.assertIn(info.format, ("zip", "legacy"))
        return f.count

    def test_zip_reads_the_same_for_small_and_large(self):
        small, large = self.bytes_read(_saved(2048, True)), self.bytes_read(_saved(TENSOR_BYTES, True))
        self.assertLess(large, 64 * 1024)
        self.assertLess(abs(large - small), 4096)

    def test_legacy_stream_reads_its_pickles_only(self):
        small, large = self.bytes_read(_saved(2048, False)), self.bytes_read(_saved(TENSOR_BYTES, False))
        self.assertLess(large, 128 * 1024)
        self.assertLessEqual(small, 2 * len(_saved(2048, False)))  # a small file: the tar test, then read whole
        self.assertLess(large, TENSOR_BYTES // 100)

    def test_legacy_pickles_longer_than_the_first_read(self):
        # An object pickle of ~300 KiB (many small tensors): read in doubling chunks, scanned whole.
        obj = {f"k{i}": torch.zeros(1) for i in range(3000)}
        buf = io.BytesIO()
        torch.save(obj, buf, _use_new_zipfile_serialization=False)
        info = scan_checkpoint(buf.getvalue())
        self.assertEqual(info.format, "legacy")
        self.assertGreater(info.bytes_scanned, 200 * 1024)

    def test_a_real_file(self):
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "big.pt")
            with open(path, "wb") as fh:
                fh.write(_saved(TENSOR_BYTES, True))
            with CountingFile(path, "r") as f:
                self.assertEqual(scan_checkpoint(f).format, "zip")
                self.assertLess(f.count, 64 * 1024)
            ckpt = FileCheckpoint.from_path(path)
            try:
                self.assertEqual(ckpt.info.format, "zip")
                self.assertGreater(ckpt.nbytes, TENSOR_BYTES)
            finally:
                ckpt.rewound().close()

    def test_in_test_round_trip_scan_reads_no_storage(self):
        ckpt = Checkpoint.save({"w": torch.zeros(TENSOR_BYTES // 4)})
        info = ckpt.info
        self.assertLess(info.bytes_scanned, 4096)
        self.assertGreater(ckpt.nbytes, TENSOR_BYTES)


if __name__ == "__main__":
    unittest.main()
