#!/usr/bin/env python3
"""Benchmarks for project issue 7, "prove the library is nearly free".

Every number is a ratio against the plain-torch equivalent measured in the same
run, interleaved with it to cancel drift:

``import``         ``python -c "import torch; import torch_serial_testing"`` vs
                   ``python -c "import torch"`` (whole processes).
``round_trip``     ``torch_serial_testing.round_trip(obj, mode, safe_globals)`` vs a
                   bare ``torch.save`` + ``torch.load(buf, weights_only=...)`` into
                   ``io.BytesIO`` with the same arguments, for a small sparse quantized
                   module and a 256 MB float module; plus the cost of the static
                   allowlist scan and a check that no copy of the bytes is made.
``flagship``       wall time of ``python -m unittest test_qlinear_packed_params``
                   (test/ao/sparsity) vs ``import torch.testing._internal.common_utils``.
``instantiation``  ``instantiate_round_trip_tests`` on a 4 engines x 3 modes x
                   3 devices x 20 methods matrix vs ``import torch``.

Standard library timing only (``time.perf_counter``).  No assertion is made on
any time: targets are reported, never enforced.

    python bench/run.py                 # full run (a few minutes)
    python bench/run.py --quick         # under a minute, noisier
    python bench/run.py --only import --repeat 20 --json /tmp/bench.json
    python bench/run.py --rst bench/RESULTS.rst
"""

from __future__ import annotations

import argparse
import compileall
import contextlib
import datetime
import gc
import io
import json
import os
import pickle
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import unittest
from typing import Any, Callable, Optional

import torch

import torch_serial_testing as tst
from torch_serial_testing.allowlist import normalize_safe_globals

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
FLAGSHIP_DIR = os.path.join(ROOT, "test", "ao", "sparsity")
FLAGSHIP_FILE = os.path.join(FLAGSHIP_DIR, "test_qlinear_packed_params.py")
PACKAGE_DIR = os.path.dirname(os.path.abspath(tst.__file__))

BENCHMARKS = ("import", "round_trip", "flagship", "instantiation")
MODES = ("weights_only_false", "safe_globals", "default")
TARGETS = {"import": 1.03, "round_trip_large": 1.10}
LARGE_NUMEL = 64 * 1024 * 1024  # float32: 256 MiB of state


class BigModule(torch.nn.Module):
    """A float module with a 256 MiB parameter; top level so it can be allowlisted."""

    def __init__(self, numel: int = LARGE_NUMEL) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(numel), requires_grad=False)


# -- statistics ---------------------------------------------------------------------------


def stats(values: list[float]) -> dict[str, float]:
    return {
        "min": min(values),
        "median": statistics.median(values),
        "max": max(values),
        "n": len(values),
    }


def ratio_block(
    lib: list[float], base: list[float], lib_cpu: Optional[list[float]] = None, base_cpu: Optional[list[float]] = None
) -> dict[str, Any]:
    """Both distributions, the ratio of medians (the headline) and the per-pair ratios.

    With CPU times (user + system), also their ratio: on a shared machine it is far
    less sensitive to other processes than the wall-clock one.
    """
    pairs = [a / b for a, b in zip(lib, base)]
    out = {
        "library_s": stats(lib),
        "baseline_s": stats(base),
        "ratio": statistics.median(lib) / statistics.median(base),
        "ratio_of_min": min(lib) / min(base),
        "pair_ratio": stats(pairs),
    }
    if lib_cpu and base_cpu:
        out["library_cpu_s"] = stats(lib_cpu)
        out["baseline_cpu_s"] = stats(base_cpu)
        out["cpu_ratio"] = statistics.median(lib_cpu) / statistics.median(base_cpu)
    return out


def fmt_s(seconds: float) -> str:
    if seconds < 0:
        return "-" + fmt_s(-seconds)
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds * 1e6:.0f} us"


def fmt_dist(d: dict[str, float]) -> str:
    return f"{fmt_s(d['min'])} / {fmt_s(d['median'])} / {fmt_s(d['max'])}"


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


# -- machine ------------------------------------------------------------------------------


def machine() -> dict[str, Any]:
    return {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        "cpu_count": os.cpu_count(),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "torch": torch.__version__,
        "torch_serial_testing": tst.__version__,
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "pythondontwritebytecode": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "loadavg_start": _loadavg(),
    }


def _loadavg() -> Optional[float]:
    try:
        return round(os.getloadavg()[0], 2)
    except (AttributeError, OSError):
        return None


# -- subprocess timing ---------------------------------------------------------------------


def _children_cpu() -> float:
    try:
        import resource
    except ImportError:  # not on Windows: CPU times are then reported as 0
        return 0.0
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def run_timed(cmd: list[str], cwd: str, env: dict[str, str]) -> tuple[float, float, subprocess.CompletedProcess]:
    """(wall seconds, child CPU seconds, the completed process)."""
    c0 = _children_cpu()
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    elapsed = time.perf_counter() - t0
    cpu = _children_cpu() - c0
    if proc.returncode != 0 and "unittest" not in cmd:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed, cpu, proc


def interleaved(
    commands: dict[str, tuple[list[str], str, dict[str, str]]], rounds: int, warmup: bool = True
) -> tuple[dict[str, list[float]], dict[str, list[float]], dict[str, subprocess.CompletedProcess]]:
    """Run every command once per round, rotating the order each round, after a discarded warm-up.

    Returns wall times, child CPU times and the last completed process of each command.
    """
    names = list(commands)
    last: dict[str, subprocess.CompletedProcess] = {}
    if warmup:  # page cache, dynamic loader
        for name in names:
            last[name] = run_timed(*commands[name])[2]
    times: dict[str, list[float]] = {n: [] for n in names}
    cpus: dict[str, list[float]] = {n: [] for n in names}
    for r in range(rounds):
        k = r % len(names)
        for name in names[k:] + names[:k]:
            elapsed, cpu, last[name] = run_timed(*commands[name])
            times[name].append(elapsed)
            cpus[name].append(cpu)
    return times, cpus, last


def _neutral_env(extra_path: Optional[str] = None) -> dict[str, str]:
    env = dict(os.environ)
    if extra_path:
        env["PYTHONPATH"] = extra_path + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env


@contextlib.contextmanager
def compiled_copy() -> Any:
    """A byte-compiled copy of the package, as a regular (non-editable) install would have.

    This environment may set PYTHONDONTWRITEBYTECODE (no ``__pycache__`` is ever
    written for the editable checkout), so every process would compile the
    library from source; torch itself ships its bytecode.  The copy lives in a
    temporary directory put first on PYTHONPATH; the checkout is not touched.
    """
    tmp = tempfile.mkdtemp(prefix="tst-bench-pkg-")
    try:
        dest = os.path.join(tmp, "torch_serial_testing")
        shutil.copytree(PACKAGE_DIR, dest, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        compileall.compile_dir(dest, quiet=1)
        yield tmp
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# -- 1. import ----------------------------------------------------------------------------


# The library processes also time themselves in-process (perf_counter around each import):
# the marginal cost of the library import is a few tens of milliseconds, well below the
# run-to-run noise of a 2-3 s process on a shared machine, so it is measured directly too.
_TIMED_IMPORT = (
    "import time; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
    "import torch_serial_testing; t2 = time.perf_counter(); print(t1 - t0, t2 - t1)"
)


def bench_import(rounds: int, results: dict[str, Any], warmup: bool = True) -> None:
    log(f"[import] {rounds} interleaved rounds of 5 processes ...")
    py = sys.executable
    with compiled_copy() as pkg, tempfile.TemporaryDirectory(prefix="tst-bench-cwd-") as cwd:
        plain, cached = _neutral_env(), _neutral_env(pkg)
        check = subprocess.run(
            [py, "-c", "import torch_serial_testing as t; print(t.__file__)"],
            cwd=cwd, env=cached, stdout=subprocess.PIPE, text=True, check=True,
        ).stdout.strip()
        if not check.startswith(pkg):
            raise RuntimeError(f"the compiled copy is not the one imported: {check}")
        commands = {
            "torch": ([py, "-c", "import torch"], cwd, plain),
            "torch+lib": ([py, "-c", _TIMED_IMPORT], cwd, cached),
            "torch+lib (no bytecode)": ([py, "-c", _TIMED_IMPORT], cwd, plain),
            "lib alone": ([py, "-c", "import torch_serial_testing"], cwd, cached),
            "lib alone (no bytecode)": ([py, "-c", "import torch_serial_testing"], cwd, plain),
        }
        inproc: dict[str, list[tuple[float, float]]] = {"torch+lib": [], "torch+lib (no bytecode)": []}
        names = list(commands)
        if warmup:
            for name in names:
                run_timed(*commands[name])
        times: dict[str, list[float]] = {n: [] for n in names}
        cpus: dict[str, list[float]] = {n: [] for n in names}
        for r in range(rounds):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                elapsed, cpu, proc = run_timed(*commands[name])
                times[name].append(elapsed)
                cpus[name].append(cpu)
                if name in inproc:
                    t_torch, t_lib = (float(x) for x in proc.stdout.split())
                    inproc[name].append((t_torch, t_lib))
        # Does 'import torch_serial_testing' alone pull torch in?  (It should not.)
        lazy = subprocess.run(
            [py, "-c", "import sys, torch_serial_testing; print('torch' in sys.modules)"],
            cwd=cwd, env=cached, stdout=subprocess.PIPE, text=True, check=True,
        ).stdout.strip() == "False"
    base = times["torch"]
    out: dict[str, Any] = {
        "rounds": rounds,
        "torch_s": stats(base),
        "torch_cpu_s": stats(cpus["torch"]),
        "torch_plus_library": ratio_block(times["torch+lib"], base, cpus["torch+lib"], cpus["torch"]),
        "torch_plus_library_no_bytecode": ratio_block(
            times["torch+lib (no bytecode)"], base, cpus["torch+lib (no bytecode)"], cpus["torch"]
        ),
        "library_alone_s": stats(times["lib alone"]),
        "library_alone_no_bytecode_s": stats(times["lib alone (no bytecode)"]),
        "library_alone_imports_torch": not lazy,
        "added_s": statistics.median(times["torch+lib"]) - statistics.median(base),
        "added_no_bytecode_s": statistics.median(times["torch+lib (no bytecode)"]) - statistics.median(base),
        "target": TARGETS["import"],
    }
    for name, key in (("torch+lib", "in_process"), ("torch+lib (no bytecode)", "in_process_no_bytecode")):
        t_torch = [a for a, _ in inproc[name]]
        t_lib = [b for _, b in inproc[name]]
        out[key] = {
            "import_torch_s": stats(t_torch),
            "import_library_after_torch_s": stats(t_lib),
            # (import torch + import library) / import torch, both timed inside the same processes
            "ratio": 1 + statistics.median(t_lib) / statistics.median(t_torch),
        }
    results["import"] = out


# -- 2. round trip --------------------------------------------------------------------------


def small_module() -> tuple[Any, tuple[Any, ...]]:
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
    from torch.ao.nn.sparse.quantized.linear import LinearPackedParams

    with tst.override_qengine("qnnpack"):
        w = torch.quantize_per_tensor(torch.randn(3, 16), 2.0, 0, torch.qint8)
        lin = Linear(3, 16, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.ones(3), 1, 4)
    return lin, (Linear, LinearPackedParams, torch.ScriptObject)


def plain_round_trip(obj: Any, mode: str, entries: list[Any]) -> Any:
    """What a test would write without the library: the same torch.save / torch.load calls."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    if mode == "weights_only_false":
        return torch.load(buf, weights_only=False)
    if mode == "safe_globals":
        with torch.serialization.safe_globals(entries):
            return torch.load(buf, weights_only=True)
    try:
        return torch.load(buf)
    except pickle.UnpicklingError as e:  # the rejection is the expected outcome
        return e


def library_round_trip(obj: Any, mode: str, sgs: tuple[Any, ...]) -> Any:
    result = tst.round_trip(obj, mode, sgs)
    return result.value if result.loaded else result.error


@contextlib.contextmanager
def registered(objs: tuple[Any, ...]) -> Any:
    """Process-wide allowlisting (what makes a bare default load accept a user class)."""
    before = list(torch.serialization.get_safe_globals())
    torch.serialization.add_safe_globals(list(objs))
    try:
        yield
    finally:
        torch.serialization.clear_safe_globals()
        if before:
            torch.serialization.add_safe_globals(before)


def time_pair(lib: Callable[[], Any], base: Callable[[], Any], repeat: int) -> dict[str, Any]:
    """Interleaved, alternating order; each result is dropped (and collected) outside the timing."""
    t: dict[Any, list[float]] = {lib: [], base: []}
    c: dict[Any, list[float]] = {lib: [], base: []}
    lib()  # warm-up
    base()
    gc.collect()
    for i in range(repeat):
        for fn in ((lib, base) if i % 2 == 0 else (base, lib)):
            c0 = time.process_time()
            t0 = time.perf_counter()
            out = fn()
            t[fn].append(time.perf_counter() - t0)
            c[fn].append(time.process_time() - c0)
            del out
            gc.collect()
    return ratio_block(t[lib], t[base], c[lib], c[base])


def _outcome(fn: Callable[[], Any]) -> str:
    out = fn()
    kind = "rejected" if isinstance(out, BaseException) else "loaded"
    del out
    gc.collect()
    return kind


class CountingBytesIO(io.BytesIO):
    """io.BytesIO that counts the bytes copied out of it by getvalue()."""

    copied = 0

    def getvalue(self) -> bytes:  # type: ignore[override]
        value = super().getvalue()
        CountingBytesIO.copied += len(value)
        return value


def _getvalue_bytes(fn: Callable[[], Any]) -> int:
    """Bytes copied by getvalue() on any BytesIO made while *fn* runs (torch.save uses one itself)."""
    original = io.BytesIO
    io.BytesIO = CountingBytesIO  # type: ignore[misc]
    CountingBytesIO.copied = 0
    try:
        out = fn()
        del out
        return CountingBytesIO.copied
    finally:
        io.BytesIO = original  # type: ignore[misc]
        gc.collect()


def copy_check(obj: Any, sgs: tuple[Any, ...], entries: list[Any]) -> dict[str, Any]:
    """No extra copy of the bytes: no more getvalue() than torch, and peak Python memory matches torch's."""
    import tracemalloc

    fns = {
        "baseline": lambda: plain_round_trip(obj, "weights_only_false", entries),
        "library": lambda: library_round_trip(obj, "weights_only_false", sgs),
    }
    copied = {name: _getvalue_bytes(fn) for name, fn in fns.items()}
    peaks = {}
    for name, fn in fns.items():
        tracemalloc.start()
        out = fn()
        peaks[name] = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
        del out
        gc.collect()
    src_hits = []
    for fname in sorted(os.listdir(PACKAGE_DIR)):
        if fname.endswith(".py"):
            with open(os.path.join(PACKAGE_DIR, fname), encoding="utf-8") as fh:
                for lineno, line in enumerate(fh, 1):
                    if "getvalue(" in line:
                        src_hits.append(f"{fname}:{lineno}")
    return {
        "getvalue_bytes_baseline": copied["baseline"],
        "getvalue_bytes_library": copied["library"],
        "getvalue_in_library_source": src_hits,
        "python_peak_bytes_baseline": peaks["baseline"],
        "python_peak_bytes_library": peaks["library"],
        "python_peak_extra_bytes": peaks["library"] - peaks["baseline"],
    }


def scan_timing(repeat: int, small_obj: Any, big_obj: Any) -> dict[str, Any]:
    out = {}
    for name, obj in (("small", small_obj), ("large", big_obj)):
        ckpt = tst.Checkpoint.save(obj)
        buf = ckpt.rewound()
        tst.scan_checkpoint(buf)
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            info = tst.scan_checkpoint(buf)
            times.append(time.perf_counter() - t0)
        out[name] = {"nbytes": info.nbytes, "globals": list(info.globals), "s": stats(times)}
        del ckpt, buf
        gc.collect()
    out["large_over_small"] = out["large"]["s"]["median"] / out["small"]["s"]["median"]
    return out


def bench_round_trip(small_repeat: int, large_repeat: int, results: dict[str, Any]) -> None:
    out: dict[str, Any] = {}
    small, small_globals = small_module()
    small_sgs = normalize_safe_globals(small_globals)
    log(f"[round_trip] small sparse quantized module, {small_repeat} interleaved pairs per mode ...")
    with tst.override_qengine("qnnpack"):
        for mode in MODES:
            lib = lambda m=mode: library_round_trip(small, m, small_sgs)  # noqa: E731
            base = lambda m=mode: plain_round_trip(small, m, list(small_globals))  # noqa: E731
            outcome = (_outcome(lib), _outcome(base))
            if outcome[0] != outcome[1]:
                raise RuntimeError(f"small/{mode}: library {outcome[0]}, plain torch {outcome[1]}")
            out[f"small/{mode}"] = {**time_pair(lib, base, small_repeat), "outcome": outcome[0]}

    log(f"[round_trip] 256 MiB float module, {large_repeat} interleaved pairs per mode ...")
    big = BigModule()
    big_globals = (BigModule,)
    big_sgs = normalize_safe_globals(big_globals)
    for mode in MODES:
        ctx = registered(big_globals) if mode == "default" else contextlib.nullcontext()
        with ctx:
            lib = lambda m=mode: library_round_trip(big, m, big_sgs)  # noqa: E731
            base = lambda m=mode: plain_round_trip(big, m, list(big_globals))  # noqa: E731
            block = time_pair(lib, base, large_repeat)
        out[f"large/{mode}"] = {**block, "outcome": "loaded", "target": TARGETS["round_trip_large"]}
    for key in list(out):
        out[key]["added_s"] = out[key]["library_s"]["median"] - out[key]["baseline_s"]["median"]

    log("[round_trip] copy check and allowlist scan timing ...")
    out["copy_check"] = copy_check(big, big_sgs, list(big_globals))
    out["scan"] = scan_timing(max(5, small_repeat // 2), small, big)
    out["large_nbytes"] = out["scan"]["large"]["nbytes"]
    del big
    gc.collect()
    results["round_trip"] = out


# -- 3. flagship ----------------------------------------------------------------------------


_RAN = re.compile(r"^Ran (\d+) tests? in ([0-9.]+)s", re.M)
_SKIPPED = re.compile(r"skipped=(\d+)")


_FLOOR_TEST = """\
from torch.testing._internal.common_utils import TestCase, run_tests


class TestNothing(TestCase):
    def test_nothing(self):
        pass


if __name__ == "__main__":
    run_tests()
"""


def bench_flagship(repeat: int, results: dict[str, Any], wait_s: float, warmup: bool) -> None:
    deadline = time.monotonic() + wait_s
    while not os.path.exists(FLAGSHIP_FILE):
        if time.monotonic() > deadline:
            results["flagship"] = {"missing": FLAGSHIP_FILE}
            log(f"[flagship] {FLAGSHIP_FILE} does not exist; skipped")
            return
        log("[flagship] waiting for the flagship test file ...")
        time.sleep(15)
    log(f"[flagship] {repeat} interleaved runs of 3 processes ...")
    py = sys.executable
    env = _neutral_env()
    with tempfile.TemporaryDirectory(prefix="tst-bench-cwd-") as cwd:
        with open(os.path.join(cwd, "test_floor.py"), "w", encoding="utf-8") as fh:
            fh.write(_FLOOR_TEST)
        commands = {
            "flagship": ([py, "-m", "unittest", "test_qlinear_packed_params"], FLAGSHIP_DIR, env),
            "context": ([py, "-c", "import torch; import torch.testing._internal.common_utils"], cwd, env),
            # pytorch's TestCase.run calls torch.compiler.set_stance, which imports torch._dynamo
            # on the first test: every pytorch test file pays this, with or without the library.
            "floor": ([py, "-m", "unittest", "test_floor"], cwd, env),
        }
        times, cpus, procs = interleaved(commands, repeat, warmup=warmup)
    proc = procs["flagship"]
    tail = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else ""
    ran = _RAN.search(proc.stderr)
    n = int(ran.group(1)) if ran else 0
    in_runner = float(ran.group(2)) if ran else float("nan")
    skipped = _SKIPPED.search(tail)
    wall = statistics.median(times["flagship"])
    ctx = statistics.median(times["context"])
    floor = statistics.median(times["floor"])
    results["flagship"] = {
        "file": os.path.relpath(FLAGSHIP_FILE, ROOT),
        "command": "python -m unittest test_qlinear_packed_params  (cwd test/ao/sparsity)",
        "returncode": proc.returncode,
        "status": tail,
        "tests": n,
        "skipped": int(skipped.group(1)) if skipped else 0,
        "wall_s": stats(times["flagship"]),
        "context_s": stats(times["context"]),
        "floor_s": stats(times["floor"]),
        "wall_cpu_s": stats(cpus["flagship"]),
        "context_cpu_s": stats(cpus["context"]),
        "floor_cpu_s": stats(cpus["floor"]),
        "ratio_to_context": wall / ctx,
        "ratio_to_floor": wall / floor,
        "unittest_reported_s": in_runner,
        "per_case_wall_s": wall / n if n else float("nan"),
        "per_case_beyond_imports_s": (wall - ctx) / n if n else float("nan"),
        "per_case_beyond_floor_s": (wall - floor) / n if n else float("nan"),
        "per_case_in_runner_s": in_runner / n if n else float("nan"),
    }


# -- 4. instantiation -------------------------------------------------------------------------


ENGINES4 = ("fbgemm", "qnnpack", "onednn", "x86")
DEVICES3 = ("cpu", "cuda", "meta")


def _make_generic(methods: int) -> type:
    def make_test(i: int) -> Callable[..., None]:
        def test(self: Any, device: str) -> None:
            self.round_trip(torch.nn.Linear(2, 2))

        test.__name__ = f"test_case_{i:02d}"
        return test

    body: dict[str, Any] = {
        "__module__": "bench_matrix",
        "qengines": ENGINES4,
        "load_modes": MODES,
        "devices": DEVICES3,
        "make_module": lambda self: torch.nn.Linear(2, 2),
    }
    for i in range(methods):
        body[f"test_case_{i:02d}"] = make_test(i)
    return type("TestBenchMatrix", (tst.SerializationRoundTripTestCase, unittest.TestCase), body)


def _instantiate_once(methods: int) -> int:
    cls = _make_generic(methods)
    scope: dict[str, Any] = {"__name__": "bench_matrix", "TestBenchMatrix": cls}
    generated = tst.instantiate_round_trip_tests(cls, scope)
    return sum(1 for c in generated for n in vars(c) if n.startswith("test"))


def bench_instantiation(repeat: int, results: dict[str, Any], torch_import_s: Optional[float]) -> None:
    log(f"[instantiation] {repeat} repetitions ...")
    methods = 20
    t0 = time.perf_counter()
    count = _instantiate_once(methods)  # first call also imports parameterized
    first = time.perf_counter() - t0
    times = []
    for _ in range(repeat):
        gc.collect()
        t0 = time.perf_counter()
        _instantiate_once(methods)
        times.append(time.perf_counter() - t0)
    if torch_import_s is None:
        with tempfile.TemporaryDirectory(prefix="tst-bench-cwd-") as cwd:
            base, _, _ = interleaved({"torch": ([sys.executable, "-c", "import torch"], cwd, _neutral_env())}, 3)
        torch_import_s = statistics.median(base["torch"])
    results["instantiation"] = {
        "matrix": f"{len(ENGINES4)} engines x {len(MODES)} modes x {len(DEVICES3)} devices x {methods} methods",
        "generated_tests": count,
        "first_call_s": first,
        "s": stats(times),
        "per_test_s": statistics.median(times) / count,
        "import_torch_s": torch_import_s,
        "ratio_to_import_torch": statistics.median(times) / torch_import_s,
    }


# -- profiling --------------------------------------------------------------------------------


def profile_round_trip(which: str) -> None:
    import cProfile
    import pstats

    if which == "small":
        obj, globs = small_module()
        ctx: Any = tst.override_qengine("qnnpack")
        n = 50
    else:
        obj, globs = BigModule(), (BigModule,)
        ctx = contextlib.nullcontext()
        n = 2
    sgs = normalize_safe_globals(globs)
    with ctx:
        for mode in MODES:
            reg = registered(globs) if which == "large" and mode == "default" else contextlib.nullcontext()
            with reg:
                prof = cProfile.Profile()
                prof.enable()
                for _ in range(n):
                    library_round_trip(obj, mode, sgs)
                prof.disable()
            print(f"\n=== cProfile: library round trip, {which} module, mode {mode}, {n} calls ===")
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)


# -- report -----------------------------------------------------------------------------------


def verdict(ratio: float, target: float) -> str:
    return "met" if ratio <= target else "MISSED"


def print_report(results: dict[str, Any]) -> None:
    m = results["machine"]
    print(f"machine: {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}; torch {m['torch']}; {m['date']}")
    print(f"command: {results['command']}; load average {m['loadavg_start']} at start, "
          f"{results.get('loadavg_end')} at end")
    if "import" in results:
        r = results["import"]
        print("\n[1] import (whole processes, min / median / max)")
        print(f"  python -c 'import torch'                          {fmt_dist(r['torch_s'])}"
              f"  (CPU {fmt_dist(r['torch_cpu_s'])})")
        for key, label in (("torch_plus_library", "import torch; import torch_serial_testing"),
                           ("torch_plus_library_no_bytecode", "  same, library compiled from source")):
            b = r[key]
            print(f"  {label:<50}{fmt_dist(b['library_s'])}  ratio {b['ratio']:.3f} "
                  f"(pairs {b['pair_ratio']['min']:.3f}..{b['pair_ratio']['max']:.3f}; CPU time ratio "
                  f"{b['cpu_ratio']:.3f})")
        for key, label in (("in_process", "in-process"), ("in_process_no_bytecode", "in-process, no bytecode")):
            ip = r[key]
            print(f"  {label}: import torch {fmt_dist(ip['import_torch_s'])}, then import torch_serial_testing "
                  f"{fmt_dist(ip['import_library_after_torch_s'])}: ratio {ip['ratio']:.3f}")
        print(f"  import torch_serial_testing alone                 {fmt_dist(r['library_alone_s'])}"
              f"  (imports torch: {r['library_alone_imports_torch']})")
        ip = r["in_process"]
        print(f"  target <= {r['target']}: {verdict(ip['ratio'], r['target'])} in-process ({ip['ratio']:.3f}, "
              f"+{fmt_s(ip['import_library_after_torch_s']['median'])}); whole processes "
              f"{r['torch_plus_library']['ratio']:.3f} ({'+' if r['added_s'] >= 0 else ''}{fmt_s(r['added_s'])}, "
              f"within run-to-run noise of {fmt_s(r['torch_s']['max'] - r['torch_s']['min'])})")
    if "round_trip" in results:
        r = results["round_trip"]
        print("\n[2] one round trip: library vs bare torch.save + torch.load (min / median / max)")
        for key, b in r.items():
            if "/" not in key:
                continue
            tgt = f"  target <= {b['target']}: {verdict(b['ratio'], b['target'])}" if "target" in b else ""
            print(f"  {key:<26} lib {fmt_dist(b['library_s'])}  torch {fmt_dist(b['baseline_s'])}  "
                  f"ratio {b['ratio']:.3f} (of min {b['ratio_of_min']:.3f}, CPU {b['cpu_ratio']:.3f}; "
                  f"{'+' if b['added_s'] >= 0 else ''}{fmt_s(b['added_s'])}, {b['outcome']}){tgt}")
        c = r["copy_check"]
        print(f"  copies: getvalue() bytes in a round trip: library {c['getvalue_bytes_library']}, torch "
              f"{c['getvalue_bytes_baseline']} (torch's own data.pkl); getvalue( in library source: "
              f"{', '.join(c['getvalue_in_library_source']) or 'none'}")
        print(f"  peak traced Python memory: library {c['python_peak_bytes_library'] / 2**20:.1f} MiB, torch "
              f"{c['python_peak_bytes_baseline'] / 2**20:.1f} MiB ({c['python_peak_extra_bytes'] / 2**20:+.2f} MiB)")
        s = r["scan"]
        print(f"  scan_checkpoint: {s['small']['nbytes']} B checkpoint {fmt_dist(s['small']['s'])}; "
              f"{s['large']['nbytes'] / 2**20:.0f} MiB checkpoint {fmt_dist(s['large']['s'])} "
              f"(x{s['large_over_small']:.2f})")
    if "flagship" in results:
        r = results["flagship"]
        print("\n[3] flagship test file")
        if "missing" in r:
            print(f"  {r['missing']} does not exist")
        else:
            print(f"  {r['command']}: {r['status']} ({r['tests']} tests, {r['skipped']} skipped)")
            print(f"  wall {fmt_dist(r['wall_s'])}; import torch + common_utils {fmt_dist(r['context_s'])}; "
                  f"ratio {r['ratio_to_context']:.2f}")
            print(f"  per case: {fmt_s(r['per_case_wall_s'])} of wall, {fmt_s(r['per_case_beyond_imports_s'])} "
                  f"beyond the imports, {fmt_s(r['per_case_in_runner_s'])} inside the runner "
                  f"(unittest reports {r['unittest_reported_s']:.3f} s)")
            print(f"  empty pytorch test file (1 no-op common_utils.TestCase test) {fmt_dist(r['floor_s'])}; "
                  f"ratio {r['ratio_to_floor']:.2f}; per case beyond it {fmt_s(r['per_case_beyond_floor_s'])}")
            print(f"  CPU: flagship {fmt_dist(r['wall_cpu_s'])}; context {fmt_dist(r['context_cpu_s'])}; "
                  f"floor {fmt_dist(r['floor_cpu_s'])}")
    if "instantiation" in results:
        r = results["instantiation"]
        print("\n[4] instantiation")
        print(f"  {r['matrix']} = {r['generated_tests']} tests: {fmt_dist(r['s'])} "
              f"(first call {fmt_s(r['first_call_s'])}, imports parameterized); "
              f"{fmt_s(r['per_test_s'])} per test; {100 * r['ratio_to_import_torch']:.1f}% of import torch "
              f"({fmt_s(r['import_torch_s'])})")


def _table(rows: list[list[str]]) -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    sep = "  ".join("=" * w for w in widths)
    out = [sep, "  ".join(c.ljust(w) for c, w in zip(rows[0], widths)).rstrip(), sep]
    out += ["  ".join(c.ljust(w) for c, w in zip(r, widths)).rstrip() for r in rows[1:]]
    out.append(sep)
    return out


def rst_rows(results: dict[str, Any]) -> list[list[str]]:
    rows = [["Measurement", "Library (min / median / max)", "Plain torch (min / median / max)", "Ratio",
             "CPU ratio", "Target"]]
    if "import" in results:
        r = results["import"]
        b = r["torch_plus_library"]
        rows.append(["import torch + library", fmt_dist(b["library_s"]), fmt_dist(r["torch_s"]),
                     f"{b['ratio']:.3f}", f"{b['cpu_ratio']:.3f}", f"<= {r['target']} ({verdict(b['ratio'], r['target'])})"])
        b = r["torch_plus_library_no_bytecode"]
        rows.append(["same, no bytecode cache", fmt_dist(b["library_s"]), fmt_dist(r["torch_s"]),
                     f"{b['ratio']:.3f}", f"{b['cpu_ratio']:.3f}", f"<= {r['target']} ({verdict(b['ratio'], r['target'])})"])
        for key, label in (("in_process", "in-process: library after torch"),
                           ("in_process_no_bytecode", "same, no bytecode cache")):
            ip = r[key]
            rows.append([label, fmt_dist(ip["import_library_after_torch_s"]),
                         fmt_dist(ip["import_torch_s"]) + " [#bench-inproc]_", f"{ip['ratio']:.3f}", "n/a",
                         f"<= {r['target']} ({verdict(ip['ratio'], r['target'])})"])
        rows.append(["import library alone", fmt_dist(r["library_alone_s"]), "n/a", "n/a", "n/a", "info"])
    if "round_trip" in results:
        for key, b in results["round_trip"].items():
            if "/" not in key:
                continue
            size, mode = key.split("/")
            label = f"round trip, {'small sparse q.' if size == 'small' else '256 MiB float'}, {mode}"
            if b["outcome"] == "rejected":
                label += " (rejected)"
            tgt = f"<= {b['target']} ({verdict(b['ratio'], b['target'])})" if "target" in b else "info"
            rows.append([label, fmt_dist(b["library_s"]), fmt_dist(b["baseline_s"]), f"{b['ratio']:.3f}",
                         f"{b['cpu_ratio']:.3f}", tgt])
        s = results["round_trip"]["scan"]
        rows.append([f"scan_checkpoint, {s['large']['nbytes'] / 2**20:.0f} MiB", fmt_dist(s["large"]["s"]),
                     "n/a", f"x{s['large_over_small']:.2f} of 4 KiB", "n/a", "constant"])
    if "flagship" in results and "missing" not in results["flagship"]:
        r = results["flagship"]
        rows.append([f"flagship file, {r['tests']} tests", fmt_dist(r["wall_s"]),
                     fmt_dist(r["context_s"]) + " [#bench-context]_", f"{r['ratio_to_context']:.2f}",
                     f"{r['wall_cpu_s']['median'] / r['context_cpu_s']['median']:.2f}",
                     "info"])
        rows.append([f"flagship file, {r['tests']} tests", fmt_dist(r["wall_s"]),
                     fmt_dist(r["floor_s"]) + " [#bench-floor]_", f"{r['ratio_to_floor']:.2f}",
                     f"{r['wall_cpu_s']['median'] / r['floor_cpu_s']['median']:.2f}", "info"])
    if "instantiation" in results:
        r = results["instantiation"]
        rows.append([f"instantiation, {r['generated_tests']} tests", fmt_dist(r["s"]),
                     fmt_s(r["import_torch_s"]) + " [#bench-torch]_", f"{r['ratio_to_import_torch']:.3f}", "n/a", "negligible"])
    return rows


def _command_for_rst(command: str) -> str:
    """The command without output-only flags (--json/--rst PATH do not change what is measured)."""
    return re.sub(r"\s--(json|rst)(=|\s+)\S+", "", command)


def rst_notes(results: dict[str, Any]) -> list[str]:
    notes: list[str] = []
    m = results["machine"]
    notes.append(
        f"The machine was shared with other jobs (load average {m['loadavg_start']} at the start, "
        f"{results.get('loadavg_end')} at the end, on {m['cpu_count']} CPUs), so single wall-clock "
        "samples vary by tens of percent; the medians of interleaved runs and the CPU-time ratios "
        "are the figures to read."
    )
    if "import" in results:
        r = results["import"]
        ip, nb = r["in_process"], r["in_process_no_bytecode"]
        notes.append(
            f"*Import.*  Whole processes differ by {fmt_s(abs(r['added_s']))} in the median, far below the "
            f"run-to-run spread of ``import torch`` itself ({fmt_s(r['torch_s']['max'] - r['torch_s']['min'])}), "
            f"so the library processes also time their imports: ``import torch_serial_testing`` after "
            f"``import torch`` takes {fmt_s(ip['import_library_after_torch_s']['median'])} "
            f"(ratio {ip['ratio']:.3f}).  This environment sets "
            f"``PYTHONDONTWRITEBYTECODE={m.get('pythondontwritebytecode')!s}``, so the editable checkout is compiled from source in "
            f"every process ({fmt_s(nb['import_library_after_torch_s']['median'])}, ratio {nb['ratio']:.3f}); "
            "the first and third rows import a byte-compiled copy of the package, as a regular install has.  "
            "``import torch_serial_testing`` alone "
            + ("imports torch." if r["library_alone_imports_torch"] else "does not import torch.")
        )
    if "round_trip" in results:
        r = results["round_trip"]
        c, sc = r["copy_check"], r["scan"]
        notes.append(
            "*Round trips.*  The baseline is a bare ``torch.save`` into ``io.BytesIO`` and "
            "``torch.load(buf, weights_only=...)`` with the same arguments (inside "
            "``torch.serialization.safe_globals([...])`` for that mode; for ``default`` the module class is "
            "registered with ``add_safe_globals`` for both, and for the small module the baseline's "
            "rejected load, ``UnpicklingError`` included, is what is timed).  On 256 MiB the library is "
            "within noise of torch.  No extra copy of the bytes is made: ``getvalue()`` copies "
            f"{c['getvalue_bytes_library']} bytes in a library round trip and {c['getvalue_bytes_baseline']} "
            "in torch's (torch's own ``data.pkl`` buffer), the library source never calls it, and the peak "
            f"traced Python memory is {c['python_peak_bytes_library'] / 2**20:.1f} MiB for both "
            f"({c['python_peak_extra_bytes'] / 2**20:+.2f} MiB).  The allowlist scan reads only ``data.pkl``: "
            f"{fmt_s(sc['large']['s']['median'])} on the 256 MiB checkpoint, "
            f"{fmt_s(sc['small']['s']['median'])} on the {sc['small']['nbytes']}-byte one (its cost follows "
            "the number of pickle opcodes, not the tensor bytes)."
        )
        small = [b for k, b in r.items() if k.startswith("small/")]
        if small:
            lo = min(b["added_s"] for b in small)
            hi = max(b["added_s"] for b in small)
            notes.append(
                f"*Small module.*  A tiny round trip costs {fmt_s(lo)} to {fmt_s(hi)} more than bare torch "
                "(no target was set for it).  cProfile attributes about half of it to the static scan of "
                "``data.pkl`` with ``pickletools`` (pure Python, ~0.35 ms for this module's ~300 opcodes), "
                "about 0.15 ms to the prediction and load wrapper (the registry snapshot, capturing "
                "warnings; the replaced-``torch.load`` check is cached); the remainder is "
                "not attributable to any single function in the profile.  It is a constant per round trip, "
                "not proportional to the checkpoint size; the scan is what lets the library predict the "
                "outcome exactly without unpickling anything."
            )
    if "flagship" in results and "missing" not in results["flagship"]:
        r = results["flagship"]
        notes.append(
            f"*Flagship file.*  ``{r['file']}``: {r['tests']} tests ({r['status']}).  Most of its wall time "
            "is what every pytorch test file pays: importing torch and ``common_utils``, then "
            "``torch._dynamo``, which pytorch's ``TestCase.run`` imports on the first test "
            "(``torch.compiler.set_stance``).  Beyond an empty pytorch test file a case costs "
            f"{fmt_s(r['per_case_beyond_floor_s'])} (most cases build, save, load and check three weight variants)."
        )
    if "instantiation" in results:
        r = results["instantiation"]
        notes.append(
            f"*Instantiation.*  {r['matrix']} generates {r['generated_tests']} tests in "
            f"{fmt_s(r['s']['median'])} ({fmt_s(r['per_test_s'])} per test, "
            f"{100 * r['ratio_to_import_torch']:.1f}% of ``import torch``); the first call also imports "
            f"``parameterized`` ({fmt_s(r['first_call_s'])}).  Devices that are absent are still generated "
            "and skip when run."
        )
    notes.append("Timings are reported, never asserted: no test depends on them.")
    return notes


def write_rst(results: dict[str, Any], path: str) -> None:
    m = results["machine"]
    lines = [
        "Cost of the library",
        "~~~~~~~~~~~~~~~~~~~",
        "",
        "Each cost is measured against the plain-torch equivalent in the same run, interleaved with it.",
        "Times are min / median / max; a ratio is library median over plain-torch median; the CPU ratio",
        "compares user + system time, which other jobs on the machine disturb much less.",
        f"Machine: {m['platform']}, {m['cpu_count']} CPUs, Python {m['python']}; torch {m['torch']};",
        f"{m['date']}.  Command: ``{_command_for_rst(results['command'])}``.",
        "",
    ]
    lines += _table(rst_rows(results))
    lines += [""]
    if "flagship" in results and "missing" not in results["flagship"]:
        lines.append(".. [#bench-context] ``python -c \"import torch; import torch.testing._internal.common_utils\"``, "
                     "what any pytorch test file pays before its first test.")
        lines.append(".. [#bench-floor] ``python -m unittest test_floor``: a file with one no-op pytorch ``TestCase`` "
                     "test; its first test imports ``torch._dynamo`` (``torch.compiler.set_stance``).")
    if "instantiation" in results:
        lines.append(".. [#bench-torch] ``python -c \"import torch\"``.")
    if "import" in results:
        lines.append(".. [#bench-inproc] ``import torch`` timed inside the same processes; the ratio is "
                     "1 + (library import) / (torch import), medians.")
    for note in rst_notes(results):
        lines += ["", *_wrap(note)]
    with open(path, "w", encoding="utf-8") as fh:
        fh.write("\n".join(lines) + "\n")


def _wrap(text: str, width: int = 100) -> list[str]:
    import textwrap

    return textwrap.wrap(text, width=width, break_long_words=False, break_on_hyphens=False)


# -- main -------------------------------------------------------------------------------------


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="fewer repetitions (under a minute, noisier)")
    parser.add_argument("--repeat", type=int, default=None, metavar="N",
                        help="repetitions of each measurement (default: per benchmark; see the code)")
    parser.add_argument("--only", action="append", choices=BENCHMARKS, metavar="NAME",
                        help=f"run only this benchmark (repeatable): {', '.join(BENCHMARKS)}")
    parser.add_argument("--json", metavar="PATH", help="also write every number as JSON")
    parser.add_argument("--rst", metavar="PATH", help="also write the results table as an RST fragment")
    parser.add_argument("--profile", choices=("small", "large"),
                        help="cProfile the library round trip of the small or large module and exit")
    parser.add_argument("--from-json", metavar="PATH",
                        help="do not measure: report (and --rst) the results saved earlier with --json")
    parser.add_argument("--wait-flagship", type=float, default=0.0, metavar="SECONDS",
                        help="wait this long for the flagship test file to appear")
    args = parser.parse_args(argv)
    if args.profile:
        profile_round_trip(args.profile)
        return 0
    if args.from_json:
        with open(args.from_json, encoding="utf-8") as fh:
            results = json.load(fh)
        print_report(results)
        if args.rst:
            write_rst(results, args.rst)
        return 0
    q = args.quick
    reps = {
        "import": 3 if q else 8,
        "small": 10 if q else 40,
        "large": 1 if q else 4,
        "flagship": 1 if q else 3,
        "instantiation": 3 if q else 10,
    }
    if args.repeat is not None:
        reps = {k: max(1, args.repeat) for k in reps}
    only = args.only or list(BENCHMARKS)
    results: dict[str, Any] = {
        "machine": machine(),
        "command": "python bench/run.py" + (" " + " ".join(argv if argv is not None else sys.argv[1:])).rstrip(),
        "repetitions": reps,
    }
    t_start = time.perf_counter()
    if "import" in only:
        bench_import(reps["import"], results, warmup=not q)
    if "round_trip" in only:
        bench_round_trip(reps["small"], reps["large"], results)
    if "flagship" in only:
        bench_flagship(reps["flagship"], results, args.wait_flagship, warmup=not q)
    if "instantiation" in only:
        torch_s = results["import"]["torch_s"]["median"] if "import" in results else None
        bench_instantiation(reps["instantiation"], results, torch_s)
    results["elapsed_s"] = time.perf_counter() - t_start
    results["loadavg_end"] = _loadavg()
    print_report(results)
    print(f"\n(benchmark took {results['elapsed_s']:.0f} s)")
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, default=str)
    if args.rst:
        write_rst(results, args.rst)
    return 0


if __name__ == "__main__":
    sys.exit(main())
