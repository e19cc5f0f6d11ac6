"""What torch itself tells users to allowlist: the remedy its weights-only errors print.

torch's ``torch.load`` documentation and its weights-only error messages tell the owner of a checkpoint
holding numpy scalars to allowlist numpy's scalar reconstructor, ``numpy.dtype`` and the numpy dtype
classes.  Which names those are (``numpy.core`` or ``numpy._core``, which dtype classes) depends on
the numpy and torch installed, so they are asked of torch: numpy scalars and dtypes of every numeric
kind are pickled here and fed to torch's real weights-only unpickler, and each name its refusal
prints as the remedy (``add_safe_globals([X])``, or the type a BUILD "got") is allowlisted and the
probe run again, until it loads.  Only the library's own bytes are ever loaded.
"""

from __future__ import annotations

import pickle
import re
from typing import Any

from ...errors import torch_key
from ...unpickler import ProbeFailed, unpickle
from ...registry import allowlisted

#: Where each accepted name comes from, as reports say it.
NUMPY_SCALAR_SOURCE = (
    "torch documents it: torch.load's weights_only documentation, and the error torch's weights-only "
    "unpickler prints for a checkpoint holding numpy scalars, name it as the global to allowlist"
)


_GLOBAL_REMEDY = re.compile(r"add_safe_globals\(\[([A-Za-z0-9_.]+)\]\)")


#: "... or classes allowlisted via `add_safe_globals`, but got <class 'X'>" (before 2.5: "Can only build
#: Tensor, parameter or OrderedDict objects, but got <class 'X'>", and allowlisting X lets it BUILD as well)
_BUILD_REMEDY = re.compile(r"Can only build .*, but got <class '([A-Za-z0-9_.]+)'>")


#: torch before 2.5 prints the bare name in its remedy (``add_safe_globals([scalar])``); the refused
#: global's whole name is in the sentence before it.
_REFUSED_GLOBAL = re.compile(r"GLOBAL ([A-Za-z0-9_.]+) was not an allowed global")


_known: dict[Any, dict[str, Any]] = {}


def _samples(np: Any) -> list[Any]:
    codes = np.typecodes["AllInteger"] + np.typecodes["AllFloat"] + "?"
    dtypes = [np.dtype(c) for c in dict.fromkeys(codes)]
    return [*(d.type(0) for d in dtypes), *dtypes]


def numpy_scalar_remedy() -> dict[str, Any]:
    """``{name: object}`` torch names as the remedy for a checkpoint of numpy scalars and dtypes
    (empty without numpy); remembered per torch allowlist and numpy.  :class:`ProbeFailed` when torch
    refuses it without naming a remedy among the objects the pickle holds."""
    try:
        import numpy as np
    except ImportError:
        return {}
    from ...registry import torch_allowlist_table

    key = (id(torch_allowlist_table()), np.__version__)
    known = _known.get(key)
    if known is not None:
        return known
    samples = _samples(np)
    candidates: dict[str, Any] = {}
    for value in samples:
        for obj in (value.__reduce__()[0], type(value)):
            name = torch_key(obj)
            if name:
                candidates[name] = obj
    import _codecs  # protocol 2 pickles a scalar's bytes by _codecs.encode, which torch < 2.5 does not allow

    candidates["_codecs.encode"] = _codecs.encode
    body = pickle.dumps(samples, protocol=2)
    remedy: dict[str, Any] = {}
    for _ in range(len(candidates) + 1):
        with allowlisted(list(remedy.values())):
            outcome = unpickle(body, proto=False)
        if outcome.loaded:
            _known[key] = remedy
            return remedy
        message = outcome.message
        found = (m.group(1) for r in (_GLOBAL_REMEDY, _BUILD_REMEDY, _REFUSED_GLOBAL) if (m := r.search(message)))
        name = next((n for n in found if n in candidates), None)
        if not outcome.refused or name is None or name in remedy:
            raise ProbeFailed(
                f"torch's weights-only unpickler refused numpy scalars without naming a remedy the "
                f"library can verify ({type(outcome.error).__name__}: {message[:300]!r})"
            )
        remedy[name] = candidates[name]
    raise ProbeFailed("torch kept refusing numpy scalars after allowlisting every name it printed")
