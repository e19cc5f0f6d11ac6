"""The oracle: the corpus x formats x environment states x load variants, in fresh processes.

``python -m tools.differential`` runs the CI subset, ``--full`` the whole matrix; both print a
summary table (torch version, cases, agreements, disagreements by cause, torch-side exclusions).
Torch's own failures are excluded by rule: a checkpoint torch cannot build or save, or that
fails to load with ``weights_only=False`` in a clean process (no TORCH_FORCE_* set), never
reaches the comparison and is listed with torch's exception.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from typing import Any, Optional

from .cases import (
    CI_ENVS,
    CI_FORMATS,
    FORCE_NO_WO,
    FORCE_WO,
    FULL_ENVS,
    FULL_FORMATS,
    Excluded,
    Saved,
    env_label,
    generation_items,
)
from .worker import PASSES, work_items

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")


@dataclass
class Report:
    """Everything a run found."""

    torch_version: str = ""
    library: str = ""
    envs: int = 0
    checkpoints: int = 0
    cases: int = 0
    agreements: int = 0
    disagreements: collections.Counter = field(default_factory=collections.Counter)
    examples: dict[str, list[str]] = field(default_factory=dict)
    excluded: list[Excluded] = field(default_factory=list)

    @property
    def disagreement_total(self) -> int:
        return sum(self.disagreements.values())

    def add(self, cause: Optional[str], example: str) -> None:
        self.cases += 1
        if cause is None:
            self.agreements += 1
            return
        self.disagreements[cause] += 1
        shown = self.examples.setdefault(cause, [])
        if len(shown) < 4:
            shown.append(example)

    def table(self) -> str:
        lines = [
            f"torch {self.torch_version}; library {self.library}",
            f"environment states {self.envs}, checkpoints {self.checkpoints}",
            f"{'cases':<40}{self.cases:>10}",
            f"{'agreements':<40}{self.agreements:>10}",
            f"{'disagreements':<40}{self.disagreement_total:>10}",
        ]
        for cause, n in self.disagreements.most_common():
            lines.append(f"  {cause[:90]:<90}{n:>8}")
        by_stage = collections.Counter(e.stage for e in self.excluded)
        lines.append(
            f"{'torch-side exclusions':<40}{len(self.excluded):>10}  "
            + ", ".join(f"{stage} {n}" for stage, n in sorted(by_stage.items()))
        )
        return "\n".join(lines)

    def details(self) -> str:
        out = [self.table(), "", "Disagreements by cause (a few examples each):"]
        for cause, n in self.disagreements.most_common():
            out.append(f"\n[{n}] {cause}")
            out.extend(f"    {ex}" for ex in self.examples.get(cause, []))
        out.append("\nTorch-side exclusions (kind, format, stage: torch's exception):")
        for e in sorted(self.excluded, key=lambda e: (e.stage, e.kind, e.format)):
            out.append(f"    {e.kind} [{e.format}] {e.stage}: {e.error}")
        return "\n".join(out)


def _subprocess_env(state: dict[str, str], tmpdir: Optional[str] = None) -> dict[str, str]:
    """The environment of a child: *state*'s switches and, given *tmpdir*, that folder as its TMPDIR.

    A worker that dies on a case (torch crashing is part of what the corpus records) runs no exit
    handlers, so whatever torch made in the temporary directory at import -- torch 2.8 makes a
    folder when ``torch._dynamo`` is imported -- would stay; inside the run's folder it goes with it.
    """
    env = {k: v for k, v in os.environ.items() if k not in (FORCE_WO, FORCE_NO_WO)}
    env.update(state)
    if tmpdir is not None:
        env["TMPDIR"] = tmpdir
    # The caller's PYTHONPATH first (e.g. another tree of the library), then this repo for `tools`.
    env["PYTHONPATH"] = os.pathsep.join(p for p in (os.environ.get("PYTHONPATH"), REPO_ROOT) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def run_worker(
    tmpdir: str,
    tag: str,
    role: str,
    state: dict[str, str],
    ids: Any,
    timeout: float,
    n_items: Optional[int] = None,
) -> list[dict[str, Any]]:
    """Run one worker process (restarting after a crash); return its records, crashes included."""
    out = os.path.join(tmpdir, f"{tag}.jsonl")
    with open(out.replace(".jsonl", ".ids"), "w") as fh:
        json.dump(ids, fh)
    items = [(0, None)] * n_items if n_items is not None else work_items(ids, role == "probe")
    start = 0
    crashes: list[dict[str, Any]] = []
    while start < len(items):
        proc = subprocess.run(
            [sys.executable, WORKER, os.path.join(tmpdir, "manifest.json"), out, str(start), role],
            env=_subprocess_env(state, tmpdir),
            cwd=tmpdir,
            capture_output=True,
            text=True,
            timeout=timeout,
        )
        done, begun = _progress(out)
        if proc.returncode == 0:
            break
        if begun is None or begun in done:
            raise RuntimeError(f"worker {tag} failed before any case ({proc.returncode}):\n{proc.stderr[-2000:]}")
        tail = [line for line in proc.stderr.strip().splitlines() if line.strip()][-1:] or [""]
        crashes.append(
            {"i": begun, "id": items[begun][1], "crash": f"process died ({proc.returncode}) {tail[0][:120]}"}
        )
        start = begun + 1
    records = [r for r in _read(out) if "begin" not in r]
    return records + crashes


def _read(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path) as fh:
        return [json.loads(line) for line in fh if line.strip()]


def _progress(path: str) -> tuple[set[int], Optional[int]]:
    done: set[int] = set()
    begun: Optional[int] = None
    for r in _read(path):
        if "begin" in r:
            begun = r["begin"]
        else:
            done.add(r["i"])
    return done, begun


def run(
    full: bool,
    jobs: int = 2,
    kinds: Optional[list[str]] = None,
    timeout: float = 3600.0,
    envs: Optional[list[dict[str, str]]] = None,
    formats: Optional[tuple[str, ...]] = None,
) -> Report:
    """Generate, probe, compare; return the report."""
    import torch

    formats = formats or (FULL_FORMATS if full else CI_FORMATS)
    envs = envs if envs is not None else (FULL_ENVS if full else CI_ENVS)
    report = Report(torch_version=torch.__version__, envs=len(envs))
    tmpdir = tempfile.mkdtemp(prefix="tst-differential-")
    try:
        saved = _generate(tmpdir, formats, kinds, timeout, report)
        by_id = {s.id: s for s in saved}
        probe = run_worker(tmpdir, "probe", "probe", {}, [s.id for s in saved], timeout)
        loadable: list[int] = []
        for r in probe:
            s = by_id[r["id"]]
            error = r.get("crash") or (None if r["probe"]["ok"] else r["probe"]["error"])
            if error:
                report.excluded.append(Excluded(s.kind, s.format, "load", error))
            else:
                loadable.append(s.id)
        loadable.sort()
        report.checkpoints = len(loadable)
        report.library = _library_location()

        def one(index_state: tuple[int, dict[str, str]]) -> tuple[dict[str, str], list[dict[str, Any]]]:
            index, state = index_state
            return state, run_worker(tmpdir, f"env{index:02d}", "run", state, loadable, timeout)

        with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
            per_env = list(pool.map(one, list(enumerate(envs))))
        items = work_items(loadable, probe=False)
        torch_side = torch_side_failures(per_env, items)
        for cid, error in sorted(torch_side.items()):
            s = by_id[cid]
            report.excluded.append(Excluded(s.kind, s.format, "load", f"in a worker process: {error}"))
        report.checkpoints -= len(torch_side)
        for state, records in per_env:
            label = env_label(state)
            for r in records:
                if r["id"] in torch_side:
                    continue
                s = by_id[r["id"]]
                where = f"{s.kind} [{s.format}] env {label}"
                if "crash" in r:
                    for variant in PASSES[items[r["i"]][0]]:
                        report.add(f"torch crashed: {r['crash'][:60]}", f"{where} {variant}")
                    continue
                for v in r["r"]:
                    example = f"{where} {v['v']}"
                    if not v["ok"]:
                        example += f": predicted {_short(v['pred'])}; torch {_short(v['act'])}"
                    report.add(None if v["ok"] else v["cause"], example)
    finally:
        shutil.rmtree(tmpdir, ignore_errors=True)
    return report


def torch_side_failures(
    per_env: list[tuple[dict[str, str], list[dict[str, Any]]]], items: list[tuple[int, int]]
) -> dict[int, str]:
    """Checkpoints torch itself cannot read back, by id: torch's own failures show up in worker processes
    too (e.g. a legacy-format Generator whose __setstate__ fails depending on process state).  A
    checkpoint whose explicit weights_only=False load raised in any process of the run is excluded, by
    the same rule as the probe, and so is one whose process died in the pass that makes only that load,
    in an environment that sets no TORCH_FORCE_WEIGHTS_ONLY_LOAD (torch crashing on its own bytes in a
    full load, as a crash while saving or probing is excluded).  Any other crash stays a disagreement."""
    only_full_load = [p for p, variants in PASSES.items() if tuple(variants) == ("weights_only_false",)]
    torch_side: dict[int, str] = {}
    for state, records in per_env:
        for r in records:
            if "crash" in r:
                if items[r["i"]][0] in only_full_load and FORCE_WO not in state:
                    torch_side.setdefault(r["id"], f"weights_only=False: torch crashed: {r['crash'][:60]}")
                continue
            for v in r.get("r", ()):
                act, pred = v.get("act", {}), v.get("pred", {})
                if (
                    v["v"] == "weights_only_false"
                    and act.get("outcome") == "error"
                    and pred.get("weights_only") is False
                ):
                    torch_side.setdefault(r["id"], f"{act.get('type')}: {_first_line(act.get('message', ''))}")
    return torch_side


def _generate(
    tmpdir: str, formats: tuple[str, ...], kinds: Optional[list[str]], timeout: float, report: Report
) -> list[Saved]:
    """Save the corpus in a worker process; crashes while saving become save exclusions."""
    items = generation_items(formats, kinds)
    spec = {"formats": list(formats), "kinds": kinds}
    records = run_worker(tmpdir, "generate", "generate", {}, spec, timeout, n_items=len(items))
    saved: list[Saved] = []
    for r in sorted(records, key=lambda r: r["i"]):
        if "crash" in r:
            kind, fmt = items[r["i"]]
            report.excluded.append(Excluded(kind, fmt, "save", f"torch crashed: {r['crash']}"))
        elif "excluded" in r:
            report.excluded.append(Excluded(**r["excluded"]))
        else:
            saved.append(Saved(**r["saved"]))
    with open(os.path.join(tmpdir, "manifest.json"), "w") as fh:
        json.dump([asdict(s) for s in saved], fh)
    return saved


def _short(d: dict[str, Any]) -> str:
    keep = {
        k: d[k]
        for k in ("outcome", "type", "missing", "opcodes", "warns", "warned", "reason")
        if d.get(k) not in (None, [], "")
    }
    text = json.dumps(keep)
    message = d.get("message")
    if message:
        lines = [
            line
            for line in message.strip().splitlines()
            if line.strip() and not line.startswith(("Check the documentation", "Please file an issue"))
        ]
        text += f" {lines[-1][:160]!r}" if lines else ""
    return text


def _first_line(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return (lines[0] if lines else "")[:160]


def _library_location() -> str:
    env = _subprocess_env({})
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, torch_serial_testing as t; print(os.path.dirname(os.path.dirname(t.__file__)))",
        ],
        env=env,
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    )
    return proc.stdout.strip() or f"? ({proc.stderr.strip()[-200:]})"
