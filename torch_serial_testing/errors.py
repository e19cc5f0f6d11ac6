"""Exceptions raised by torch_serial_testing.

Every error names the problem and the fix.  Configuration mistakes are
``ValueError``/``TypeError`` subclasses so they surface at class creation or
instantiation time; outcome mismatches are ``AssertionError`` subclasses so
test runners report them as failures, not errors.
"""

from __future__ import annotations

__all__ = [
    "RoundTripConfigError",
    "UnsafeLoadRefused",
    "CheckpointFormatError",
    "ConflictingEnvironmentError",
    "UnexpectedLoadOutcome",
    "AllowlistError",
    "LeakedGlobalStateError",
]


class RoundTripConfigError(ValueError):
    """A test class, dimension or argument is declared wrongly."""


class UnsafeLoadRefused(RuntimeError):
    """A full-pickle (``weights_only=False``) load was asked for bytes the library did not produce."""


class CheckpointFormatError(ValueError):
    """The bytes are not a checkpoint the library can read (truncated, damaged, wrong format)."""


class ConflictingEnvironmentError(AssertionError):
    """Both TORCH_FORCE_WEIGHTS_ONLY_LOAD and TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD are set: torch refuses every load."""


class UnexpectedLoadOutcome(AssertionError):
    """torch.load did not do what torch's own rules predict for this mode and environment."""


class AllowlistError(AssertionError):
    """The declared safe globals do not match what the checkpoint needs (missing or over-trusted)."""


class LeakedGlobalStateError(AssertionError):
    """A test changed process-wide state (engine, allocator, registry, environment) and did not restore it."""
