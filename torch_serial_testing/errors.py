"""Exceptions raised by torch_serial_testing, and how names in their messages are shown.

Configuration mistakes are ``ValueError`` subclasses, raised when a class is created or instantiated;
outcome mismatches are ``AssertionError`` subclasses, so test runners report failures, not errors.
Messages name things from checkpoints and declarations: non-printable characters are shown escaped."""

from __future__ import annotations

import keyword
import re
import sys
from typing import Any, Optional


class _EscapedMessage(Exception):
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


class ProbeFailed(Exception):
    """A probe of torch could not run or be read: what needs the fact becomes unknown, never a guess."""


def innermost_frame(error: BaseException) -> Any:  # None without a traceback
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame


def dimension(attr: str, value: Any, example: str) -> tuple[Any, ...]:
    """A class's dimension declaration as a non-empty tuple without repeats, or a clear error."""
    if isinstance(value, (str, bytes)) or not hasattr(value, "__iter__"):
        raise RoundTripConfigError(f"{attr} must be a tuple, got {value!r}; write {attr} = {example}")
    if not (items := tuple(value)):
        raise RoundTripConfigError(f"{attr} is empty; list at least one (e.g. {attr} = {example}) or leave it as None")
    if repeated := sorted({str(x) for x in items if items.count(x) > 1}):
        raise RoundTripConfigError(f"{attr} lists {', '.join(repeated)} more than once")
    return items


#: Longer names are malformed: no real class path comes near it, and a report must stay readable.
MAX_NAME_LENGTH = 512
_SHOWN = 160  # how much of a malformed name a report shows
_MARKER = re.compile(r"<[A-Za-z0-9_ ]{1,80}>\Z")  # the scanner's "<unresolved STACK_GLOBAL>"


def name_problem(name: Any) -> Optional[str]:
    """Why *name* is not a dotted sequence of ASCII Python identifiers, or None.  ASCII: Python folds
    identifiers with NFKC (``ｅｖａｌ`` *is* ``eval`` in a snippet), and lookalikes would make a report lie."""
    if not isinstance(name, str):
        return f"not a string but {type(name).__name__}"
    if not name:
        return "empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"{len(name)} characters long (limit {MAX_NAME_LENGTH})"
    if not name.isascii():
        return "contains non-ASCII characters"
    for part in name.split("."):
        if not part:
            return "has an empty part (a leading, trailing or doubled '.')"
        if not part.isidentifier() or keyword.iskeyword(part):
            shown = ascii(part) if len(part) <= 40 else f"{ascii(part[:40])}..."
            return f"part {shown} is " + ("a Python keyword" if part.isidentifier() else "not a Python identifier")
    return None if "." in name else "has no module part ('module.Name')"


def is_marker(name: Any) -> bool:
    return isinstance(name, str) and _MARKER.match(name) is not None


def show_name(name: Any) -> str:
    """*name* fit for any text output: as is when valid, else ``ascii()``-quoted and shortened."""
    if name_problem(name) is None or is_marker(name):
        return str(name)
    if not isinstance(name, str):
        return f"<{type(name).__name__}>"
    return f"{ascii(name[:_SHOWN])}...({len(name)} characters)" if len(name) > _SHOWN else ascii(name)


def quote_name(name: Any) -> str:
    """``'a.b'`` for a valid name, else the ``ascii()`` form of :func:`show_name`."""
    shown = show_name(name)
    return f"'{shown}'" if shown == name else shown


def _escape_char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_text(text: Any, *, keep_newlines: bool = False) -> str:
    """*text* with every non-printable character (controls, ESC, CR, bidi overrides, lone surrogates)
    shown as a visible ``\\xNN``/``\\uNNNN`` escape; ``keep_newlines`` keeps ``\\n``."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else _escape_char(c) for c in s)


def imported_prefix(name: str) -> int:
    """How many leading parts of dotted *name* form the longest module in ``sys.modules`` (0: none); imports nothing."""
    dots = [i for i, c in enumerate(name) if c == "."]
    cut = len(dots)
    while cut > 0 and name[: dots[cut - 1]] not in sys.modules:
        cut -= 1
    return cut


def torch_key(entry: Any) -> Optional[str]:
    """The name torch's allowlist keys *entry* by: ``name`` of an ``(obj, name)`` pair, else
    ``obj.__module__ + "." + obj.__qualname__`` read as torch reads them; None without those strings."""
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[1]
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) and module else None


def qualified_name(obj: Any) -> str:
    """``module.qualname``: the spelling torch's weights-only unpickler matches *obj* by."""
    if (name := torch_key(obj)) is None:
        raise RoundTripConfigError(
            f"safe global {obj!r} has no __module__/__qualname__; declare the class or function "
            "itself, a 'module.Name' string, or an (object, 'module.Name') tuple"
        )
    return name
