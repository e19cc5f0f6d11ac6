"""The effective ``weights_only`` of a load mode, here and now: ``torch.load``'s own precedence.

An explicit ``weights_only`` argument (the mode's), the two ``TORCH_FORCE_*`` switches as this
torch reads them, and this torch's default decide it, in torch's order: TORCH_FORCE_WEIGHTS_ONLY_LOAD
beats everything, an explicit argument beats TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD, which beats the
default; both switches set is torch's RuntimeError on every load.  :func:`decide` runs on every
load, so it remembers its answer by everything it reads and reads only that.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

from . import switches as switches_module
from .errors import ConflictingEnvironmentError
from .modes import LoadMode
from .replaced_loader import torch_load_replacement
from .switches import FORCE_NO_WO, FORCE_WO, WeightsOnlySwitches, switch_values, torch_default_weights_only

__all__ = ["Decision", "decide"]


class Decision:
    """The effective ``weights_only`` of one load mode here and now, and what it was read from."""

    __slots__ = ("weights_only", "warns", "reason", "replaced_by", "force_no_set", "full")

    def __init__(self, weights_only: bool, warns: bool, reason: str, replaced_by: Optional[str],
                 force_no_set: bool) -> None:
        self.weights_only = weights_only
        #: torch warns that TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD made the load a full one.
        self.warns = warns
        self.reason = reason
        #: Who replaced ``torch.load`` (see :func:`.replaced_loader.torch_load_replacement`), or None.
        self.replaced_by = replaced_by
        #: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is in the environment (any value: torch may warn).
        self.force_no_set = force_no_set
        #: The prediction's expectation of a full load under this decision (set on first use).
        self.full: Any = None

    def __repr__(self) -> str:
        return f"<Decision weights_only={self.weights_only} ({self.reason})>"


def _decide(mode: LoadMode, switches: WeightsOnlySwitches) -> tuple[bool, bool, str]:
    """(effective weights_only, torch warns, reason) with torch.load's own precedence."""
    explicit = mode.explicit_weights_only
    if switches.conflict:
        raise ConflictingEnvironmentError(switches.conflict_message())
    if switches.force_weights_only:
        over = " over explicit weights_only=False" if explicit is False else ""
        return True, False, f"weights_only=True forced by {FORCE_WO}={switches.raw[FORCE_WO]}{over}"
    if explicit is not None:
        return explicit, False, f"weights_only={explicit} explicit"
    if switches.force_no_weights_only:
        return False, True, f"weights_only=False forced by {FORCE_NO_WO}={switches.raw[FORCE_NO_WO]}"
    default, why = torch_default_weights_only()
    return default, False, f"weights_only={default} {why}"


def decide(mode: LoadMode, environ: Optional[Mapping[str, str]] = None) -> Decision:
    """torch.load's precedence for *mode* in *environ* (default ``os.environ``).

    The two switches' values, how this torch reads them, ``torch.load`` (replaced or not) and
    torch's default function and version are read on every call; the answer is worked out again
    only when one of them changed.  A conflict raises :class:`ConflictingEnvironmentError` every time.
    """
    import torch

    readings = switches_module.torch_switch_readings()
    values = switch_values(environ)
    key = (mode, *values, id(readings), torch.load,
           getattr(torch.serialization, "_default_to_weights_only", None), torch.__version__)
    hit = _decisions.get(key)
    if hit is not None and hit[0] is readings:
        return hit[1]
    weights_only, warns, reason = _decide(mode, WeightsOnlySwitches.from_values(values, environ))
    decision = Decision(weights_only, warns, reason, torch_load_replacement(), values[1] is not None)
    if len(_decisions) >= 256:
        _decisions.clear()
    _decisions[key] = (readings, decision)  # keeps the readings alive: their id stays theirs
    return decision


#: (mode, switch values, id(readings), torch.load, torch's default function, version) -> (readings, decision).
_decisions: dict[tuple[Any, ...], tuple[Any, Decision]] = {}
