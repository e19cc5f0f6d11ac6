"""A checkpoint written under numpy 1, loaded weights-only under numpy 2: the (object, name) form.

The checkpoint names ``numpy.core.multiarray.*``; numpy 2 keeps those objects in ``numpy._core``,
and torch keys a safe global by the object's own name, so the live object alone does not match.
To run anywhere, the script makes such a checkpoint itself: it saves while numpy's two functions
carry their numpy 1 ``__module__`` (restored at once).

    python numpy1_checkpoint.py
"""

import io
import pickle

import numpy as np
import torch

if not np.__version__.startswith("1."):
    from numpy._core import multiarray

    buf = io.BytesIO()
    saved = [(f, f.__module__) for f in (multiarray.scalar, multiarray._reconstruct)]
    try:
        for f, _ in saved:
            f.__module__ = "numpy.core.multiarray"
        torch.save({"s": np.float64(2.5), "a": np.arange(3.0)}, buf)
    finally:
        for f, module in saved:
            f.__module__ = module

    allowlist = [
        (multiarray._reconstruct, "numpy.core.multiarray._reconstruct"),  # the name the checkpoint writes
        (multiarray.scalar, "numpy.core.multiarray.scalar"),
        np.dtype,
        np.ndarray,
        type(np.dtype("float64")),
    ]
    buf.seek(0)
    try:  # the live objects alone: torch refuses
        with torch.serialization.safe_globals(allowlist[2:] + [multiarray._reconstruct, multiarray.scalar]):
            torch.load(buf, weights_only=True)
        raise SystemExit("expected a refusal")
    except pickle.UnpicklingError as e:
        assert "numpy.core.multiarray" in str(e), e
    buf.seek(0)
    with torch.serialization.safe_globals(allowlist):
        print(torch.load(buf, weights_only=True))
