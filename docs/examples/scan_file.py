"""Scan a checkpoint file without loading it, and see what the scan refuses to read.

Files (and the formats before torch 1.6) are read by the tools; the core reads bytes in memory."""

import os
import tempfile

import torch

from torch_serial_testing import CheckpointFormatError, scan_limits
from torch_serial_testing.tools import FileCheckpoint, scan_checkpoint

with tempfile.TemporaryDirectory() as d:
    path = os.path.join(d, "model.pt")
    torch.save({"weight": torch.zeros(1024, 1024)}, path)  # 4 MiB of tensor data

    # The scan reads data.pkl and the small records by name, never the tensor bytes.
    info = scan_checkpoint(path)
    assert info.format == "zip" and info.readings == ("zip",)
    assert info.bytes_scanned < 4096, info.bytes_scanned

    # A Checkpoint over the open file: scanned on first use, never read whole into memory.
    ckpt = FileCheckpoint.from_path(path)
    assert ckpt.nbytes > 4 * 1024 * 1024 and not ckpt.owned
    assert ckpt.info.globals  # e.g. torch._utils._rebuild_tensor_v2, collections.OrderedDict
    ckpt.rewound().close()

    # Regular files only: a FIFO (or /dev/zero, a directory) is refused before anything is read.
    if hasattr(os, "mkfifo"):
        fifo = os.path.join(d, "pipe.pt")
        os.mkfifo(fifo)
        try:
            scan_checkpoint(fifo)
        except CheckpointFormatError as e:
            assert "not a regular file" in str(e)
        else:
            raise AssertionError("a FIFO was scanned")

    # Every cap of ScanLimits ends the scan with an error naming it (and how to raise it).
    with scan_limits(max_opcodes=10):
        try:
            scan_checkpoint(path)
        except CheckpointFormatError as e:
            assert "max_opcodes=10" in str(e)
        else:
            raise AssertionError("the opcode cap did not hold")
print("ok")
