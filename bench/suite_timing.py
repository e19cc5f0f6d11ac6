#!/usr/bin/env python3
"""The figures README.rst and the docs publish about running tests: the suite, its fast subset, and
what one test file costs next to ``import torch``.

Method: each command runs as a child process of this script; *wall* is the clock time from start
to exit (``time.perf_counter``), *CPU* is the user + system time of that process and of every
process it started and waited for (pytest-xdist's workers, the child interpreters of the tests
marked ``slow``), read from ``os.wait4``'s resource usage -- what the shell's ``time`` reports as
user + sys.  The machine's load average and CPU count are printed before and after, so a figure
taken on a busy machine says so.  Nothing here asserts a time::

    python bench/suite_timing.py fast          # python -m pytest -n 2 -m "not slow" test, once
    python bench/suite_timing.py full          # python -m pytest -n 2 test, once (minutes; needs quiet cores)
    python bench/suite_timing.py one-test      # a one-test file vs import torch, median of --rounds runs
    python bench/suite_timing.py fast --rounds 3

Run from anywhere; the suite runs from the repository's root, in the interpreter running this script.
"""

from __future__ import annotations

import argparse
import os
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The README's commands, quiet (-q), listing failures and errors (-rfE), writing no cache into the checkout.
PYTEST = [sys.executable, "-m", "pytest", "-n", "2", "-q", "-rfE", "-p", "no:cacheprovider"]
SUITES = {"fast": [*PYTEST, "-m", "not slow", "test"], "full": [*PYTEST, "test"]}

# The smallest useful test file: one round trip in one load mode, as a user would write it.
ONE_TEST = """\
import unittest

import torch

from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests


class OneNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.ones(2, 3))


class TestOneNet(SerializationRoundTripTestCase, unittest.TestCase):
    safe_globals = (OneNet,)
    load_modes = ("safe_globals",)
    devices = ("cpu",)

    def test_round_trip(self, device):
        original = OneNet()
        self.assertRoundTripEqual(original, self.round_trip(original))


instantiate_round_trip_tests(TestOneNet, globals())
"""


def run(cmd: list[str], cwd: str) -> tuple[float, float, int, str]:
    """(wall s, CPU s of the process and its waited-for descendants, exit code, pytest's FAILED/ERROR lines and
    the output's last line)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TORCH_FORCE_", "EXPECTTEST_"))}
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    out = proc.stdout.read() if proc.stdout else ""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    if proc.stdout:
        proc.stdout.close()
    lines = out.strip().splitlines()
    failed = [line for line in lines if line.startswith(("FAILED ", "ERROR "))]  # pytest's summary: what went wrong
    return wall, usage.ru_utime + usage.ru_stime, os.waitstatus_to_exitcode(status), "\n".join([*failed, *lines[-1:]])


def machine() -> str:
    one, five, _ = os.getloadavg()
    return f"{os.cpu_count()} CPUs, load average {one:.1f} (1 min) {five:.1f} (5 min)"


def time_suite(name: str, rounds: int) -> None:
    cmd = SUITES[name]
    print(f"{name}: {shlex.join(['python', *cmd[1:]])}   (cwd: {ROOT})")
    print(f"  before: {machine()}")
    for i in range(rounds):
        wall, cpu, code, last = run(cmd, ROOT)
        print(f"  run {i + 1}: wall {wall:.0f} s, CPU {cpu:.0f} s ({cpu / 60:.1f} CPU-min), exit {code}: {last}")
    print(f"  after:  {machine()}")


def time_one_test(rounds: int) -> None:
    with tempfile.TemporaryDirectory() as d:
        with open(os.path.join(d, "test_one.py"), "w", encoding="utf-8") as fh:
            fh.write(ONE_TEST)
        commands = {
            "import torch": [sys.executable, "-c", "import torch"],
            "one-test file": [sys.executable, "-m", "unittest", "test_one"],
        }
        print(f"one-test: median of {rounds} runs each, interleaved, after one warm-up each (cwd: a temporary folder)")
        print(f"  before: {machine()}")
        results: dict[str, list[tuple[float, float]]] = {name: [] for name in commands}
        for cmd in commands.values():  # warm-up: the file system cache, the byte-compiled modules
            run(cmd, d)
        for _ in range(rounds):
            for name, cmd in commands.items():
                wall, cpu, code, last = run(cmd, d)
                if code != 0:
                    raise SystemExit(f"{name} failed (exit {code}): {last}")
                results[name].append((wall, cpu))
        for name, pairs in results.items():
            wall = statistics.median(w for w, _ in pairs)
            cpu = statistics.median(c for _, c in pairs)
            print(f"  {name:14} wall {wall:.2f} s, CPU {cpu:.2f} s")
        print(f"  after:  {machine()}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("what", choices=["fast", "full", "one-test"])
    parser.add_argument("--rounds", type=int, default=None, help="runs (default: 1 for a suite, 5 for one-test)")
    args = parser.parse_args(argv)
    if args.what == "one-test":
        time_one_test(args.rounds or 5)
    else:
        time_suite(args.what, args.rounds or 1)


if __name__ == "__main__":
    main()
