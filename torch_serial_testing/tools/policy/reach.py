"""What constructing or BUILD-ing a class, or calling a function, can reach: judged without running it.

A weights-only load runs, for an allowlisted class, ``cls(*args)`` (REDUCE), ``cls.__new__(cls,
*args)`` (NEWOBJ) and ``inst.__setstate__(state)`` or ``setattr`` (BUILD), with arguments the pickle
chooses, and later the instance's finalizer.  Two things make such a class unsafe:

* **compiled code** on that path (a type not created by a ``class`` statement, or an entry point that
  is not a Python function: pybind11 and C types, ``torch._C``'s): the policy cannot see what it
  does (``torch._C._aoti.AOTIModelPackageLoader`` runs a compiler, ``torch.PyTorchFileWriter``
  truncates files), so it is refused unless torch vouches for the class (its own allowlist, or the
  remedy its errors print) or :data:`TRUSTED_NATIVE` names it;
* **Python code on that path that reaches** a denylisted module or function (files, sockets,
  processes, compilers, other pickles): the names its code objects use (``co_names``, the
  interpreter's own record, never source text) are looked up in its globals, in the class and in
  the modules it uses, and followed through Python functions and classes, a bounded number of steps.

Everything from a vouched class up its MRO (``object``, plain builtins, torch's allowlisted classes)
is trusted as torch trusts it.
"""

from __future__ import annotations

import builtins
import types
from typing import Any, Callable, Optional

from ..names import identity
from .denylist import denylist_reason, reach_reason

__all__ = ["TRUSTED_NATIVE", "construction_reason", "function_reason"]

#: Compiled classes the policy trusts although torch does not allowlist them, and why.
TRUSTED_NATIVE: dict[str, str] = {
    "torch.ScriptObject": (
        "torch.save writes it for TorchBind objects (quantized packed parameters); NEWOBJ makes an empty "
        "holder, and BUILD can only call a __setstate__ a loaded TorchBind class registered"
    ),
    "numpy.ndarray": (
        "numpy's array: its constructor and __setstate__ build an array from a shape, a dtype and bytes "
        "(bounds-checked), or from objects already unpickled"
    ),
    "collections.deque": "a container: it is built from an iterable already unpickled",
    "collections.defaultdict": (
        "a dict: built from a mapping already unpickled; its default factory is an object the load already "
        "allowed, called only when your code reads a missing key"
    ),
    "datetime.date": "a value type: built from numbers or its own bytes",
    "datetime.time": "a value type: built from numbers or its own bytes",
    "datetime.datetime": "a value type: built from numbers or its own bytes",
    "datetime.timedelta": "a value type: built from numbers",
    "datetime.timezone": "a value type: built from a timedelta and a name",
    "decimal.Decimal": "a value type: built from a string, a number or a digit tuple",
}

#: What the weights-only unpickler (and the instance's life) calls on a class or instance.
ENTRY_POINTS = ("__new__", "__init__", "__setstate__", "__setattr__", "__getattr__", "__getattribute__", "__del__")
_HEAPTYPE = 1 << 9
#: How many functions one judgement follows, and how deep.
MAX_FUNCTIONS = 400
MAX_DEPTH = 4


def _plain_builtin(cls: type) -> bool:
    name = identity(cls)
    return name is not None and name.startswith("builtins.") and denylist_reason(name) is None


def _class_attr(cls: type, name: str) -> Any:
    """What *name* is in the ``__dict__`` of the first class of *cls*'s MRO that has it (None: none);
    read from the dicts, no descriptor or ``__getattr__`` runs."""
    for k in type.__getattribute__(cls, "__mro__"):
        found = type.__getattribute__(k, "__dict__").get(name)
        if found is not None:
            return found
    return None


def _unwrap(entry: Any) -> Any:
    return entry.__func__ if isinstance(entry, (staticmethod, classmethod)) else entry


class _Walk:
    """One judgement's memory: what was followed, against a budget."""

    def __init__(self, vouched: Callable[[type], bool]) -> None:
        self.vouched = vouched
        self.seen: set[int] = set()
        self.count = 0

    def vouches(self, cls: type) -> bool:
        return cls is object or _plain_builtin(cls) or self.vouched(cls)

    # -- the class the pickle names: compiled code on its path is refused -------------------------

    def top(self, cls: type) -> Optional[str]:
        if self.vouches(cls):
            return None
        meta = type(cls)
        if meta is not type and not self.vouches(meta):
            why = self._mro(meta, ("__call__",), native=True, stop=type)
            if why:
                return f"its metaclass: {why}"
        return self._mro(cls, ENTRY_POINTS, native=True)

    def _mro(self, cls: type, names: tuple[str, ...], *, native: bool, stop: Optional[type] = None) -> Optional[str]:
        for k in type.__getattribute__(cls, "__mro__"):
            if k is stop or self.vouches(k):
                return None
            shown = identity(k) or repr(k)
            why = reach_reason(shown)
            if why:
                return f"it is or subclasses {shown}: {why}" if not native else f"{shown}: {why}"
            if native and not type.__getattribute__(k, "__flags__") & _HEAPTYPE:
                return f"{shown} is a compiled type: what building it does cannot be seen"
            own = type.__getattribute__(k, "__dict__")
            for name in names:
                entry = _unwrap(own.get(name))
                if entry is None:
                    continue
                if isinstance(entry, types.FunctionType):
                    why = self.function(entry, 1, cls)
                    if why:
                        return f"{shown}.{name} {why}"
                elif native and not self._vouched_descriptor(entry):
                    return (
                        f"{shown}.{name} is compiled code ({type(entry).__name__}): what it does with the "
                        "pickle's arguments cannot be seen"
                    )
        return None

    def _vouched_descriptor(self, obj: Any) -> bool:
        owner = getattr(obj, "__objclass__", None)
        return isinstance(owner, type) and self.vouches(owner)

    # -- code on the path: what it uses ---------------------------------------------------------

    def function(self, func: types.FunctionType, depth: int, owner: Optional[type] = None) -> Optional[str]:
        """Why calling the Python function *func* can reach files, sockets, processes, compilers or pickles."""
        if id(func) in self.seen or depth > MAX_DEPTH or self.count >= MAX_FUNCTIONS:
            return None
        self.seen.add(id(func))
        self.count += 1
        names: set[str] = set()
        stack = [func.__code__]
        while stack:
            code = stack.pop()
            names.update(code.co_names)
            stack.extend(c for c in code.co_consts if isinstance(c, types.CodeType))
        namespace = func.__globals__ if isinstance(func.__globals__, dict) else {}
        builtin_names = vars(builtins)
        # globals first: a name in co_names may be an attribute (os.open), not the builtin (open)
        for name in sorted(names, key=lambda n: (n not in namespace, n)):
            if name in namespace:
                why = self._used(namespace[name], names, depth)
            elif name in builtin_names:
                why = reach_reason(f"builtins.{name}")
            elif owner is not None:
                attr = _unwrap(_class_attr(owner, name))
                why = self.function(attr, depth + 1, owner) if isinstance(attr, types.FunctionType) else None
            else:
                continue
            if why:
                return f"uses {name}, which {why}" if why.startswith("uses ") else f"uses {name}: {why}"
        return None

    def _used(self, obj: Any, names: set[str], depth: int) -> Optional[str]:
        if isinstance(obj, types.ModuleType):
            module = getattr(obj, "__name__", None)
            if not isinstance(module, str):
                return None
            why = reach_reason(module)
            if why:
                return why
            namespace = vars(obj)
            for attr in sorted(names & namespace.keys()):
                if not attr.startswith("__"):
                    why = self._object(namespace[attr], depth, f"{module}.{attr}")
                    if why:
                        return f"{module}.{attr}: {why}" if not why.startswith(module) else why
            return None
        return self._object(obj, depth)

    def _object(self, obj: Any, depth: int, spelled: Optional[str] = None) -> Optional[str]:
        if isinstance(obj, types.ModuleType):
            module = getattr(obj, "__name__", None)
            return reach_reason(module) if isinstance(module, str) else None
        if not callable(obj):
            return None
        for name in (spelled, identity(obj)):
            why = reach_reason(name) if name else None
            if why:
                return why
        if isinstance(obj, types.FunctionType):
            return self.function(obj, depth + 1)
        if isinstance(obj, type) and depth < MAX_DEPTH and id(obj) not in self.seen and not self.vouches(obj):
            self.seen.add(id(obj))
            return self._mro(obj, ENTRY_POINTS, native=False)
        return None


def construction_reason(cls: type, vouched: Callable[[type], bool]) -> Optional[str]:
    """Why constructing or BUILD-ing *cls* may do more than build a value (None: nothing seen);
    *vouched* says which classes torch (or :data:`TRUSTED_NATIVE`) trusts, MRO and all."""
    return _Walk(vouched).top(cls)


def function_reason(func: Any, vouched: Callable[[type], bool]) -> Optional[str]:
    """Why calling the Python function *func* can reach files, sockets, processes, compilers or other
    pickles (None for compiled functions, which the denylist judges by name)."""
    if not isinstance(func, types.FunctionType):
        return None
    why = _Walk(vouched).function(func, 0)
    return f"it {why}" if why else None
