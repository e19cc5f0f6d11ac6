"""Reading checkpoints from strangers: files on disk, streams, and every format ``torch.load`` reads.

The core (:mod:`torch_serial_testing.checkpoint`) reads the zip archive ``torch.save`` writes, from
memory.  Here, for ``inspect`` and ``audit``:

* files: regular files only (:func:`open_regular_file`), kept open and read by record, never whole;
* ``PK\\x03\\x04`` first: a zip archive, read as the core reads it;
* a tar archive (``storages``, ``tensors``, ``pickle``; torch < 0.4), which torch tries only for a real
  file (a path, an ``open()``-ed file); from any other file object (``io.BytesIO``) it reads
* the legacy stream of five pickles (magic number, protocol version, sys_info, the object, the storage
  keys): its pickles come first, so only they are read, never the storage bytes after them.

Bytes can be both a tar and a legacy stream (a *polyglot*): the scan does not know which source torch
will be given, so it walks both readings and reports the union (``CheckpointInfo.readings``).  Sizes
are checked against :class:`~torch_serial_testing.model.ScanLimits` before anything is decompressed.
"""

from __future__ import annotations

import io
import os
import stat
import struct
import tarfile
from typing import IO, Any, Optional, Union

from ..checkpoint import (
    ZIP_MAGIC,
    Checkpoint,
    CheckpointInfo,
    _cap,
    _one_line,
    _require_binary_seekable,
    _scan,
    read_zip,
)
from ..errors import CheckpointFormatError
from ..model import Global, ScanLimits, ScanState, default_scan_limits
from ..prediction import needed_globals
from ..errors import ProbeFailed
from ..stream import TruncatedStream
from ..walker import scan_pickle
from .facts import TAR_REFUSAL, storage_element_size, torchscript_refusal

__all__ = ["FileCheckpoint", "required_globals", "scan_checkpoint", "open_regular_file", "read_any", "LEGACY_MAGIC"]


def is_truncated(e: BaseException) -> bool:
    """Whether *e* is a :func:`~torch_serial_testing.stream.TruncatedStream`: more bytes may complete the stream."""
    return getattr(e, "truncated", False) is True


class FileCheckpoint(Checkpoint):
    """A foreign :class:`~torch_serial_testing.checkpoint.Checkpoint` read in every format torch reads,
    from memory, a stream or a file."""

    __slots__ = ()

    def _read(self, f: IO[bytes], nbytes: int, state: ScanState) -> str:
        return read_any(f, nbytes, state)

    @classmethod
    def from_path(cls, path: Union[str, os.PathLike[str]]) -> FileCheckpoint:
        """A foreign checkpoint *file*, kept open and read by record when scanned (a zip's pickle
        records, a legacy stream's pickles), never whole into memory.  Regular files only: a symlink
        is resolved and its target judged; a device, FIFO, socket or directory raises
        :class:`CheckpointFormatError` before anything is read."""
        return cls(open_regular_file(path))

    @classmethod
    def from_stream(cls, stream: IO[bytes], *, limits: Optional[ScanLimits] = None) -> FileCheckpoint:
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

    @classmethod
    def from_buffer(cls, f: Any) -> Checkpoint:
        """A foreign buffer, file object or path (read into memory once)."""
        if isinstance(f, (str, os.PathLike)):
            with open_regular_file(f) as fh:
                return cls(io.BytesIO(fh.read()))
        if isinstance(f, Checkpoint) and not isinstance(f, FileCheckpoint):
            return f if f.owned else cls(io.BytesIO(f.rewound().read()))
        return super().from_buffer(f)


def required_globals(f: Any) -> list[str]:
    """:func:`torch_serial_testing.required_globals` of a checkpoint in any format, or a file (*f* a path)."""
    info = scan_checkpoint(f)
    if info.format == "torchscript":
        raise CheckpointFormatError(
            "this is a TorchScript archive: load it with torch.jit.load; weights_only does not apply"
        )
    return needed_globals(info)


def scan_checkpoint(f: Any, *, limits: Optional[ScanLimits] = None) -> CheckpointInfo:
    """:func:`torch_serial_testing.scan_checkpoint` for every format, and for files (*f* a path)."""
    limits = default_scan_limits() if limits is None else limits
    if isinstance(f, FileCheckpoint):
        return f.info if limits == default_scan_limits() else _scan(f.rewound(), limits, read_any)
    if isinstance(f, Checkpoint):
        return _scan(f.rewound(), limits, read_any)
    if isinstance(f, (str, os.PathLike)):
        with open_regular_file(f) as fh:
            return _scan(fh, limits, read_any)
    if isinstance(f, (bytes, bytearray, memoryview)):
        return _scan(io.BytesIO(bytes(f)), limits, read_any)
    _require_binary_seekable(f)
    start = f.tell()
    try:  # the checkpoint starts where the stream is positioned, as for torch.load
        return _scan(f if start == 0 else io.BytesIO(f.read()), limits, read_any)
    finally:
        f.seek(start)


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


#: torch.serialization.MAGIC_NUMBER and PROTOCOL_VERSION: the first two pickles of the legacy format.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C


LEGACY_PROTOCOL_VERSION = 1001


def _torchscript(state: ScanState) -> str:
    """A TorchScript archive: what torch.load does with it weights-only (refuses it; torch 2.4 hands it to
    torch.jit.load, a ``jit`` check the prediction reads)."""
    try:
        refusal = torchscript_refusal()
    except ProbeFailed as e:
        state.check("unknown", "", f"what this torch does with a TorchScript archive is unknown: {e}")
    else:
        state.check("refused", "", refusal) if refusal is not None else state.check("jit")
    state.weights_only_live = False
    return "torchscript"


def read_any(f: IO[bytes], nbytes: int, state: ScanState) -> str:
    """Walk every pickle torch would unpickle from *f* (at position 0); return the format name."""
    head = f.read(4)
    f.seek(0)
    if head == ZIP_MAGIC:  # torch reads a zip from every kind of source, never anything else
        return read_zip(f, nbytes, state, _torchscript)
    if not _is_tar(f):
        _scan_legacy(f, nbytes, state)
        return "legacy"
    # A real file is read as a tar, any other file object as a legacy stream: walk both readings.
    tar_state = _fork(state)
    try:
        _scan_tar(f, tar_state)
        tar_error: Optional[CheckpointFormatError] = None
    except CheckpointFormatError as e:
        tar_error = e
    f.seek(0)
    stream_state = _fork(tar_state)
    try:
        _scan_legacy(f, nbytes, stream_state)
    except CheckpointFormatError:
        if tar_error is not None:
            raise tar_error from None
        _absorb(state, tar_state)  # a plain tar: no stream reading
        return "tar"
    if tar_error is None:
        _absorb(state, tar_state)
        _absorb(state, stream_state)
        state.readings = ("tar", "legacy")
        return "tar"
    _absorb(state, stream_state)  # torch.load of the file fails (a damaged tar): only the stream loads
    return "legacy"


def _fork(state: ScanState) -> ScanState:
    """A fresh state for another reading of the same bytes (its work counted on from *state*'s)."""
    return ScanState(state.limits, opcodes=state.opcodes, bytes_scanned=state.bytes_scanned, max_memo=state.max_memo)


def _absorb(state: ScanState, other: ScanState) -> None:
    """Add to *state* what the reading *other* (made by :func:`_fork`) found: its names and checks, its work."""
    for c in other.checks:
        state.check(c.kind, c.name, c.message, c.shape)
    state.globals |= other.globals
    state.full_load_globals = {**other.full_load_globals, **state.full_load_globals}
    state.refused_opcodes |= other.refused_opcodes
    state.opcodes, state.bytes_scanned = other.opcodes, other.bytes_scanned  # forked: counted on from ours
    state.max_memo = max(state.max_memo, other.max_memo)
    state.weights_only_live = other.weights_only_live


def _is_tar(f: IO[bytes]) -> bool:
    try:
        with tarfile.open(fileobj=f, mode="r:", format=tarfile.PAX_FORMAT) as tar:
            return tar.next() is not None
    except (tarfile.TarError, EOFError, OSError, ValueError, UnicodeError):
        return False
    finally:
        f.seek(0)


def _element_size(storage_type: Any) -> int:
    """Bytes per element of the legacy storage class the tar 'storages' member names."""
    name = storage_type.name.rpartition(".")[2] if isinstance(storage_type, Global) else None
    try:
        return storage_element_size(name)
    except KeyError:
        raise CheckpointFormatError(
            f"the tar 'storages' member names an unknown storage type ({name!r}): the checkpoint is damaged"
        ) from None


def _scan_tar(f: IO[bytes], state: ScanState) -> None:
    # Never loadable weights-only; a full load reads 'storages', 'tensors' then 'pickle'.
    state.check("refused", "", TAR_REFUSAL)
    state.weights_only_live = False
    try:
        with tarfile.open(fileobj=f, mode="r:", format=tarfile.PAX_FORMAT) as tar:
            storages = _member(tar, "storages", state)
            pos, count = scan_pickle(storages, 0, state, zip_format=False)
            for _ in range(_count(count, "storages")):
                pos, args = scan_pickle(storages, pos, state, zip_format=False)
                width = _element_size(args[2] if isinstance(args, tuple) and len(args) == 3 else None)
                numel = _read(storages, pos, 8, "storages")
                pos += 8 + width * int.from_bytes(numel, "little", signed=True)
                if pos > len(storages):
                    raise CheckpointFormatError("the tar 'storages' member is truncated")
            scan_pickle(storages, pos, state, zip_format=False)  # the storage views
            tensors = _member(tar, "tensors", state)
            pos, count = scan_pickle(tensors, 0, state, zip_format=False)
            for _ in range(_count(count, "tensors")):
                pos, _args = scan_pickle(tensors, pos, state, zip_format=False)
                (ndim,) = struct.unpack("<i", _read(tensors, pos, 4, "tensors"))
                if ndim < 0:
                    raise CheckpointFormatError("the tar 'tensors' member is damaged (negative ndim)")
                pos += 8 + 16 * ndim + 8
            scan_pickle(_member(tar, "pickle", state), 0, state, zip_format=False)
    except tarfile.TarError as e:
        raise CheckpointFormatError(f"the legacy tar checkpoint is damaged: {_one_line(e)}") from None


def _count(value: Any, member: str) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise CheckpointFormatError(f"the tar {member!r} member does not start with a count: damaged")
    return value


def _read(data: bytes, pos: int, size: int, member: str) -> bytes:
    if pos + size > len(data):
        raise CheckpointFormatError(f"the tar {member!r} member is truncated")
    return data[pos : pos + size]


def _member(tar: tarfile.TarFile, name: str, state: ScanState) -> bytes:
    try:
        member = tar.getmember(name)
    except KeyError:
        raise CheckpointFormatError(f"the tar archive has no {name!r} member: not a legacy torch checkpoint") from None
    if member.issparse():
        raise CheckpointFormatError(
            f"the tar member {name!r} is a GNU sparse file: refused (torch never writes one, and it can "
            "expand far beyond the archive's size)"
        )
    if not member.isreg():
        raise CheckpointFormatError(f"the tar member {name!r} is not a regular file: refused")
    _cap(member.size, f"the tar member {name!r}", state)
    extracted = tar.extractfile(member)
    if extracted is None:  # pragma: no cover - isreg() members always extract
        raise CheckpointFormatError(f"the tar member {name!r} cannot be read")
    data = extracted.read(member.size)
    if len(data) != member.size:
        raise CheckpointFormatError(f"the tar member {name!r} is truncated")
    return data


#: The first read of a legacy stream; doubled until its five pickles are in (they precede the storages).
_LEGACY_FIRST_READ = 64 * 1024


class _NeedMore(Exception):
    """A pickle of the legacy stream runs past the bytes read so far."""


def _scan_legacy(f: IO[bytes], nbytes: int, state: ScanState) -> None:
    cap = min(nbytes, state.limits.max_scan_bytes - state.bytes_scanned)
    size = min(cap, _LEGACY_FIRST_READ)
    while True:
        f.seek(0)
        data = f.read(size)
        attempt = _fork(state)
        try:
            _walk_legacy(data, len(data) < nbytes, attempt)
        except _NeedMore:
            if len(data) < cap:
                size = min(cap, size * 2)  # read more: at most twice the work of one walk, in all
                continue
            raise CheckpointFormatError(
                f"the legacy checkpoint's pickles run past ScanLimits.max_scan_bytes="
                f"{state.limits.max_scan_bytes}; raise it with scan_limits(max_scan_bytes=...)"
            ) from None
        _absorb(state, attempt)
        return


def _walk_legacy(data: bytes, more: bool, state: ScanState) -> None:
    """The five pickles of a legacy stream in *data* (*more*: the file has bytes beyond it)."""
    try:
        _walk_five(data, state)
    except CheckpointFormatError as e:
        if more and is_truncated(e):
            raise _NeedMore from None
        raise


def _walk_five(data: bytes, state: ScanState) -> None:
    head = data[:4]
    try:
        pos, magic = scan_pickle(data, 0, state, zip_format=False)
    except CheckpointFormatError as e:
        if head[:1] == b"\x80":  # a pickle (PROTO opcode), but damaged
            raise
        raise (TruncatedStream if is_truncated(e) else CheckpointFormatError)(
            f"not a torch checkpoint: the first bytes are {head!r}, neither a zip archive from torch.save "
            f"(b'PK\\x03\\x04') nor a legacy pickle stream ({e})"
        ) from None
    if magic != LEGACY_MAGIC:
        raise CheckpointFormatError(
            "a pickle stream, but not a torch checkpoint (no torch magic number in its first pickle): "
            "torch.load would refuse it with 'Invalid magic number; corrupt file?'"
        )
    pos, version = scan_pickle(data, pos, state, zip_format=False)
    if version != LEGACY_PROTOCOL_VERSION:
        raise CheckpointFormatError(
            f"the legacy checkpoint's protocol version is not {LEGACY_PROTOCOL_VERSION}: torch.load "
            "would refuse it with 'Invalid protocol version'"
        )
    for _ in ("sys_info", "the object", "the storage keys"):
        pos, _value = scan_pickle(data, pos, state, zip_format=False)
