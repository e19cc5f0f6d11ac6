"""The three load modes, each one exact ``torch.load`` call, named as in test ids.

* ``weights_only_false``: ``torch.load(buf, weights_only=False)``
* ``safe_globals``: ``with torch.serialization.safe_globals([...]): torch.load(buf, weights_only=True)``
* ``default``: ``torch.load(buf)``, no ``weights_only`` argument at all
"""

from __future__ import annotations

import enum
from typing import Optional

from .errors import RoundTripConfigError

__all__ = ["LoadMode"]


class LoadMode(enum.Enum):
    """How a round trip is loaded; the value is the stable name used in test ids."""

    WEIGHTS_ONLY_FALSE = "weights_only_false"
    SAFE_GLOBALS = "safe_globals"
    DEFAULT = "default"

    @property
    def explicit_weights_only(self) -> Optional[bool]:
        """The ``weights_only`` argument this mode passes (None: not passed at all)."""
        return _EXPLICIT[self._value_]

    @classmethod
    def parse(cls, value: LoadMode | str) -> LoadMode:
        if value.__class__ is LoadMode:  # the common case first: parse runs on every load
            return value  # type: ignore[return-value]
        found = (_BY_SPELLING.get(value) or _BY_SPELLING.get(value.upper())) if isinstance(value, str) else None
        if found is not None:
            return found
        raise RoundTripConfigError(
            f"unknown load mode {value!r}; use one of {', '.join(m.value for m in cls)} "
            "(or LoadMode.WEIGHTS_ONLY_FALSE / SAFE_GLOBALS / DEFAULT)"
        )

    def __str__(self) -> str:
        return self.value


_EXPLICIT = {"weights_only_false": False, "safe_globals": True, "default": None}
#: Each mode by its value and by its member name (``"default"``, ``"DEFAULT"``).
_BY_SPELLING = {**{m.value: m for m in LoadMode}, **{m.name: m for m in LoadMode}}
