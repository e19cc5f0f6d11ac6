"""How a round-trip test ends: an expected rejection, and the messages for misused tests.

An expected rejection is a ``BaseException`` (like unittest's and pytest's outcome
exceptions) so a test's ``except Exception`` cannot swallow it; the mixin ends
the test or subtest with it as a pass.  The messages here explain the two ways
a test can be used so that it cannot end that way: run without instantiation,
or rejected outside the ``subTest`` block a generator holds open.
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Optional

from ..core.errors import RoundTripConfigError

__all__ = ["ExpectedRejection", "required_args", "not_instantiated", "rejection_outside_subtest"]


class ExpectedRejection(BaseException):
    """torch rejected the load exactly as predicted; the test ends here as a pass.

    A ``BaseException`` (like unittest's and pytest's outcome exceptions) so that an
    ``except Exception`` or ``assertRaises(Exception)`` in a test cannot swallow it and
    carry on without a loaded object.
    """

    def __init__(self, summary: str) -> None:
        super().__init__(summary)
        self.summary = summary
        #: A subTest that a generator held open and that was closed while this propagated.
        self.abandoned_subtest: Optional[str] = None


def required_args(fn: Callable[..., Any]) -> list[str]:
    """Parameters after ``self`` that have no default (``device`` for a generic test)."""
    try:
        params = list(inspect.signature(fn).parameters.values())[1:]
    except (TypeError, ValueError):
        return []
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return [p.name for p in params if p.kind in kinds and p.default is inspect.Parameter.empty]


def not_instantiated(cls: type, name: str, params: list[str]) -> RoundTripConfigError:
    generic = cls.__name__
    return RoundTripConfigError(
        f"{generic}.{name} is a generic round-trip test (it takes {', '.join(repr(p) for p in params)}): "
        f"its tests exist only in the classes instantiate_round_trip_tests generates.  Add\n\n"
        f"    instantiate_round_trip_tests({generic}, globals())\n\n"
        f"at module level after the class, and run the generated tests ({generic}CPU.{name}_<load_mode>_cpu, ...)"
    )


def rejection_outside_subtest(subtest: str, rejection: ExpectedRejection) -> RoundTripConfigError:
    return RoundTripConfigError(
        f"{rejection.summary}\n... but this expected rejection happened outside the `with "
        f"self.subTest({subtest})` block that was open (the block yields to its caller, e.g. from a "
        "generator), so it could not end just that subtest and the remaining subtests would silently "
        "not run.  Call round_trip inside the with block (no yield inside it), or open the subTest in "
        "the loop body."
    )
