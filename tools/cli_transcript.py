#!/usr/bin/env python3
"""Write ``docs/cli_transcript.txt``: real runs of the CLI on checkpoints made here, as printed.

    python tools/cli_transcript.py            # rewrite docs/cli_transcript.txt
    python tools/cli_transcript.py --stdout   # print it instead

Every command runs in a fresh interpreter in a temporary folder (so paths are short), at a fixed
width (``COLUMNS=100``), without the TORCH_FORCE_* switches unless the command sets them.
``test/cli/test_transcript.py`` checks that the file shows exactly the commands listed here.
"""

from __future__ import annotations

import os
import platform
import shlex
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
OUT = os.path.join(ROOT, "docs", "cli_transcript.txt")
WIDTH = "100"

MAKE = """
import warnings
import numpy as np
import torch
from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
import mymodels

warnings.simplefilter("ignore")  # quantized tensor creation is deprecated (this script's own process)
torch.backends.quantized.engine = "qnnpack"
w = torch.quantize_per_tensor(torch.randn(3, 16), 2.0, 0, torch.qint8)
lin = Linear(3, 16, 1, 4, bias=True, dtype=torch.qint8)
lin.set_weight_bias(w, torch.ones(3), 1, 4)
torch.save(lin, "seed.pt")
torch.save(mymodels.MyNet(), "mynet.pt")
torch.save({"lr": np.float64(0.1), "step": np.int64(3)}, "scalars.pt")
"""
USER_MODULE = (
    "import torch\n"
    "\n"
    "\n"
    "class MyNet(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(3, 2)\n"
)
SEED = "torch.ao.nn.sparse.quantized"
NP_SCALAR = "numpy._core.multiarray.scalar"

#: (shell command as shown, environment additions, a note printed above it or None)
COMMANDS: list[tuple[str, dict[str, str], str | None]] = [
    ("python -m torch_serial_testing inspect seed.pt", {}, None),
    ("python -m torch_serial_testing inspect seed.pt -v", {}, "the same with every reason (-v)"),
    ("python -m torch_serial_testing doctor", {}, None),
    (
        "python -m torch_serial_testing inspect seed.pt --safe-global torch.ScriptObject "
        f"--safe-global {SEED}.dynamic.linear.Linear --safe-global {SEED}.linear.LinearPackedParams",
        {},
        None,
    ),
    ("python -m torch_serial_testing inspect mynet.pt", {}, "a module of your own (mymodels.py in the folder)"),
    ("python -m torch_serial_testing inspect mynet.pt --import mymodels", {}, None),
    ("python -m torch_serial_testing inspect scalars.pt", {}, "numpy scalars: a function the pickle calls"),
    (f"python -m torch_serial_testing inspect scalars.pt --safe-global {NP_SCALAR}", {}, None),
    (
        "python -m torch_serial_testing inspect seed.pt mynet.pt scalars.pt",
        {},
        "several checkpoints in one call: a line each, the worst exit code",
    ),
    ("python -m torch_serial_testing inspect seed.pt --import no_such_module", {}, None),
    ("python -m torch_serial_testing inspect seed.pt", {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1"}, None),
    (
        "python -m torch_serial_testing inspect seed.pt",
        {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"},
        None,
    ),
]


def shown(command: str, env: dict[str, str]) -> str:
    return "$ " + " ".join(f"{k}={v}" for k, v in env.items()) + (" " if env else "") + command


def commands() -> list[tuple[str, dict[str, str], str | None]]:
    """:data:`COMMANDS` with numpy's module spelled as this numpy spells it (``numpy.core`` before 2)."""
    np_module = "numpy._core" if hasattr(__import__("numpy"), "_core") else "numpy.core"
    return [(command.replace("numpy._core", np_module), env, note) for command, env, note in COMMANDS]


def transcript() -> str:
    import torch

    lines = [
        f"# Real output: torch {torch.__version__}, Python {platform.python_version()}, "
        f"{platform.system()} {platform.machine()}; COLUMNS={WIDTH}; written by tools/cli_transcript.py.",
        "# seed.pt = torch.save(lin), lin the seed module torch.ao.nn.sparse.quantized.dynamic.linear.Linear",
        "# (3 out, 16 in, block 1x4, qint8), packed by the qnnpack engine; mynet.pt = torch.save(MyNet())",
        "# of mymodels.py in the same folder; scalars.pt = torch.save({'lr': np.float64(0.1), 'step': np.int64(3)}).",
        "",
    ]
    with tempfile.TemporaryDirectory(prefix="tst-transcript-") as cwd:
        with open(os.path.join(cwd, "mymodels.py"), "w") as fh:
            fh.write(USER_MODULE)
        base = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
        base.update(COLUMNS=WIDTH, PYTHONPATH=os.pathsep.join(p for p in (ROOT, base.get("PYTHONPATH", "")) if p))
        subprocess.run([sys.executable, "-c", MAKE], cwd=cwd, env=base, check=True)
        for command, extra, note in commands():
            argv = [sys.executable, *shlex.split(command)[1:]]
            proc = subprocess.run(argv, cwd=cwd, env=dict(base, **extra), capture_output=True, text=True)
            if note:
                lines.append(f"# {note}")
            lines.append(shown(command, extra))
            lines.extend((proc.stdout + proc.stderr).rstrip("\n").splitlines())
            lines += [f"[exit {proc.returncode}]", ""]
    return "\n".join(lines).rstrip("\n") + "\n"


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    text = transcript()
    if "--stdout" in args:
        sys.stdout.write(text)
    else:
        with open(OUT, "w", encoding="utf-8") as fh:
            fh.write(text)
        print(f"wrote {OUT}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
