"""torch's own deprecation warnings that the library's saving and loading provoke.

Rebuilding quantized tensors and storages while loading makes torch 2.13 warn
(quantized tensor creation, ``TypedStorage``); torch 2.4 announces its default flip on
every bare ``torch.load``.  Those are torch internals, not
the test's code: the library ignores exactly them around its own torch calls,
so ``python -m unittest -v`` output stays outcomes, and every other warning shows.
"""

from __future__ import annotations

import contextlib
import warnings
from typing import Iterator

__all__ = ["TORCH_INTERNAL_WARNINGS", "TORCH_DEFAULT_FLIP_WARNING", "quiet_torch_internals"]

#: torch deprecation warnings that saving and loading quantized modules provoke inside torch
#: (rebuilding quantized tensors, storages); the library quiets them around its own save/load.
TORCH_INTERNAL_WARNINGS = (
    r".*quantized tensor creation functions.*",
    r"TypedStorage is deprecated",
)

#: torch 2.4-2.5's FutureWarning on every bare ``torch.load`` (the announcement that the default
#: weights_only would flip).  The library's default mode makes that bare call on purpose: the
#: announcement is about torch, not about the test, so the library quiets it around its own loads.
TORCH_DEFAULT_FLIP_WARNING = r"You are using `torch\.load` with `weights_only=False` \(the current default value\)"


@contextlib.contextmanager
def quiet_torch_internals() -> Iterator[None]:
    """Ignore :data:`TORCH_INTERNAL_WARNINGS` raised inside the library's own torch calls only."""
    with warnings.catch_warnings():
        for message in TORCH_INTERNAL_WARNINGS:
            warnings.filterwarnings("ignore", message=message, category=UserWarning)
        warnings.filterwarnings("ignore", message=TORCH_DEFAULT_FLIP_WARNING, category=FutureWarning)
        yield
