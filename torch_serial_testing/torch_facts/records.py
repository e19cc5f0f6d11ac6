"""torch's own reading of checkpoint records: its zip reader, its format tests, its storage types.

The scan reads what ``torch.load`` reads, through torch: ``torch._C.PyTorchFileReader``, never
``zipfile``, which resolves duplicate, case-folded or zip64-relocated records differently.
"""

from __future__ import annotations

import functools
import io
from typing import IO, Any, Optional

from .probes import ProbeFailed
from .serialization_state import genuine

__all__ = [
    "zip_reader",
    "is_torchscript",
    "storage_element_size",
    "storage_type_names",
    "torchscript_refusal",
    "TAR_REFUSAL",
]

#: torch's reason for refusing the legacy tar format weights-only (torch/serialization.py).
TAR_REFUSAL = "Cannot use ``weights_only=True`` with files saved in the legacy .tar format."


def zip_reader(f: IO[bytes]) -> Any:
    """torch's reader of the zip archive *f* (raises what torch raises for a damaged one)."""
    import torch

    return torch._C.PyTorchFileReader(f)


def is_torchscript(reader: Any) -> bool:
    """torch.load's own test: a TorchScript archive holds a ``constants.pkl`` record."""
    import torch

    test = getattr(torch.serialization, "_is_torchscript_zip", None)
    return bool(test(reader)) if test is not None else "constants.pkl" in reader.get_all_records()


def storage_element_size(storage_type: Optional[str]) -> int:
    """Bytes per element of a legacy storage type (``FloatStorage``); KeyError for an unknown one."""
    import torch

    if storage_type is None:
        raise KeyError(storage_type)
    try:
        dtype = torch.storage._get_dtype_from_pickle_storage_type(storage_type)  # type: ignore[attr-defined]
        return int(torch._utils._element_size(dtype))
    except (KeyError, AttributeError, TypeError, RuntimeError):
        raise KeyError(storage_type) from None


@functools.lru_cache(maxsize=1)
def storage_type_names() -> frozenset[str]:
    """Names ``torch.load`` resolves to its own StorageType without importing anything."""
    import torch

    try:
        return frozenset(torch.storage._storage_type_to_dtype_map())  # type: ignore[attr-defined]
    except AttributeError as e:
        raise ProbeFailed(f"torch no longer has the storage type table the library reads: {e}") from None


_refusal: list[Optional[str]] = []


def torchscript_refusal() -> Optional[str]:
    """torch's message refusing a TorchScript archive weights-only, or None when it hands it to
    ``torch.jit.load`` whatever ``weights_only`` says (torch 2.4): asked once, with a tiny archive."""
    if not _refusal:
        import torch

        from .loader import observe_serialization_warnings, raiser

        buf = io.BytesIO()
        writer = torch._C.PyTorchFileWriter(buf)
        for name in ("data.pkl", "constants.pkl"):
            writer.write_record(name, b"\x80\x02).", 4)
        writer.write_end_of_file()
        del writer
        buf.seek(0)
        with observe_serialization_warnings(consume_all=True):  # torch warns that it dispatches to jit
            try:
                genuine("load")(buf, weights_only=True)
                error: Optional[BaseException] = None
            except Exception as e:  # noqa: BLE001 - where it was raised is the answer
                error = e
        where = raiser(error) if error is not None else "nowhere"
        if where.startswith("torch.jit"):
            _refusal.append(None)
        elif where.startswith("torch.serialization") and isinstance(error, RuntimeError):
            message = str(error).strip()
            unsafe = getattr(torch.serialization, "UNSAFE_MESSAGE", "")
            if unsafe and message.endswith(unsafe):
                message = message[: -len(unsafe)].strip()
            _refusal.append(message)
        else:
            raise ProbeFailed(
                f"torch.load of a TorchScript archive with weights_only=True raised in {where}: "
                f"{type(error).__name__}: {error}"
            )
    return _refusal[0]
