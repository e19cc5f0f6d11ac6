"""A ``pickle.dumps`` / ``pickle.loads`` round trip of tensors, asserted like a ``torch.load``.

Python's pickle of a tensor holds each storage as ``torch.save`` bytes, and ``pickle.loads`` calls
``torch.load(..., weights_only=False)`` on them (``torch.storage._load_from_bytes``).  So the
``TORCH_FORCE_*`` switches reach a plain ``pickle.loads``: forced weights-only (the storage payloads
load all the same), a warning under TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD where torch warns for an
explicit ``weights_only=False``, RuntimeError when both are set.  What that inner call does is asked
of torch (:func:`~..torch_facts.load_call.decide` for an explicit ``weights_only=False``), and the
round trip must do exactly that.  Only bytes this call just pickled are ever unpickled.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Optional

from ..core.errors import UnexpectedLoadOutcome
from ..core.modes import LoadMode
from ..torch_facts.load_call import FORCE_NO_WO, decide
from ..torch_facts.loader import observe_serialization_warnings

__all__ = ["PickleResult", "pickle_round_trip"]

#: The name a pickled storage is rebuilt by (``torch.storage._load_from_bytes``), in the pickle's bytes.
_STORAGE_FROM_BYTES = b"_load_from_bytes"


@dataclass(frozen=True)
class PickleResult:
    value: Any
    #: The inner ``torch.load`` calls' effective ``weights_only`` (forced True by TORCH_FORCE_WEIGHTS_ONLY_LOAD).
    weights_only: bool
    summary: str


def pickle_round_trip(obj: Any, protocol: Optional[int] = None) -> PickleResult:
    """``pickle.loads(pickle.dumps(obj, protocol))``; the environment conflict raises
    ConflictingEnvironmentError first, any other difference from torch's decision UnexpectedLoadOutcome."""
    data = pickle.dumps(obj, protocol=protocol)
    if _STORAGE_FROM_BYTES not in data:  # no storage in it: torch.load is never called
        return PickleResult(pickle.loads(data), False, "pickle.loads: loaded as expected (no tensor storage in it)")
    decision = decide(LoadMode.WEIGHTS_ONLY_FALSE)  # the call torch.storage._load_from_bytes makes
    where = f"its storages through torch.load: {decision.reason}"
    with observe_serialization_warnings() as observed:
        try:
            value = pickle.loads(data)  # noqa: S301 - the bytes pickled on the line above
        except Warning:
            raise  # a warning the caller's filters turned into an error: theirs
        except Exception as e:  # noqa: BLE001 - reported with what torch was predicted to do
            raise UnexpectedLoadOutcome(
                f"pickle.loads: expected to load ({where}); it raised {type(e).__name__}: {e}"
            ) from e
    if observed.seen != decision.warns and decision.replaced_by is None:
        raise UnexpectedLoadOutcome(
            f"pickle.loads: expected torch {'to' if decision.warns else 'not to'} warn about {FORCE_NO_WO} "
            f"({where}); it {'did' if observed.seen else 'did not'}"
        )
    return PickleResult(value, decision.weights_only, f"pickle.loads: loaded as expected ({where})")
