"""``inspect`` next to the scanners people use, on the same files, as whole processes.

Per file (a 2 KiB and a 256 MiB state_dict, a user's own module, numpy scalars and arrays): wall
time and peak RSS (``os.wait4``'s ``ru_maxrss`` of that one child) of

* ``python -m torch_serial_testing inspect FILE --json``,
* ``torch.serialization.get_unsafe_globals_in_checkpoint(FILE)`` (torch's own, >= 2.5),
* ``picklescan --path FILE`` (optional: ``pip install picklescan``; the row says so when absent),
* ``python -c "import torch"``: the floor every torch-side tool pays,

and what each reported.  Medians of interleaved rounds; the table is made by ``tabulate``
(``tablefmt="rst"``; optional too: plain text without it).
"""

from __future__ import annotations

import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Callable, NamedTuple, Optional, Sequence

MAKE = """
import numpy as np, torch
import usermodels
torch.save({"w": torch.ones(4, 4), "b": torch.zeros(4)}, "small_state_dict.pt")
torch.save({"w": torch.zeros(64 * 1024 * 1024)}, "state_dict_256MiB.pt")
torch.save(usermodels.MyNet(), "user_module.pt")
torch.save({"w": torch.ones(2), "lr": np.float64(0.1), "step": np.int64(3), "mask": np.arange(3)}, "numpy.pt")
"""
USER_MODULE = (
    "import torch\n"
    "\n"
    "class MyNet(torch.nn.Module):\n"
    "    def __init__(self):\n"
    "        super().__init__()\n"
    "        self.fc = torch.nn.Linear(3, 2)\n"
)
FILES = ("small_state_dict.pt", "state_dict_256MiB.pt", "user_module.pt", "numpy.pt")

TORCH_UNSAFE = (
    "import json, sys, torch\n"
    "print(json.dumps(sorted(torch.serialization.get_unsafe_globals_in_checkpoint(sys.argv[1]))))\n"
)


class Tool(NamedTuple):
    name: str
    argv: Callable[[str], list[str]]
    #: what it reported, in a few words, from its stdout and exit code
    found: Callable[[str, int], str]
    missing: Optional[str] = None  # why the row has no numbers


class Row(NamedTuple):
    file: str
    size: int
    tool: str
    wall: Optional[float]
    cpu: Optional[float]
    rss_mib: Optional[float]
    found: str


def _inspect_found(out: str, code: int) -> str:
    r = json.loads(out)
    flagged = {key: len(r[key]) for key in ("dangerous", "unverified", "needs_opt_in") if r[key]}
    return f"exit {code}, {r['status']}: {len(r['required_globals'])} needed" + "".join(
        f", {n} {key}" for key, n in flagged.items()
    )


def _torch_found(out: str, code: int) -> str:
    if code:
        return f"exit {code}"
    names = json.loads(out.strip().splitlines()[-1])
    return f"{len(names)} unsafe globals" + (f": {', '.join(names)}" if 0 < len(names) <= 2 else "")


def _picklescan_found(out: str, code: int) -> str:
    counts = {}
    for line in out.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip() in ("Infected files", "Suspicious globals", "Dangerous globals"):
            counts[key.strip().split()[0].lower()] = value.strip()
    return f"exit {code}, " + ", ".join(f"{v} {k}" for k, v in counts.items())


def tools(py: str) -> list[Tool]:
    picklescan = shutil.which("picklescan", path=os.path.dirname(py)) or shutil.which("picklescan")
    return [
        Tool("python -c 'import torch' (floor)", lambda f: [py, "-c", "import torch"], lambda out, code: "-"),
        Tool(
            "torch_serial_testing inspect",
            lambda f: [py, "-m", "torch_serial_testing", "inspect", f, "--json"],
            _inspect_found,
        ),
        Tool("torch get_unsafe_globals_in_checkpoint", lambda f: [py, "-c", TORCH_UNSAFE, f], _torch_found),
        Tool(
            "picklescan",
            lambda f: [picklescan or "picklescan", "--path", f],
            _picklescan_found,
            None if picklescan else "picklescan is not installed (pip install picklescan): row skipped",
        ),
    ]


def run_once(argv: Sequence[str], cwd: str, env: dict[str, str]) -> tuple[float, float, float, str, int]:
    """(wall seconds, CPU seconds (user + system), peak RSS MiB, stdout, exit code) of one child process."""
    start = time.perf_counter()
    proc = subprocess.Popen(list(argv), cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    assert proc.stdout is not None
    out = proc.stdout.read()
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - start
    proc.returncode = os.waitstatus_to_exitcode(status)
    cpu = usage.ru_utime + usage.ru_stime
    return wall, cpu, usage.ru_maxrss / 1024, out.decode(errors="replace"), proc.returncode


def measure(rounds: int, env: dict[str, str], log: Callable[[str], None] = print) -> list[Row]:
    py = sys.executable
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="tst-bench-scan-") as cwd:
        with open(os.path.join(cwd, "usermodels.py"), "w") as fh:
            fh.write(USER_MODULE)
        child_env = dict(env, PYTHONPATH=os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH", "")) if p))
        subprocess.run([py, "-c", MAKE], cwd=cwd, env=child_env, check=True)
        all_tools = tools(py)
        samples: dict[tuple[str, str], list[tuple[float, float, float]]] = {}
        found: dict[tuple[str, str], str] = {}
        for i in range(rounds):  # interleaved: drift hits every tool alike
            log(f"[scanners] round {i + 1}/{rounds} ...")
            for f in FILES:
                for tool in all_tools:
                    if tool.missing:
                        continue
                    wall, cpu, rss, out, code = run_once(tool.argv(f), cwd, child_env)
                    samples.setdefault((f, tool.name), []).append((wall, cpu, rss))
                    found[(f, tool.name)] = tool.found(out, code)
        for f in FILES:
            size = os.path.getsize(os.path.join(cwd, f))
            for tool in all_tools:
                got = samples.get((f, tool.name))
                if not got:
                    rows.append(Row(f, size, tool.name, None, None, None, tool.missing or "not run"))
                    continue
                rows.append(
                    Row(
                        f,
                        size,
                        tool.name,
                        statistics.median(w for w, _, _ in got),
                        statistics.median(c for _, c, _ in got),
                        statistics.median(r for _, _, r in got),
                        found[(f, tool.name)],
                    )
                )
    return rows


def _size(n: int) -> str:
    return f"{n / 2**20:.0f} MiB" if n >= 2**20 else f"{n / 1024:.1f} KiB"


def table(rows: Sequence[Row], rounds: int) -> str:
    """The RST table (``tabulate``), or plain columns when tabulate is not installed."""
    head = ["File", "Tool", "Wall", "CPU", "Peak RSS", "Reported"]
    body = [
        [
            f"{r.file} ({_size(r.size)})",
            r.tool,
            f"{r.wall:.2f} s" if r.wall is not None else "n/a",
            f"{r.cpu:.2f} s" if r.cpu is not None else "n/a",
            f"{r.rss_mib:.0f} MiB" if r.rss_mib is not None else "n/a",
            r.found,
        ]
        for r in rows
    ]
    note = (
        f"Whole processes, medians of {rounds} interleaved rounds: wall time, CPU time (user + system) "
        "and peak RSS of each child (``os.wait4``); CPU time is disturbed much less by other jobs "
        "than wall time.  A torch-side tool's own cost is its figure over the ``import torch`` floor "
        "(picklescan does not import torch)."
    )
    try:
        from tabulate import tabulate
    except ImportError:
        return "\n".join("  ".join(row) for row in [head, *body]) + "\n\n" + note + " (tabulate not installed.)\n"
    return tabulate(body, head, tablefmt="rst") + "\n\n" + note + "\n"


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(here), env.get("PYTHONPATH", "")) if p)
    print(table(measure(args.rounds, env, lambda m: print(m, file=sys.stderr, flush=True)), args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
