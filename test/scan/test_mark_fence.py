"""Issue 27.7: no opcode reaches below a MARK, in the scan's model as in torch's unpickler.

Every opcode that takes or reads a stack value, right after a MARK, with what it would take pushed
below the MARK (:mod:`tools.differential.mark_cases`): predict() and torch.load (weights-only, on
these crafted bytes) agree; and the scan calls the stream damaged, naming the MARK.
"""

from __future__ import annotations

import io
import os
import sys
import unittest
from unittest import mock

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from test.helpers import hostile_checkpoints as H  # noqa: E402
from test.helpers.roundtrip_fixtures import WEIGHTS_ONLY_BARE_ENV  # noqa: E402
from tools.differential import mark_cases  # noqa: E402
from torch_serial_testing import CheckpointFormatError, predict, scan_checkpoint
from torch_serial_testing.checkpoint import Checkpoint


def _weights_only_raises(data: bytes) -> bool:
    try:
        torch.load(io.BytesIO(data), weights_only=True)
    except Exception:  # noqa: BLE001 - any failure counts
        return True
    return False


class TestMarkFence(unittest.TestCase):
    def test_every_popping_opcode_after_mark_agrees_with_torch(self):
        labels = []
        for label, data in mark_cases.cases():
            labels.append(label)
            with self.subTest(label):
                raises, rejects, what = mark_cases.compare(data)
                self.assertEqual(raises, rejects, what)
                # every case is read (a legacy stream by the tools), never refused unread by the core
                self.assertNotIn("not a zip archive", what)
        names = {label.partition("/")[2] for label in labels}
        for op in ("TUPLE1", "BINPUT", "LONG_BINPUT", "PUT", "SETITEM", "APPEND", "REDUCE", "BUILD", "STOP"):
            self.assertIn(op, names)
        self.assertEqual(len(labels), 2 * len(names))  # zip and legacy each

    def test_issue_cases_are_damaged_streams(self):
        # TUPLE1, BINPUT, SETITEM right after a MARK: torch raises IndexError; the scan names the MARK.
        for op in (b"\x85", b"q\x00", b"s"):
            data = H.torch_zip(b"\x80\x02}K\x01K\x02(" + op + b".")
            with self.subTest(op=op):
                self.assertTrue(_weights_only_raises(data))
                with self.assertRaisesRegex(CheckpointFormatError, "above the last MARK"):
                    scan_checkpoint(data)
                with self.assertRaises(CheckpointFormatError), mock.patch.dict(os.environ, WEIGHTS_ONLY_BARE_ENV):
                    predict("default", Checkpoint.from_bytes(data), [])  # (a weights-only default, as since 2.6)

    def test_values_above_the_mark_still_count(self):
        # MARK, one value, TUPLE1: the value is above the MARK; torch and the scan both take it.
        data = H.torch_zip(b"\x80\x02}(K\x01\x85.")
        self.assertFalse(_weights_only_raises(data))
        self.assertTrue(predict("default", Checkpoint.from_bytes(data), []).loads)
        # Two needed, one above the MARK: underflow at the MARK, not below it.
        data = H.torch_zip(b"\x80\x02K\x01(K\x02\x86.")
        self.assertTrue(_weights_only_raises(data))
        with self.assertRaisesRegex(CheckpointFormatError, "needs 2 values above the last MARK"):
            scan_checkpoint(data)

    def test_fence_restored_after_the_mark_closes(self):
        # MARK ... TUPLE closes the MARK: the values below it are reachable again (TUPLE2 of dict, tuple).
        data = H.torch_zip(b"\x80\x02}(K\x01t\x86.")
        self.assertFalse(_weights_only_raises(data))
        self.assertTrue(predict("default", Checkpoint.from_bytes(data), []).loads)
        # Nested MARKs: closing the inner one fences at the outer one.
        data = H.torch_zip(b"\x80\x02}((t\x86.")
        self.assertTrue(_weights_only_raises(data))
        with self.assertRaisesRegex(CheckpointFormatError, "above the last MARK"):
            scan_checkpoint(data)


if __name__ == "__main__":
    unittest.main()
