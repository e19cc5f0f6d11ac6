"""Names are data: validating the dotted names a checkpoint carries, and escaping text.

A GLOBAL's module and name are bytes an attacker wrote: a name that is not a dotted sequence of
plain ASCII identifiers is *malformed* and only ever shown through :func:`show_name`, and free text
goes through :func:`escape_text`, so a name can neither run as code when pasted nor repaint a
terminal.  Pure string work, linear in its input: nothing here imports what a name refers to.
"""

from __future__ import annotations

import types
from typing import Any, Optional


def pickle_forms(name: str) -> tuple[str, ...]:
    """*name* and every spelling a full unpickle may resolve it to, for a judgement to cover: ``pickle``
    renames Python 2 names under protocol < 3 (``_compat_pickle``), ``torch.load`` maps ``torch.tensor``."""
    import _compat_pickle

    candidates = []
    start = 0
    while True:  # a GLOBAL's module/name split is not known from the dotted form: try every split
        cut = name.find(".", start)
        if cut < 0:
            break
        mod, rest = name[:cut], name[cut + 1 :]
        head, _, tail = rest.partition(".")
        if (mod, rest) in _compat_pickle.NAME_MAPPING:
            candidates.append(".".join(_compat_pickle.NAME_MAPPING[(mod, rest)]))
        elif tail and (mod, head) in _compat_pickle.NAME_MAPPING:
            candidates.append(".".join(_compat_pickle.NAME_MAPPING[(mod, head)]) + "." + tail)
        if mod in _compat_pickle.IMPORT_MAPPING:
            candidates.append(f"{_compat_pickle.IMPORT_MAPPING[mod]}.{rest}")
        if mod == "torch.tensor":  # torch.serialization's load_module_mapping
            candidates.append(f"torch._tensor.{rest}")
        start = cut + 1
    return tuple(dict.fromkeys([name, *candidates]))


FUNCTION_TYPES = (
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.WrapperDescriptorType,
    types.MethodWrapperType,
    types.MethodDescriptorType,
    types.ClassMethodDescriptorType,
)


def identity(obj: Any) -> Optional[str]:
    """The ``module.qualname`` a class or function really has, read past any hook (a class's
    ``__getattribute__``, a forged ``__qualname__`` on a partial); None for anything else."""
    try:
        if isinstance(obj, type):
            module = type.__getattribute__(obj, "__module__")
            qualname = type.__getattribute__(obj, "__qualname__")
        elif isinstance(obj, FUNCTION_TYPES):
            module = getattr(obj, "__module__", None)
            qualname = getattr(obj, "__qualname__", None)
            owner = getattr(obj, "__self__", None)
            if module is None and isinstance(owner, types.ModuleType):
                module = owner.__name__
        else:
            return None
    except Exception:  # noqa: BLE001 - an object that cannot say what it is
        return None
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None
