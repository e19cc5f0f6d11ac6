"""Read exactly the records torch reads, decided by the same tests ``torch.load`` applies.

``torch.load`` (torch/serialization.py) decides the format this way, and so does
:func:`scan_archive`:

* the first four bytes are ``PK\\x03\\x04`` (``_is_zipfile``): a zip archive, opened
  with torch's own reader ``torch._C.PyTorchFileReader`` (never Python's
  ``zipfile``, which resolves duplicate, case-folded or zip64-relocated records
  differently).  ``constants.pkl`` among its records (``_is_torchscript_zip``) makes it
  a TorchScript archive; otherwise torch unpickles the record ``data.pkl`` -- the very
  bytes torch's reader returns for that name;
* a tar archive (``storages``, ``tensors``, ``pickle`` members; torch < 0.4), which
  ``torch.load`` reads only from a real file at offset 0;
* otherwise the legacy stream: five pickles (magic number, protocol version,
  sys_info, the object, the storage keys), all unpickled by torch.

Every pickle torch would unpickle is walked by :func:`~.pickle_scan.scan_pickle`.
Sizes are checked against :class:`~.scan_limits.ScanLimits` *before* anything is
decompressed or copied.
"""

from __future__ import annotations

import struct
import sys
import tarfile
import threading
from typing import IO, Any

from .errors import CheckpointFormatError
from .pickle_scan import ScanState, _Global, scan_pickle
from .torch_unpickler_rules import torch_refuses_torchscript_weights_only

__all__ = ["scan_archive", "ZIP_MAGIC", "LEGACY_MAGIC", "LEGACY_PROTOCOL_VERSION", "TORCHSCRIPT_BLOCKER", "TAR_BLOCKER"]

ZIP_MAGIC = b"PK\x03\x04"
#: torch.serialization.MAGIC_NUMBER and PROTOCOL_VERSION: the first two pickles of the legacy format.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
LEGACY_PROTOCOL_VERSION = 1001

#: torch's reasons (torch/serialization.py) for refusing these formats weights-only.
TORCHSCRIPT_BLOCKER = "Cannot use ``weights_only=True`` with TorchScript archives passed to ``torch.load``."
TAR_BLOCKER = "Cannot use ``weights_only=True`` with files saved in the legacy .tar format."


def scan_archive(f: IO[bytes], nbytes: int, state: ScanState) -> str:
    """Walk every pickle torch would unpickle from *f* (at position 0); return the format name."""
    head = f.read(4)
    f.seek(0)
    if head == ZIP_MAGIC:
        return _scan_zip(f, state)
    if _is_tar(f):
        _scan_tar(f, state)
        return "tar"
    _scan_legacy(f, nbytes, state)
    return "legacy"


def _one_line(e: BaseException) -> str:
    text = str(e).strip().splitlines()
    first = text[0] if text else type(e).__name__
    # torch's reader appends boilerplate ("This is an internal miniz error..."): keep the cause.
    return first.split(". This is an internal miniz error")[0].split("  (Could this error")[0]


def _scan_zip(f: IO[bytes], state: ScanState) -> str:
    import torch

    try:
        reader = torch._C.PyTorchFileReader(f)
    except (RuntimeError, ValueError, OSError) as e:
        raise CheckpointFormatError(
            f"the zip archive is truncated or its central directory is damaged (torch's reader: {_one_line(e)}); "
            "re-save the checkpoint"
        ) from None
    try:
        is_torchscript = getattr(torch.serialization, "_is_torchscript_zip", None)
        if is_torchscript(reader) if is_torchscript else "constants.pkl" in reader.get_all_records():
            if torch_refuses_torchscript_weights_only():  # else torch.jit.load takes it (torch 2.4)
                state.check("refused", "", TORCHSCRIPT_BLOCKER)
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
    _scan_cached(data, state)
    return "zip"


# Facts of recently scanned data.pkl records, keyed by their exact bytes: a test file saves the
# same module once per mode and engine, and the pickle torch writes for it is byte-identical.
_CACHE_ENTRIES = 64
_CACHE_MAX_BYTES = 1 << 20
_cache: dict[tuple[bytes, Any, bool], ScanState] = {}
_cache_lock = threading.Lock()


def _scan_cached(data: bytes, state: ScanState) -> None:
    if len(data) > _CACHE_MAX_BYTES or state.checks or not state.weights_only_live:
        scan_pickle(data, 0, state, zip_format=True)
        return
    key = (data, state.limits, "numpy" in sys.modules)
    hit = _cache.get(key)
    if hit is None:
        hit = ScanState(state.limits)
        scan_pickle(data, 0, hit, zip_format=True)
        with _cache_lock:
            if len(_cache) >= _CACHE_ENTRIES:
                _cache.pop(next(iter(_cache)), None)
            _cache[key] = hit
    state.merge(hit)


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


# Element sizes of the legacy storage classes (the tar 'storages' member stores raw elements).
def _element_size(storage_type: Any) -> int:
    import torch

    name = storage_type.name.rpartition(".")[2] if isinstance(storage_type, _Global) else None
    try:
        dtype = torch.storage._get_dtype_from_pickle_storage_type(name)  # type: ignore[attr-defined]
        return int(torch._utils._element_size(dtype))
    except (KeyError, AttributeError, TypeError, RuntimeError):
        raise CheckpointFormatError(
            f"the tar 'storages' member names an unknown storage type ({name!r}): the checkpoint is damaged"
        ) from None


def _scan_tar(f: IO[bytes], state: ScanState) -> None:
    # Not loadable weights-only at all; a full load reads 'storages', 'tensors' then 'pickle'.
    state.check("refused", "", TAR_BLOCKER)
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
    return data[pos:pos + size]


def _member(tar: tarfile.TarFile, name: str, state: ScanState) -> bytes:
    try:
        member = tar.getmember(name)
    except KeyError:
        raise CheckpointFormatError(
            f"the tar archive has no {name!r} member: not a legacy torch checkpoint"
        ) from None
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


def _scan_legacy(f: IO[bytes], nbytes: int, state: ScanState) -> None:
    limit = min(nbytes, state.limits.max_scan_bytes - state.bytes_scanned)
    data = f.read(limit)
    head = data[:4]
    try:
        pos, magic = scan_pickle(data, 0, state, zip_format=False)
    except CheckpointFormatError as e:
        if head[:1] == b"\x80":  # a pickle (PROTO opcode), but damaged
            raise
        raise CheckpointFormatError(
            f"not a torch checkpoint: the first bytes are {head!r}, neither a zip archive from torch.save "
            f"(b'PK\\x03\\x04') nor a legacy pickle stream ({e})"
        ) from None
    if magic != LEGACY_MAGIC:
        raise CheckpointFormatError(
            "a pickle stream, but not a torch checkpoint (no torch magic number in its first pickle): "
            "torch.load would refuse it with 'Invalid magic number; corrupt file?'"
        )
    try:
        pos, version = scan_pickle(data, pos, state, zip_format=False)
        if version != LEGACY_PROTOCOL_VERSION:
            raise CheckpointFormatError(
                f"the legacy checkpoint's protocol version is not {LEGACY_PROTOCOL_VERSION}: torch.load "
                "would refuse it with 'Invalid protocol version'"
            )
        for _ in ("sys_info", "the object", "the storage keys"):
            pos, _value = scan_pickle(data, pos, state, zip_format=False)
    except CheckpointFormatError as e:
        if len(data) < nbytes and "ended early" in str(e):
            raise CheckpointFormatError(
                f"the legacy checkpoint's pickles run past ScanLimits.max_scan_bytes="
                f"{state.limits.max_scan_bytes}; raise it with scan_limits(max_scan_bytes=...)"
            ) from None
        raise
