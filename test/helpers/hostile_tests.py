"""What a hostile *test* does to torch's serialization, and a payload that shows whether it worked.

``payload`` is a module-level function a crafted checkpoint calls with REDUCE: it only records that
it ran (in :data:`RAN`, and as a file in ``$TST_PAYLOAD_DIR`` when set, for child processes).  It is
harmless; what matters is whether a load ever reached it.  ``payload_checkpoint()`` is foreign bytes:
every weights-only load must refuse them; a full load would call ``payload``.
"""

from __future__ import annotations

import functools
import os
import uuid
from typing import Any, Callable

import torch

from test.helpers.hostile_checkpoints import STOP, call1, glob, proto, torch_zip, ustr

#: What ``payload`` was called with, in this process.
RAN: list[str] = []
PAYLOAD_DIR_ENV = "TST_PAYLOAD_DIR"
PAYLOAD_NAME = f"{__name__}.payload"


def payload(tag: str) -> str:
    """Stands in for an attacker's callable: records that it ran, nothing else."""
    RAN.append(tag)
    folder = os.environ.get(PAYLOAD_DIR_ENV)
    if folder:
        with open(os.path.join(folder, f"ran-{uuid.uuid4().hex}"), "w") as fh:
            fh.write(tag)
    return tag


def payload_checkpoint(tag: str = "payload ran") -> bytes:
    """A zip checkpoint whose data.pkl is ``payload(tag)``."""
    return torch_zip(proto(2) + call1(glob(__name__, "payload"), ustr(tag)) + STOP)


def force_full_load_shim(original: Callable[..., Any]) -> Callable[..., Any]:
    """The common "fix" for torch 2.6's default: every load made a full one (no functools.wraps)."""

    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = False
        return original(*args, **kwargs)

    return load


def wrapped_force_full_load_shim(original: Callable[..., Any]) -> Callable[..., Any]:
    """The same with ``functools.wraps``: it claims torch's ``__module__``, ``__name__`` and ``__doc__``."""

    @functools.wraps(original)
    def load(*args: Any, **kwargs: Any) -> Any:
        kwargs["weights_only"] = False
        return original(*args, **kwargs)

    return load


def payload_writing_save(original: Callable[..., Any]) -> Callable[..., Any]:
    """A ``torch.save`` that writes the payload checkpoint whatever it is given."""

    @functools.wraps(original)
    def save(obj: Any, f: Any, *args: Any, **kwargs: Any) -> None:
        f.write(payload_checkpoint("written by the save shim"))

    return save


def serialization_ids() -> dict[str, int]:
    """Identities of what a hostile test replaces (compared before and after)."""
    wou = torch._weights_only_unpickler
    return {
        "torch.load": id(torch.load),
        "torch.save": id(torch.save),
        "torch.serialization.load": id(torch.serialization.load),
        "torch.serialization._load": id(torch.serialization._load),
        "wou.load": id(wou.load),
        "wou._get_allowed_globals": id(wou._get_allowed_globals),
    }


def allowlist_copy() -> dict[str, Any]:
    """torch's allowlist by identity (a legacy ``StorageType``, rebuilt whenever torch refills its
    cache, by its dtype)."""
    storage_type = torch.serialization.StorageType
    return {
        k: ("StorageType", v.dtype) if type(v) is storage_type else id(v)
        for k, v in torch._weights_only_unpickler._get_allowed_globals().items()
    }
