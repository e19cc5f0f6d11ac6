"""What a test's round trips did, kept on the test for whoever reports it.

Every checked load leaves a :class:`RoundTripRecord` on its test (and, with ``REPORT_ENV`` set, a JSON
line naming the test and the subTest it ran in).  The runners read the records: unittest's verbose
line shows each distinct outcome as it happens, the pytest plugin
(:mod:`torch_serial_testing.testing.pytest_plugin`) turns them into a visible status and JUnit
properties.  An expected rejection is a *pass*: torch did what it should, and the library checked it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from typing import Any, Mapping, Optional, Sequence

__all__ = ["REPORT_ENV", "RoundTripRecord", "current_subtest", "load_kind", "note", "records", "rejection_status"]

#: Set to a file path to get one JSON line per round trip (test id, subTest, mode, outcome).
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"

#: The attribute of a test instance holding its records (read by the pytest plugin without importing us).
RECORDS_ATTRIBUTE = "_tst_records"

#: The message of a subTest opened without one (unittest's own sentinel is private).
SUBTEST_NO_MESSAGE: Any = object()


@dataclass(frozen=True)
class RoundTripRecord:
    """One checked load: how it was made, what torch did, and in which subTest."""

    kind: str  # "torch.load", "torch.load(path, mmap=True)", or "pickle.loads" (a tensor's pickle calls torch.load)
    mode: Optional[str]  # the load mode (None for a pickle round trip: it has none)
    loaded: bool
    weights_only: Optional[bool]
    summary: str
    subtest: Optional[str]  # the subTest's description, e.g. "(engine='fbgemm')"


#: The attribute of a test instance holding the subTests the library opened, for a result that has no
#: subTest support (pytest < 9): unittest then sets no ``_subtest``, yet the records should name it.
OPEN_SUBTESTS_ATTRIBUTE = "_tst_open_subtests"


def current_subtest(test: Any) -> Optional[str]:
    """The description unittest gives the subTest open in *test* (``[msg] (k=v)``), or None."""
    sub = getattr(test, "_subtest", None)
    if sub is None:
        return _described(test.__dict__.get(OPEN_SUBTESTS_ATTRIBUTE, ()))
    describe = getattr(sub, "_subDescription", None)
    text = describe() if callable(describe) else str(sub)
    return str(text).strip() or None


def _described(open_subtests: Sequence[tuple[Any, Mapping[str, Any]]]) -> Optional[str]:
    """unittest's description of the innermost of *open_subtests* ((message, params) pairs, outer first):
    its message in brackets, then the parameters of every open subTest, innermost first and winning."""
    if not open_subtests:
        return None
    msg = open_subtests[-1][0]
    params: dict[str, Any] = {}
    for _, more in reversed(open_subtests):
        for key, value in more.items():
            params.setdefault(key, value)
    parts = [] if msg is SUBTEST_NO_MESSAGE else [f"[{msg}]"]
    if params:
        parts.append("(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")")
    return " ".join(parts) or "(<subtest>)"


def load_kind(from_file: bool, extra_kwargs: Optional[Mapping[str, Any]]) -> str:
    """How a load was made, for its record: ``torch.load``, ``torch.load(path)``, ``torch.load(path, mmap=True)``."""
    extra = dict(extra_kwargs or {})
    args = (["path"] if from_file or extra.get("mmap") else []) + [f"{k}={v!r}" for k, v in sorted(extra.items())]
    return f"torch.load({', '.join(args)})" if args else "torch.load"


def note(test: Any, record: RoundTripRecord) -> None:
    """Keep *record* on *test*; append it to the ``REPORT_ENV`` file when that is set."""
    test.__dict__.setdefault(RECORDS_ATTRIBUTE, []).append(record)
    path = os.environ.get(REPORT_ENV)
    if path:
        line = {"test": test.id(), **asdict(record)}
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(line) + "\n")


def records(test: Any) -> list[RoundTripRecord]:
    """The records *test* collected so far (none outside a round-trip test)."""
    return list(getattr(test, "__dict__", {}).get(RECORDS_ATTRIBUTE, ()))


def rejection_status(recs: Sequence[RoundTripRecord]) -> Optional[tuple[str, str]]:
    """``(status, reasons)`` for a test in which torch refused a load as predicted, else None.

    The status is ``rejected as predicted`` when every round trip was refused, else
    ``N of M round trips rejected as predicted``; the reasons list each distinct refusal once, with the
    subTests it happened in.
    """
    rejected = [r for r in recs if not r.loaded]
    if not rejected:
        return None
    status = (
        "rejected as predicted"
        if len(rejected) == len(recs)
        else f"{len(rejected)} of {len(recs)} round trips rejected as predicted"
    )
    where: dict[str, list[str]] = {}
    for r in rejected:
        subs = where.setdefault(r.summary, [])
        if r.subtest and r.subtest not in subs:
            subs.append(r.subtest)
    reasons = "; ".join(summary + (f" in subTest {', '.join(subs)}" if subs else "") for summary, subs in where.items())
    return status, reasons
