"""Reading a pickle stream: argument layouts, arguments, and the errors of a damaged or over-limit
stream -- the part of the walk (:mod:`.walker`) that knows nothing of torch."""

from __future__ import annotations

import pickletools
import re
from pickletools import TAKEN_FROM_ARGUMENT1, TAKEN_FROM_ARGUMENT4, TAKEN_FROM_ARGUMENT4U, TAKEN_FROM_ARGUMENT8U
from typing import Any

from .errors import CheckpointFormatError
from .model import BOOL, INT, ScanLimits

_FIXED, _COUNTED, _LINE, _TWO_LINES = range(4)
_DIGITS = re.compile(rb"\s*[+-]?\d+(?:_\d+)*\s*")  # what int() reads in base 10
_WIDTHS = {TAKEN_FROM_ARGUMENT1: 1, TAKEN_FROM_ARGUMENT4: 4, TAKEN_FROM_ARGUMENT4U: 4, TAKEN_FROM_ARGUMENT8U: 8}


def _layout(arg: Any) -> tuple[int, int]:
    if arg is None or arg.n >= 0:
        return (_FIXED, arg.n if arg is not None else 0)
    if arg.name == "stringnl_noescape_pair":
        return (_TWO_LINES, 0)
    return (_LINE, 0) if arg.n == pickletools.UP_TO_NEWLINE else (_COUNTED, _WIDTHS[arg.n])


#: Opcode byte -> (how its argument is laid out, its size or the width of its length), from the stdlib's table.
ARG: dict[int, tuple[int, int]] = {ord(op.code): _layout(op.arg) for op in pickletools.opcodes}
NAMES = {ord(op.code): op.name for op in pickletools.opcodes}


def TruncatedStream(message: str) -> CheckpointFormatError:  # noqa: N802 - raised like a class
    """A plain CheckpointFormatError marked (``truncated = True``): the stream ends inside an opcode or
    before STOP, and more bytes may complete it (a legacy stream is read in chunks)."""
    e = CheckpointFormatError(message)
    e.truncated = True  # type: ignore[attr-defined]
    return e


def damaged(what: str, pos: int, truncated: bool = False) -> CheckpointFormatError:  # truncated: more may complete it
    message = f"the pickle stream is truncated or damaged: {what} at byte {pos}"
    return TruncatedStream(message) if truncated else CheckpointFormatError(message)


def need(stack: list[Any], k: int, at: int, floor: int = 0) -> None:  # floor: the innermost open MARK's height
    if len(stack) - floor < k:
        raise underflow(k, at)


def underflow(k: int, at: int) -> CheckpointFormatError:
    return damaged(f"stack underflow (needs {k} value{'s' if k > 1 else ''} above the last MARK, if any)", at)


def over_limit(limits: ScanLimits, name: str, what: str, trusted_to: str = "be that large") -> CheckpointFormatError:
    """*what* (its last ``{}`` names the limit; file text may precede it) went over it; says how to raise it."""
    what = f"ScanLimits.{name}={getattr(limits, name)}".join(what.rsplit("{}", 1))
    return CheckpointFormatError(
        f"{what}; raise it with scan_limits({name}=...) if the checkpoint is trusted to {trusted_to}"
    )


def memo_error(limits: ScanLimits) -> CheckpointFormatError:
    return over_limit(limits, "max_memo_entries", "the pickle stores more than {} memo entries")


def check_budget(n: int, budget: int, depth: int, memo: int, limits: ScanLimits) -> int:
    """The caps that bound time and memory, checked every 1024 opcodes; returns *n*."""
    if n > budget:
        raise over_limit(limits, "max_opcodes", "the pickle has more than {} opcodes")
    if depth > limits.max_stack_depth:
        raise over_limit(limits, "max_stack_depth", "the pickle stack grew past {} entries")
    if memo > limits.max_memo_entries:
        raise memo_error(limits)
    return n


def text_int(raw: bytes, code: int, at: int, limits: ScanLimits) -> Any:  # INT, LONG (protocol 0/1)
    text = raw[:-1] if code == 0x4C and raw.endswith(b"L") else raw
    if len(text) > limits.max_int_digits:
        raise over_limit(limits, "max_int_digits", f"an integer of {len(text)} digits at byte {at} exceeds {{}}")
    if code == 0x49 and text in (b"00", b"01"):
        return BOOL
    if _DIGITS.fullmatch(text) is None:
        raise damaged("an integer that is not a number", at)
    return int(text) if len(text) <= 40 else INT  # int() takes time quadratic in the digits: not worth it


def read_argument(data: bytes, pos: int, spec: tuple[int, int], limits: ScanLimits, at: int) -> tuple[Any, int]:
    """The argument (laid out as *spec*) of the opcode at *at*, starting at *pos*, and the position
    after it: raw bytes, ``(start, length)`` of a counted argument, a text line or a pair of them."""
    kind, size = spec
    end = len(data)
    if kind == _FIXED:
        if not size:
            return None, pos
        if pos + size > end:
            raise damaged("truncated argument", at, truncated=True)
        return data[pos : pos + size], pos + size
    if kind == _COUNTED:
        if pos + size > end:
            raise damaged("truncated length", at, truncated=True)
        length = int.from_bytes(data[pos : pos + size], "little")
        pos += size
        if length > end - pos:
            raise damaged(f"a {length}-byte argument beyond the end of the stream", at, truncated=True)
        return (pos, length), pos + length
    max_name = limits.max_name_length
    window = pos + max_name + limits.max_int_digits + 2
    nl = data.find(b"\n", pos, min(end, window))
    if nl < 0:
        raise damaged("a text argument without newline (or longer than the limits)", at, truncated=window > end)
    arg: Any = data[pos:nl]
    pos = nl + 1
    if kind == _TWO_LINES:
        nl = data.find(b"\n", pos, min(end, pos + max_name + 2))
        if nl < 0:
            what = "a global name without newline (or longer than ScanLimits.max_name_length)"
            raise damaged(what, at, truncated=pos + max_name + 2 > end)
        arg = (arg, data[pos:nl])
        pos = nl + 1
    return arg, pos


def checked_global_name(module: str, name: str, at: int, limits: ScanLimits) -> None:
    """Refuse a global name no module can have, or longer than the limits allow."""
    if (length := len(module) + len(name) + 1) > limits.max_name_length:
        raise over_limit(limits, "max_name_length", f"a global name of {length} characters at byte {at} exceeds {{}}")
    try:
        (module + name).encode("utf-8")
    except UnicodeEncodeError:
        raise CheckpointFormatError(
            f"a global name at byte {at} contains a lone surrogate ({(module + '.' + name)!a}): "
            "no module can have that name"
        ) from None


def stream_error(e: Exception, pos: int, end: int, at: int) -> CheckpointFormatError:
    """What an exception escaping the walk of the opcode at *at* means (*end*: the stream's length)."""
    if isinstance(e, IndexError):
        if pos >= end:
            return TruncatedStream("the pickle stream ended early (no STOP opcode): the checkpoint is truncated")
        if at + 9 >= end:  # an opcode's fixed argument (at most 8 bytes) past the end
            return damaged("an argument past the end of the stream", at, truncated=True)
        return damaged("stack underflow, or an argument past the end of the stream", at)
    if isinstance(e, KeyError):
        return damaged(f"memo entry {e} read before it was written", at)
    if isinstance(e, UnicodeDecodeError):
        return damaged("a string that is not UTF-8", at)
    return damaged(f"{type(e).__name__}: {e}", at)


def memo_index(arg: bytes, opcode: str, at: int) -> int:  # PUT, GET: pickle's C unpickler reads 19 digits at most
    if len(arg) > 24 or _DIGITS.fullmatch(arg) is None:
        raise damaged(f"{opcode} with an index that is not an integer of at most 19 digits", at)
    return int(arg)


def text_value(code: int, arg: Any, data: bytes, max_name: int) -> Any:
    """What STRING, UNICODE, SHORT_BINSTRING or BINSTRING pushes as torch reads it (UTF-8 text):
    the str while short, None when too long (or empty) to keep, the bytes when not UTF-8."""
    if code == 0x53 or code == 0x56:
        raw = arg
        if code == 0x53 and len(raw) >= 2 and raw[:1] == raw[-1:] and raw[:1] in (b"'", b'"'):
            raw = raw[1:-1]
    else:
        p, length = arg
        raw = data[p : p + length] if length <= max_name else b""
    if not 0 < len(raw) <= max_name:
        return None
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return raw
