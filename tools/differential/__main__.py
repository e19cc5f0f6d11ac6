"""``python -m tools.differential [--full] [--jobs N] [--kinds a,b] [--report FILE]``.

Runs the differential oracle (the CI subset by default, ``--full`` for the whole matrix),
prints the summary table, and exits 1 when predict() disagrees with torch anywhere.
"""

from __future__ import annotations

import argparse
import sys

from .oracle import run


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m tools.differential", description=__doc__)
    parser.add_argument("--full", action="store_true", help="every format, protocol and environment state")
    parser.add_argument("--jobs", type=int, default=2, help="environment states run in parallel (default 2)")
    parser.add_argument("--kinds", default="", help="comma-separated corpus kinds (default: all)")
    parser.add_argument("--report", default="", help="also write the table and every cause with examples here")
    args = parser.parse_args(argv)
    report = run(args.full, jobs=args.jobs, kinds=[k for k in args.kinds.split(",") if k] or None)
    print(report.table())
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(report.details() + "\n")
    return 1 if report.disagreement_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
