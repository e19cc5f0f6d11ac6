"""Issue 27.6: inspect and the tools' scan_checkpoint read regular files only, judged before anything is read.

/dev/zero used to end in a MemoryError traceback and a FIFO without a writer hung: both, and
directories, sockets and symlinks to any of them, are now one CheckpointFormatError / exit 2.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import tempfile
import unittest
from contextlib import redirect_stdout

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import CheckpointFormatError, predict
from torch_serial_testing import scan_checkpoint as core_scan_checkpoint
from torch_serial_testing.tools import FileCheckpoint, scan_checkpoint
from torch_serial_testing.tools.cli import main

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _inspect_json(path: str) -> tuple[int, dict]:
    out = io.StringIO()
    with redirect_stdout(out):
        code = main(["inspect", "--json", path])
    return code, json.loads(out.getvalue())


@unittest.skipUnless(hasattr(os, "mkfifo") and os.path.exists("/dev/zero"), "needs POSIX FIFOs and /dev/zero")
class TestNotRegularFiles(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name

    def assertRefused(self, path: str, kind: str):  # noqa: N802
        with self.assertRaisesRegex(CheckpointFormatError, f"is {kind}, not a regular file"):
            scan_checkpoint(path)
        with self.assertRaisesRegex(CheckpointFormatError, "not a regular file"):
            FileCheckpoint.from_path(path)
        code, report = _inspect_json(path)
        self.assertEqual((code, report["status"], report["exit_code"]), (2, "unreadable", 2))
        self.assertRegex(report["error"], kind)
        self.assertEqual(len(report["error"].splitlines()), 1)

    def test_character_device(self):
        self.assertRefused("/dev/zero", "a character device")

    def test_fifo_without_writer_does_not_hang(self):
        fifo = os.path.join(self.dir, "ckpt.pt")
        os.mkfifo(fifo)
        self.assertRefused(fifo, r"a FIFO \(named pipe\)")

    def test_directory(self):
        # The scan refuses a directory; inspect takes a folder as its files (test/cli/test_inspect_many.py),
        # and a folder holding none is unreadable, in one line.
        with self.assertRaisesRegex(CheckpointFormatError, "is a directory, not a regular file"):
            scan_checkpoint(self.dir)
        with self.assertRaisesRegex(CheckpointFormatError, "not a regular file"):
            FileCheckpoint.from_path(self.dir)
        out = io.StringIO()
        with redirect_stdout(out):
            code = main(["inspect", "--jsonl", self.dir])
        report = json.loads(out.getvalue())
        self.assertEqual((code, report["status"], report["exit_code"]), (2, "unreadable", 2))
        self.assertRegex(report["error"], "a folder holding no file")
        self.assertEqual(len(report["error"].splitlines()), 1)

    def test_socket(self):
        path = os.path.join(self.dir, "s")
        sock = socket.socket(socket.AF_UNIX)
        self.addCleanup(sock.close)
        try:
            sock.bind(path)
        except OSError as e:  # a sandbox without AF_UNIX binds
            self.skipTest(f"cannot bind a unix socket here: {e}")
        with self.assertRaises((CheckpointFormatError, OSError)):  # opening a socket file: ENXIO, or refused
            scan_checkpoint(path)

    def test_symlink_is_resolved_and_judged(self):
        link = os.path.join(self.dir, "model.pt")
        os.symlink("/dev/zero", link)
        with self.assertRaisesRegex(CheckpointFormatError, r"a symlink to '/dev/zero'.*character device"):
            scan_checkpoint(link)
        good = os.path.join(self.dir, "real.pt")
        with open(good, "wb") as fh:
            fh.write(H.torch_zip(b"\x80\x02}."))
        link2 = os.path.join(self.dir, "good-link.pt")
        os.symlink(good, link2)
        self.assertEqual(scan_checkpoint(link2).format, "zip")
        code, report = _inspect_json(link2)
        self.assertEqual((code, report["format"]), (0, "zip"))

    def test_regular_file_kept_open_not_read_whole(self):
        path = os.path.join(self.dir, "ok.pt")
        data = H.torch_zip(b"\x80\x02}.")
        with open(path, "wb") as fh:
            fh.write(data)
        ckpt = FileCheckpoint.from_path(path)
        self.assertEqual(ckpt.nbytes, len(data))
        self.assertEqual(ckpt.info.format, "zip")
        self.assertFalse(ckpt.owned)
        ckpt.rewound().close()

    def test_the_core_reads_no_path(self):
        path = os.path.join(self.dir, "ok.pt")
        with open(path, "wb") as fh:
            fh.write(H.torch_zip(b"\x80\x02}."))
        with self.assertRaises(TypeError) as cm:
            core_scan_checkpoint(path)
        self.assertEqual(
            str(cm.exception),
            f"scan_checkpoint takes bytes, a buffer or a Checkpoint, not the path {path!r}: files are "
            "read by torch_serial_testing.tools.scan_checkpoint(path)",
        )
        with self.assertRaises(TypeError) as cm:
            predict("safe_globals", path)
        self.assertEqual(
            str(cm.exception),
            f"predict() takes a Checkpoint (or, to predict, bytes or a buffer), not the path {path!r}: "
            "wrap a file with torch_serial_testing.tools.FileCheckpoint.from_path(path)",
        )
        checkpoint = FileCheckpoint.from_path(path)
        self.addCleanup(checkpoint.rewound().close)
        self.assertTrue(predict("safe_globals", checkpoint).loads)

    def test_stdin_from_dev_zero_is_capped(self):
        with open("/dev/zero", "rb") as zero:
            proc = subprocess.run(
                [sys.executable, "-m", "torch_serial_testing", "inspect", "--json", "-"],
                stdin=zero,
                capture_output=True,
                timeout=300,
                env={**os.environ, "PYTHONPATH": ROOT},
                cwd=ROOT,
            )
        self.assertEqual(proc.returncode, 2, proc.stderr[-2000:])
        report = json.loads(proc.stdout)
        self.assertIn("max_pickle_bytes", report["error"])

    def test_stdin_regular_file(self):
        path = os.path.join(self.dir, "ok.pt")
        with open(path, "wb") as fh:
            fh.write(H.torch_zip(b"\x80\x02}."))
        with open(path, "rb") as fh:
            proc = subprocess.run(
                [sys.executable, "-m", "torch_serial_testing", "inspect", "--json", "-"],
                stdin=fh,
                capture_output=True,
                timeout=300,
                env={**os.environ, "PYTHONPATH": ROOT},
                cwd=ROOT,
            )
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        self.assertEqual(json.loads(proc.stdout)["format"], "zip")


if __name__ == "__main__":
    unittest.main()
