"""Which globals a checkpoint needs beyond torch's own allowlist, found without unpickling it."""

from __future__ import annotations

import os
from typing import Any

from ..core.errors import CheckpointFormatError
from ..torch_facts.registry import torch_allowed_type_names, torch_allowlist

__all__ = ["required_globals", "needed_globals"]

_NOT_GIVEN: Any = object()


def required_globals(
    obj_or_buffer: Any = _NOT_GIVEN, *, obj: Any = _NOT_GIVEN, checkpoint: Any = _NOT_GIVEN, path: Any = _NOT_GIVEN
) -> list[str]:
    """Sorted globals a checkpoint needs beyond torch's own allowlist, found without unpickling.

    With a keyword nothing is guessed: ``obj=`` is always ``torch.save``-d first (even a ``str`` or
    ``bytes``), ``checkpoint=`` (bytes, a buffer or file object, a :class:`Checkpoint`) is scanned,
    ``path=`` is a file to scan.  Positionally, bytes-likes are checkpoint bytes and a ``str`` a path
    (backward compatibility; the error says to pass ``obj=`` when they are not), a :class:`Checkpoint`
    or file object is scanned, and any other object is saved.
    """
    given = {k: v for k, v in (("obj", obj), ("checkpoint", checkpoint), ("path", path)) if v is not _NOT_GIVEN}
    if obj_or_buffer is not _NOT_GIVEN:
        given["positional"] = obj_or_buffer
    if len(given) != 1:
        raise TypeError(
            "required_globals() takes exactly one of: an object (obj=...), checkpoint bytes or a buffer "
            f"(checkpoint=...) or a file (path=...); got {', '.join(sorted(given)) or 'nothing'}"
        )
    ((kind, value),) = given.items()
    from ..scan.checkpoint import Checkpoint, scan_checkpoint  # the scan, imported where one is made

    if kind == "obj":
        info = Checkpoint.save(value).info
    elif kind == "path":
        if not isinstance(value, (str, os.PathLike)):
            raise TypeError(f"required_globals(path=...) takes a str or os.PathLike, got {type(value).__name__}")
        info = scan_checkpoint(value)
    elif kind == "checkpoint":
        if isinstance(value, (str, os.PathLike)):
            raise TypeError(
                "required_globals(checkpoint=...) takes bytes, a buffer or a Checkpoint; pass a file name as path=..."
            )
        info = scan_checkpoint(value)
    elif isinstance(value, Checkpoint) or hasattr(value, "read"):
        info = scan_checkpoint(value)
    elif isinstance(value, (bytes, bytearray, memoryview, str, os.PathLike)):
        info = _scan_ambiguous(value)
    else:
        info = Checkpoint.save(value).info
    if info.format == "torchscript":
        raise CheckpointFormatError(
            "this is a TorchScript archive: load it with torch.jit.load; weights_only does not apply"
        )
    return needed_globals(info)


def needed_globals(info: Any, allowed: Any = None) -> list[str]:
    """Sorted globals the scanned checkpoint *info* needs beyond torch's allowlist (*allowed*, default
    asked): its GLOBALs and the types BUILD is applied to.  The one place this is computed
    (:func:`required_globals`, the CLI's ``required_globals`` and snippets)."""
    from ..torch_facts.unpickler import unpickler_rules

    if allowed is None:
        allowed = torch_allowlist()
    needed = {g for g in info.globals if g not in allowed}
    # Types BUILD is applied to count too (numpy.dtypes.Float64DType is never a GLOBAL); those on
    # torch's own allowlist only where this torch's BUILD does not build them (2.4, 2.5).
    types = set(info.type_checks)
    if types and unpickler_rules().build.torch_types_buildable:
        types -= set(allowed) | torch_allowed_type_names()
    return sorted(needed | types)


def _scan_ambiguous(value: Any) -> Any:
    """Scan a positional str (path) or bytes (checkpoint); say how to mean the object instead."""
    from ..scan.checkpoint import scan_checkpoint

    as_object = f"to get the globals of the {type(value).__name__} object itself, call required_globals(obj=...)"
    if isinstance(value, (str, os.PathLike)):
        if not os.path.isfile(value):
            raise FileNotFoundError(
                f"required_globals({value!r}): a positional str is a checkpoint file, and there "
                f"is no such file; {as_object}"
            )
        return scan_checkpoint(value)
    try:
        return scan_checkpoint(value)
    except CheckpointFormatError as e:
        raise CheckpointFormatError(
            f"{e} (a positional {type(value).__name__} is read as checkpoint bytes; {as_object})"
        ) from None
