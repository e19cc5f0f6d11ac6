"""Round trips other than ``torch.save`` / ``torch.load`` through memory: through a file path (with
``mmap=True`` or another ``torch.load`` keyword), and Python's ``pickle`` of tensors.

Each is checked like :meth:`~.case.SerializationRoundTripTestCase.round_trip`: the outcome torch should
have here, recorded (``kind`` in the record and the JSONL report) and shown in verbose output.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence

from ..core.modes import LoadMode
from ..torch_facts.engines import qnnpack_allocator
from .checked_loads import MISSING, load_in_test, save
from .outcomes import RoundTripRecord, current_subtest, note

__all__ = ["RoundTripKinds"]


class RoundTripKinds:
    """Methods of :class:`~.case.SerializationRoundTripTestCase` for the other kinds of round trip."""

    def round_trip_file(
        self,
        obj: Any,
        *,
        mode: Optional[LoadMode | str] = None,
        safe_globals: Optional[Sequence[Any]] = None,
        map_location: Any = MISSING,
        mmap: bool = False,
        **load_kwargs: Any,
    ) -> Any:
        """As :meth:`round_trip`, loading through a file path: the saved bytes go to a private
        temporary file (removed after the load) and ``torch.load(path, ..., mmap=mmap, **load_kwargs)``
        reads them.  *load_kwargs*: any other keyword in ``loading.load.LOAD_KWARGS`` (the mode and
        *map_location* have their own arguments; pickle_load_args such as ``encoding`` are refused: torch
        ignores them in weights-only loads)."""
        extra = {"mmap": True, **load_kwargs} if mmap else dict(load_kwargs)
        declared, where = self._declared(safe_globals, "safe_globals", "round_trip_file")  # type: ignore[attr-defined]
        return load_in_test(
            self, save(obj), mode, declared, where, map_location, obj, from_file=True, extra_kwargs=extra
        )

    def round_trip_pickle(self, obj: Any, *, protocol: Optional[int] = None) -> Any:
        """``pickle.loads(pickle.dumps(obj, protocol))``, asserted to do what torch does here: a tensor's
        pickle rebuilds its storages with ``torch.load(..., weights_only=False)``, which the
        ``TORCH_FORCE_*`` switches reach (see :mod:`..loading.pickled`).  It has no load mode: in a
        generated test it runs the same in every mode (``round_trip_dims(load_modes=())`` runs it once)."""
        from ..loading.pickled import pickle_round_trip  # imported on first use

        with self.loading_engine(), qnnpack_allocator(self.load_qengine):  # type: ignore[attr-defined]
            result = pickle_round_trip(obj, protocol)
        outcomes: list[str] = self.round_trip_outcomes  # type: ignore[attr-defined]
        if result.summary not in outcomes:
            outcomes.append(result.summary)
            self._tst_say(result.summary)  # type: ignore[attr-defined]
        note(
            self,
            RoundTripRecord("pickle.loads", None, True, result.weights_only, result.summary, current_subtest(self)),
        )
        return result.value
