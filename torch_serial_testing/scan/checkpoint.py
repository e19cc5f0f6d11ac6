"""Checkpoint bytes: who produced them, what format they are, which globals they name.

*Ownership*: only a :class:`Checkpoint` made by :meth:`Checkpoint.save` (bytes this process just
wrote with ``torch.save``) may ever be loaded with ``weights_only=False``; bytes from anywhere else
are *foreign* and only ever loaded weights-only.  The *static scan* (:func:`scan_checkpoint`) reads
what torch reads (:mod:`.archive`) and walks it (:mod:`.walker`), importing and executing nothing,
never touching tensor storages, bounded by :mod:`..core.limits`; small checkpoints' scans are
remembered by their bytes (the one scan cache).
"""

from __future__ import annotations

import io
import os
import stat
import sys
import threading
from dataclasses import dataclass
from typing import IO, Any, Callable, Optional, Union

from ..core.errors import CheckpointFormatError
from ..core.limits import ScanLimits, default_scan_limits
from .model import Check, ScanState
from .stream import check_budget
from .walker import walk_rules

__all__ = [
    "Checkpoint",
    "CheckpointInfo",
    "Check",
    "scan_checkpoint",
    "open_regular_file",
    "FORMATS",
    "add_save_listener",
]

#: Told the bytes of every :meth:`Checkpoint.save` (an observer such as the audit's): a copy, after the save.
_SAVE_LISTENERS: list[Callable[[bytes], None]] = []


def add_save_listener(listener: Callable[[bytes], None]) -> None:
    """Have *listener* told the bytes of every :meth:`Checkpoint.save` (idempotent).  The save itself is
    torch's own function, which no replacement of ``torch.save`` (an observer's wrapper included) sees."""
    if listener not in _SAVE_LISTENERS:
        _SAVE_LISTENERS.append(listener)


#: Formats :func:`scan_checkpoint` recognises.
FORMATS = ("zip", "torchscript", "legacy", "tar")

BufferLike = Union[bytes, bytearray, memoryview, IO[bytes], "os.PathLike[str]", str, "Checkpoint"]


@dataclass(frozen=True)
class CheckpointInfo:
    """What a static scan found: the format, the globals the pickles name and the checks torch's
    weights-only unpickler would make (in its order, duplicates dropped)."""

    format: str
    #: Globals as torch's weights-only unpickler spells them (its Python-2 renames applied), sorted.
    globals: tuple[str, ...]
    nbytes: int
    #: Opcodes torch's weights-only unpickler refuses ("Unsupported operand"), e.g. STACK_GLOBAL.
    unsupported_opcodes: tuple[str, ...] = ()
    #: torch's reason when NO allowlist can make ``weights_only=True`` load this (TorchScript, tar, an
    #: unsupported opcode, SETITEM on a defaultdict, a non-storage persistent id...), else None.
    weights_only_blocker: Optional[str] = None
    #: Every global a *full* unpickle resolves, as it resolves it (``_compat_pickle``, ``load_module_mapping``).
    full_load_globals: tuple[str, ...] = ()
    checks: tuple[Check, ...] = ()
    #: Work the scan did: opcodes walked, pickle bytes read, the largest memo held.
    opcodes_walked: int = 0
    bytes_scanned: int = 0
    memo_entries: int = 0
    #: Every format torch may read the bytes as: one, or ``("tar", "legacy")`` for bytes that are both a
    #: tar archive (what ``torch.load`` of a path reads) and a legacy stream (what it reads from
    #: ``io.BytesIO``); the names and checks above are then those of both readings.
    readings: tuple[str, ...] = ()

    @property
    def type_checks(self) -> tuple[str, ...]:
        """Types BUILD is applied to that must be allowlisted (e.g. ``numpy.dtypes.Float64DType``)."""
        return tuple(c.name for c in self.checks if c.kind == "type")

    @property
    def unresolved(self) -> bool:
        """True when a global is built at unpickling time and cannot be named statically."""
        return any(g.startswith("<") for g in self.globals)


class Checkpoint:
    """Checkpoint bytes plus whether this process produced them: :meth:`save` for your own (the only
    ones ever loaded with ``weights_only=False``), :meth:`from_bytes` / :meth:`from_buffer` for others."""

    __slots__ = ("_buffer", "_owned", "_info")

    def __init__(self, buffer: IO[bytes], *, _owned: bool = False) -> None:
        self._buffer = buffer
        self._owned = _owned
        self._info: Optional[CheckpointInfo] = None

    @classmethod
    def save(cls, obj: Any) -> Checkpoint:
        """``torch.save`` *obj* into a private in-memory buffer (no copy is ever made of it), with torch's
        own function (:func:`~..torch_facts.serialization_state.genuine`): a replaced ``torch.save``
        could write any bytes into a buffer that is then trusted with a full load."""
        from ..torch_facts.serialization_state import genuine

        buffer = io.BytesIO()
        genuine("save")(obj, buffer)
        for listener in tuple(_SAVE_LISTENERS):
            listener(buffer.getvalue())
        return cls(buffer, _owned=True)

    @classmethod
    def from_bytes(cls, data: Union[bytes, bytearray, memoryview]) -> Checkpoint:
        """Wrap foreign bytes; they will only ever be loaded weights-only."""
        if not isinstance(data, (bytes, bytearray, memoryview)):
            raise TypeError(
                f"Checkpoint.from_bytes expects bytes, got {type(data).__name__}; "
                "use Checkpoint.from_buffer for file objects"
            )
        return cls(io.BytesIO(bytes(data)))

    @classmethod
    def from_buffer(cls, f: BufferLike) -> Checkpoint:
        """Wrap a foreign buffer, file object or path (read into memory once)."""
        if isinstance(f, Checkpoint):
            return f
        if isinstance(f, (bytes, bytearray, memoryview)):
            return cls.from_bytes(f)
        if isinstance(f, (str, os.PathLike)):
            with open_regular_file(f) as fh:
                return cls(io.BytesIO(fh.read()))
        _require_binary_seekable(f)
        start = f.tell()
        data = f.read()
        f.seek(start)
        return cls(io.BytesIO(data))

    @classmethod
    def from_path(cls, path: Union[str, os.PathLike[str]]) -> Checkpoint:
        """A foreign checkpoint *file*, kept open and read by record when scanned (a zip's pickle
        records, a legacy stream's pickles), never whole into memory.  Regular files only: a symlink
        is resolved and its target judged; a device, FIFO, socket or directory raises
        :class:`CheckpointFormatError` before anything is read."""
        return cls(open_regular_file(path))

    @classmethod
    def from_stream(cls, stream: IO[bytes], *, limits: Optional[ScanLimits] = None) -> Checkpoint:
        """A foreign checkpoint read from *stream* (stdin): a regular file behind it is used in place,
        anything else is read up to ``ScanLimits.max_pickle_bytes`` (more raises)."""
        try:
            regular = stat.S_ISREG(os.fstat(stream.fileno()).st_mode)
        except (AttributeError, OSError, ValueError):
            regular = False
        if regular and stream.seekable():
            return cls(stream)
        cap = (limits or default_scan_limits()).max_pickle_bytes
        data = stream.read(cap + 1)
        if len(data) > cap:
            raise CheckpointFormatError(
                f"the stream gave more than ScanLimits.max_pickle_bytes={cap} bytes; pass the checkpoint's path instead"
            )
        return cls(io.BytesIO(data))

    @property
    def owned(self) -> bool:
        """True only for bytes produced by :meth:`save` in this process."""
        return self._owned

    @property
    def nbytes(self) -> int:
        if isinstance(self._buffer, io.BytesIO):
            return self._buffer.getbuffer().nbytes
        return os.fstat(self._buffer.fileno()).st_size

    @property
    def info(self) -> CheckpointInfo:
        """The static scan, computed once (under the default :class:`ScanLimits`)."""
        if self._info is None:
            self._info = _small_checkpoint_info(self._buffer) or _scan(self.rewound(), default_scan_limits())
        return self._info

    @property
    def format(self) -> str:
        """``zip``, ``torchscript``, ``legacy`` or ``tar``.  Known without a scan for a zip archive
        :meth:`save` wrote (``torch.save`` writes no ``constants.pkl``): a full load needs no scan."""
        if self._info is None and self._owned and isinstance(self._buffer, io.BytesIO):
            with self._buffer.getbuffer() as view:
                head = bytes(view[:4])
            if head == b"PK\x03\x04":
                return "zip"
        return self.info.format

    def rewound(self) -> IO[bytes]:
        """The underlying buffer (or file, :meth:`from_path`) at position 0 (for ``torch.load``)."""
        self._buffer.seek(0)
        return self._buffer

    def __repr__(self) -> str:
        return f"<Checkpoint {'owned' if self._owned else 'foreign'} {self.nbytes} bytes>"


# Scans of small checkpoints by content: a test file saves the same module once per load mode and
# engine, byte-identical each time.  A scan depends on the bytes, the limits, this torch's rules and
# whether numpy is imported; failed scans and scans without this torch's rules are not kept.  Keyed
# by the size and the last 256 bytes (a zip's central directory: every record's CRC-32 and size),
# cheaper to hash than all of them; a hit counts only when the bytes are equal (one memcmp).
_SMALL_CHECKPOINT = 64 * 1024
_SMALL_ENTRIES = 64
_TAIL = 256
_small_infos: dict[tuple[Any, ...], tuple[bytes, ScanLimits, Any, CheckpointInfo]] = {}
_small_lock = threading.Lock()


def _small_checkpoint_info(buffer: IO[bytes]) -> Optional[CheckpointInfo]:
    """The scan of a checkpoint of at most 64 KiB, remembered by content; None for larger ones (and files)."""
    if (
        not isinstance(buffer, io.BytesIO) or len(buffer.getbuffer()) > _SMALL_CHECKPOINT
    ):  # the view is released at once (no reference kept)
        return None
    limits = default_scan_limits()
    rules = walk_rules()
    data = buffer.getvalue()  # at most a memcpy; comparing bytes is a memcmp
    key = (len(data), data[-_TAIL:], id(limits), id(rules), "numpy" in sys.modules)
    known = _small_infos.get(key)
    if known is not None and known[1] is limits and known[2] is rules and data == known[0]:
        return known[3]
    info = _scan(io.BytesIO(data), limits)
    if rules.rules is not None:
        with _small_lock:
            if len(_small_infos) >= _SMALL_ENTRIES:
                _small_infos.pop(next(iter(_small_infos)), None)
            _small_infos[key] = (data, limits, rules, info)  # kept alive: their ids stay theirs
    return info


_KINDS = [(stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")]
_KINDS += [(stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISSOCK, "a socket")]


def open_regular_file(path: Union[str, os.PathLike[str]]) -> IO[bytes]:
    """*path* opened for reading if it is (or links to) a regular file, else :class:`CheckpointFormatError`
    (OSError when it cannot be opened).  Opened non-blocking and judged by ``fstat`` of what was opened,
    so a FIFO without a writer never hangs and a file swapped after the check is still judged."""
    target = os.path.realpath(path)
    fd = os.open(target, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = next((name for test, name in _KINDS if test(mode)), "not a regular file")
            via = f" (a symlink to {target!r})" if target != os.path.abspath(path) else ""
            raise CheckpointFormatError(
                f"{os.fspath(path)!r}{via} is {kind}, not a regular file: only regular files are read; "
                "copy the checkpoint into a file first"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


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


def scan_checkpoint(f: BufferLike, *, limits: Optional[ScanLimits] = None) -> CheckpointInfo:
    """The format, the globals and torch's weights-only checks of a checkpoint, without unpickling it.

    Raises :class:`CheckpointFormatError` naming what is wrong for empty, truncated, damaged,
    unrecognised or over-limit bytes (*limits*, default :func:`~..core.limits.default_scan_limits`).
    """
    limits = default_scan_limits() if limits is None else limits
    if isinstance(f, Checkpoint):
        return f.info if limits == default_scan_limits() else _scan(f.rewound(), limits)
    if isinstance(f, (str, os.PathLike)):
        with open_regular_file(f) as fh:
            return _scan(fh, limits)
    if isinstance(f, (bytes, bytearray, memoryview)):
        return _scan(Checkpoint.from_buffer(f).rewound(), limits)
    _require_binary_seekable(f)
    start = f.tell()
    try:
        # The checkpoint starts where the stream is positioned, as for torch.load.
        return _scan(f if start == 0 else io.BytesIO(f.read()), limits)
    finally:
        f.seek(start)


def _scan(f: IO[bytes], limits: ScanLimits) -> CheckpointInfo:
    """Scan the checkpoint of *f*, from its position 0 to its end."""
    from .archive import scan_archive  # imports the walker's tables: on first scan

    nbytes = f.seek(0, io.SEEK_END)
    f.seek(0)
    if nbytes == 0:
        raise CheckpointFormatError("the checkpoint is empty (0 bytes): was the buffer rewound or written at all?")
    state = ScanState(limits)
    try:
        fmt = scan_archive(f, nbytes, state)
    finally:
        f.seek(0)
    check_budget(state.opcodes, limits.max_opcodes, 0, 0, limits)  # the walk checks every 1024 opcodes only
    return CheckpointInfo(
        format=fmt,
        globals=tuple(sorted(state.globals)),
        nbytes=nbytes,
        unsupported_opcodes=tuple(sorted(state.refused_opcodes)),
        weights_only_blocker=state.blocker,
        full_load_globals=tuple(sorted(state.full_load_globals)),
        checks=tuple(state.checks),
        opcodes_walked=state.opcodes,
        bytes_scanned=state.bytes_scanned,
        memo_entries=state.max_memo,
        readings=state.readings or (fmt,),
    )
