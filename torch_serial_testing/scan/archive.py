"""Read exactly the records ``torch.load`` reads, deciding the format by its own tests.

* ``PK\\x03\\x04`` first (``_is_zipfile``): a zip archive, read with torch's own
  ``torch._C.PyTorchFileReader`` (never ``zipfile``, which resolves duplicate, case-folded or
  zip64-relocated records differently); ``constants.pkl`` makes it TorchScript, else torch
  unpickles the bytes its reader returns for ``data.pkl``;
* a tar archive (``storages``, ``tensors``, ``pickle``; torch < 0.4), which torch tries only for a
  real file (a path, an ``open()``-ed file); from any other file object (``io.BytesIO``) it reads
* the legacy stream of five pickles (magic number, protocol version, sys_info, the object, the
  storage keys) -- its pickles come first, so only they are read, never the storage bytes after them.

Bytes can be both a tar and a legacy stream (a *polyglot*): the scan does not know which source
torch will be given, so it walks both readings and reports the union of what they name
(``CheckpointInfo.readings``).

Every pickle torch would unpickle is walked (:func:`~.walker.scan_pickle`); sizes are checked
against :class:`~..core.limits.ScanLimits` before anything is decompressed or copied.
"""

from __future__ import annotations

import struct
import tarfile
from typing import IO, Any, Optional

from ..core.errors import CheckpointFormatError
from ..torch_facts.probes import ProbeFailed
from ..torch_facts.records import TAR_REFUSAL, is_torchscript, storage_element_size, torchscript_refusal, zip_reader
from .model import Global, ScanState
from .stream import TruncatedStream, is_truncated
from .walker import scan_pickle

__all__ = ["scan_archive", "ZIP_MAGIC", "LEGACY_MAGIC", "LEGACY_PROTOCOL_VERSION"]

ZIP_MAGIC = b"PK\x03\x04"
#: torch.serialization.MAGIC_NUMBER and PROTOCOL_VERSION: the first two pickles of the legacy format.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001


def scan_archive(f: IO[bytes], nbytes: int, state: ScanState) -> str:
    """Walk every pickle torch would unpickle from *f* (at position 0); return the format name."""
    head = f.read(4)
    f.seek(0)
    if head == ZIP_MAGIC:  # torch reads a zip from every kind of source, never anything else
        return _scan_zip(f, state)
    if not _is_tar(f):
        _scan_legacy(f, nbytes, state)
        return "legacy"
    # A real file is read as a tar, any other file object as a legacy stream: walk both readings.
    tar_state = state.fork()
    try:
        _scan_tar(f, tar_state)
        tar_error: Optional[CheckpointFormatError] = None
    except CheckpointFormatError as e:
        tar_error = e
    f.seek(0)
    stream_state = tar_state.fork()
    try:
        _scan_legacy(f, nbytes, stream_state)
    except CheckpointFormatError:
        if tar_error is not None:
            raise tar_error from None
        state.absorb(tar_state)  # a plain tar: no stream reading
        return "tar"
    if tar_error is None:
        state.absorb(tar_state)
        state.absorb(stream_state)
        state.readings = ("tar", "legacy")
        return "tar"
    state.absorb(stream_state)  # torch.load of the file fails (a damaged tar): only the stream loads
    return "legacy"


def _one_line(e: BaseException) -> str:
    """The first line of *e*, without the boilerplate torch's reader appends ("This is an internal miniz error...")."""
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    return first.split(". This is an internal miniz error")[0].split("  (Could this error")[0]


def _scan_zip(f: IO[bytes], state: ScanState) -> str:
    try:
        reader = zip_reader(f)
    except (RuntimeError, ValueError, OSError) as e:
        raise CheckpointFormatError(
            f"the zip archive is truncated or its central directory is damaged (torch's reader: {_one_line(e)}); "
            "re-save the checkpoint"
        ) from None
    try:
        if is_torchscript(reader):
            try:
                refusal = torchscript_refusal()
            except ProbeFailed as e:
                state.check("unknown", "", f"what this torch does with a TorchScript archive is unknown: {e}")
            else:
                if refusal is not None:  # else torch.jit.load takes it (torch 2.4)
                    state.check("refused", "", refusal)
            state.weights_only_live = False
            return "torchscript"
        if not reader.has_record("data.pkl"):
            raise CheckpointFormatError(
                "the zip archive has no data.pkl record (torch.load would fail): not a torch.save checkpoint"
            )
        size_of = getattr(reader, "get_record_size", None)
        if size_of is not None:
            _cap(size_of("data.pkl"), "data.pkl", state)
        data = reader.get_record("data.pkl")
    except RuntimeError as e:
        raise CheckpointFormatError(f"torch cannot read the zip archive: {_one_line(e)}") from None
    _cap(len(data), "data.pkl", state)
    scan_pickle(data, 0, state, zip_format=True)
    return "zip"


def _cap(size: int, what: str, state: ScanState) -> None:
    limits = state.limits
    if size > limits.max_pickle_bytes:
        raise CheckpointFormatError(
            f"{what} is {size} bytes, over ScanLimits.max_pickle_bytes={limits.max_pickle_bytes}; "
            "raise it with scan_limits(max_pickle_bytes=...) if the checkpoint is trusted to be that large"
        )
    if state.bytes_scanned + size > limits.max_scan_bytes:
        raise CheckpointFormatError(
            f"the checkpoint's pickles exceed ScanLimits.max_scan_bytes={limits.max_scan_bytes}; "
            "raise it with scan_limits(max_scan_bytes=...)"
        )


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
        attempt = state.fork()
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
        state.absorb(attempt)
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
