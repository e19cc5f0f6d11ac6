"""How a load ends a test (an expected rejection is a *pass*: torch did what it should), and the test's records:
a :class:`RoundTripRecord` per checked load (and, with ``REPORT_ENV`` set, a JSON line) for the runners."""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import sys
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from .declarations import Declaration, allowed_anyway, local_class_message, names_used
from .dimensions import qnnpack_allocator
from .errors import RoundTripConfigError
from .modes import LoadMode

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

#: Set to a file path to get one JSON line per round trip (test id, subTest, mode, outcome).
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"
#: The attribute of a test instance holding its records (read by the pytest plugin without importing us).
RECORDS_ATTRIBUTE = "_tst_records"
#: The subTests the library opened, named in the records also where a result has no subTest support (pytest < 9).
OPEN_SUBTESTS_ATTRIBUTE = "_tst_open_subtests"
#: An argument not given (``map_location``; the saved object of a ``load_checkpoint``; a subTest's message).
MISSING: Any = object()


@dataclass(frozen=True)
class RoundTripRecord:
    """One checked load: how it was made, what torch did, and in which subTest."""

    kind: str  # "torch.load", "torch.load(path, mmap=True)", or "pickle.loads" (a tensor's pickle calls torch.load)
    mode: Optional[str]  # the load mode (None for a pickle round trip: it has none)
    loaded: bool
    weights_only: Optional[bool]
    summary: str
    subtest: Optional[str]  # the subTest's description, e.g. "(engine='fbgemm')"


def current_subtest(test: Any) -> Optional[str]:
    """unittest's description of the subTest open in *test* (``[msg] (k=v)``; else from the library's own)."""
    if (sub := getattr(test, "_subtest", None)) is not None:
        describe = getattr(sub, "_subDescription", None)
        return str(describe() if callable(describe) else str(sub)).strip() or None
    open_subtests: Sequence[tuple[Any, Mapping[str, Any]]] = test.__dict__.get(OPEN_SUBTESTS_ATTRIBUTE, ())
    if not open_subtests:
        return None
    params: dict[str, Any] = {}
    for _, more in reversed(open_subtests):  # the parameters of every open subTest, innermost first and winning
        for key, value in more.items():
            params.setdefault(key, value)
    msg = open_subtests[-1][0]
    parts = [] if msg is MISSING else [f"[{msg}]"]
    if params:
        parts.append("(" + ", ".join(f"{k}={v!r}" for k, v in params.items()) + ")")
    return " ".join(parts) or "(<subtest>)"


def report(test: Any, kind: str, mode: Optional[str], loaded: bool, weights_only: Optional[bool], summary: str) -> None:
    """Each distinct outcome once in verbose output; every load in the records and the ``REPORT_ENV`` file."""
    if summary not in test.round_trip_outcomes:
        test.round_trip_outcomes.append(summary)
        test._tst_say(summary)
    record = RoundTripRecord(kind, mode, loaded, weights_only, summary, current_subtest(test))
    test.__dict__.setdefault(RECORDS_ATTRIBUTE, []).append(record)
    if path := os.environ.get(REPORT_ENV):
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({"test": test.id(), **asdict(record)}) + "\n")


def records(test: Any) -> list[RoundTripRecord]:
    """The records *test* collected so far (none outside a round-trip test)."""
    return list(getattr(test, "__dict__", {}).get(RECORDS_ATTRIBUTE, ()))


def rejection_status(recs: Sequence[RoundTripRecord]) -> Optional[tuple[str, str]]:
    """``(status, reasons)`` for a test in which torch refused a load as predicted (``[N of M round trips]
    rejected as predicted``; each distinct refusal once, as ``default (why)``, with its subTests), else None."""
    rejected = [r for r in recs if not r.loaded]
    if not rejected:
        return None
    partly = "" if len(rejected) == len(recs) else f"{len(rejected)} of {len(recs)} round trips "
    where: dict[str, list[str]] = {}
    for r in rejected:
        subs = where.setdefault(r.summary.replace(": rejected as expected (", " (", 1), [])  # the status says it
        if r.subtest and r.subtest not in subs:
            subs.append(r.subtest)
    reasons = "; ".join(summary + (f" in subTest {', '.join(subs)}" if subs else "") for summary, subs in where.items())
    return f"{partly}rejected as predicted", reasons


class ExpectedRejection(BaseException):
    """torch rejected the load exactly as predicted; the test ends here as a pass.  A ``BaseException``
    (like unittest's and pytest's outcome exceptions) so a test's ``except Exception`` cannot swallow it."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary
        self.abandoned_subtest: Optional[str] = None  #: a subTest a generator held open, closed meanwhile


def _required_args(fn: Callable[..., Any]) -> list[str]:  # after self, without default: a generic test's device
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    return [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]


def ends_on_rejection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """*fn* ended as a pass by an expected rejection (under ``@given`` one example: ``fn.hypothesis.inner_test``);
    a generic test run uninstantiated fails saying how to instantiate it."""
    if getattr(fn, "_tst_wrapped", False):
        return fn
    inner = getattr(getattr(fn, "hypothesis", None), "inner_test", None)
    if callable(inner) and not getattr(inner, "_tst_wrapped", False):
        fn.hypothesis.inner_test = _ending(inner, generic=False)  # type: ignore[attr-defined]
    return _ending(fn, generic=True)


def _ending(fn: Callable[..., Any], generic: bool) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        if generic and self._tst_case is None and not args and not kwargs and (params := _required_args(fn)):
            name, test = type(self).__name__, fn.__name__
            raise RoundTripConfigError(
                f"{name}.{test} is a generic round-trip test (it takes {', '.join(repr(p) for p in params)}): "
                f"its tests exist only in the classes instantiate_round_trip_tests generates.  Add\n\n"
                f"    instantiate_round_trip_tests({name}, globals())\n\n"
                f"at module level after the class, and run the generated tests ({name}CPU.{test}_<load_mode>_cpu, ...)"
            )
        try:
            return fn(self, *args, **kwargs)
        except ExpectedRejection as rejection:
            self._tst_in_flight = None
            if rejection.abandoned_subtest is not None:  # it escaped a subTest: no pass then
                raise RoundTripConfigError(
                    f"{rejection.summary}\n... but this expected rejection happened outside the `with "
                    f"self.subTest({rejection.abandoned_subtest})` block that was open (the block yields to its "
                    "caller, e.g. from a generator), so it could not end just that subtest and the remaining "
                    "subtests would silently not run.  Call round_trip inside the with block (no yield inside "
                    "it), or open the subTest in the loop body."
                ) from None
            return None

    wrapper._tst_wrapped = True  # type: ignore[attr-defined]
    return wrapper


def save(obj: Any) -> Checkpoint:
    """``torch.save`` *obj* to memory; a function-local class fails saying to move it."""
    from .checkpoint import Checkpoint

    try:
        return Checkpoint.save(obj)
    except (AttributeError, pickle.PicklingError, TypeError) as e:
        if "<locals>" not in str(e):
            raise
        local = next((w.strip("'\"<>,:") for w in str(e).split() if "<locals>" in w), "a class")
        raise RoundTripConfigError(f"torch.save failed: {type(e).__name__}: {e}\n" + local_class_message(local)) from e


def load_in_test(
    test: Any,
    checkpoint: Checkpoint,
    mode: Optional[LoadMode | str],
    declared: Declaration,
    map_location: Any,
    saved: Any,
    file_kwargs: Optional[Mapping[str, Any]] = None,
) -> Any:
    """*checkpoint* loaded in *test*'s mode (or *mode*), through a file with *file_kwargs*; or ExpectedRejection."""
    resolved = LoadMode.parse(mode) if mode is not None else test.load_mode
    if resolved is None:
        raise RoundTripConfigError(
            "this test has no load mode: pass mode=LoadMode.DEFAULT (or another mode), generate the tests with "
            "instantiate_round_trip_tests(...), or (if the method narrowed its dimensions with "
            "round_trip_dims(load_modes=()) / no_round_trip_dims) give it back its load modes"
        )
    from . import loading  # its load skips a mode this torch lacks, before the declaration is judged

    if map_location is MISSING:
        map_location = test._tst_case.map_location if test._tst_case else None
    from_file = file_kwargs is not None
    with test.loading_engine(), qnnpack_allocator(test.load_qengine):  # the load as pytorch's qnnpack tests do
        result = loading.load(
            checkpoint, resolved, declared.entries, map_location, from_file=from_file, extra_kwargs=file_kwargs
        )
    if resolved is LoadMode.SAFE_GLOBALS:
        _judge_declaration(test, checkpoint, result, declared, saved)
    extra = [f"{k}={v!r}" for k, v in sorted((file_kwargs or {}).items())]  # torch.load(path, mmap=True)
    kind = f"torch.load({', '.join(['path', *extra])})" if from_file else "torch.load"
    report(test, kind, result.expectation.mode.value, result.loaded, result.expectation.weights_only, result.summary)
    if not result.loaded:
        test._tst_in_flight = rejection = ExpectedRejection(result.summary)
        raise rejection
    return result.value


def _judge_declaration(test: Any, checkpoint: Checkpoint, result: Any, where: Declaration, saved: Any) -> None:
    """The declaration against this ``safe_globals`` load's needs: missing fails now, class over-trust at cleanup."""
    saved_type = None if saved is MISSING or isinstance(saved, sys.modules["torch"].nn.Module) else type(saved).__name__
    info, missing = checkpoint.info, result.expectation.missing
    used, names = names_used(info), {sg.name for sg in where.entries}
    allow = test.allow_unneeded_safe_globals
    deferred = where.attribute is not None and not allow
    seen, types = set(used), [saved_type]
    if deferred:
        uses = test.__dict__.setdefault("_tst_declaration_uses", {})
        if not uses:
            test.addCleanup(lambda: _refuse_over_trust(*test.__dict__.pop("_tst_declaration_uses", {}).values()))
        _names, seen, types, _where = uses.setdefault(where.label, (names, set(), [], where))
        seen.update(used)
        types.append(saved_type)
    if not result.loaded and (info.weights_only_blocker or missing):
        test.__dict__.get("_tst_declaration_uses", {}).pop(where.label, None)  # no second error at cleanup
        if info.weights_only_blocker:
            raise where.blocked(info.weights_only_blocker, sorted(used - allowed_anyway()))
        raise where.error(names, missing, () if allow else names - seen - allowed_anyway(), types)
    if result.loaded and not deferred and not allow:
        _refuse_over_trust((names, used, types, where))


def _refuse_over_trust(*uses: tuple[set[str], set[str], list[Optional[str]], Declaration]) -> None:
    for names, used, types, where in uses:  # (names declared, names used, saved types, where declared)
        if unneeded := names - used - allowed_anyway():
            raise where.error(names, (), unneeded, types)
