"""What the benchmark measures, and how: nothing here formats or judges a number.

In-process costs (round trips) are timed with ``torch.utils.benchmark.Timer.blocked_autorange``,
the tool pytorch's own benchmarks use.  Whole-process costs (``import``, a test file) are timed
the standard way, wall clock and the child's CPU time from ``os.wait4``'s rusage, and returned as
``torch.utils.benchmark.Measurement`` objects too, so ``Compare`` shows everything in one table.

Every library measurement has a plain-torch twin, and the two are measured *interleaved* -- in
alternating rounds, order swapped each round -- so that drift in machine load hits both alike;
a ratio is only ever taken between twins of the same run.
"""

from __future__ import annotations

import contextlib
import io
import os
import pickle
import subprocess
import sys
import tempfile
import time
from typing import Any, Iterator, NamedTuple, Optional

import torch
from torch.utils.benchmark import Measurement, Timer
from torch.utils.benchmark.utils.common import TaskSpec

import torch_serial_testing as tst

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLAGSHIP_DIR = os.path.join(ROOT, "test", "ao", "sparsity")
FLAGSHIP_MODULE = "test_qlinear_packed_params"
MODES = ("weights_only_false", "safe_globals", "default")
LARGE_NUMEL = 64 * 1024 * 1024  # float32: 256 MiB of state

LIBRARY = "library"
PLAIN = "plain torch"


class Pair(NamedTuple):
    """One comparison: the library's measurement and its plain-torch twin (same label/sub_label)."""

    library: Measurement
    plain: Measurement
    cpu_ratio: Optional[float]  # user+system time ratio (whole processes only)
    #: In process: the median of each round's own time ratio (library median / plain median of that round).
    round_ratio: Optional[float] = None


# -- in-process: round trips --------------------------------------------------------------------


def small_module() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    """The flagship's object: a small sparse quantized dynamic Linear, and what it needs allowlisted."""
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
    from torch.ao.nn.sparse.quantized.linear import LinearPackedParams

    with tst.override_qengine("qnnpack"), _quiet():
        w = torch.quantize_per_tensor(torch.randn(3, 16), 2.0, 0, torch.qint8)
        lin = Linear(3, 16, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.ones(3), 1, 4)
    return lin, (Linear, LinearPackedParams, torch.ScriptObject, set)


class BigModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(LARGE_NUMEL))


def large_module() -> tuple[torch.nn.Module, tuple[Any, ...]]:
    return BigModule(), (BigModule, set)


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    import warnings

    with warnings.catch_warnings():  # quantized tensor creation warns (deprecated) on torch 2.13+
        warnings.simplefilter("ignore")
        yield


def plain_round_trip(obj: Any, mode: str, declared: tuple[Any, ...]) -> Any:
    """What a test writes without the library: the same torch.save / torch.load calls."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    if mode == "weights_only_false":
        return torch.load(buf, weights_only=False)
    if mode == "safe_globals":
        with torch.serialization.safe_globals(list(declared)):
            return torch.load(buf, weights_only=True)
    try:
        return torch.load(buf)
    except pickle.UnpicklingError as e:  # the rejection is the expected outcome here
        return e


def library_round_trip(obj: Any, mode: str, declared: tuple[Any, ...]) -> Any:
    result = tst.round_trip(obj, mode, declared)
    return result.value if result.loaded else result.error


def forget_scans() -> None:
    """Drop the library's memory of checkpoints: its scans of small checkpoints, and the expectations made from
    them (remembered by the bytes too: a repeated round trip would otherwise never look for a scan)."""
    from torch_serial_testing import checkpoint, prediction

    checkpoint._small_infos.clear()
    prediction._expected.clear()


def library_round_trip_first_scan(obj: Any, mode: str, declared: tuple[Any, ...]) -> Any:
    """The library's round trip of bytes it has never scanned: what a test's first round trip of a module pays."""
    forget_scans()
    return library_round_trip(obj, mode, declared)


def plain_round_trip_twin(obj: Any, mode: str, declared: tuple[Any, ...]) -> Any:
    """plain_round_trip, also calling forget_scans so both sides pay that call."""
    forget_scans()
    return plain_round_trip(obj, mode, declared)


def time_round_trips(
    label: str,
    obj: Any,
    declared: tuple[Any, ...],
    rounds: int,
    min_run_time: float,
    modes: tuple[str, ...] = MODES,
    library_fn: Any = library_round_trip,
    plain_fn: Any = plain_round_trip,
) -> list[Pair]:
    """Library vs plain torch per mode: *rounds* interleaved ``blocked_autorange`` runs each, merged."""
    threads = torch.get_num_threads()
    pairs = []
    for mode in modes:
        if mode == "safe_globals" and not hasattr(torch.serialization, "safe_globals"):
            continue  # torch < 2.5: the library skips this mode, so there is nothing to compare
        timers = {
            LIBRARY: Timer(
                "fn(obj, mode, declared)",
                globals=dict(fn=library_fn, obj=obj, mode=mode, declared=declared),
                label=label,
                sub_label=mode,
                description=LIBRARY,
                num_threads=threads,
            ),
            PLAIN: Timer(
                "fn(obj, mode, declared)",
                globals=dict(fn=plain_fn, obj=obj, mode=mode, declared=declared),
                label=label,
                sub_label=mode,
                description=PLAIN,
                num_threads=threads,
            ),
        }
        runs: dict[str, list[Measurement]] = {LIBRARY: [], PLAIN: []}
        for r in range(rounds):
            order = (LIBRARY, PLAIN) if r % 2 == 0 else (PLAIN, LIBRARY)
            for who in order:
                runs[who].append(timers[who].blocked_autorange(min_run_time=min_run_time))
        per_round = [a.median / b.median for a, b in zip(runs[LIBRARY], runs[PLAIN])]
        (lib,) = Measurement.merge(runs[LIBRARY])
        (plain,) = Measurement.merge(runs[PLAIN])
        pairs.append(Pair(lib, plain, None, _median(per_round)))
    return pairs


@contextlib.contextmanager
def registered(objs: tuple[Any, ...]) -> Iterator[None]:
    """``add_safe_globals`` for the duration; the registry is restored afterwards."""
    before = list(torch.serialization.get_safe_globals())
    torch.serialization.add_safe_globals(list(objs))
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        if before:
            torch.serialization.add_safe_globals(before)


# -- whole processes: import and test files ------------------------------------------------------


def byte_compile(*paths: str) -> None:
    """Write the ``.pyc`` files of *paths* (directories or files), as ``pip install`` does for torch.

    Both sides of a whole-process comparison then import compiled code: torch's files were
    compiled when it was installed, the library's are compiled here (an editable install under
    PYTHONDONTWRITEBYTECODE=1 would otherwise compile the library's source in every process).
    """
    import compileall

    for path in paths:
        ok = compileall.compile_dir(path, quiet=1) if os.path.isdir(path) else compileall.compile_file(path, quiet=1)
        if not ok:
            raise RuntimeError(f"could not byte-compile {path}")


def run_process(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float, int, str]:
    """(wall s, user+system CPU s, exit code, stderr) of one child process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=cwd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    stderr = proc.stderr.read() if proc.stderr else b""
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status) if hasattr(os, "waitstatus_to_exitcode") else status
    if proc.stderr:
        proc.stderr.close()
    return wall, usage.ru_utime + usage.ru_stime, proc.returncode, stderr.decode(errors="replace")


def _measurement(times: list[float], label: str, sub_label: str, description: str, stmt: str) -> Measurement:
    return Measurement(
        number_per_run=1,
        raw_times=times,
        task_spec=TaskSpec(stmt=stmt, setup="", label=label, sub_label=sub_label, description=description),
    )


def time_processes(
    label: str,
    sub_label: str,
    library: tuple[list[str], str],
    plain: tuple[list[str], str],
    rounds: int,
    env: dict[str, str],
) -> tuple[Pair, dict[str, str]]:
    """Interleaved whole-process runs of two commands (each ``(argv, cwd)``); one warm-up each.

    Returns the pair and each command's last stderr (a test runner's summary is there)."""
    runs, last = run_interleaved({LIBRARY: library, PLAIN: plain}, rounds, env)
    return pair_of(runs, LIBRARY, PLAIN, label, sub_label, {LIBRARY: library, PLAIN: plain}), last


def run_interleaved(
    commands: dict[str, tuple[list[str], str]], rounds: int, env: dict[str, str]
) -> tuple[dict[str, tuple[list[float], list[float]]], dict[str, str]]:
    """Whole-process runs of each command, *rounds* times, in an order rotated every round so
    that drift hits all alike; one uncounted warm-up each.  Returns ``{name: (walls, cpus)}`` and
    each command's last stderr."""
    runs: dict[str, tuple[list[float], list[float]]] = {who: ([], []) for who in commands}
    last: dict[str, str] = {}
    names = list(commands)
    for cmd, cwd in commands.values():  # warm the page cache; not counted
        _, _, code, err = run_process(cmd, cwd, env)
        if code != 0:
            raise RuntimeError(f"{' '.join(cmd)} (in {cwd}) exited {code}:\n{err[-2000:]}")
    for r in range(rounds):
        shift = r % len(names)
        order = names[shift:] + names[:shift]
        if (r // len(names)) % 2:
            order.reverse()
        for who in order:
            cmd, cwd = commands[who]
            w, c, code, err = run_process(cmd, cwd, env)
            if code != 0:
                raise RuntimeError(f"{' '.join(cmd)} (in {cwd}) exited {code}:\n{err[-2000:]}")
            runs[who][0].append(w)
            runs[who][1].append(c)
            last[who] = err
    return runs, last


def pair_of(
    runs: dict[str, tuple[list[float], list[float]]],
    library: str,
    plain: str,
    label: str,
    sub_label: str,
    commands: dict[str, tuple[list[str], str]],
) -> Pair:
    """The :class:`Pair` of two commands' runs from :func:`run_interleaved`."""
    ms = {
        who: _measurement(runs[name][0], label, sub_label, who, " ".join(commands[name][0]))
        for who, name in ((LIBRARY, library), (PLAIN, plain))
    }
    # The CPU ratio is the median of the rounds' own ratios: the two runs of one round are seconds
    # apart, so drift in the machine's speed over the whole benchmark (up to 30% on a shared VM)
    # cancels within each round instead of widening both medians.
    cpus = zip(runs[library][1], runs[plain][1])
    return Pair(ms[LIBRARY], ms[PLAIN], _median([lib / plain_cpu for lib, plain_cpu in cpus]))


def _median(xs: list[float]) -> float:
    import statistics

    return statistics.median(xs)


def process_env() -> dict[str, str]:
    """The children's environment: ours, minus switches that would change what torch.load does,
    with the library importable from this checkout even when it is not pip-installed."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (ROOT, env.get("PYTHONPATH", "")) if p)
    return env


def time_import(rounds: int) -> Pair:
    py = sys.executable
    byte_compile(os.path.dirname(tst.__file__))
    with tempfile.TemporaryDirectory(prefix="tst-bench-") as cwd:
        pair, _ = time_processes(
            "import (whole process)",
            "import torch [+ library]",
            ([py, "-c", "import torch; import torch_serial_testing"], cwd),
            ([py, "-c", "import torch"], cwd),
            rounds,
            process_env(),
        )
    return pair


# A pytorch-style test file with one empty test: what any pytorch test file pays (torch,
# common_utils, and torch._dynamo, which TestCase.run imports on the first test).
EMPTY_TEST_FILE = """\
from torch.testing._internal.common_utils import TestCase, run_tests


class TestNothing(TestCase):
    def test_nothing(self):
        pass


if __name__ == "__main__":
    run_tests()
"""


PLAIN_TWIN_DIR = HERE
PLAIN_TWIN_MODULE = "flagship_plain"
TWIN_LABEL = "test file vs its plain-torch twin (whole process)"


@contextlib.contextmanager
def empty_test_dir() -> Iterator[str]:
    """A temporary directory holding ``test_empty.py`` (:data:`EMPTY_TEST_FILE`)."""
    with tempfile.TemporaryDirectory(prefix="tst-bench-") as cwd:
        with open(os.path.join(cwd, "test_empty.py"), "w", encoding="utf-8") as fh:
            fh.write(EMPTY_TEST_FILE)
        yield cwd


def test_files(empty_dir: str) -> dict[str, tuple[str, str]]:
    """The three files the flagship benchmarks compare, each as (directory, module)."""
    return {
        "flagship": (FLAGSHIP_DIR, FLAGSHIP_MODULE),
        "empty": (empty_dir, "test_empty"),
        "twin": (PLAIN_TWIN_DIR, PLAIN_TWIN_MODULE),
    }


def _runner_summary(stderr: str) -> str:
    """unittest's closing lines (``Ran N tests in ...``, ``OK``)."""
    return " ".join(line for line in stderr.splitlines() if line.startswith(("Ran ", "OK", "FAILED")))


def time_flagship(rounds: int) -> tuple[list[Pair], str]:
    """The flagship file vs an empty pytorch TestCase file (issue 16's target), and vs its plain-torch
    twin (:mod:`flagship_plain`: the same tests without the library), all three interleaved and
    under ``python -m unittest``."""
    py = sys.executable
    with empty_test_dir() as cwd:
        files = test_files(cwd)
        byte_compile(os.path.dirname(tst.__file__), *(os.path.join(d, m + ".py") for d, m in files.values()))
        commands = {who: ([py, "-m", "unittest", module], directory) for who, (directory, module) in files.items()}
        runs, last = run_interleaved(commands, rounds, process_env())
    pairs = [
        pair_of(
            runs,
            "flagship",
            "empty",
            "test file (whole process)",
            f"{FLAGSHIP_MODULE} vs empty TestCase file",
            commands,
        ),
        pair_of(runs, "flagship", "twin", TWIN_LABEL, f"{FLAGSHIP_MODULE} vs {PLAIN_TWIN_MODULE}", commands),
        # what the same tests cost without the library: the part of the first row no library can remove
        pair_of(runs, "twin", "empty", TWIN_EMPTY_LABEL, f"{PLAIN_TWIN_MODULE} vs empty TestCase file", commands),
    ]
    summary = _runner_summary(last.get("flagship", ""))
    return pairs, f"{summary}; its plain-torch twin: {_runner_summary(last.get('twin', ''))}"


TWIN_EMPTY_LABEL = "plain-torch twin vs empty TestCase file (whole process)"
THREE_TESTS_LABEL = "three-test file vs its plain-torch twin (whole process)"


def time_three_tests(rounds: int) -> tuple[Pair, str]:
    """The smallest real use, :mod:`three_tests` (one module, three load modes), vs its plain-torch
    twin :mod:`three_tests_plain`, interleaved, under ``python -m unittest``."""
    py = sys.executable
    files = {"library": "three_tests", "plain": "three_tests_plain"}
    byte_compile(os.path.dirname(tst.__file__), *(os.path.join(HERE, m + ".py") for m in files.values()))
    commands = {who: ([py, "-m", "unittest", module], HERE) for who, module in files.items()}
    runs, last = run_interleaved(commands, rounds, process_env())
    pair = pair_of(runs, "library", "plain", THREE_TESTS_LABEL, "three_tests vs three_tests_plain", commands)
    return pair, f"{_runner_summary(last.get('library', ''))}; its twin: {_runner_summary(last.get('plain', ''))}"


def all_round_trips(rounds: int, min_run_time: float) -> list[Pair]:
    small, small_declared = small_module()
    with tst.override_qengine("qnnpack"):  # its packed weights load only under the engine that packed them
        pairs = time_round_trips(
            "round trip, small sparse quantized Linear", small, small_declared, rounds, min_run_time
        )
        # The same, with the library's scan memory cleared before every round trip (informational:
        # a test pays this once per distinct checkpoint; the rows above are the repeats).
        pairs += time_round_trips(
            "round trip, small sparse quantized Linear, first scan of its bytes",
            small,
            small_declared,
            rounds,
            min_run_time,
            modes=("default",),
            library_fn=library_round_trip_first_scan,
            plain_fn=plain_round_trip_twin,
        )
    big, big_declared = large_module()
    label = "round trip, 256 MiB float"
    pairs += time_round_trips(label, big, big_declared, rounds, min_run_time, modes=MODES[:2])
    # The bare default, with the module's class registered process-wide (for both), so that it
    # loads and the 256 MiB are read back -- a rejected load would time only the save.
    with registered(big_declared):
        pairs += time_round_trips(label, big, big_declared, rounds, min_run_time, modes=("default",))
    return pairs
