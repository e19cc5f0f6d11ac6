"""Which classes torch vouches for, and the construction judgement of a class, remembered.

The trust policy trusts, MRO and metaclass included: the classes on torch's own allowlist, those
torch registers itself (when registered; asked of a fresh interpreter), the compiled classes of
:data:`~.reach.TRUSTED_NATIVE`, and, for numpy's, the remedy torch's weights-only error prints.
Both answers are remembered while torch's allowlist, the registry and the imported modules are
unchanged, so a report judging thousands of names walks each class once.
"""

from __future__ import annotations

import sys
import threading
from typing import Any, Callable, Optional

from ...registry import snapshot_registry, torch_allowlist_table
from ..facts import torch_own_registrations
from ..names import identity
from .reach import TRUSTED_NATIVE, construction_reason, function_reason
from .remedies import numpy_scalar_remedy

__all__ = ["vouched", "class_reason", "callable_reason"]

_lock = threading.Lock()
_memo: dict[Any, Any] = {}
_MAX = 8192


def _key() -> tuple[Any, ...]:
    table = torch_allowlist_table()
    registry = tuple(sorted(id(g) for g in snapshot_registry()))
    return id(table), len(table), registry, len(sys.modules)


def _build() -> Callable[[type], bool]:
    objs = [v for v in torch_allowlist_table().values() if isinstance(v, type)]
    for name in TRUSTED_NATIVE:  # 'module.Class': looked up, never imported
        module, _, attr = name.rpartition(".")
        found = vars(sys.modules[module]).get(attr) if module in sys.modules else None
        if isinstance(found, type) and identity(found) == name:
            objs.append(found)
    ids = {id(o) for o in objs} | {id(type(o)) for o in objs}
    numpy_ids: list[set[int]] = []
    registered = {id(g) for g in snapshot_registry() if isinstance(g, type)}

    def check(cls: type) -> bool:
        if id(cls) in ids:
            return True
        real = identity(cls) or ""
        if id(cls) in registered and real.startswith("torch.") and real in torch_own_registrations():
            return True  # torch registers it itself (DTensor's classes)
        if not real.startswith("numpy."):
            return False
        if not numpy_ids:
            remedy = [o for o in numpy_scalar_remedy().values() if isinstance(o, type)]
            numpy_ids.append({id(o) for o in remedy} | {id(type(o)) for o in remedy})
        return id(cls) in numpy_ids[0]

    return check


def _remembered(tag: str, obj: Any, compute: Callable[[], Any]) -> Any:
    key = _key()
    with _lock:
        if _memo.get("key") != key or len(_memo) > _MAX:
            _memo.clear()
            _memo["key"] = key
        hit = _memo.get((tag, id(obj)))
    if hit is not None and hit[0] is obj:
        return hit[1]
    value = compute()
    with _lock:
        if _memo.get("key") == key:
            _memo[(tag, id(obj))] = (obj, value)  # the object is kept: its id stays its own
    return value


def vouched() -> Callable[[type], bool]:
    """The predicate: does torch (or :data:`~.reach.TRUSTED_NATIVE`) vouch for this class?"""
    return _remembered("vouched", _remembered, _build)  # type: ignore[no-any-return]


def class_reason(cls: type) -> Optional[str]:
    """:func:`~.reach.construction_reason` of *cls*, remembered."""
    return _remembered("class", cls, lambda: construction_reason(cls, vouched()))  # type: ignore[no-any-return]


def callable_reason(func: Any) -> Optional[str]:
    """:func:`~.reach.function_reason` of *func*, remembered."""
    return _remembered("callable", func, lambda: function_reason(func, vouched()))  # type: ignore[no-any-return]
