"""The compatibility matrix as CSV: one row per JUnit XML file that a ``nox -s compat`` session wrote.

The CSV is the data of the documentation's compatibility page (``csv-table``)::

    python -m tools.compat_table                                   # every .nox/_results/*.xml
    python -m tools.compat_table --csv docs/_data/compat.csv A.xml B.xml   # these, in this order

Each compat session first runs ``python -m tools.compat_table --stamp CODE XML`` in its venv: that
records the torch and Python versions the suite ran on and pytest's exit status as properties of
the XML's test suite (writing an empty suite if pytest wrote none), and prints the row.

Exit status: 0 when every row passed (skips allowed), 1 otherwise; always 0 with ``--stamp``.
"""

from __future__ import annotations

import argparse
import collections
import csv
import glob
import io
import os
import re
import sys
import xml.etree.ElementTree as ET
from typing import NamedTuple, Optional

RESULTS = os.path.join(".nox", "_results")
CSV_HEADER = ("torch", "Python", "passed", "skipped", "failed", "notes")
# properties of the XML's <testsuite>, written by stamp()
TORCH, PYTHON, EXIT = "compat.torch", "compat.python", "compat.pytest_exit"


class Row(NamedTuple):
    torch: str  # the version torch reports in the venv (shows +cpu, +cu121 ...)
    python: str
    passed: int
    skipped: int
    failed: int  # failures + errors, or 1 when pytest exited non-zero without one
    notes: str  # failing tests, then notable skips (reason (xN)), or what went wrong

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0


def _suite(root: ET.Element) -> ET.Element:
    """The (first) <testsuite>: pytest writes it inside <testsuites>."""
    suite = root if root.tag == "testsuite" else root.find("testsuite")
    if suite is None:
        raise ValueError("no <testsuite> in the JUnit XML")
    return suite


def stamp(path: str, exit_code: int, torch_version: str, python_version: str) -> None:
    """Record what the suite ran on, and pytest's exit status, in the JUnit XML at *path*."""
    tree = ET.parse(path) if os.path.exists(path) else ET.ElementTree(ET.Element("testsuites"))
    root = tree.getroot()
    if root.find("testsuite") is None and root.tag != "testsuite":
        ET.SubElement(root, "testsuite", name="pytest", tests="0")
    suite = _suite(root)
    properties = suite.find("properties")
    if properties is None:
        properties = ET.Element("properties")
        suite.insert(0, properties)  # the JUnit schema puts <properties> first
    for name, value in ((TORCH, torch_version), (PYTHON, python_version), (EXIT, str(exit_code))):
        for old in properties.findall(f"property[@name='{name}']"):
            properties.remove(old)
        ET.SubElement(properties, "property", name=name, value=value)
    tree.write(path, encoding="utf-8", xml_declaration=True)


def skip_reason(message: str) -> str:
    """A skip message without the run-specific parts, so equal reasons group together."""
    message = re.sub(r"^(?:unittest\.case\.)?SkipTest:\s*", "", message).strip()
    message = re.sub(r"torch \S+ lacks", "torch lacks", message)
    return message[:110] + ("..." if len(message) > 110 else "")


def summarise(path: str) -> Row:
    """The table row of one JUnit XML file."""
    suite = _suite(ET.parse(path).getroot())
    props = {
        p.get("name"): p.get("value", "") for p in suite.iter("property") if p.get("name") in (TORCH, PYTHON, EXIT)
    }
    passed = skipped = failed = 0
    failing: list[str] = []
    skips: collections.Counter[str] = collections.Counter()
    for case in suite.iter("testcase"):
        kinds = {child.tag for child in case}
        if kinds & {"failure", "error"}:
            failed += 1
            failing.append(f"{case.get('classname')}.{case.get('name')}")
        elif "skipped" in kinds:
            skipped += 1
            skip = case.find("skipped")
            skips[skip_reason(skip.get("message", "") if skip is not None else "")] += 1
        else:
            passed += 1
    notes = failing + [f"{reason} (x{n})" for reason, n in skips.most_common()]
    code = props.get(EXIT, "0")
    if code != "0" and failed == 0:  # e.g. files left in the temporary directory fail the run
        failed = 1
        notes.insert(0, f"pytest exited {code}" + ("" if passed or skipped else " without results"))
    return Row(props.get(TORCH, "?"), props.get(PYTHON, "?"), passed, skipped, failed, "; ".join(notes))


def csv_table(rows: list[Row]) -> str:
    """The matrix as CSV, the data of the compatibility page's ``csv-table`` (docs/_data/compat.csv)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(CSV_HEADER)
    writer.writerows([r.torch, r.python, r.passed, r.skipped, r.failed, r.notes or "-"] for r in rows)
    return out.getvalue()


def _version_key(row: Row) -> tuple[tuple[int, ...], tuple[int, ...]]:
    def numbers(version: str) -> tuple[int, ...]:
        return tuple(int(n) for n in re.findall(r"\d+", version.split("+")[0]))

    return numbers(row.python), numbers(row.torch)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("xml", nargs="*", help=f"JUnit XML files (default: {RESULTS}/*.xml, by Python and torch)")
    parser.add_argument("--csv", default=None, help="also write the table to this file (docs/_data/compat.csv)")
    parser.add_argument(
        "--stamp", type=int, metavar="EXIT_CODE", help="first record this venv's torch and Python, and pytest's exit"
    )
    args = parser.parse_args(argv)
    if args.stamp is not None:
        import platform

        import torch

        for path in args.xml:
            stamp(path, args.stamp, torch.__version__, platform.python_version())
    rows = [summarise(path) for path in args.xml]
    if not args.xml:
        rows = sorted((summarise(path) for path in glob.glob(os.path.join(RESULTS, "*.xml"))), key=_version_key)
    if not rows:
        parser.error(f"no results: name JUnit XML files, or run nox -s compat first (it writes {RESULTS}/)")
    table = csv_table(rows)
    print(table, end="")
    if args.csv:
        with open(args.csv, "w", encoding="utf-8", newline="") as fh:
            fh.write(table)
    return 0 if args.stamp is not None or all(r.ok for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
