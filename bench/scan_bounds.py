#!/usr/bin/env python3
"""What a static scan costs at its worst under the default ScanLimits, and on large checkpoints.

``bounds``  per hostile family (issue 27.5, and ``FLOODS`` of ``test/helpers/hostile_checkpoints.py``:
            BUILD, SETITEMS and APPENDS on objects shared through the memo, long text integers, EXT
            codes), the first input the default caps refuse (just over ``max_opcodes``, or less
            when a family is refused sooner): wall and CPU time of ``scan_checkpoint`` in this
            process, and the opcode units it counted.
``inspect`` the same inputs deflated into zip files (a few kB each), each ``inspect --json``'d
            by a whole process: CPU time (user + system, ``os.wait4``) next to ``import torch``.
``report``  ``inspect`` (text and ``--json``) of a checkpoint naming 9,000 flagged globals
            (under ScanLimits.max_globals).
``size``    ``python -m torch_serial_testing inspect --json`` on a 2 KiB and a 256 MiB state_dict
            (zip and legacy), whole processes: wall time and peak RSS, next to
            ``torch.serialization.get_unsafe_globals_in_checkpoint`` and picklescan (when
            installed: ``pip install picklescan``) on the same files.  Files are generated into a
            temporary directory and deleted after.

    python bench/scan_bounds.py [bounds] [inspect] [report] [size]
"""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
import time
import zipfile
from typing import Any, Callable

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, ROOT)

import torch  # noqa: E402

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import CheckpointFormatError  # noqa: E402
from torch_serial_testing.model import default_scan_limits  # noqa: E402
from torch_serial_testing.tools import scan_checkpoint  # noqa: E402


def _families() -> dict[str, Callable[[int], bytes]]:
    return {
        **H.FLOODS,
        "GLOBAL+POP, one name": lambda n: b"\x80\x02" + (H.glob("a", "b") + b"0") * (n // 5) + b"N.",
        "GLOBAL+POP, distinct names": lambda n: (
            b"\x80\x02" + b"".join(H.glob(f"m{i}", "n") + b"0" for i in range(n // 5)) + b"N."
        ),
        "BININT1+TUPLE1 nesting": lambda n: b"\x80\x02K\x01" + b"\x85" * n + b".",
        "K1 K2 SETITEM": lambda n: b"\x80\x02}" + b"K\x01K\x02s" * (n // 3) + b".",
        "BINPUT memo flood": lambda n: (
            b"\x80\x02N" + b"r" + b"".join(i.to_bytes(4, "little") + b"r" for i in range(n // 2))[:-1] + b"."
        ),
    }


def _timed(fn: Callable[[], Any]) -> tuple[float, float, str]:
    w, c = time.perf_counter(), time.process_time()
    try:
        info = fn()
        outcome = f"scanned ({getattr(info, 'opcodes_walked', '?')} opcode units)"
    except CheckpointFormatError as e:
        outcome = "refused: " + str(e).split(";")[0][-70:]
    return time.perf_counter() - w, time.process_time() - c, outcome


def _inputs() -> dict[str, bytes]:
    """Each family's data.pkl, just over the opcode cap (the INT family: 50,000 integers, 215 MB)."""
    limit = default_scan_limits().max_opcodes
    return {name: make(50_000 if name.startswith("INT") else limit + 10_000) for name, make in _families().items()}


def bounds() -> list[str]:
    rows = []
    for name, body in _inputs().items():
        data = H.torch_zip(body)
        wall, cpu, outcome = _timed(lambda data=data: scan_checkpoint(data))
        rows.append(f"{name:<34} {len(data) / 1e6:7.1f} MB zip  {wall:6.2f} s wall  {cpu:6.2f} s CPU  {outcome}")
        del data
    return rows


def _child_cpu(cmd: list[str]) -> tuple[float, int]:
    """CPU seconds (user + system) and exit code of a child process, by os.wait4."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return usage.ru_utime + usage.ru_stime, proc.returncode


def inspect_processes() -> list[str]:
    py = sys.executable
    rows = [f"{'python -c import torch (floor)':<34} {'':>10}  {_child_cpu([py, '-c', 'import torch'])[0]:6.2f} s CPU"]
    with tempfile.TemporaryDirectory() as d:
        for name, body in _inputs().items():
            path = os.path.join(d, "flood.pt")
            with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as z:
                z.writestr("archive/data.pkl", body)
                z.writestr("archive/byteorder", b"little")
                z.writestr("archive/version", b"3\n")
            cpu, code = _child_cpu([py, "-m", "torch_serial_testing", "inspect", "--json", path])
            rows.append(f"{name:<34} {os.path.getsize(path) / 1e3:7.1f} kB  {cpu:6.2f} s CPU  exit {code}")
    return rows


def report() -> list[str]:
    from torch_serial_testing.tools.cli import main

    body = b"\x80\x02" + b"".join(H.glob("os", f"n{i}") + b"0" for i in range(9_000)) + b"N."
    rows = []
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "names.pt")
        with open(path, "wb") as fh:
            fh.write(H.torch_zip(body))
        for args in (["inspect", path], ["inspect", "--json", path]):
            w = time.perf_counter()
            with contextlib.redirect_stdout(io.StringIO()):
                code = main(args)
            rows.append(
                f"{' '.join(args[:-1]):<16} 9,000 flagged names: {time.perf_counter() - w:6.2f} s (exit {code})"
            )
    return rows


def _process(cmd: list[str]) -> tuple[float, float]:
    """Wall seconds and peak RSS (MB) of a child process.  The RSS is read by ``/usr/bin/time`` when
    present: a child forked from this process (torch imported) would inherit its peak otherwise."""
    env = {**os.environ, "PYTHONPATH": ROOT + os.pathsep + os.environ.get("PYTHONPATH", "")}
    timer = ["/usr/bin/time", "-f", "%M"] if os.path.exists("/usr/bin/time") else []
    w = time.perf_counter()
    proc = subprocess.run(timer + cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=ROOT)
    wall = time.perf_counter() - w
    if timer:
        return wall, int(proc.stderr.decode().strip().splitlines()[-1]) / 1024
    return wall, float("nan")


def size() -> list[str]:
    py = sys.executable
    rows = []
    with tempfile.TemporaryDirectory() as d:
        files = {}
        for label, nbytes in (("2 KiB", 2048), ("256 MiB", 256 << 20)):
            for fmt in ("zip", "legacy"):
                path = os.path.join(d, f"{fmt}-{nbytes}.pt")
                sd = {f"w{i}": torch.zeros(nbytes // 4 // 8) for i in range(8)}
                torch.save(sd, path, _use_new_zipfile_serialization=fmt == "zip")
                files[f"{fmt} {label}"] = path
                del sd
        tools = {
            "python -c 'import torch'": lambda p: [py, "-c", "import torch"],
            "inspect --json": lambda p: [py, "-m", "torch_serial_testing", "inspect", "--json", p],
            "get_unsafe_globals_in_checkpoint": lambda p: [
                py,
                "-c",
                "import sys, torch; torch.serialization.get_unsafe_globals_in_checkpoint(sys.argv[1])",
                p,
            ],
        }
        try:
            import picklescan  # noqa: F401

            tools["picklescan"] = lambda p: [py, "-m", "picklescan", "--path", p]
        except ImportError:
            rows.append("(picklescan not installed: pip install picklescan for its rows)")
        for file_label, path in files.items():
            for tool, cmd in tools.items():
                wall, rss = _process(cmd(path))
                rows.append(f"{file_label:<16} {tool:<34} {wall:6.2f} s  {rss:7.0f} MB")
    return rows


if __name__ == "__main__":
    chosen = sys.argv[1:] or ["bounds", "inspect", "report", "size"]
    for part in chosen:
        print(f"-- {part}", flush=True)
        for row in {"bounds": bounds, "inspect": inspect_processes, "report": report, "size": size}[part]():
            print(row, flush=True)
