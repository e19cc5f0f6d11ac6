"""Run the fixtures in child processes, observed by the audit, and read the records back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from typing import Any, Optional

import torch

from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY
from test.helpers.subprocess_env import child_env

FIXTURES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "fixtures")
PLUGIN = "torch_serial_testing.tools.audit.pytest_plugin"


def fixture_line(name: str, text: str) -> int:
    """The line of *name*'s first line containing *text* (a test reads source; the package never does)."""
    with open(os.path.join(FIXTURES, name), encoding="utf-8") as f:
        return next(n for n, line in enumerate(f, 1) if text in line)


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, records: list[dict[str, Any]], markdown: Optional[str]):
        self.code = proc.returncode
        self.stdout = proc.stdout
        self.stderr = proc.stderr
        self.records = records
        self.markdown = markdown

    def loads(self) -> list[dict[str, Any]]:
        return [r for r in self.records if r["event"] == "load"]

    def outcomes(self) -> dict[str, str]:
        return {r["test"]: r["outcome"] for r in self.records if r["event"] == "test"}


TEST_ROOT = os.path.dirname(os.path.dirname(FIXTURES))


def run(
    argv: list[str], env: Optional[dict[str, str]] = None, timeout: float = 600, cwd: str = FIXTURES
) -> subprocess.CompletedProcess:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=child_env(env),
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def audit(command: list[str], *options: str, env: Optional[dict[str, str]] = None, cwd: str = FIXTURES) -> Run:
    """``python -m torch_serial_testing audit --report R [options] -- command`` (in the fixtures folder)."""
    with tempfile.TemporaryDirectory() as tmp:
        report, md = os.path.join(tmp, "audit.jsonl"), os.path.join(tmp, "table.md")
        argv = [sys.executable, "-m", "torch_serial_testing", "audit", "--report", report, "--markdown", md]
        proc = run([*argv, *options, "--", *command], env, cwd=cwd)
        return Run(proc, _read(report), _text(md))


def pytest_audit(*args: str, env: Optional[dict[str, str]] = None) -> Run:
    """``pytest -p <plugin> --serial-audit=R [args]`` in the fixtures folder."""
    with tempfile.TemporaryDirectory() as tmp:
        report, md = os.path.join(tmp, "audit.jsonl"), os.path.join(tmp, "table.md")
        argv = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q"]
        argv += [f"--serial-audit={report}", "--serial-audit-markdown", md, *args]
        proc = run(argv, env)
        return Run(proc, _read(report), _text(md))


def _read(path: str) -> list[dict[str, Any]]:
    if not os.path.exists(path):
        return []
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


def _text(path: str) -> Optional[str]:
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as f:
        return f.read()


def unittest_cmd(*modules: str) -> list[str]:
    return [sys.executable, "-W", "ignore", "-m", "unittest", *modules]


#: Why the audits of the fixtures' bare loads cannot show anything on this torch, or None.
BEFORE_THE_DEFAULT = (
    None
    if DEFAULT_WEIGHTS_ONLY
    else f"a bare torch.load is a full load on torch {torch.__version__} (weights-only by default since 2.6): "
    "the fixtures' bare loads need nothing, so there is nothing for the audit to find"
)


def observed_here(test: Any) -> str:
    """A temporary report path for an observer in this process; torch's load/save and the observer's state
    restored after *test*."""
    from torch_serial_testing.tools.audit import observe

    tmp = tempfile.TemporaryDirectory()
    test.addCleanup(tmp.cleanup)
    cls, before = type(torch), (torch.__dict__["load"], torch.__dict__["save"])

    def restore() -> None:
        torch.__class__ = cls
        torch.load, torch.save = before
        observe._State.report = None
        observe._State.saved.clear()

    test.addCleanup(restore)
    return os.path.join(tmp.name, "r.jsonl")
