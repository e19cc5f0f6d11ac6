"""A torchao-style package for the fresh-interpreter tests: its tensor subclass is allowlisted when the package is
imported (``torch.serialization.add_safe_globals`` at import, as torchao does for its own), not where it is
defined -- so a checkpoint holding one loads weights-only only where ``test.paths.aolike`` was imported."""

import torch

from .tensors import ScaledTensor

torch.serialization.add_safe_globals([ScaledTensor])

__all__ = ["ScaledTensor"]
