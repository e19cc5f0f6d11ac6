"""What this torch trusts by itself, asked of torch: the globals a test declares are exactly the rest.

torch 2.6 to 2.14 allow ``torch._utils._rebuild_nested_tensor`` (a strided nested tensor) and register the jagged
layout's ``NestedTensor`` and ``_rebuild_njt`` when ``torch.nested`` is imported; torch 2.15 does neither, so on
it a test declares them as it would a class of its own.  A declaration of a global torch allows anyway changes
nothing and is never over-trust, so a test may also declare them everywhere; the ports that check "nothing
declared where torch trusts it" declare only what :func:`beyond_torchs_trust` returns.
"""

from __future__ import annotations

import io
import pickletools
import zipfile
from typing import Any

import torch
from torch._weights_only_unpickler import _get_allowed_globals
from torch.nested._internal.nested_tensor import NestedTensor, _rebuild_njt

#: A jagged nested tensor's own globals (what torch 2.6 to 2.14 register themselves).
NJT_GLOBALS = (NestedTensor, _rebuild_njt)
#: A strided nested tensor's rebuild function (on torch's allowlist before 2.15).
STRIDED_NESTED_GLOBALS = (torch._utils._rebuild_nested_tensor,)


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def trusted_by_torch() -> set[str]:
    """Every global torch allows weights-only here without a declaration: its allowlist and its registry
    (which holds only torch's own registrations inside a test: the mixin restores it after each)."""
    registered = getattr(torch.serialization, "get_safe_globals", lambda: [])()
    return set(_get_allowed_globals()) | {g[1] if isinstance(g, tuple) else _name(g) for g in registered}


def beyond_torchs_trust(*objs: Any) -> tuple[Any, ...]:
    """Of *objs*, those this torch does not allow by itself: what a test running on it declares."""
    trusted = trusted_by_torch()
    return tuple(obj for obj in objs if _name(obj) not in trusted)


def torch_trusts(*objs: Any) -> bool:
    return not beyond_torchs_trust(*objs)


def pickled_globals(obj: Any) -> set[str]:
    """The ``module.name`` of every global ``torch.save(obj)``'s pickle names."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as archive:
        data = archive.read(next(n for n in archive.namelist() if n.endswith("/data.pkl")))
    # torch.save writes pickle protocol 2, where every global is a GLOBAL opcode ("module name")
    return {str(arg).replace(" ", ".") for op, arg, _ in pickletools.genops(data) if op.name == "GLOBAL"}
