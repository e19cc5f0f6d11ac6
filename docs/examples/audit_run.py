"""Audit an unchanged test file: which torch.load fails only because of the weights_only default, and the fix."""

import json
import os
import subprocess
import sys
import tempfile
import textwrap

TEST_FILE = textwrap.dedent(
    """
    import io
    import unittest

    import torch


    class TestCheckpoint(unittest.TestCase):
        def test_whole_module(self):
            buf = io.BytesIO()
            torch.save(torch.nn.Linear(2, 2), buf)
            buf.seek(0)
            torch.load(buf)  # bare: weights-only since torch 2.6
    """
)

with tempfile.TemporaryDirectory() as tmp:
    with open(os.path.join(tmp, "test_ckpt.py"), "w") as f:
        f.write(TEST_FILE)
    report = os.path.join(tmp, "audit.jsonl")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch_serial_testing",
            "audit",
            "--report",
            report,
            "--",
            sys.executable,
            "-m",
            "unittest",
            "test_ckpt",
        ],
        cwd=tmp,
        capture_output=True,
        text=True,
    )
    with open(report) as f:
        (load,) = [r for r in map(json.loads, f) if r["event"] == "load"]

# stderr holds the test run's own output, then the audit's summary
summary = proc.stderr[proc.stderr.index("torch_serial_testing audit:") :]
print(summary)
print(json.dumps(load, indent=2))
assert load["test"] == "test_ckpt.TestCheckpoint.test_whole_module"
assert load["site"] == "test_ckpt.py:13"
assert load["needs"] == ["torch.nn.modules.linear.Linear"]
assert load["fix"]["kind"] == "safe_globals" and load["fix"]["verified"]
if load["effective_weights_only"]:
    assert "fails only because of the weights_only default" in summary, summary
# the run's own status: 1 where the bare load is weights-only (torch >= 2.6), 0 before
assert proc.returncode == (1 if load["effective_weights_only"] else 0)
