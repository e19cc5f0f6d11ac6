"""The mixin's one save path and one load path, shared by all its round-trip methods.

``round_trip``, ``round_trip_state_dict``, ``save_checkpoint`` and ``load_checkpoint`` save with
:func:`save` and load with :func:`load_in_test`: the test's mode resolved (or a mode that cannot
run here skipped), the environment's switches checked, the declared ``safe_globals`` judged
against the checkpoint, the load performed and asserted by :func:`..loading.load.load` under the
test's load engine, the outcome reported in verbose output, and an expected rejection raised to
end the test (or its subtest) as a pass.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import unittest
from typing import TYPE_CHECKING, Any, Optional, Sequence

from ..core.errors import ConflictingEnvironmentError, RoundTripConfigError
from ..core.modes import LoadMode
from ..policy.declared import SafeGlobal, as_safe_globals
from ..torch_facts.registry import safe_globals_context_missing
from .declarations import Declaration, check_declared, local_class_message, refuse_local
from .outcomes import ExpectedRejection

if TYPE_CHECKING:
    from ..loading.load import LoadResult
    from ..scan.checkpoint import Checkpoint

__all__ = ["REPORT_ENV", "MISSING", "declared_argument", "save", "load_in_test"]

#: Set to a file path to get one JSON line per round trip (test id, mode, outcome).
REPORT_ENV = "TORCH_SERIAL_TESTING_REPORT"
#: An argument not given (``map_location``; the saved object of a ``load_checkpoint``).
MISSING: Any = object()


def _is_module(obj: Any) -> bool:
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.nn.Module)


def declared_argument(safe_globals: Sequence[Any]) -> tuple[SafeGlobal, ...]:
    """A call's ``safe_globals=`` argument, checked like a class declaration."""
    refuse_local(safe_globals, "safe_globals=")
    return as_safe_globals(safe_globals)


def save(obj: Any) -> Checkpoint:
    """``torch.save`` *obj* to memory; a function-local class fails saying to move it."""
    from ..scan.checkpoint import Checkpoint  # the round-trip machinery: imported on the first round trip

    try:
        return Checkpoint.save(obj)
    except (AttributeError, pickle.PicklingError, TypeError) as e:
        if "<locals>" not in str(e):
            raise
        local = next((w.strip("'\"<>,:") for w in str(e).split() if "<locals>" in w), "a class")
        raise RoundTripConfigError(
            f"torch.save failed: {type(e).__name__}: {e}\n" + local_class_message(local)
        ) from e


def load_in_test(
    test: Any,
    checkpoint: Checkpoint,
    mode: Optional[LoadMode | str],
    declared: Sequence[SafeGlobal],
    where: Declaration,
    map_location: Any,
    saved: Any,
) -> Any:
    """Load *checkpoint* in *test*'s mode (or *mode*); the loaded object, or ExpectedRejection."""
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
    from ..torch_facts.load_call import WeightsOnlySwitches

    switches = WeightsOnlySwitches.from_environ()
    if switches.conflict:  # the environment breaks every load: that, not the declaration, is the news
        raise ConflictingEnvironmentError(switches.conflict_message())
    if resolved is LoadMode.SAFE_GLOBALS:
        saved_type = None
        if saved is not MISSING and not _is_module(saved):
            saved_type = type(saved).__name__
        check_declared(checkpoint, declared, where, allow_unneeded=test.allow_unneeded_safe_globals,
                       saved_type=saved_type)
    if map_location is MISSING:
        map_location = test._tst_case.map_location if test._tst_case else None
    with test.loading_engine():
        result = loading.load(checkpoint, resolved, declared, map_location)
    _report(test, result)
    if not result.loaded:
        rejection = ExpectedRejection(result.summary)
        test._tst_in_flight = rejection
        raise rejection
    return result.value


def _report(test: Any, result: LoadResult) -> None:
    """Each distinct outcome once in verbose output; every load in the REPORT_ENV file."""
    summary = result.summary
    if summary not in test.round_trip_outcomes:
        test.round_trip_outcomes.append(summary)
        test._tst_say(summary)
    path = os.environ.get(REPORT_ENV)
    if path:
        record = {
            "test": test.id(),
            "mode": result.expectation.mode.value,
            "loaded": result.loaded,
            "weights_only": result.expectation.weights_only,
            "summary": summary,
        }
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(record) + "\n")
