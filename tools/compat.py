#!/usr/bin/env python3
"""Measure the compatibility matrix: the full test suite once per torch version.

Why a script: torch's behaviour that the library predicts (the weights_only default, which
``TORCH_FORCE_*`` switches are read and how, the allowlist, the ``safe_globals`` context) changes
between releases, so "supported" is only a claim until the suite has run on each release.

Each version gets a fresh venv (``--python``), ``torch==VERSION``, then the checkout given by
``--source`` with its ``test`` extra, then ``python -m pytest -n 2 test`` in that checkout -- the
Quick start's commands.  The venv is deleted afterwards (torch's CUDA builds are several GB), so
only one exists at a time.  One table row per version is printed as soon as it is known, and the
whole table at the end (``--csv FILE`` also writes it as the CSV the documentation's
compatibility page shows with ``csv-table``)::

    python tools/compat.py 2.4.1 2.13.0                # from the checkout this script is in
    python tools/compat.py --source /work/main --all   # latest patch of every minor 2.4 .. 2.15
    python tools/compat.py --from-logs LOGDIR --csv docs/_data/compat.csv  # the table, from earlier runs

Exit status: 0 when every version passed (skips allowed), 1 otherwise.
"""

from __future__ import annotations

import argparse
import collections
import csv
import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from typing import NamedTuple

# The latest patch of every torch minor the library supports (setup.cfg: torch>=2.4).
ALL_VERSIONS = (
    "2.4.1",
    "2.5.1",
    "2.6.0",
    "2.7.1",
    "2.8.0",
    "2.9.1",
    "2.10.0",
    "2.11.0",
    "2.12.1",
    "2.13.0",
    "2.14.1",
    "2.15.0",
)


class Row(NamedTuple):
    torch: str  # the version torch reports inside the venv (shows +cpu, +cu121 ...)
    python: str
    passed: int
    skipped: int
    failed: int  # failures + errors
    notes: str  # notable skips (reason x count) or what went wrong
    seconds: float

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


def _run(cmd: list[str], log, **kw) -> int:
    log.write(f"$ {' '.join(cmd)}\n")
    log.flush()
    return subprocess.run(cmd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, **kw).returncode


def _summarise_junit(path: str) -> tuple[int, int, int, list[str]]:
    """passed, skipped, failed(+errors) and the failing test ids, from pytest's JUnit XML."""
    root = ET.parse(path).getroot()
    passed = skipped = failed = 0
    failing: list[str] = []
    skips: collections.Counter[str] = collections.Counter()
    for case in root.iter("testcase"):
        name = f"{case.get('classname')}.{case.get('name')}"
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
            failing.append(name)
        elif "skipped" in kinds:
            skipped += 1
            skip = case.find("skipped")
            skips[_skip_reason(skip.get("message", "") if skip is not None else "")] += 1
        else:
            passed += 1
    notes = [f"{reason} (x{n})" for reason, n in skips.most_common()]
    return passed, skipped, failed, failing + notes


def _skip_reason(message: str) -> str:
    """A skip message without the run-specific parts, so equal reasons group together."""
    message = re.sub(r"^(?:unittest\.case\.)?SkipTest:\s*", "", message).strip()
    message = re.sub(r"torch \S+ lacks", "torch lacks", message)
    return message[:110] + ("..." if len(message) > 110 else "")


def run_version(version: str, source: str, python: str, workdir: str, log_dir: str, pytest_args: list[str]) -> Row:
    started = time.monotonic()
    venv = os.path.join(workdir, f"torch-{version}")
    log_path = os.path.join(log_dir, f"torch-{version}.log")
    junit = os.path.join(log_dir, f"torch-{version}.junit.xml")
    env = dict(os.environ)
    # A machine may cap torch through a pip constraints file (this one does, at the releases it
    # has on disk); the matrix asks for exact versions, so no other constraint applies.
    env["PIP_CONSTRAINT"] = os.devnull
    env["PIP_NO_CACHE_DIR"] = "1"  # several GB per version: do not keep a copy in pip's cache
    env.pop("PYTHONPATH", None)  # the venv must see only what it installed and the checkout
    for name in [k for k in env if k.startswith("TORCH_FORCE_")]:
        del env[name]  # the suite sets these itself, per test
    with open(log_path, "w") as log:
        try:
            if _run([python, "-m", "venv", venv], log) != 0:
                return Row(version, "?", 0, 0, 0, "venv creation failed", time.monotonic() - started)
            vpy = os.path.join(venv, "bin", "python")
            if _run([vpy, "-m", "pip", "install", "--quiet", f"torch=={version}"], log, env=env) != 0:
                return Row(
                    version,
                    _python_version(vpy),
                    0,
                    0,
                    0,
                    "pip install torch failed (see log)",
                    time.monotonic() - started,
                )
            if _run([vpy, "-m", "pip", "install", "--quiet", "-e", f"{source}[test]"], log, env=env) != 0:
                return Row(
                    version,
                    _python_version(vpy),
                    0,
                    0,
                    0,
                    "pip install of the checkout failed",
                    time.monotonic() - started,
                )
            reported = (
                subprocess.run(
                    [vpy, "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True, env=env
                ).stdout.strip()
                or version
            )
            code = _run(
                [
                    vpy,
                    "-m",
                    "pytest",
                    "-p",
                    "no:cacheprovider",
                    "-q",
                    "-rs",
                    f"--junitxml={junit}",
                    *pytest_args,
                    "test",
                ],
                log,
                env=env,
                cwd=source,
            )
            if not os.path.exists(junit):
                return Row(
                    reported,
                    _python_version(vpy),
                    0,
                    0,
                    0,
                    f"pytest exited {code} without results",
                    time.monotonic() - started,
                )
            passed, skipped, failed, notes = _summarise_junit(junit)
            if code != 0 and failed == 0:
                failed, notes = 1, [f"pytest exited {code}", *notes]
            return Row(
                reported, _python_version(vpy), passed, skipped, failed, "; ".join(notes), time.monotonic() - started
            )
        finally:
            shutil.rmtree(venv, ignore_errors=True)


def _python_version(python: str) -> str:
    return subprocess.run(
        [python, "-c", "import platform; print(platform.python_version())"], capture_output=True, text=True
    ).stdout.strip()


def format_row(row: Row) -> str:
    return (
        f"{row.torch:<16} {row.python:<8} {row.passed:>6} {row.skipped:>7} {row.failed:>6} "
        f"{row.seconds:>6.0f}s  {row.notes or '-'}"
    )


HEADER = f"{'torch':<16} {'python':<8} {'passed':>6} {'skipped':>7} {'failed':>6} {'time':>7}  notable skips / failures"


CSV_HEADER = ("torch", "Python", "passed", "skipped", "failed", "notes")


def csv_table(rows: list[Row]) -> str:
    """The matrix as CSV, the data of the compatibility page's ``csv-table`` (docs/_data/compat.csv)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows([r.torch, r.python, r.passed, r.skipped, r.failed, r.notes or "-"] for r in rows)
    return out.getvalue()


def write_csv(path: str, rows: list[Row]) -> None:
    with open(path, "w", encoding="utf-8", newline="") as fh:
        fh.write(csv_table(rows))


def main(argv: list[str] | None = None) -> int:
    here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("versions", nargs="*", help="torch versions (exact, e.g. 2.8.0)")
    parser.add_argument(
        "--all", action="store_true", help="every minor 2.4 .. 2.15, latest patch: " + " ".join(ALL_VERSIONS)
    )
    parser.add_argument("--source", default=here, help="the checkout to test (default: this script's)")
    parser.add_argument(
        "--python",
        default=shutil.which("python3") or sys.executable,
        help="the interpreter each venv is made from (default: python3 on PATH)",
    )
    parser.add_argument(
        "--workdir", default=None, help="where the (one) venv lives while it runs (default: a temp dir)"
    )
    parser.add_argument(
        "--log-dir", default=None, help="pip/pytest logs and JUnit XML per version (default: a temp dir)"
    )
    parser.add_argument("--csv", default=None, help="also write the table as CSV to this file (docs/_data/compat.csv)")
    parser.add_argument("--pytest-args", default="-n 2", help="extra pytest arguments (default: %(default)s)")
    parser.add_argument(
        "--from-logs",
        metavar="DIR",
        action="append",
        default=[],
        help="run nothing: print the table from the rows.jsonl of earlier runs' --log-dir (repeatable)",
    )
    args = parser.parse_args(argv)
    if args.from_logs:
        rows = []
        for folder in args.from_logs:
            with open(os.path.join(folder, "rows.jsonl"), encoding="utf-8") as fh:
                rows += [Row(**json.loads(line)) for line in fh if line.strip()]
        print(csv_table(rows), end="")
        if args.csv:
            write_csv(args.csv, rows)
        return 0 if all(r.ok for r in rows) else 1
    versions = list(ALL_VERSIONS) if args.all else args.versions
    if not versions:
        parser.error("name torch versions (e.g. 2.8.0 2.13.0) or pass --all")
    source = os.path.abspath(args.source)
    if not os.path.isfile(os.path.join(source, "setup.cfg")) or not os.path.isdir(os.path.join(source, "test")):
        parser.error(
            f"--source {source} is not a torch_serial_testing checkout (no setup.cfg and test/): "
            "pass the repository's root folder"
        )
    workdir = args.workdir or tempfile.mkdtemp(prefix="tst-compat-")
    log_dir = args.log_dir or tempfile.mkdtemp(prefix="tst-compat-logs-")
    os.makedirs(workdir, exist_ok=True)
    os.makedirs(log_dir, exist_ok=True)
    print(f"source {source}; logs in {log_dir}", flush=True)
    print(HEADER, flush=True)
    rows = []
    for version in versions:
        row = run_version(version, source, args.python, workdir, log_dir, args.pytest_args.split())
        rows.append(row)
        print(format_row(row), flush=True)
        with open(os.path.join(log_dir, "rows.jsonl"), "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row._asdict()) + "\n")
    print("\n" + csv_table(rows), end="", flush=True)
    if args.csv:
        write_csv(args.csv, rows)
    return 0 if all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
