"""The observer-style case (a HistogramObserver calibrated for ~0.8 s, per engine) with the library --
built once per engine, loaded in every mode by ``round_trip_each_mode`` -- against its plain-torch twin
(``bench/observer_plain.py``), and for context the histogram case alone generated per load mode (its body,
and so the calibration, run once per mode: ``bench/observer_per_mode.py``).  Whole processes, wall clock, in interleaved
rounds (order swapped each round); prints the median of each and the ratios.  Run from the repository root:

    PYTHONPATH=$PWD python bench/each_mode.py [rounds]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PORT = "test.ports.test_observer_serialization"
CASES = {
    "library, built once (round_trip_each_mode)": [
        sys.executable,
        "-m",
        "unittest",
        "-k",
        "test_observer_state_dict",
        PORT,
    ],
    "plain torch twin": [sys.executable, "-m", "unittest", "bench.observer_plain"],
    "library, body per load mode (histogram only)": [sys.executable, "-m", "unittest", "bench.observer_per_mode"],
}


def run(name: str) -> float:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([ROOT, os.environ.get("PYTHONPATH", "")]))
    env["TORCH_SERIAL_TESTING_PORTS"] = "library"
    start = time.perf_counter()
    proc = subprocess.run(CASES[name], cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0 or "Ran 6 tests" not in proc.stderr:  # 6: 3 observers x 2 engines, or 3 modes x 2
        raise SystemExit(f"{name} failed:\n{proc.stderr[-2000:]}")
    return elapsed


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    times: dict[str, list[float]] = {name: [] for name in CASES}
    names = list(CASES)
    for i in range(rounds):
        for name in names if i % 2 == 0 else reversed(names):
            times[name].append(run(name))
    median = {name: statistics.median(ts) for name, ts in times.items()}
    plain = median["plain torch twin"]
    for name, value in median.items():
        print(
            f"{name:45s} {value:6.2f} s  ({value / plain:.2f}x plain)  "
            f"rounds: {', '.join(f'{t:.2f}' for t in times[name])}"
        )


if __name__ == "__main__":
    main()
