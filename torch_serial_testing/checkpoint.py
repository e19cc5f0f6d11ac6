"""Checkpoint bytes: who produced them, and what a static scan finds in them.

Only bytes :meth:`Checkpoint.save` just wrote with torch's own ``torch.save`` are ever loaded with
``weights_only=False``; others are *foreign*.  The scan walks ``data.pkl`` of the zip archive, read by
torch's own reader, importing and executing nothing, its work bounded (:class:`~.model.ScanLimits`).
Files, TorchScript and the formats before torch 1.6: :mod:`torch_serial_testing.tools.formats`."""

from __future__ import annotations

import io
import os
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable, Optional, Union

from .errors import CheckpointFormatError
from .model import Check, ScanLimits, ScanState, default_scan_limits
from .serialization import genuine
from .unpickler import is_torchscript, walk_rules, zip_reader
from .stream import check_budget, over_limit
from .walker import scan_pickle

#: Told the bytes of every :meth:`Checkpoint.save` (an observer such as the audit's), after the save.
_SAVE_LISTENERS: list[Callable[[bytes], None]] = []
BufferLike = Union[bytes, bytearray, memoryview, IO[bytes], "Checkpoint"]
ZIP_MAGIC = b"PK\x03\x04"


def add_save_listener(listener: Callable[[bytes], None]) -> None:
    """Have *listener* told the bytes of every :meth:`Checkpoint.save` (idempotent): no replacement of
    ``torch.save`` (an observer's wrapper included) sees that save."""
    if listener not in _SAVE_LISTENERS:
        _SAVE_LISTENERS.append(listener)


@dataclass(frozen=True)
class CheckpointInfo:
    """What a static scan found: the format; the globals as torch's weights-only unpickler spells them
    (Python-2 renames applied); the opcodes it refuses; why no allowlist can make it load this (TorchScript,
    an unsupported opcode, SETITEM on a defaultdict...); every global a *full* unpickle resolves; the checks
    it would make (in its order, no duplicates); the work done; every format torch may read the bytes as
    (``("tar", "legacy")``: a path is read as tar, ``io.BytesIO`` as legacy; the rest covers both)."""

    format: str
    globals: tuple[str, ...]
    nbytes: int
    unsupported_opcodes: tuple[str, ...] = ()
    weights_only_blocker: Optional[str] = None
    full_load_globals: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    opcodes_walked: int = 0
    bytes_scanned: int = 0
    memo_entries: int = 0
    readings: tuple[str, ...] = ()

    @property
    def type_checks(self) -> tuple[str, ...]:
        """Types BUILD is applied to that must be allowlisted (e.g. ``numpy.dtypes.Float64DType``)."""
        return tuple(c.name for c in self.checks if c.kind == "type")


class Checkpoint:
    """Checkpoint bytes plus whether this process produced them: :meth:`save` for your own (the only
    ones ever loaded with ``weights_only=False``), :meth:`from_bytes` / :meth:`from_buffer` for others."""

    __slots__ = ("_buffer", "_owned", "_info")

    def __init__(self, buffer: Union[bytes, IO[bytes]], *, _owned: bool = False) -> None:
        self._buffer, self._owned = buffer.getvalue() if isinstance(buffer, io.BytesIO) else buffer, _owned
        self._info: Optional[CheckpointInfo] = None

    @classmethod
    def save(cls, obj: Any) -> Checkpoint:
        """``torch.save`` *obj* into a private in-memory buffer, with torch's own function: a replaced
        ``torch.save`` could write any bytes into a buffer that is then trusted with a full load."""
        buffer = io.BytesIO()
        genuine("save")(obj, buffer)
        for listener in tuple(_SAVE_LISTENERS):
            listener(buffer.getvalue())  # the very bytes object the checkpoint keeps (never copied)
        return cls(buffer, _owned=True)

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> Checkpoint:
        """Wrap foreign bytes; they will only ever be loaded weights-only."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"Checkpoint.from_bytes expects bytes, got {type(data).__name__}; "
                "use Checkpoint.from_buffer for file objects"
            )
        return cls(bytes(data))

    @classmethod
    def from_buffer(cls, f: BufferLike) -> Checkpoint:
        """Wrap a foreign buffer or binary file object (read into memory once, from where it is)."""
        if isinstance(f, Checkpoint):
            return f
        if isinstance(f, (bytes, bytearray, memoryview)):
            return cls.from_bytes(f)
        if isinstance(f, (str, os.PathLike)):
            raise TypeError(
                f"Checkpoint.from_buffer takes bytes or a buffer, not the path {os.fspath(f)!r}: files are read by "
                "torch_serial_testing.tools.FileCheckpoint.from_path(path)"
            )
        _require_binary_seekable(f)
        start, data = f.tell(), f.read()
        f.seek(start)
        return cls(data)

    @property
    def owned(self) -> bool:
        return self._owned

    @property
    def nbytes(self) -> int:
        return len(self._buffer) if isinstance(self._buffer, bytes) else os.fstat(self._buffer.fileno()).st_size

    @property
    def info(self) -> CheckpointInfo:
        """The static scan, computed once (under the default :class:`~.model.ScanLimits`)."""
        if self._info is None:
            small = _small_checkpoint_info(self._buffer, self._read)
            self._info = small or _scan(self.rewound(), default_scan_limits(), self._read)
        return self._info

    @property
    def scan_key(self) -> Any:  # what info is a function of, cheaply and stably: a small buffer's bytes, or the scan
        small = isinstance(self._buffer, bytes) and len(self._buffer) <= _SMALL_CHECKPOINT
        return self._buffer if small else self.info

    def _read(self, f: IO[bytes], nbytes: int, state: ScanState) -> str:
        """Walk what torch would unpickle from *f* into *state*; the format (a subclass reads more)."""
        return read_zip(f, nbytes, state)

    @property
    def format(self) -> str:
        """``zip`` or ``torchscript`` (``legacy``, ``tar``: the tools).  Known without a scan for a zip
        archive :meth:`save` wrote (``torch.save`` writes no ``constants.pkl``): a full load needs no scan."""
        if self._info is None and self._owned and isinstance(self._buffer, bytes) and self._buffer[:4] == ZIP_MAGIC:
            return "zip"
        return self.info.format

    def rewound(self) -> IO[bytes]:
        """A new ``io.BytesIO`` over the immutable bytes each call (what :meth:`save` wrote stays); a file: rewound."""
        if isinstance(self._buffer, bytes):
            return io.BytesIO(self._buffer)  # shares the bytes until written to
        self._buffer.seek(0)
        return self._buffer

    def __repr__(self) -> str:
        return f"<Checkpoint {'owned' if self._owned else 'foreign'} {self.nbytes} bytes>"


# Scans of small checkpoints by content: a test file saves the same module once per load mode and engine,
# byte-identical each time.  A scan depends on the bytes, the limits, this torch's rules, the reader and whether
# numpy is imported; failed scans and scans without this torch's rules are not kept.
_SMALL_CHECKPOINT, _SMALL_ENTRIES = 64 * 1024, 64
_small_infos: dict[tuple[Any, ...], tuple[ScanLimits, Any, CheckpointInfo]] = {}
_small_lock = threading.Lock()


def _small_checkpoint_info(buffer: Union[bytes, IO[bytes]], read: Any) -> Optional[CheckpointInfo]:
    """The scan of a checkpoint of at most 64 KiB, remembered by content; None for larger ones (and files)."""
    if not isinstance(buffer, bytes) or len(buffer) > _SMALL_CHECKPOINT:
        return None
    limits, rules = default_scan_limits(), walk_rules()
    key = (buffer, id(limits), id(rules), getattr(read, "__func__", read), "numpy" in sys.modules)
    if (known := _small_infos.get(key)) is None or known[0] is not limits or known[1] is not rules:
        known = (limits, rules, _scan(io.BytesIO(key[0]), limits, read))
        if rules.rules is not None:
            with _small_lock:
                if len(_small_infos) >= _SMALL_ENTRIES:
                    _small_infos.pop(next(iter(_small_infos)), None)
                _small_infos[key] = known  # keeps them alive: their ids stay theirs
    return known[2]


def _require_binary_seekable(f: Any) -> None:
    if not hasattr(f, "read"):
        raise TypeError(
            f"expected a checkpoint buffer (bytes, io.BytesIO, a file opened 'rb' or a "
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


def scan_checkpoint(f: BufferLike, *, limits: Optional[ScanLimits] = None) -> CheckpointInfo:
    """The format, the globals and torch's weights-only checks of *f* (bytes, a binary buffer from where
    it is positioned, or a :class:`Checkpoint`), without unpickling it.  Raises :class:`CheckpointFormatError`
    naming what is wrong for empty, truncated, damaged, unrecognised or over-*limits* bytes."""
    if isinstance(f, (str, os.PathLike)):
        raise TypeError(
            f"scan_checkpoint takes bytes, a buffer or a Checkpoint, not the path {os.fspath(f)!r}: files are "
            "read by torch_serial_testing.tools.scan_checkpoint(path)"
        )
    checkpoint = f if isinstance(f, Checkpoint) else Checkpoint.from_buffer(f)
    if limits is None or limits == default_scan_limits():
        return checkpoint.info
    return _scan(checkpoint.rewound(), limits, checkpoint._read)


def _scan(f: IO[bytes], limits: ScanLimits, read: Callable[[IO[bytes], int, ScanState], str]) -> CheckpointInfo:
    nbytes = f.seek(0, io.SEEK_END)
    f.seek(0)
    if nbytes == 0:
        raise CheckpointFormatError("the checkpoint is empty (0 bytes): was the buffer rewound or written at all?")
    state = ScanState(limits)
    try:
        fmt = read(f, nbytes, state)
    finally:
        f.seek(0)
    check_budget(state.opcodes, limits.max_opcodes, 0, 0, limits)  # the walk checks every 1024 opcodes only
    return CheckpointInfo(
        format=fmt,
        globals=tuple(sorted(state.globals)),
        nbytes=nbytes,
        unsupported_opcodes=tuple(sorted(state.refused_opcodes)),
        weights_only_blocker=next((c.message for c in state.checks if c.kind == "refused"), None),
        full_load_globals=tuple(sorted(state.full_load_globals)),
        checks=tuple(state.checks),
        opcodes_walked=state.opcodes,
        bytes_scanned=state.bytes_scanned,
        memo_entries=state.max_memo,
        readings=state.readings or (fmt,),
    )


def read_zip(f: IO[bytes], nbytes: int, state: ScanState, torchscript: Optional[Callable[..., str]] = None) -> str:
    """Walk the pickle torch would unpickle from the zip archive *f*; the format.  A TorchScript archive
    goes to *torchscript* (``(state) -> format``, the tools'), else raises."""
    head = f.read(4)
    f.seek(0)
    if head != ZIP_MAGIC:
        raise CheckpointFormatError(
            f"not a zip archive (the first bytes are {head!r}): torch.save has written zip archives since "
            "torch 1.6; read other formats (legacy streams, tar archives) and files with "
            "torch_serial_testing.tools.scan_checkpoint"
        )
    try:
        reader = zip_reader(f)
    except (RuntimeError, ValueError, OSError) as e:
        raise CheckpointFormatError(
            f"the zip archive is truncated or its central directory is damaged (torch's reader: {_one_line(e)}); "
            "re-save the checkpoint"
        ) from None
    try:
        if is_torchscript(reader):
            if torchscript is None:
                raise CheckpointFormatError(
                    "this is a TorchScript archive (torch.jit.save wrote it): torch.load hands it to torch.jit.load; "
                    "read it with torch_serial_testing.tools.scan_checkpoint"
                )
            return torchscript(state)
        # What torch.load checks before it unpickles, in its order (torch 2.13, asked by crafted archives).
        for name, valid in (("byteorder", (b"little", b"big").__contains__), (".storage_alignment", _int_literal)):
            if reader.has_record(name) and not valid(raw := _record(reader, name, state)):
                raise CheckpointFormatError(
                    f"torch.load raises on this archive in every mode, before it unpickles anything: its {name} "
                    f"record is {raw[:40]!r}, not {'little or big' if name == 'byteorder' else 'an integer'}; "
                    "re-save the checkpoint"
                )
        if not reader.has_record("data.pkl"):
            raise CheckpointFormatError(
                "the zip archive has no data.pkl record (torch.load would fail): not a torch.save checkpoint"
            )
        data = _record(reader, "data.pkl", state)
    except RuntimeError as e:
        raise CheckpointFormatError(f"torch cannot read the zip archive: {_one_line(e)}") from None
    scan_pickle(data, 0, state, zip_format=True)
    return "zip"


def _record(reader: Any, name: str, state: ScanState) -> bytes:  # its size capped before it is decompressed
    if (size_of := getattr(reader, "get_record_size", None)) is not None:
        _cap(size_of(name), name, state)
    data: bytes = reader.get_record(name)
    _cap(len(data), name, state)
    return data


def _int_literal(raw: bytes) -> bool:  # torch reads .storage_alignment with int()
    try:
        return int(raw) is not None
    except ValueError:
        return False


def _one_line(e: BaseException) -> str:
    """The first line of *e*, without the boilerplate torch's reader appends ("This is an internal miniz error...")."""
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return first.split(". This is an internal miniz error")[0].split("  (Could this error")[0]


def _cap(size: int, what: str, state: ScanState) -> None:
    limits = state.limits
    if size > limits.max_pickle_bytes:
        raise over_limit(limits, "max_pickle_bytes", f"{what} is {size} bytes, over {{}}")
    if state.bytes_scanned + size > limits.max_scan_bytes:
        raise over_limit(limits, "max_scan_bytes", "the checkpoint's pickles exceed {}")
