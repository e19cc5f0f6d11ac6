"""Files that are two checkpoints at once: a legacy tar archive (torch < 0.4) whose bytes are also a
legacy pickle stream, so ``torch.load`` reads one or the other depending on what it is given."""

from __future__ import annotations

import io
import pickle
import struct
import tarfile

from .hostile_checkpoints import LEGACY_MAGIC, _LEGACY_PROTOCOL_VERSION

__all__ = ["tar_legacy_polyglot", "ascii_pickle"]


def ascii_pickle(obj: object) -> bytes:
    """A protocol-0 pickle: ASCII only, so it can sit inside the skipped string of the stream."""
    return pickle.dumps(obj, protocol=0)


_SYS_INFO = {"protocol_version": _LEGACY_PROTOCOL_VERSION, "little_endian": True, "type_sizes": {"short": 2}}


def _tar(first_name: bytes, tar_pickle: bytes) -> bytes:
    members = [
        (first_name.decode("utf-8", "surrogateescape"), b""),
        ("sys_info", ascii_pickle(_SYS_INFO)),
        ("pickle", tar_pickle),
        ("storages", ascii_pickle(0) + ascii_pickle([])),  # no storages, no views
        ("tensors", ascii_pickle(0)),
    ]
    out = io.BytesIO()
    with tarfile.open(
        fileobj=out, mode="w:", format=tarfile.USTAR_FORMAT, encoding="utf-8", errors="surrogateescape"
    ) as tar:
        for name, raw in members:
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


def tar_legacy_polyglot(tar_pickle: bytes, stream_pickle: bytes) -> bytes:
    """A tar checkpoint unpickling *tar_pickle* (ASCII: :func:`ascii_pickle`) that is also a legacy
    stream unpickling *stream_pickle*: the first member's name opens the magic-number pickle with
    PROTO 2 and a BINUNICODE string spanning the rest of the tar, and the stream's pickles follow it."""
    head = b"\x80\x02X"  # PROTO 2, BINUNICODE <4-byte length>
    size = len(_tar(head + b"\0\0\0\0z", tar_pickle))
    data = _tar(head + struct.pack("<I", size - len(head) - 4) + b"z", tar_pickle)
    assert len(data) == size
    magic = pickle.dumps(LEGACY_MAGIC, protocol=2)[2:]  # after the string: the magic number, STOP
    rest = pickle.dumps(_LEGACY_PROTOCOL_VERSION, protocol=2) + pickle.dumps(_SYS_INFO, protocol=2)
    return data + magic + rest + stream_pickle + pickle.dumps([], protocol=2)
