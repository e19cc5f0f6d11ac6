"""Exceptions raised by torch_serial_testing; every message names the problem and the fix.

Configuration mistakes are ``ValueError`` subclasses, raised when a class is created or instantiated;
outcome mismatches are ``AssertionError`` subclasses, so test runners report failures, not errors.
"""

from __future__ import annotations

from typing import Any

from .names import escape_text

__all__ = [
    "RoundTripConfigError",
    "UnsafeLoadRefused",
    "CheckpointFormatError",
    "ConflictingEnvironmentError",
    "UnexpectedLoadOutcome",
    "AllowlistError",
    "LeakedGlobalStateError",
]


class _EscapedMessage(Exception):
    """Messages name things from checkpoints and declarations: non-printable characters are shown escaped."""

    def __init__(self, *args: Any) -> None:
        super().__init__(*(escape_text(a, keep_newlines=True) if isinstance(a, str) else a for a in args))


class RoundTripConfigError(_EscapedMessage, ValueError):
    """A test class, dimension or argument is declared wrongly."""


class UnsafeLoadRefused(_EscapedMessage, RuntimeError):
    """A full-pickle (``weights_only=False``) load was asked for bytes the library did not produce."""


class CheckpointFormatError(_EscapedMessage, ValueError):
    """The bytes are not a checkpoint the library can read (truncated, damaged, wrong format)."""


class ConflictingEnvironmentError(_EscapedMessage, AssertionError):
    """Both TORCH_FORCE_WEIGHTS_ONLY_LOAD and TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD are set: torch refuses every load."""


class UnexpectedLoadOutcome(_EscapedMessage, AssertionError):
    """torch.load did not do what torch's own rules predict for this mode and environment."""


class AllowlistError(_EscapedMessage, AssertionError):
    """The declared safe globals do not match what the checkpoint needs (missing or over-trusted)."""


class LeakedGlobalStateError(_EscapedMessage, AssertionError):
    """A test changed process-wide state (engine, allocator, registry, environment) and did not restore it."""


def dimension(attr: str, value: Any, example: str) -> tuple[Any, ...]:
    """A class's dimension declaration as a non-empty tuple without repeats, or a clear error."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise RoundTripConfigError(f"{attr} must be a tuple, got {value!r}; write {attr} = {example}")
    items = tuple(value)
    if not items:
        raise RoundTripConfigError(f"{attr} is empty; list at least one (e.g. {attr} = {example}) or leave it as None")
    repeated = sorted({str(x) for x in items if items.count(x) > 1})
    if repeated:
        raise RoundTripConfigError(f"{attr} lists {', '.join(repeated)} more than once")
    return items
