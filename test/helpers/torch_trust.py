"""What this torch trusts by itself, asked of torch: the globals a test declares are exactly the rest.

torch 2.6 to 2.14 allow ``torch._utils._rebuild_nested_tensor`` (a strided nested tensor) and register the jagged
layout's ``NestedTensor`` and ``_rebuild_njt`` when ``torch.nested`` is imported; torch 2.15 does neither, so on
it a test declares them as it would a class of its own.  A declaration of a global torch allows anyway changes
nothing and is never over-trust, so a test may also declare them everywhere; the ports that check "nothing
declared where torch trusts it" declare only what :func:`beyond_torchs_trust` returns.
"""

from __future__ import annotations

import importlib
import io
import pickletools
import warnings
import zipfile
from typing import Any

import torch
from torch._weights_only_unpickler import _get_allowed_globals

from torch_serial_testing.registry import restore_registry, snapshot_registry


def _name(obj: Any) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"


def _resolve(name: str) -> Any:
    module, _, attr = name.rpartition(".")
    return getattr(importlib.import_module(module), attr)


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


def _nested_globals(layout: Any) -> tuple[Any, ...]:
    """The ``torch.nested`` and ``torch._utils`` rebuild globals a nested tensor's pickle names on this torch."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the strided layout's "prototype stage" warning, not this helper's
        nt = torch.nested.nested_tensor([torch.zeros(1), torch.zeros(2)], layout=layout)
    names = sorted(n for n in pickled_globals(nt) if n.startswith(("torch.nested.", "torch._utils._rebuild_nested")))
    return tuple(_resolve(n) for n in names)


#: A jagged nested tensor's own globals (``NestedTensor``, ``_rebuild_njt``: what torch 2.6 to 2.14 register).
NJT_GLOBALS = _nested_globals(torch.jagged)
#: A strided nested tensor's rebuild function (on torch's allowlist before 2.15).
STRIDED_NESTED_GLOBALS = _nested_globals(torch.strided)


def torch_takes_named_entries() -> bool:
    """Whether this torch's allowlist takes an ``(obj, "module.name")`` entry (torch 2.4 keys every entry by its
    ``__module__`` and fails every weights-only load while one is registered); asked with a throwaway registration."""
    snapshot = snapshot_registry()
    try:
        torch.serialization.add_safe_globals([(torch.nn.Linear, "tst_probe.Named")])
        return "tst_probe.Named" in torch._weights_only_unpickler._get_user_allowed_globals()
    except Exception:  # noqa: BLE001 - the answer is no
        return False
    finally:
        restore_registry(snapshot)
