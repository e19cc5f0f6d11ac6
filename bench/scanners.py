"""``inspect`` next to the scanners people use, on the same files, as whole processes.

Per file (a 2 KiB and a 256 MiB state_dict, a user's own module, numpy scalars and arrays): wall
time and peak RSS (``os.wait4``'s ``ru_maxrss`` of that one child) of

* ``python -m torch_serial_testing inspect FILE --json``,
* ``torch.serialization.get_unsafe_globals_in_checkpoint(FILE)`` (torch's own, >= 2.5),
* ``picklescan --path FILE`` (optional: ``pip install picklescan``; the row says so when absent),
* ``python -c "import torch"``: the floor every torch-side tool pays,

and what each reported.  Medians of interleaved rounds; the table is made by ``tabulate``
(``tablefmt="rst"``; optional too: plain text without it).

``--corpus``: detection instead of cost.  The library's attack corpus (every checkpoint of
``test/helpers/hostile_checkpoints.build_all`` plus the gadgets in :data:`EXTRA_ATTACKS`) and a benign
corpus of real-world-shaped ``torch.save`` outputs (:data:`BENIGN`) are written into a temporary
folder, then judged by ``inspect ATTACKS BENIGN --jsonl`` (one call), picklescan
(``scanner.scan_file_path``), modelscan (``ModelScan().scan``) and fickling (``scan_zip_archive`` for
a zip, else ``scan_file``), each tool in one child process; a tool not installed is said.  Prints per
tool the attacks flagged, the benign files flagged (false alarms) and errors, then every attack a
tool missed; exits 1 if ``inspect`` misses an attack another scanner flags, or raises a false alarm.
Nothing is ever loaded: a sentinel file that any executed payload would write must not exist.
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


# -- detection on the library's own corpus (--corpus) --------------------------------------------

#: Gadgets beyond hostile_checkpoints' (name -> Python building the zip with its helpers H, sentinel
#: command SH): each runs a shell command or Python code when fully unpickled.
EXTRA_ATTACKS = {
    "nested_pickle_loads": "H.call1(H.glob('pickle', 'loads'), BINBYTES(INNER))",
    "timeit_timeit": "H.call1(H.glob('timeit', 'timeit'), H.ustr(PY))",
    "cprofile_run": "H.call1(H.glob('cProfile', 'run'), H.ustr(PY))",
    "pydoc_pipepager": "H.glob('pydoc', 'pipepager') + H.ustr('x') + H.ustr(SH) + H.TUPLE2 + H.REDUCE",
    "importlib_import_module": "H.glob('builtins', 'getattr') + H.call1(H.glob('importlib', 'import_module'), "
    "H.ustr('os')) + H.ustr('system') + H.TUPLE2 + H.REDUCE + H.ustr(SH) + H.TUPLE1 + H.REDUCE",
}

MAKE_CORPUS = """
import collections, io, os, pickle, shlex, sys
import numpy as np, torch
import usermodels
from test.helpers import hostile_checkpoints as H

sentinel = sys.argv[1]
os.makedirs("attacks"); os.makedirs("benign")
for name, data in H.build_all(sentinel).items():
    open(f"attacks/{name}.pt", "wb").write(data)
SH = f"echo extra >> {shlex.quote(sentinel)}"
PY = f"open({sentinel!r}, 'a').write('extra')"
INNER = pickle.dumps(H._Reduce(os.system, SH), protocol=2)
BINBYTES = lambda data: b'B' + len(data).to_bytes(4, 'little') + data  # noqa: E731
for name, body in EXTRA.items():
    open(f"attacks/{name}.pt", "wb").write(H.torch_zip(H.proto(2) + eval(body) + H.STOP))

lin = torch.nn.Linear(4, 3)
opt = torch.optim.Adam(lin.parameters())
lin(torch.ones(2, 4)).sum().backward(); opt.step()
sched = torch.optim.lr_scheduler.StepLR(opt, 10)
seq = torch.nn.Sequential(torch.nn.Conv2d(1, 2, 3), torch.nn.BatchNorm2d(2), torch.nn.ReLU(), torch.nn.Flatten())
benign = {
    "state_dict": lin.state_dict(),
    "module_linear": lin,
    "module_sequential": seq,
    "module_lstm": torch.nn.LSTM(4, 8, 2),
    "module_embedding_layernorm": torch.nn.ModuleDict({"emb": torch.nn.Embedding(10, 4), "ln": torch.nn.LayerNorm(4)}),
    "optimizer_state": opt.state_dict(),
    "scheduler_state": sched.state_dict(),
    "training_checkpoint": {"model": seq.state_dict(), "optimizer": opt.state_dict(), "epoch": 3, "loss": 0.25},
    "ordered_dict": collections.OrderedDict(a=torch.zeros(2), b=torch.ones(3)),
    "nested_containers": {"a": [torch.ones(1), (2, 3.5, "s", None, True)], "b": {"c": b"bytes"}},
    "dtypes": {t: torch.ones(2, dtype=getattr(torch, t)) for t in ("float16", "bfloat16", "int8", "bool")},
    "sparse_coo": torch.eye(3).to_sparse(),
    "parameter": torch.nn.Parameter(torch.ones(2)),
    "size_dtype_device": {"size": torch.Size([2, 3]), "dtype": torch.float32, "device": torch.device("cpu")},
    "quantized_tensor": torch.quantize_per_tensor(torch.ones(4), 0.1, 0, torch.qint8),
    "numpy_scalars": {"lr": np.float64(0.1), "step": np.int64(3)},
    "large_tensor_4MiB": {"w": torch.zeros(1024 * 1024)},
    "views_share_storage": (lambda t: {"t": t, "view": t[2:]})(torch.arange(6.0)),
    "legacy_format": ("legacy", lin.state_dict()),
    "user_module": usermodels.MyNet(),
    "amp_grad_scaler_state": {"scale": 65536.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 2000,
                              "_growth_tracker": 0},
    "batchnorm_state_dict": seq.state_dict(),
    "int_keys_and_tuple": {0: torch.ones(1), 1: (torch.zeros(1), "x")},
    "empty_dict": {},
    "python_scalars": [1, 2.5, "three", None, False],
}
for name, obj in benign.items():
    if isinstance(obj, tuple) and obj and obj[0] == "legacy":
        torch.save(obj[1], f"benign/{name}.pt", _use_new_zipfile_serialization=False)
    else:
        torch.save(obj, f"benign/{name}.pt")
"""

WORKERS = {
    "picklescan": """
import json, sys
from picklescan.scanner import scan_file_path
out = {}
for path in sys.argv[1:]:
    try:
        r = scan_file_path(path)
    except Exception as e:
        out[path] = ("error", type(e).__name__)
        continue
    bad = sorted({f"{g.module}.{g.name}" for g in r.globals if g.safety.name == "Dangerous"})
    if r.scan_err:
        out[path] = ("error", "scan error")
    else:
        out[path] = ("flagged", ", ".join(bad)) if r.infected_files else ("clean", "")
print(json.dumps(out))
""",
    "modelscan": """
import json, sys
from modelscan.modelscan import ModelScan
out = {}
for path in sys.argv[1:]:
    try:
        r = ModelScan().scan(path)
    except Exception as e:
        out[path] = ("error", type(e).__name__)
        continue
    issues = r["summary"]["total_issues"]
    errors = r.get("errors") or []
    scanned = r["summary"]["scanned"]["total_scanned"]
    out[path] = ("flagged", f"{issues} issues") if issues else ("error", "scan error") if errors else (
        ("clean", "") if scanned else ("error", "nothing scanned"))
print(json.dumps(out))
""",
    "fickling": """
import json, sys, zipfile
import fickling
out = {}
for path in sys.argv[1:]:
    try:
        results = fickling.scan_zip_archive(path) if zipfile.is_zipfile(path) else {path: fickling.scan_file(path)}
    except Exception as e:
        out[path] = ("error", type(e).__name__)
        continue
    unsafe = [r.severity.name for r in results.values() if not r.is_safe]
    out[path] = ("flagged", ", ".join(sorted(set(unsafe)))) if unsafe else ("clean", "")
print(json.dumps(out))
""",
}


def _installed(py: str, module: str) -> bool:
    return subprocess.run([py, "-c", f"import {module}"], capture_output=True).returncode == 0


def corpus(env: dict[str, str]) -> int:
    """Detection on the library's corpus (the module docstring's ``--corpus``); prints, returns the exit code."""
    py = sys.executable
    with tempfile.TemporaryDirectory(prefix="tst-bench-corpus-") as cwd:
        sentinel = os.path.join(cwd, "sentinel")
        with open(os.path.join(cwd, "usermodels.py"), "w") as fh:
            fh.write(USER_MODULE)
        make_env = dict(env, PYTHONPATH=os.pathsep.join([cwd, env["PYTHONPATH"]]))
        script = "EXTRA = " + repr(EXTRA_ATTACKS) + "\n" + MAKE_CORPUS
        subprocess.run([py, "-W", "ignore", "-c", script, sentinel], cwd=cwd, env=make_env, check=True)
        files = sorted(
            f"{kind}/{name}" for kind in ("attacks", "benign") for name in os.listdir(os.path.join(cwd, kind))
        )
        verdicts: dict[str, dict[str, tuple[str, str]]] = {}
        proc = subprocess.run(
            [py, "-m", "torch_serial_testing", "inspect", "attacks", "benign", "--jsonl"],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
        )
        inspect: dict[str, tuple[str, str]] = {}
        for line in proc.stdout.splitlines():
            r = json.loads(line)
            verdict = "flagged" if r["exit_code"] == 2 else "unverified" if r["status"] == "unverified" else "clean"
            inspect[r["checkpoint"]] = (verdict, r["status"])
        verdicts["torch_serial_testing inspect"] = inspect
        versions = {"torch_serial_testing inspect": ""}
        for tool, worker in WORKERS.items():
            if not _installed(py, tool):
                versions[tool] = "not installed: pip install " + tool
                continue
            out = subprocess.run([py, "-c", worker, *files], cwd=cwd, env=env, capture_output=True, text=True)
            verdicts[tool] = json.loads(out.stdout.strip().splitlines()[-1]) if out.returncode == 0 else {}
            versions[tool] = subprocess.run(
                [py, "-c", f"import importlib.metadata as m; print(m.version({tool!r}))"],
                capture_output=True,
                text=True,
            ).stdout.strip()
        executed = os.path.exists(sentinel)
    attacks = [f for f in files if f.startswith("attacks/")]
    benign = [f for f in files if f.startswith("benign/")]
    print(
        f"corpus: {len(attacks)} attacks, {len(benign)} benign files; nothing loaded "
        f"(sentinel {'WRITTEN: a payload ran' if executed else 'absent'})\n"
    )
    head = ["Tool", "Attacks flagged", "Benign flagged (false alarms)", "Errors", "Not judged (unverified)"]
    body = []
    for tool, v in verdicts.items():
        got = {f: v.get(f, ("error", "no report"))[0] for f in files}
        body.append(
            [
                f"{tool} {versions.get(tool, '')}".strip(),
                f"{sum(got[f] == 'flagged' for f in attacks)} / {len(attacks)}",
                f"{sum(got[f] == 'flagged' for f in benign)} / {len(benign)}",
                str(sum(got[f] == "error" for f in files)),
                str(sum(got[f] == "unverified" for f in files)),
            ]
        )
    for tool, why in versions.items():
        if tool not in verdicts:
            body.append([tool, why, "", "", ""])
    try:
        from tabulate import tabulate

        print(tabulate(body, head, tablefmt="rst"))
    except ImportError:
        print("\n".join("  ".join(row) for row in [head, *body]))
    mine = verdicts["torch_serial_testing inspect"]
    print()
    for tool, v in verdicts.items():
        missed = [f for f in attacks if v.get(f, ("error", ""))[0] != "flagged"]
        alarms = [f for f in benign if v.get(f, ("error", ""))[0] == "flagged"]
        print(
            f"{tool}: missed {', '.join(m.split('/')[1] for m in missed) or 'none'}; "
            f"false alarms {', '.join(a.split('/')[1] for a in alarms) or 'none'}"
        )
    worse = [
        f
        for f in attacks
        if mine.get(f, ("",))[0] != "flagged"
        and any(v.get(f, ("",))[0] == "flagged" for t, v in verdicts.items() if t != "torch_serial_testing inspect")
    ]
    alarms = [f for f in benign if mine.get(f, ("",))[0] == "flagged"]
    if worse or alarms or executed:
        print(f"FAIL: inspect missed {worse} that another scanner flags; false alarms {alarms}")
        return 1
    return 0


def main(argv: Optional[Sequence[str]] = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--corpus", action="store_true", help="detection on the library's corpus, not cost")
    args = parser.parse_args(argv)
    here = os.path.dirname(os.path.abspath(__file__))
    env: dict[str, Any] = {k: v for k, v in os.environ.items() if not k.startswith("TORCH_FORCE_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.path.dirname(here), env.get("PYTHONPATH", "")) if p)
    if args.corpus:
        return corpus(env)
    print(table(measure(args.rounds, env, lambda m: print(m, file=sys.stderr, flush=True)), args.rounds))
    return 0


if __name__ == "__main__":
    sys.exit(main())
