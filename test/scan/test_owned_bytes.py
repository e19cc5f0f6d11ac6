"""Issue 40.4: an owned Checkpoint is bound to the bytes Checkpoint.save wrote.

``Checkpoint.rewound()`` is public.  It hands out a new ``io.BytesIO`` over the checkpoint's bytes
(immutable ``bytes``) on every call, so writing other bytes into what it returns changes only that
copy: every later load, a ``weights_only=False`` one included, reads what the save wrote.  The
attack writes a checkpoint whose full unpickle would append to a sentinel file; it must never run.
"""

from __future__ import annotations

import io
import os
import sys
import tempfile
import unittest

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

from test.helpers import hostile_checkpoints as H  # noqa: E402
from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY  # noqa: E402
from torch_serial_testing import Checkpoint  # noqa: E402
from torch_serial_testing.errors import UnsafeLoadRefused  # noqa: E402
from torch_serial_testing.loading import load  # noqa: E402
from torch_serial_testing.modes import LoadMode  # noqa: E402

STATE = {"w": torch.arange(4.0), "b": torch.ones(2)}


class TestOwnedBytes(unittest.TestCase):
    def setUp(self) -> None:
        d = tempfile.TemporaryDirectory()
        self.addCleanup(d.cleanup)
        self.sentinel = os.path.join(d.name, "sentinel")
        self.evil = H.build_all(self.sentinel)["builtins_exec"]  # a full unpickle appends to the sentinel

    def assertLoadsWhatWasSaved(self, checkpoint: Checkpoint) -> None:  # noqa: N802
        for mode in LoadMode:
            with self.subTest(mode=mode.value):
                result = load(checkpoint, mode)
                self.assertTrue(result.loaded, result.summary)
                self.assertEqual(set(result.value), set(STATE))
                for key, tensor in STATE.items():
                    self.assertTrue(torch.equal(result.value[key], tensor), key)
        self.assertFalse(os.path.exists(self.sentinel), "the other bytes were unpickled")

    def test_writing_into_rewound_changes_nothing_the_checkpoint_loads(self) -> None:
        checkpoint = Checkpoint.save(STATE)
        saved, nbytes = checkpoint.rewound().getvalue(), checkpoint.nbytes
        buf = checkpoint.rewound()
        buf.seek(0)
        buf.write(self.evil)
        buf.truncate()
        self.assertTrue(checkpoint.owned)
        self.assertEqual(checkpoint.nbytes, nbytes)
        self.assertEqual(checkpoint.rewound().getvalue(), saved)
        self.assertEqual(checkpoint.info.globals, Checkpoint.from_bytes(saved).info.globals)
        self.assertLoadsWhatWasSaved(checkpoint)

    def test_each_call_is_a_new_buffer_from_the_start(self) -> None:
        checkpoint = Checkpoint.save(STATE)
        first = checkpoint.rewound()
        first.read(10)
        second = checkpoint.rewound()
        self.assertIsNot(first, second)
        self.assertEqual(second.tell(), 0)
        self.assertEqual(second.read(), first.getvalue())

    def test_writing_into_a_buffer_returned_before_the_load(self) -> None:
        # The buffer a caller kept from before the checkpoint was scanned or loaded: written afterwards.
        checkpoint = Checkpoint.save(STATE)
        kept = checkpoint.rewound()
        self.assertEqual(checkpoint.format, "zip")
        kept.seek(0)
        kept.write(self.evil)
        kept.truncate()
        self.assertLoadsWhatWasSaved(checkpoint)

    def test_the_save_buffer_is_not_the_checkpoint(self) -> None:
        # Wrapping a BytesIO keeps its bytes as they were: later writes into it do not reach the checkpoint.
        buffer = io.BytesIO()
        torch.save(STATE, buffer)
        buffer.seek(0)
        checkpoint = Checkpoint.from_buffer(buffer)
        buffer.seek(0)
        buffer.write(self.evil)
        self.assertFalse(checkpoint.owned)
        self.assertNotEqual(checkpoint.rewound().getvalue()[: len(self.evil)], self.evil)
        for mode in (LoadMode.DEFAULT, LoadMode.SAFE_GLOBALS):
            if mode is LoadMode.DEFAULT and not DEFAULT_WEIGHTS_ONLY:  # a bare load is a full load before torch 2.6
                with self.assertRaisesRegex(UnsafeLoadRefused, "refusing a weights_only=False load"):
                    load(checkpoint, mode)
                continue
            self.assertTrue(load(checkpoint, mode).loaded)
        self.assertFalse(os.path.exists(self.sentinel))


if __name__ == "__main__":
    unittest.main()
