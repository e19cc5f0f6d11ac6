"""Reading ``os.environ`` cheaply: the ``TORCH_FORCE_*`` switches are read around every load and test.

``os.environ.get(name)`` encodes *name*, looks it up and decodes the value, and for an unset
variable (the usual case) raises and catches ``KeyError`` twice; iterating ``os.environ`` decodes
every key of the environment.  CPython's ``os.environ`` keeps the encoded mapping it wraps
(``_data``, with ``encodekey``/``decodekey``): reading that directly skips the conversions, and
anything else (a plain mapping, another implementation) is read through its public interface.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping, Optional

__all__ = ["stored_environ"]


def stored_environ(env: Mapping[str, str]) -> Optional[tuple[dict[Any, Any], Callable[[str], Any], Callable[[Any], str]]]:
    """``(the stored mapping, its key encoder, its key decoder)`` when *env* is CPython's
    ``os.environ`` (``os._Environ`` exactly), else None: read *env* itself."""
    if type(env) is not _ENVIRON:
        return None
    return env._data, env.encodekey, env.decodekey  # type: ignore[attr-defined]


#: CPython's class of ``os.environ`` (None elsewhere: every mapping is then read as it is).
_ENVIRON = getattr(os, "_Environ", None)
