"""What a fresh-interpreter load costs (:mod:`torch_serial_testing.paths.fresh`), against an in-process one.

* the first fresh load of a set of imports: it starts that set's server (``python -I``, the imports, the
  library's core), against ``python -I -c "import torch"`` (plus the other imports) as a whole process;
* each later one, against the same load made in this process (``torch_serial_testing.loading.load``), the two
  interleaved load by load, with a pause between loads as a test's own work makes one (the server forks the
  next load's child in it);
* for context, torch's own first and second ``torch.load`` of the same bytes in a new ``python -I`` process:
  what a fresh interpreter pays on its first load of a kind, whoever starts it.

Wall clock (``time.perf_counter``); medians.  Run from the repository root:

    PYTHONPATH=$PWD python bench/fresh_loads.py [loads]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

import torch

from torch_serial_testing import loading
from torch_serial_testing.checkpoint import Checkpoint
from torch_serial_testing.paths import forkserver
from torch_serial_testing.paths.fresh import fresh_load

PAUSE = 0.05  # seconds between two loads: a test's own work


def cases() -> dict[str, tuple[tuple[str, ...], Checkpoint]]:
    njt = torch.nested.nested_tensor([torch.randn(2, 3), torch.randn(4, 3)], layout=torch.jagged)
    return {
        "state_dict, imports torch": (("torch",), Checkpoint.save({"w": torch.randn(64, 64), "b": torch.zeros(64)})),
        "jagged nested tensor, imports torch, torch._dynamo": (("torch", "torch._dynamo"), Checkpoint.save(njt)),
    }


def import_floor(imports: tuple[str, ...]) -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-I", "-c", "; ".join(f"import {m}" for m in imports)], check=True)
    return time.perf_counter() - start


FIRST_LOADS = """import io, sys, time
{imports}
data = sys.stdin.buffer.read()
for _ in range(2):
    start = time.perf_counter()
    torch.load(io.BytesIO(data))
    print(1000 * (time.perf_counter() - start))
"""


def torch_first_loads(imports: tuple[str, ...], checkpoint: Checkpoint) -> list[float]:
    """torch's own first and second ``torch.load`` of the bytes in a new ``python -I`` process (ms): what any
    fresh interpreter pays on its first load, whoever starts it."""
    code = FIRST_LOADS.format(imports="\n".join(f"import {m}" for m in imports))
    proc = subprocess.run(
        [sys.executable, "-I", "-c", code], input=checkpoint.rewound().read(), capture_output=True, check=True
    )
    return [float(x) for x in proc.stdout.split()]


def main() -> None:
    loads = int(sys.argv[1]) if len(sys.argv) > 1 else 20
    print(f"torch {torch.__version__}, {os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.1f}")
    for name, (imports, checkpoint) in cases().items():
        floor = import_floor(imports)
        start = time.perf_counter()
        fresh_load(checkpoint, "default", imports)
        first = time.perf_counter() - start
        here, there = [], []
        for _ in range(loads):
            time.sleep(PAUSE)
            start = time.perf_counter()
            loading.load(checkpoint, "default")
            here.append(time.perf_counter() - start)
            time.sleep(PAUSE)
            start = time.perf_counter()
            fresh_load(checkpoint, "default", imports)
            there.append(time.perf_counter() - start)
        ms = [1000 * statistics.median(x) for x in (here, there)]
        first_two = torch_first_loads(imports, checkpoint)
        print(
            f"{name}: first fresh load {first:.2f} s (python -I -c 'import {', '.join(imports)}': {floor:.2f} s); "
            f"later, median of {loads}: in process {ms[0]:.1f} ms, fresh {ms[1]:.1f} ms "
            f"(+{ms[1] - ms[0]:.1f} ms); torch's own first load in a new process {first_two[0]:.1f} ms, "
            f"its second {first_two[1]:.1f} ms"
        )
    forkserver.shutdown()


if __name__ == "__main__":
    main()
