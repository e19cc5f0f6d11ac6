"""How benchmark results are shown: ratios, targets, the RST results (a csv-table), machine notes.

Kept apart from :mod:`timing` so that what is measured and how it is judged change separately.
"""

from __future__ import annotations

import csv
import datetime
import io
import os
import platform
from typing import Optional, Sequence

import torch
from torch.utils.benchmark import Compare

from timing import Pair

# Issues 16 and 37's targets: library over plain torch, per measurement label.  Whole processes are judged
# by their CPU time (user + system), which other jobs on the machine disturb far less than wall time;
# in-process round trips by their time (one thread: wall is CPU).  Both by the median of each round's own
# ratio: the two sides of a round run back to back, so drift in the machine's speed cancels within it.
TARGETS = {
    "import (whole process)": 1.03,
    "round trip, small sparse quantized Linear": 1.10,
    "round trip, 256 MiB float": 1.10,
    "test file (whole process)": 1.05,
    "test file vs its plain-torch twin (whole process)": 1.03,
    "three-test file vs its plain-torch twin (whole process)": 1.05,
}


def ratio(pair: Pair) -> float:
    return pair.library.median / pair.plain.median


def judged(pair: Pair) -> float:
    """The ratio a target is judged by: CPU for whole processes, time in process (per round when known)."""
    if pair.cpu_ratio is not None:
        return pair.cpu_ratio
    return pair.round_ratio if pair.round_ratio is not None else ratio(pair)


def verdict(pair: Pair) -> str:
    target = TARGETS.get(pair.library.task_spec.label)
    if target is None:
        return "info"
    basis = "CPU" if pair.cpu_ratio is not None else "time per round" if pair.round_ratio is not None else "time"
    return f"<= {target:.2f} ({basis}; {'met' if judged(pair) <= target else 'NOT met'})"


def fmt_time(seconds: float) -> str:
    if seconds >= 1:
        return f"{seconds:.2f} s"
    if seconds >= 1e-3:
        return f"{seconds * 1e3:.2f} ms"
    return f"{seconds * 1e6:.0f} us"


def fmt_dist(m) -> str:  # noqa: ANN001 - a torch.utils.benchmark Measurement
    return f"{fmt_time(m.median)} (IQR {fmt_time(m.iqr)})"


def print_compare(pairs: Sequence[Pair]) -> None:
    """torch.utils.benchmark's own side-by-side table (one block per label)."""
    compare = Compare([m for p in pairs for m in (p.library, p.plain)])
    compare.trim_significant_figures()
    compare.print()


def text_summary(pairs: Sequence[Pair]) -> str:
    lines = []
    for p in pairs:
        cpu = f", CPU ratio {p.cpu_ratio:.3f}" if p.cpu_ratio is not None else ""
        cpu += f", per-round ratio {p.round_ratio:.3f}" if p.round_ratio is not None else ""
        lines.append(
            f"{p.library.task_spec.label} / {p.library.task_spec.sub_label}: "
            f"ratio {ratio(p):.3f}{cpu}  target {verdict(p)}"
        )
    return "\n".join(lines)


def instructions_note(counts: dict[str, int]) -> str:
    """The callgrind counts of the flagship, its twin and the empty file, and the library's share."""
    flagship, twin, empty = counts["flagship"], counts["twin"], counts["empty"]
    over_empty = flagship - empty
    share = flagship - twin
    return (
        "Instructions (``valgrind --tool=callgrind``; importing the test module and running its tests, after "
        "torch, ``common_utils`` and ``torch._dynamo``): flagship "
        f"{flagship / 1e6:.0f}M, its plain-torch twin {twin / 1e6:.0f}M, the empty file {empty / 1e6:.0f}M.  "
        f"The library's share is {share / 1e6:.0f}M ({share / flagship:.0%} of the flagship's, "
        f"{share / over_empty:.0%} of its cost over the empty file); the twin's own torch work is "
        f"{(twin - empty) / 1e6:.0f}M."
    )


def loadavg() -> Optional[float]:
    try:
        return os.getloadavg()[0]
    except (OSError, AttributeError):
        return None


def machine_line() -> str:
    return (
        f"{platform.platform()}, {os.cpu_count()} CPUs, Python {platform.python_version()}; torch {torch.__version__}"
    )


def csv_table(rows: Sequence[Sequence[str]]) -> list[str]:
    """*rows* (the first is the header) as a docutils ``csv-table`` directive, one line per item."""
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return [".. csv-table::", "   :header-rows: 1", ""] + ["   " + line for line in out.getvalue().splitlines()]


def rst(
    pairs: Sequence[Pair],
    *,
    command: str,
    load_start: Optional[float],
    load_end: Optional[float],
    when: Optional[datetime.datetime] = None,
    notes: Sequence[str] = (),
) -> str:
    """The RESULTS file: an RST fragment the documentation's benchmarks page includes."""
    when = when or datetime.datetime.now(datetime.timezone.utc)
    rows = [["Measurement", "Library median (IQR)", "Plain torch median (IQR)", "Ratio", "Round ratio", "Target"]]
    for p in pairs:
        rows.append(
            [
                f"{p.library.task_spec.label}: {p.library.task_spec.sub_label}",
                fmt_dist(p.library),
                fmt_dist(p.plain),
                f"{ratio(p):.3f}",
                f"{judged(p):.3f}" if p.cpu_ratio is not None or p.round_ratio is not None else "n/a",
                verdict(p),
            ]
        )
    table = csv_table(rows)
    load = (
        ", ".join(
            f"{name} {value:.2f}" for name, value in (("start", load_start), ("end", load_end)) if value is not None
        )
        or "unknown"
    )
    head = [
        f"Machine: {machine_line()}; {when:%Y-%m-%d %H:%M} UTC.",
        f"Command: ``{command}``.  Load average (1 min): {load}, on {os.cpu_count()} CPUs.",
        "Medians; library and plain torch are interleaved, so drift hits both alike, but a ratio is",
        "trustworthy only when the load stayed below the CPU count.  Ratio: of the medians over all",
        "rounds.  Round ratio: the median of each round's own ratio, so that drift in the machine's",
        "speed cancels within a round -- of CPU time (user + system) for whole processes, which other",
        "jobs disturb much less, of time for round trips; the targets are judged by it.",
        "",
    ]
    return "\n".join(head + table + [""] + list(notes)).rstrip() + "\n"
