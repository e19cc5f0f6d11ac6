"""Checkpoint bytes: who produced them, what format they are, which globals they name.

Two ideas live here.  First, *ownership*: a :class:`Checkpoint` made by
:meth:`Checkpoint.save` holds bytes this process just wrote with
``torch.save``; only such a checkpoint may ever be loaded with
``weights_only=False``.  Bytes from anywhere else are *foreign* and are only
ever loaded by torch's weights-only unpickler.

Second, a *static scan*: the globals a checkpoint names are read from its pickle
opcodes with :mod:`pickletools`, which never executes anything.  Only the small
``data.pkl`` record is read; tensor storages are never touched.
"""

from __future__ import annotations

import functools
import io
import os
import pickletools
import re
import tarfile
import zipfile
from dataclasses import dataclass
from typing import IO, Any, Iterator, Optional, Union

from .errors import CheckpointFormatError

__all__ = ["Checkpoint", "CheckpointInfo", "scan_checkpoint", "FORMATS", "WEIGHTS_ONLY_OPCODES"]

#: Formats :func:`scan_checkpoint` recognises.
FORMATS = ("zip", "torchscript", "legacy", "tar")

_ZIP_MAGIC = b"PK\x03\x04"
# torch.serialization.MAGIC_NUMBER, the first pickle of the legacy (pre-1.6) format.
_LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_UNRESOLVED = "<unresolved STACK_GLOBAL>"

BufferLike = Union[bytes, bytearray, memoryview, IO[bytes], "os.PathLike[str]", str, "Checkpoint"]


@dataclass(frozen=True)
class CheckpointInfo:
    """What a static scan found: the format and every global the pickle names (sorted)."""

    format: str
    globals: tuple[str, ...]
    nbytes: int
    #: Opcodes torch's weights-only unpickler refuses ("Unsupported operand"), e.g. STACK_GLOBAL.
    unsupported_opcodes: tuple[str, ...] = ()

    @property
    def unresolved(self) -> bool:
        """True when a global is built at unpickling time and cannot be named statically."""
        return any(g.startswith("<") for g in self.globals)


class Checkpoint:
    """Checkpoint bytes plus whether this process produced them.

    Use :meth:`save` for bytes of your own (the only ones that may be loaded
    with ``weights_only=False``) and :meth:`from_bytes` / :meth:`from_buffer`
    for anything else.
    """

    __slots__ = ("_buffer", "_owned", "_info")

    def __init__(self, buffer: io.BytesIO, *, _owned: bool = False) -> None:
        self._buffer = buffer
        self._owned = _owned
        self._info: Optional[CheckpointInfo] = None

    @classmethod
    def save(cls, obj: Any) -> "Checkpoint":
        """``torch.save`` *obj* into a private in-memory buffer (no copy is ever made of it)."""
        import torch

        buffer = io.BytesIO()
        torch.save(obj, buffer)
        return cls(buffer, _owned=True)

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> "Checkpoint":
        """Wrap foreign bytes; they will only ever be loaded weights-only."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"Checkpoint.from_bytes expects bytes, got {type(data).__name__}; "
                "use Checkpoint.from_buffer for file objects"
            )
        return cls(io.BytesIO(bytes(data)))

    @classmethod
    def from_buffer(cls, f: BufferLike) -> "Checkpoint":
        """Wrap a foreign buffer, file object or path (read into memory once)."""
        if isinstance(f, Checkpoint):
            return f
        if isinstance(f, (bytes, bytearray, memoryview)):
            return cls.from_bytes(f)
        if isinstance(f, (str, os.PathLike)):
            with open(f, "rb") as fh:
                return cls(io.BytesIO(fh.read()))
        _require_binary_seekable(f)
        start = f.tell()
        data = f.read()
        f.seek(start)
        return cls(io.BytesIO(data))

    @property
    def owned(self) -> bool:
        """True only for bytes produced by :meth:`save` in this process."""
        return self._owned

    @property
    def nbytes(self) -> int:
        return self._buffer.getbuffer().nbytes

    @property
    def info(self) -> CheckpointInfo:
        """The static scan, computed once."""
        if self._info is None:
            self._info = scan_checkpoint(self.rewound())
        return self._info

    def rewound(self) -> io.BytesIO:
        """The underlying buffer at position 0 (for ``torch.load``)."""
        self._buffer.seek(0)
        return self._buffer

    def __repr__(self) -> str:
        kind = "owned" if self._owned else "foreign"
        return f"<Checkpoint {kind} {self.nbytes} bytes>"


def _require_binary_seekable(f: Any) -> None:
    if not hasattr(f, "read"):
        raise TypeError(
            f"expected a checkpoint buffer (bytes, io.BytesIO, a file opened 'rb', a path or a "
            f"Checkpoint), got {type(f).__name__}"
        )
    seekable = getattr(f, "seekable", None)
    if seekable is None or not seekable():
        raise CheckpointFormatError(
            "the checkpoint stream is not seekable (a pipe or socket?); read it into memory first: "
            "io.BytesIO(stream.read())"
        )
    if isinstance(f, io.TextIOBase):
        raise TypeError("the checkpoint file is open in text mode; open it with 'rb'")


def scan_checkpoint(f: BufferLike) -> CheckpointInfo:
    """Return the format and the globals a checkpoint names, without unpickling it.

    Raises :class:`CheckpointFormatError` naming what is wrong for empty,
    truncated, damaged or unrecognised bytes.
    """
    if isinstance(f, Checkpoint):
        return f.info
    if isinstance(f, (bytes, bytearray, memoryview)):
        f = io.BytesIO(bytes(f))
    elif isinstance(f, (str, os.PathLike)):
        with open(f, "rb") as fh:
            return scan_checkpoint(io.BytesIO(fh.read()))
    _require_binary_seekable(f)
    start = f.tell()
    try:
        return _scan(f, start)
    finally:
        f.seek(start)


def _scan(f: IO[bytes], start: int) -> CheckpointInfo:
    f.seek(0, io.SEEK_END)
    nbytes = f.tell() - start
    f.seek(start)
    if nbytes == 0:
        raise CheckpointFormatError("the checkpoint is empty (0 bytes): was the buffer rewound or written at all?")
    head = f.read(4)
    f.seek(start)
    opcodes: set[str] = set()
    if head == _ZIP_MAGIC:
        fmt, globals_ = _scan_zip(f, opcodes)
    elif _is_tar(f, start):
        fmt, globals_ = "tar", _scan_tar(f, opcodes)
    elif head[:1] == b"\x80":
        fmt, globals_ = "legacy", _scan_legacy(f, opcodes)
    else:
        raise CheckpointFormatError(
            f"not a torch checkpoint: the first bytes are {head!r}; expected a zip archive from "
            "torch.save (b'PK\\x03\\x04') or the legacy pickle format"
        )
    return CheckpointInfo(fmt, tuple(sorted(globals_)), nbytes, tuple(sorted(opcodes)))


def _scan_zip(f: IO[bytes], opcodes: set[str]) -> tuple[str, set[str]]:
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, EOFError, OSError, ValueError) as e:
        raise CheckpointFormatError(
            f"the zip archive is truncated or its central directory is damaged ({e}); "
            "re-save the checkpoint"
        ) from None
    with archive:
        names = archive.namelist()
        if any(n.endswith("/constants.pkl") or n == "constants.pkl" for n in names):
            return "torchscript", set()
        data = [n for n in names if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(data) != 1:
            raise CheckpointFormatError(
                f"the zip archive has {len(data)} '<name>/data.pkl' records, expected exactly one: "
                "not a torch.save checkpoint"
            )
        try:
            pkl = archive.read(data[0])
        except (zipfile.BadZipFile, EOFError, OSError, ValueError, NotImplementedError) as e:
            raise CheckpointFormatError(f"cannot read {data[0]!r} from the archive: {e}") from None
    return "zip", _pickle_globals(io.BytesIO(pkl), 1, opcodes)


def _is_tar(f: IO[bytes], start: int) -> bool:
    f.seek(start)
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            return tar.next() is not None
    except (tarfile.TarError, EOFError, OSError, ValueError):
        return False
    finally:
        f.seek(start)


def _scan_tar(f: IO[bytes], opcodes: set[str]) -> set[str]:
    found: set[str] = set()
    try:
        with tarfile.open(fileobj=f, mode="r:") as tar:
            for member in ("sys_info", "pickle"):
                try:
                    extracted = tar.extractfile(member)
                except KeyError:
                    if member == "pickle":
                        raise CheckpointFormatError(
                            "the tar archive has no 'pickle' member: not a legacy torch checkpoint"
                        ) from None
                    continue
                if extracted is not None:
                    found |= _pickle_globals(io.BytesIO(extracted.read()), 1, opcodes)
    except tarfile.TarError as e:
        raise CheckpointFormatError(f"the legacy tar checkpoint is damaged: {e}") from None
    return found


def _scan_legacy(f: IO[bytes], opcodes: set[str]) -> set[str]:
    # magic number, protocol version, sys_info, the object, the storage keys.
    ops = list(_genops(f))
    magic = next((arg for op, arg, _ in ops if op.name in ("LONG1", "LONG4", "LONG")), None)
    if magic != _LEGACY_MAGIC:
        raise CheckpointFormatError(
            "a pickle stream, but not a torch checkpoint (no torch magic number): "
            "torch.load would refuse it"
        )
    return _pickle_globals(f, 4, opcodes)


def _genops(f: IO[bytes]) -> Iterator[tuple[Any, Any, Any]]:
    try:
        yield from pickletools.genops(f)
    except (ValueError, EOFError, UnicodeDecodeError, KeyError) as e:
        raise CheckpointFormatError(f"the pickle stream is truncated or damaged: {e}") from None


_STRING_OPS = frozenset(
    ["SHORT_BINUNICODE", "BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING"]
)


# The opcodes torch 2.13's weights-only unpickler handles (torch/_weights_only_unpickler.py,
# Unpickler.load); any other one makes it raise "Unsupported operand <code>".  Read from torch's
# own source when it is available (see weights_only_opcodes), this is the fallback.
WEIGHTS_ONLY_OPCODES = frozenset(
    "GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 "
    "NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 "
    "BINFLOAT BINUNICODE SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT LONG1 "
    "PROTO STOP".split()
)


@functools.lru_cache(maxsize=1)
def weights_only_opcodes() -> frozenset[str]:
    """The opcodes this torch's weights-only unpickler accepts, read from its source."""
    try:
        import inspect

        from torch import _weights_only_unpickler as wou

        source = inspect.getsource(wou.Unpickler.load)
    except (ImportError, AttributeError, OSError, TypeError):
        return WEIGHTS_ONLY_OPCODES
    found = frozenset(re.findall(r"\b([A-Z][A-Z0-9_]*)\[0\]", source)) & frozenset(
        op.name for op in pickletools.opcodes
    )
    return found if "GLOBAL" in found and "STOP" in found else WEIGHTS_ONLY_OPCODES


def _pickle_globals(f: IO[bytes], pickles: int, opcodes: set[str]) -> set[str]:
    """Names of every GLOBAL/INST/STACK_GLOBAL in the next *pickles* pickles of *f*.

    Opcodes outside :data:`WEIGHTS_ONLY_OPCODES` are added to *opcodes*.
    """
    from torch._utils import IMPORT_MAPPING, NAME_MAPPING  # python 2 name fix-ups torch applies

    found: set[str] = set()
    supported = weights_only_opcodes()

    def add(module: str, name: str) -> None:
        if (module, name) in NAME_MAPPING:
            module, name = NAME_MAPPING[(module, name)]
        elif module in IMPORT_MAPPING:
            module = IMPORT_MAPPING[module]
        found.add(f"{module}.{name}")

    for _ in range(pickles):
        recent: list[Any] = []  # values pushed, strings kept, others as None
        memo: dict[Any, Any] = {}
        saw_any = False
        for op, arg, _pos in _genops(f):
            saw_any = True
            name = op.name
            if name not in supported:
                opcodes.add(name)
            if name in ("GLOBAL", "INST"):
                module, _, attr = str(arg).partition(" ")
                add(module, attr)
                recent.append(None)
            elif name == "STACK_GLOBAL":
                if len(recent) >= 2 and isinstance(recent[-1], str) and isinstance(recent[-2], str):
                    add(recent[-2], recent[-1])
                else:
                    found.add(_UNRESOLVED)
                recent[-2:] = [None]
            elif name in _STRING_OPS:
                recent.append(arg if isinstance(arg, str) else bytes(arg).decode("latin-1"))
            elif name in ("PUT", "BINPUT", "LONG_BINPUT"):
                memo[arg] = recent[-1] if recent else None
            elif name == "MEMOIZE":
                memo[len(memo)] = recent[-1] if recent else None
            elif name in ("GET", "BINGET", "LONG_BINGET"):
                recent.append(memo.get(arg))
            elif name in ("EXT1", "EXT2", "EXT4"):
                found.add(f"<extension registry code {arg}>")
                recent.append(None)
            elif name == "STOP":
                break
            else:
                recent.append(None)
            if len(recent) > 64:
                del recent[:-8]
        if not saw_any:
            raise CheckpointFormatError("the pickle stream ended early: the checkpoint is truncated")
    return found
