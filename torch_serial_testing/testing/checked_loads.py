"""The mixin's one save path (:func:`save`), one load path (:func:`load_in_test`), and how a test ends.

An expected rejection raises :class:`ExpectedRejection`, which ends the test (or subtest) as a pass:
:func:`ends_on_rejection` wraps every test method for that.
"""

from __future__ import annotations

import functools
import inspect
import pickle
import sys
import unittest
from typing import TYPE_CHECKING, Any, Callable, Mapping, Optional, Sequence

from ..core.errors import RoundTripConfigError
from ..core.modes import LoadMode
from ..policy.declared import SafeGlobal
from ..torch_facts.engines import qnnpack_allocator
from ..torch_facts.registry import safe_globals_context_missing
from .declarations import Declaration, allowed_anyway, local_class_message, names_used
from .outcomes import REPORT_ENV, RoundTripRecord, current_subtest, load_kind, note

if TYPE_CHECKING:
    from ..scan.checkpoint import Checkpoint

__all__ = ["REPORT_ENV", "MISSING", "ExpectedRejection", "ends_on_rejection", "save", "load_in_test", "load_each_mode"]

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
    from ..scan.checkpoint import Checkpoint  # imported on the first round trip

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
    from ..loading import load as loading  # imported on the first round trip, with the scan and the prediction

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
