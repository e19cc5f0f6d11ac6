#!/usr/bin/env python3
"""The library's cost next to plain torch's, measured side by side in one run.

``import``      ``python -c "import torch; import torch_serial_testing"`` vs ``import torch``
                (whole processes).
``round_trip``  ``torch_serial_testing.round_trip(obj, mode, declared)`` vs the bare
                ``torch.save`` + ``torch.load`` a test would write, per load mode, for the
                flagship's small sparse quantized Linear and a 256 MiB float module.
``flagship``    ``python -m unittest test_qlinear_packed_params`` vs ``python -m unittest`` of an
                empty pytorch ``TestCase`` file (whole processes), and vs its plain-torch twin
                (:mod:`flagship_plain`, the same tests without the library: the library's share).
``small_file``  ``python -m unittest three_tests`` (one module, three load modes) vs its plain-torch
                twin :mod:`three_tests_plain` (whole processes, interleaved).
``scanners``    ``inspect`` next to ``torch.serialization.get_unsafe_globals_in_checkpoint`` and
                picklescan (optional) on the same files, whole processes: wall time, peak RSS
                and what each reported (:mod:`scanners`).
``instructions`` the same three files in instructions executed (``valgrind --tool=callgrind``,
                :mod:`instructions`), which machine load does not change; skipped without valgrind.

Timing: ``torch.utils.benchmark`` (``Timer.blocked_autorange``, ``Compare``) in process; wall and
CPU time of child processes otherwise (:mod:`timing`).  Tables and notes: :mod:`report`.  No
test asserts a time::

    python bench/run.py                    # full run; writes bench/RESULTS.rst
    python bench/run.py --quick            # a shorter, noisier run; writes nothing unless asked
    python bench/run.py --only round_trip --rounds 5
    python bench/run.py --profile-flagship # where the flagship file's time goes (cProfile)
    python bench/run.py --only instructions  # the test files in instructions (valgrind), seconds
    python bench/run.py --only scanners    # inspect vs torch's and picklescan's scans (or bench/scanners.py)
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(1, os.path.dirname(HERE))  # the checkout's library, pip-installed or not

import instructions  # noqa: E402
import report  # noqa: E402
import timing  # noqa: E402

BENCHMARKS = ("import", "round_trip", "flagship", "small_file", "scanners", "instructions")
RESULTS = os.path.join(HERE, "RESULTS.rst")


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def profile_flagship(top: int) -> None:
    """cProfile over the flagship file run in this process (imports of torch excluded)."""
    import cProfile
    import pstats
    import unittest

    sys.path.insert(0, timing.FLAGSHIP_DIR)
    import torch.testing._internal.common_utils  # noqa: F401 - the floor every pytorch file pays

    profiler = cProfile.Profile()
    profiler.enable()
    module = __import__(timing.FLAGSHIP_MODULE)
    suite = unittest.defaultTestLoader.loadTestsFromModule(module)
    result = unittest.TextTestRunner(verbosity=0, stream=open(os.devnull, "w")).run(suite)
    profiler.disable()
    log(f"flagship: {result.testsRun} tests, {len(result.failures) + len(result.errors)} failed")
    pstats.Stats(profiler, stream=sys.stdout).sort_stats("cumulative").print_stats(top)


def count_instructions() -> str:
    """The flagship, its plain-torch twin and the empty file in instructions (callgrind), as an RST note."""
    import concurrent.futures

    why_not = instructions.available()
    if why_not is not None:
        log(f"[instructions] skipped: {why_not}")
        return f"Instruction counts: not taken ({why_not})."
    log("[instructions] callgrind: the flagship, its plain-torch twin and the empty file ...")
    env = timing.process_env()
    with timing.empty_test_dir() as empty_dir:
        files = timing.test_files(empty_dir)
        with concurrent.futures.ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            futures = {who: pool.submit(instructions.count, d, m, env) for who, (d, m) in files.items()}
            counts = {who: f.result() for who, f in futures.items()}
    return report.instructions_note(counts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds, shorter timings (noisier)")
    parser.add_argument("--rounds", type=int, default=None, help="interleaved rounds per comparison")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, help="run only these (repeatable)")
    parser.add_argument("--rst", default=None, help=f"write the RST results here (full runs: {RESULTS})")
    parser.add_argument(
        "--profile-flagship",
        type=int,
        nargs="?",
        const=40,
        default=None,
        metavar="TOP",
        help="profile the flagship file in process and print the TOP entries",
    )
    args = parser.parse_args(argv)
    if args.profile_flagship is not None:
        profile_flagship(args.profile_flagship)
        return 0
    only = args.only or list(BENCHMARKS)
    rounds = args.rounds or (3 if args.quick else 10)
    min_run_time = 0.2 if args.quick else 1.0
    load_start = report.loadavg()
    pairs = []
    notes = []
    if "import" in only:
        log(f"[import] {rounds} interleaved rounds ...")
        pairs.append(timing.time_import(rounds))
    if "round_trip" in only:
        log(f"[round_trip] {rounds} interleaved blocked_autorange rounds per mode ...")
        pairs += timing.all_round_trips(rounds, min_run_time)
    if "flagship" in only:
        # Whole test files vary by several percent run to run (IQR ~5% of 2.5 s here) and the target's
        # margin is of that size: twice the rounds, as the three files share each round.
        log(f"[flagship] {2 * rounds} interleaved rounds of three files ...")
        flagship_pairs, summary = timing.time_flagship(2 * rounds)
        pairs += flagship_pairs
        notes.append(f"The flagship run: {summary}.")
        notes.append(
            "The flagship's plain-torch twin (``bench/flagship_plain.py``) runs the same tests -- its "
            "builders and checks taken from the flagship file, the same saves and loads per mode -- "
            "without the library, so the flagship's time over the twin is the library's share.  The "
            "row of the twin over the empty file has no library in it (its first column is the twin): it is "
            "what the same tests cost in torch alone, the part of the flagship's ratio over the empty file "
            "that no test helper can remove."
        )
    if "small_file" in only:
        log(f"[small_file] {2 * rounds} interleaved rounds of two files ...")
        pair, summary = timing.time_three_tests(2 * rounds)
        pairs.append(pair)
        notes.append(
            f"The three-test file (``bench/three_tests.py``, one module in three load modes): {summary}.  Its "
            "plain-torch twin (``bench/three_tests_plain.py``) makes the same saves and loads by hand."
        )
    if "import" in only or "flagship" in only or "small_file" in only:
        notes.append(
            "Whole processes import byte-compiled code on both sides: the library's and the test files' "
            "``.pyc`` are written first (``compileall``), as ``pip install`` does for torch."
        )
    if "round_trip" in only:
        notes.append(
            "The round-trip rows repeat one module, so after the first round trip the library reuses its "
            "scan of the identical bytes and the expectation made from it (as a test file's modes and engines "
            'reuse the scan); the "first scan" row clears both before every round trip (informational, no target).'
        )
    if "scanners" in only:
        scan_rounds = max(3, rounds // 2)
        log(f"[scanners] {scan_rounds} interleaved rounds of every tool on every file ...")
        # In a process of its own: Linux carries a process's peak RSS across fork and exec, so
        # tools started from this one (grown by the 256 MiB round trips) would all report its peak.
        table = subprocess.run(
            [sys.executable, os.path.join(HERE, "scanners.py"), "--rounds", str(scan_rounds)],
            env=timing.process_env(),
            stdout=subprocess.PIPE,
            text=True,
            check=True,
        ).stdout
        notes.append("Scanners side by side (``bench/scanners.py``):\n\n" + table)
    load_end = report.loadavg()
    if "instructions" in only:  # after the timings: valgrind's load would disturb them, not its own counts
        notes.append(count_instructions())
    report.print_compare(pairs)
    print(report.text_summary(pairs))
    command = (
        "python bench/run.py" + (" --quick" if args.quick else "") + (f" --rounds {args.rounds}" if args.rounds else "")
    )
    text = report.rst(pairs, command=command, load_start=load_start, load_end=load_end, notes=notes)
    out = args.rst or (RESULTS if not args.quick and not args.only and not args.rounds else None)
    if out:
        with open(out, "w", encoding="utf-8") as fh:
            fh.write(text)
        log(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
