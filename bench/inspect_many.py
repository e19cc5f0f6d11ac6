#!/usr/bin/env python3
"""What ``inspect`` costs on 50 small checkpoints in one call, against one ``import torch``.

Writes 50 small checkpoints into a temporary folder (state_dicts, torch modules, a user's own
module, numpy scalars: every status a model folder commonly gives) and runs, as whole processes in
interleaved rounds (order rotated each round, so drift in machine load hits each alike):

* ``python -c "import torch"``: the floor;
* ``python -m torch_serial_testing inspect FOLDER --jsonl``: the 50 files in one call;
* ``python -m torch_serial_testing inspect ONE_FILE --json``: one file, for scale;
* ``picklescan --path FOLDER`` when installed (it does not import torch).

Prints the medians of wall and CPU time (user + system, ``os.wait4``) and each one's ratio to the
floor of the same rounds; the target is under 3x.  The folder is deleted afterwards.

    python bench/inspect_many.py [--rounds 5] [--files 50]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from typing import Optional, Sequence

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from scanners import run_once  # noqa: E402

MAKE = """
import sys
import numpy as np, torch
import usermodels
for i in range(int(sys.argv[1])):
    kind = i % 5
    obj = (
        {"w": torch.ones(4, 4) * i, "b": torch.zeros(4), "step": i} if kind == 0
        else torch.nn.Linear(3, 2) if kind == 1
        else torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.ReLU(), torch.nn.Flatten()) if kind == 2
        else usermodels.MyNet() if kind == 3
        else {"lr": np.float64(0.1), "step": np.int64(i), "w": torch.ones(2)}
    )
    torch.save(obj, f"models/ckpt_{i:02d}.pt")
"""
USER_MODULE = (
    "import torch\n"
    "\n"
    "class MyNet(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(3, 2)\n"
)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--files", type=int, default=50)
    args = parser.parse_args(argv)
    py = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(HERE), env.get("PYTHONPATH", "")) if p)
    picklescan = shutil.which("picklescan", path=os.path.dirname(py)) or shutil.which("picklescan")
    with tempfile.TemporaryDirectory(prefix="tst-bench-many-") as cwd:
        with open(os.path.join(cwd, "usermodels.py"), "w") as fh:
            fh.write(USER_MODULE)
        os.mkdir(os.path.join(cwd, "models"))
        make_env = dict(env, PYTHONPATH=os.pathsep.join([cwd, env["PYTHONPATH"]]))
        subprocess.run([py, "-c", MAKE, str(args.files)], cwd=cwd, env=make_env, check=True)
        commands = {
            "import torch (floor)": [py, "-c", "import torch"],
            f"inspect models/ --jsonl ({args.files} files)": [
                py,
                "-m",
                "torch_serial_testing",
                "inspect",
                "models",
                "--jsonl",
            ],
            "inspect models/ckpt_00.pt --json (1 file)": [
                py,
                "-m",
                "torch_serial_testing",
                "inspect",
                "models/ckpt_00.pt",
                "--json",
            ],
        }
        if picklescan:
            commands[f"picklescan --path models/ ({args.files} files)"] = [picklescan, "--path", "models"]
        names = list(commands)
        samples: dict[str, list[tuple[float, float]]] = {name: [] for name in names}
        statuses: dict[str, int] = {}
        for i in range(args.rounds):
            print(f"[inspect_many] round {i + 1}/{args.rounds} ...", file=sys.stderr, flush=True)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                wall, cpu, _rss, out, _code = run_once(commands[name], cwd, env)
                samples[name].append((wall, cpu))
                if name.startswith("inspect models/ --jsonl"):
                    records = [json.loads(line) for line in out.splitlines()]
                    assert len(records) == args.files, f"{len(records)} reports for {args.files} files"
                    statuses = {}
                    for r in records:
                        statuses[r["status"]] = statuses.get(r["status"], 0) + 1
    floor_wall = statistics.median(w for w, _ in samples[names[0]])
    floor_cpu = statistics.median(c for _, c in samples[names[0]])
    print(f"Whole processes, medians of {args.rounds} interleaved rounds; ratios to the floor of the same rounds.")
    print(f"{'command':<48} {'wall':>8} {'x floor':>8} {'CPU':>8} {'x floor':>8}")
    for name in names:
        wall = statistics.median(w for w, _ in samples[name])
        cpu = statistics.median(c for _, c in samples[name])
        print(f"{name:<48} {wall:>7.2f}s {wall / floor_wall:>7.2f}x {cpu:>7.2f}s {cpu / floor_cpu:>7.2f}x")
    print("statuses of the files: " + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
