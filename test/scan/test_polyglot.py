"""Issue 27.2: bytes torch.load may read in more than one way are scanned in every reading.

torch reads a real file (a path, an ``open()``-ed file) that is a tar archive as the legacy tar
format, and any other file object (``io.BytesIO``) as a legacy pickle stream; a polyglot
(:mod:`test.helpers.polyglots`) is both.  The tests first ask torch (weights-only loads of harmless
polyglots) which reading each source gets, then check the scan reports both readings' names.
"""

from __future__ import annotations

import io
import os
import pickle
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from test.helpers import hostile_checkpoints as H  # noqa: E402
from test.helpers.polyglots import ascii_pickle, tar_legacy_polyglot  # noqa: E402
from torch_serial_testing import CheckpointFormatError
from torch_serial_testing import scan_checkpoint as core_scan_checkpoint
from torch_serial_testing.tools import scan_checkpoint  # every format torch.load reads
from torch_serial_testing.tools.cli import main

#: builtins.exec('1'): what a full load of the stream reading would run.
EXEC_PICKLE = b"\x80\x02" + H.glob("builtins", "exec") + b"X\x01\x00\x00\x001\x85R."
EXEC_ASCII = b"cbuiltins\nexec\n(V1\ntR."


def _load(source: object) -> object:
    try:
        return torch.load(source, weights_only=True)
    except Exception as e:  # noqa: BLE001 - the outcome is the data
        return type(e).__name__


class TestTorchReadings(unittest.TestCase):
    """What torch itself does with a harmless polyglot, per kind of source."""

    def test_path_reads_the_tar_and_bytesio_the_stream(self):
        data = tar_legacy_polyglot(ascii_pickle({"tar": 1}), pickle.dumps({"stream": 2}, protocol=2))
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "poly.pt")
            with open(path, "wb") as fh:
                fh.write(data)
            # The tar reading is never weights-only: torch refuses both real-file sources for it (torch 2.4
            # reads the tar's pickle with the weights-only unpickler instead, which refuses its opcodes).
            refusal = "RuntimeError" if hasattr(torch.serialization, "safe_globals") else "UnpicklingError"
            self.assertEqual(_load(path), refusal)
            with open(path, "rb") as fh:
                self.assertEqual(_load(fh), refusal)
        self.assertEqual(_load(io.BytesIO(data)), {"stream": 2})


class TestPolyglotScan(unittest.TestCase):
    def test_payload_in_the_stream_reading(self):
        info = scan_checkpoint(tar_legacy_polyglot(ascii_pickle({"tar": 1}), EXEC_PICKLE))
        self.assertEqual(info.readings, ("tar", "legacy"))
        self.assertEqual(info.format, "tar")
        self.assertIn("builtins.exec", info.globals)
        self.assertIn("builtins.exec", info.full_load_globals)

    def test_payload_in_the_tar_reading(self):
        info = scan_checkpoint(tar_legacy_polyglot(EXEC_ASCII, pickle.dumps({"a": 1}, protocol=2)))
        self.assertEqual(info.readings, ("tar", "legacy"))
        self.assertIn("builtins.exec", info.globals)

    def test_payload_in_both_readings_from_a_path_and_a_stream(self):
        data = tar_legacy_polyglot(EXEC_ASCII, EXEC_PICKLE)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "poly.pt")
            with open(path, "wb") as fh:
                fh.write(data)
            for source in (path, io.BytesIO(data), data):
                with self.subTest(source=type(source).__name__):
                    self.assertEqual(scan_checkpoint(source).readings, ("tar", "legacy"))

    def test_single_readings(self):
        tar = H.legacy_tar(pickle.dumps({"a": 1}, protocol=2))
        self.assertEqual(scan_checkpoint(tar).readings, ("tar",))
        stream = H.legacy_stream(pickle.dumps({"a": 1}, protocol=2))
        self.assertEqual(scan_checkpoint(stream).readings, ("legacy",))
        self.assertEqual(scan_checkpoint(H.torch_zip(b"\x80\x02}.")).readings, ("zip",))

    def test_a_zip_is_a_zip_from_every_source(self):
        # A zip followed by a legacy stream: torch reads the zip from a path and from BytesIO alike.
        data = H.torch_zip(pickle.dumps({"zip": 1}, protocol=2)) + H.legacy_stream(EXEC_PICKLE)
        self.assertEqual(_load(io.BytesIO(data)), {"zip": 1})
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "z.pt")
            with open(path, "wb") as fh:
                fh.write(data)
            self.assertEqual(_load(path), {"zip": 1})
        info = scan_checkpoint(data)
        self.assertEqual((info.format, info.readings), ("zip", ("zip",)))

    def test_damaged_tar_with_a_stream_is_the_stream(self):
        # The tar opens but lacks its members: a path load fails, BytesIO reads the stream.
        data = tar_legacy_polyglot(ascii_pickle({"tar": 1}), EXEC_PICKLE)
        data = data.replace(b"storages", b"xtorages", 1)
        self.assertEqual(_load(io.BytesIO(data)), "UnpicklingError")  # builtins.exec is not allowlisted
        info = scan_checkpoint(data)
        self.assertEqual((info.format, info.readings), ("legacy", ("legacy",)))
        self.assertIn("builtins.exec", info.globals)

    def test_the_core_reads_no_polyglot(self):
        # The core reads torch.save's zip archive from memory; the tar and stream readings are the tools'.
        data = tar_legacy_polyglot(ascii_pickle({"tar": 1}), EXEC_PICKLE)
        with self.assertRaisesRegex(
            CheckpointFormatError, r"^not a zip archive .*torch_serial_testing\.tools\.scan_checkpoint$"
        ):
            core_scan_checkpoint(data)

    def test_damaged_both_ways_names_the_tar(self):
        data = tar_legacy_polyglot(ascii_pickle({"tar": 1}), b"\x80\x02}")  # the stream's object has no STOP
        data = data.replace(b"storages", b"xtorages", 1)
        with self.assertRaisesRegex(CheckpointFormatError, "no 'storages' member"):
            scan_checkpoint(data)

    def test_cli_inspect_reports_the_worst_reading(self):
        data = tar_legacy_polyglot(ascii_pickle({"tar": 1}), EXEC_PICKLE)
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "poly.pt")
            with open(path, "wb") as fh:
                fh.write(data)
            out = io.StringIO()
            with redirect_stdout(out):
                code = main(["inspect", path])
        self.assertEqual(code, 2)
        self.assertIn("builtins.exec", out.getvalue())
        self.assertIn("DANGEROUS", out.getvalue())


if __name__ == "__main__":
    unittest.main()
