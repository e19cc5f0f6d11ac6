"""Reading ``os.environ`` cheaply: the ``TORCH_FORCE_*`` switches are read around every load and test.

``os.environ.get`` encodes the name, decodes the value and, for an unset variable, raises and catches
``KeyError`` twice; CPython's ``os.environ`` keeps the encoded mapping it wraps, read directly here.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

__all__ = ["stored_environ"]

#: CPython's class of ``os.environ`` (None elsewhere: every mapping is then read as it is).
_ENVIRON = getattr(os, "_Environ", None)
_Decode = Callable[[Any], str]


def stored_environ(env: Mapping[str, str]) -> Optional[tuple[dict[Any, Any], Callable[[str], Any], _Decode]]:
    """``(stored mapping, key encoder, key decoder)`` when *env* is exactly ``os._Environ``, else None
    (read *env* through its public interface)."""
    if type(env) is not _ENVIRON:
        return None
    return env._data, env.encodekey, env.decodekey  # type: ignore[attr-defined]
