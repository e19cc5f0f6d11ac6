"""What ``python -m torch_serial_testing audit -- COMMAND`` costs on a test run, against the same run plain.

Whole-process costs, measured the standard way: wall clock and CPU time (user + system of the
process and every descendant it waited for, from ``os.wait4``'s rusage), plain and audited runs
*interleaved* (order swapped each round) so machine load hits both alike.  Also counts the loads
the audit observed.  Run: ``python bench/audit_overhead.py [ROUNDS]`` from the repository root.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FIXTURES = os.path.join(ROOT, "test", "audit", "fixtures")
TESTS = os.path.join(ROOT, "test")
UNITTEST = [sys.executable, "-W", "ignore", "-m", "unittest"]
SUITES = {
    "fixtures (8 tests, 8 loads)": (
        FIXTURES,
        [
            *UNITTEST,
            "seed_qlinear_packed_params",
            "optim_state_dict",
            "numpy_scalars",
            "dataclass_config",
            "npu_replaced_loader",
        ],
    ),
    "flagship mixin port (20 tests, 42 loads)": (TESTS, [*UNITTEST, "ao.sparsity.test_qlinear_packed_params"]),
}


def timed(argv: list[str], cwd: str) -> tuple[float, float]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (ROOT, os.environ.get("PYTHONPATH")) if p))
    start = time.perf_counter()
    proc = subprocess.Popen(argv, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _pid, _status, usage = os.wait4(proc.pid, 0)
    return time.perf_counter() - start, usage.ru_utime + usage.ru_stime


def main(rounds: int) -> None:
    print(f"{'suite':44} {'plain wall':>11} {'audit wall':>11} {'plain cpu':>10} {'audit cpu':>10} {'cpu +':>7} loads")
    for name, (cwd, cmd) in SUITES.items():
        with tempfile.TemporaryDirectory() as tmp:
            report = os.path.join(tmp, "r.jsonl")
            audited = [sys.executable, "-m", "torch_serial_testing", "audit", "--quiet", "--report", report, "--", *cmd]
            times: dict[str, list[tuple[float, float]]] = {"plain": [], "audit": []}
            for i in range(rounds):
                order = [("plain", cmd), ("audit", audited)]
                for key, argv in order if i % 2 == 0 else order[::-1]:
                    times[key].append(timed(argv, cwd))
            with open(report, encoding="utf-8") as f:
                loads = sum(1 for line in f if json.loads(line)["event"] == "load")
        med = {k: (statistics.median(w for w, _ in v), statistics.median(c for _, c in v)) for k, v in times.items()}
        extra = med["audit"][1] - med["plain"][1]
        print(
            f"{name:44} {med['plain'][0]:10.2f}s {med['audit'][0]:10.2f}s {med['plain'][1]:9.2f}s "
            f"{med['audit'][1]:9.2f}s {extra:+6.2f}s {loads}"
        )


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 3)
