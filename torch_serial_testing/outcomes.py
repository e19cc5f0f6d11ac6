"""What a test's round trips did, kept on the test for whoever reports it.

Every checked load leaves a :class:`RoundTripRecord` on its test (and, with ``REPORT_ENV`` set, a JSON
line naming the test and the subTest it ran in).  The runners read the records: unittest's verbose
line shows each distinct outcome as it happens, the pytest plugin
(:mod:`.pytest_plugin`) turns them into a visible status and JUnit
properties.  An expected rejection is a *pass*: torch did what it should, and the library checked it.
"""

from __future__ import annotations

import functools
import inspect
import json
import os
import pickle
import sys
import unittest
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from .declarations import Declaration, SafeGlobal, allowed_anyway, local_class_message, names_used
from .engines import qnnpack_allocator
from .errors import RoundTripConfigError
from .modes import LoadMode
from .registry import safe_globals_context_missing

if TYPE_CHECKING:
    from .checkpoint import Checkpoint

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


#: An argument not given (``map_location``; the saved object of a ``load_checkpoint``).
MISSING: Any = object()


class ExpectedRejection(BaseException):
    """torch rejected the load exactly as predicted; the test ends here as a pass.  A ``BaseException``
    (like unittest's and pytest's outcome exceptions) so a test's ``except Exception`` cannot swallow it."""

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary
        #: A subTest that a generator held open and that was closed while this propagated.
        self.abandoned_subtest: Optional[str] = None


def _required_args(fn: Callable[..., Any]) -> list[str]:
    """Parameters after ``self`` that have no default (``device`` for a generic test)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def ends_on_rejection(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Wrap a test method so an expected rejection ends it as a pass, and a generic test run
    directly (never instantiated) fails saying how to instantiate it."""
    if getattr(fn, "_tst_wrapped", False):
        return fn

    @functools.wraps(fn)
    def wrapper(self: Any, *args: Any, **kwargs: Any) -> Any:
        params = _required_args(fn) if self._tst_case is None and not args and not kwargs else None
        if params:
            generic, name = type(self).__name__, fn.__name__
            raise RoundTripConfigError(
                f"{generic}.{name} is a generic round-trip test (it takes {', '.join(repr(p) for p in params)}): "
                f"its tests exist only in the classes instantiate_round_trip_tests generates.  Add\n\n"
                f"    instantiate_round_trip_tests({generic}, globals())\n\n"
                f"at module level after the class, and run the generated tests "
                f"({generic}CPU.{name}_<load_mode>_cpu, ...)"
            )
        try:
            return fn(self, *args, **kwargs)
        except ExpectedRejection as rejection:
            _ended(self, rejection)
            return None

    wrapper._tst_wrapped = True  # type: ignore[attr-defined]
    _each_example_ends_on_rejection(fn)
    return wrapper


def _ended(test: Any, rejection: ExpectedRejection) -> None:
    """*rejection* ends the test (or one hypothesis example) as a pass, unless it escaped a subTest."""
    test._tst_in_flight = None
    if rejection.abandoned_subtest is not None:
        raise RoundTripConfigError(
            f"{rejection.summary}\n... but this expected rejection happened outside the `with "
            f"self.subTest({rejection.abandoned_subtest})` block that was open (the block yields to its "
            "caller, e.g. from a generator), so it could not end just that subtest and the remaining "
            "subtests would silently not run.  Call round_trip inside the with block (no yield inside "
            "it), or open the subTest in the loop body."
        ) from None


def _each_example_ends_on_rejection(fn: Callable[..., Any]) -> None:
    """Under hypothesis's ``@given`` an expected rejection ends only its example, as a pass: hypothesis
    runs every example and reports no failure ("reproduce with @seed").  Its documented hook for
    wrapping the test it calls is ``fn.hypothesis.inner_test``."""
    handle = getattr(fn, "hypothesis", None)
    inner = getattr(handle, "inner_test", None)
    if inner is None or not callable(inner) or getattr(inner, "_tst_wrapped", False):
        return

    @functools.wraps(inner)
    def example(self: Any, *args: Any, **kwargs: Any) -> Any:
        try:
            return inner(self, *args, **kwargs)
        except ExpectedRejection as rejection:
            _ended(self, rejection)
            return None

    example._tst_wrapped = True  # type: ignore[attr-defined]
    handle.inner_test = example  # type: ignore[union-attr]


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
    declared: Sequence[SafeGlobal],
    where: Declaration,
    map_location: Any,
    saved: Any,
    *,
    from_file: bool = False,
    extra_kwargs: Optional[Mapping[str, Any]] = None,
) -> Any:
    """Load *checkpoint* in *test*'s mode (or *mode*), from memory or (*from_file*) a path, with
    *extra_kwargs* for ``torch.load``; the loaded object, or ExpectedRejection."""
    resolved = LoadMode.parse(mode) if mode is not None else test.load_mode
    if resolved is None:
        raise RoundTripConfigError(
            "this test has no load mode: pass mode=LoadMode.DEFAULT (or another mode), generate "
            "the tests with instantiate_round_trip_tests(...), or (if the method narrowed its "
            "dimensions with round_trip_dims(load_modes=()) / no_round_trip_dims) give it back "
            "its load modes"
        )
    unavailable = safe_globals_context_missing() if resolved is LoadMode.SAFE_GLOBALS else None
    if unavailable:  # before judging the declaration: the mode cannot run here at all
        raise unittest.SkipTest(unavailable)
    from . import loading

    if map_location is MISSING:
        map_location = test._tst_case.map_location if test._tst_case else None
    with test.loading_engine(), qnnpack_allocator(test.load_qengine):  # the load as pytorch's qnnpack tests do
        result = loading.load(
            checkpoint, resolved, declared, map_location, from_file=from_file, extra_kwargs=extra_kwargs
        )
    if resolved is LoadMode.SAFE_GLOBALS:
        _judge_declaration(test, checkpoint, result, declared, where, saved)
    summary = result.summary  # each distinct outcome once in verbose output, every load in the REPORT_ENV file
    if summary not in test.round_trip_outcomes:
        test.round_trip_outcomes.append(summary)
        test._tst_say(summary)
    exp = result.expectation
    kind = load_kind(from_file, extra_kwargs)
    record = RoundTripRecord(kind, exp.mode.value, result.loaded, exp.weights_only, summary, current_subtest(test))
    note(test, record)
    if not result.loaded:
        rejection = ExpectedRejection(summary)
        test._tst_in_flight = rejection
        raise rejection
    return result.value


def load_each_mode(
    test: Any,
    checkpoint: Checkpoint,
    declared: tuple[Sequence[SafeGlobal], Declaration],
    saved: Any,
    check: Optional[Callable[[Any, LoadMode], None]],
) -> dict[LoadMode, Any]:
    """*checkpoint*, saved once, loaded in each of the class's load modes in its own
    ``subTest(load_mode=...)`` (an expected rejection, a skip or a failed *check* ends only that mode's);
    ``{mode: loaded}`` of those that loaded."""
    if test.load_mode is not None:
        raise RoundTripConfigError(
            f"round_trip_each_mode loads in every load mode itself, but {test.id()} is generated per load mode "
            f"({test.load_mode.value}): every mode would be loaded once per mode.  Decorate the test with "
            "@round_trip_dims(load_modes=()) (it keeps its engine and device dimensions)"
        )
    modes = type(test).load_modes
    loaded: dict[LoadMode, Any] = {}
    for mode in tuple(modes) if modes is not None else tuple(LoadMode):
        with test.subTest(load_mode=mode.value):
            value = load_in_test(test, checkpoint, mode, *declared, MISSING, saved)
            loaded[mode] = value
            if check is not None:
                check(value, mode)
    return loaded


def _judge_declaration(
    test: Any, checkpoint: Checkpoint, result: Any, declared: Sequence[SafeGlobal], where: Declaration, saved: Any
) -> None:
    """The declaration against what this ``safe_globals`` load needed (the prediction torch just met):
    what it misses fails now, with what it over-trusts; a class declaration's over-trust is judged once
    every load of the test under it is known, at cleanup."""
    torch = sys.modules.get("torch")
    module = saved is MISSING or (torch is not None and isinstance(saved, torch.nn.Module))
    saved_type = None if module else type(saved).__name__
    info = checkpoint.info
    used = names_used(info)
    names = {sg.name for sg in declared}
    allow = test.allow_unneeded_safe_globals
    deferred = where.attribute is not None and not allow
    seen, types = set(used), [saved_type]
    if deferred:
        uses = test.__dict__.setdefault("_tst_declaration_uses", {})
        if not uses:
            test.addCleanup(_check_over_trust, test)
        _names, seen, types, _where = uses.setdefault(where.label, (names, set(), [], where))
        seen.update(used)
        types.append(saved_type)
    if not result.loaded:
        if info.weights_only_blocker or result.expectation.missing:  # this error is the declaration's one:
            test.__dict__.get("_tst_declaration_uses", {}).pop(where.label, None)  # no second one at cleanup
        if info.weights_only_blocker:
            raise where.blocked(info.weights_only_blocker, sorted(used - allowed_anyway()))
        missing = result.expectation.missing
        if missing:
            raise where.error(names, missing, () if allow else names - seen - allowed_anyway(), types)
    elif not deferred and not allow:
        unneeded = names - used - allowed_anyway()
        if unneeded:
            raise where.error(names, (), unneeded, types)


def _check_over_trust(test: Any) -> None:
    for names, used, types, where in test.__dict__.pop("_tst_declaration_uses", {}).values():
        unneeded = names - used - allowed_anyway()
        if unneeded:
            raise where.error(names, (), unneeded, types)
