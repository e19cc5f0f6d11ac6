"""Instruction counts of test files (``valgrind --tool=callgrind``): a measure machine load cannot move.

Wall-clock ratios of whole processes swing by several percent between runs on a shared machine;
the number of instructions a file's tests execute does not.  Each file is run in a child under
callgrind with collection switched on (``torch._C._valgrind_toggle``) only around importing the
test module and running its tests, after torch, pytorch's ``common_utils`` and ``torch._dynamo``
are imported: what the file itself costs on top of what every pytorch test file pays.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
from typing import Optional

# The child: import what every pytorch test file pays, then count the module's import and tests.
CHILD = """\
import os, sys, unittest
directory, name = sys.argv[1], sys.argv[2]
sys.path.insert(0, directory)
os.chdir(directory)
import torch
import torch.testing._internal.common_utils
import torch._dynamo
torch._C._valgrind_toggle()
module = __import__(name)
suite = unittest.defaultTestLoader.loadTestsFromModule(module)
result = unittest.TextTestRunner(verbosity=0, stream=open(os.devnull, "w")).run(suite)
torch._C._valgrind_toggle()
sys.exit(0 if result.wasSuccessful() else 1)
"""


def available() -> Optional[str]:
    """Why instruction counts cannot be taken here, or None when they can."""
    import torch

    if shutil.which("valgrind") is None:
        return "valgrind is not installed"
    if not getattr(torch._C, "_valgrind_supported_platform", lambda: False)():
        return "this torch build has no valgrind support"
    return None


def count(directory: str, module: str, env: dict[str, str]) -> int:
    """Instructions executed importing *module* (found in *directory*) and running its tests."""
    with tempfile.TemporaryDirectory(prefix="tst-callgrind-") as tmp:
        child = os.path.join(tmp, "child.py")
        with open(child, "w", encoding="utf-8") as fh:
            fh.write(CHILD)
        out = os.path.join(tmp, "callgrind.out")
        proc = subprocess.run(
            [
                "valgrind",
                "--tool=callgrind",
                "--collect-atstart=no",
                f"--callgrind-out-file={out}",
                sys.executable,
                child,
                directory,
                module,
            ],
            capture_output=True,
            text=True,
            env=env,
            timeout=1800,
        )
        found = re.search(r"Collected : (\d+)", proc.stderr)
        if proc.returncode != 0 or found is None:
            raise RuntimeError(f"callgrind run of {module} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
        return int(found.group(1))
