"""``python -m tools.differential [--full] [--jobs N] [--kinds a,b] [--report FILE] [--marks]``.

Runs the differential oracle (the CI subset by default, ``--full`` for the whole matrix),
prints the summary table, and exits 1 when predict() disagrees with torch anywhere.
``--marks`` runs the crafted class instead: every popping opcode right after a MARK
(:mod:`tools.differential.mark_cases`), weights-only, in this process.
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
    parser.add_argument("--marks", action="store_true", help="the crafted MARK cases only (weights-only loads)")
    args = parser.parse_args(argv)
    if args.marks:
        from .mark_cases import cases, compare_all

        disagreements = compare_all()
        print(f"{len(list(cases()))} MARK cases, {len(disagreements)} disagreements")
        print("\n".join(disagreements))
        return 1 if disagreements else 0
    report = run(args.full, jobs=args.jobs, kinds=[k for k in args.kinds.split(",") if k] or None)
    print(report.table())
    if args.report:
        with open(args.report, "w") as fh:
            fh.write(report.details() + "\n")
    return 1 if report.disagreement_total else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
