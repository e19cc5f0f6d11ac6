"""Names are data: validating the dotted names a checkpoint carries, and escaping text.

A GLOBAL's module and name are bytes an attacker wrote: a name that is not a dotted sequence of
plain ASCII identifiers is *malformed* and only ever shown through :func:`show_name`, and free text
goes through :func:`escape_text`, so a name can neither run as code when pasted nor repaint a
terminal.  Pure string work, linear in its input: nothing here imports what a name refers to.
"""

from __future__ import annotations

import keyword
import re
import types
from typing import Any, Optional

__all__ = [
    "MAX_NAME_LENGTH",
    "name_problem",
    "is_valid_name",
    "show_name",
    "quote_name",
    "escape_text",
    "pickle_forms",
    "imported_prefix",
    "qualified_name",
    "torch_key",
    "identity",
    "FUNCTION_TYPES",
]

#: Longer names are malformed: no real class path comes near it, and a report must stay readable.
MAX_NAME_LENGTH = 512
#: How much of a malformed name a report shows.
_SHOWN = 160
#: The scanner's placeholders for globals it cannot name, e.g. "<unresolved STACK_GLOBAL>".
_MARKER = re.compile(r"<[A-Za-z0-9_ ]{1,80}>\Z")


def name_problem(name: Any) -> Optional[str]:
    """Why *name* is not a dotted sequence of ASCII Python identifiers, or None.  ASCII: Python folds
    identifiers with NFKC (``ｅｖａｌ`` *is* ``eval`` in a snippet), and lookalikes would make a report lie."""
    if not isinstance(name, str):
        return f"not a string but {type(name).__name__}"
    if not name:
        return "empty"
    if len(name) > MAX_NAME_LENGTH:
        return f"{len(name)} characters long (limit {MAX_NAME_LENGTH})"
    if not name.isascii():
        return "contains non-ASCII characters"
    for part in name.split("."):
        if not part:
            return "has an empty part (a leading, trailing or doubled '.')"
        if not part.isidentifier() or keyword.iskeyword(part):
            shown = ascii(part) if len(part) <= 40 else f"{ascii(part[:40])}..."
            return f"part {shown} is " + ("a Python keyword" if part.isidentifier() else "not a Python identifier")
    if "." not in name:
        return "has no module part ('module.Name')"
    return None


def is_valid_name(name: Any) -> bool:
    return name_problem(name) is None


def is_marker(name: Any) -> bool:
    """True for the scanner's placeholders such as ``<unresolved STACK_GLOBAL>``."""
    return isinstance(name, str) and _MARKER.match(name) is not None


def show_name(name: Any) -> str:
    """*name* fit for any text output: as is when valid, else ``ascii()``-quoted and shortened."""
    if is_valid_name(name) or is_marker(name):
        return str(name)
    if not isinstance(name, str):
        return f"<{type(name).__name__}>"
    if len(name) > _SHOWN:
        return f"{ascii(name[:_SHOWN])}...({len(name)} characters)"
    return ascii(name)


def quote_name(name: Any) -> str:
    """``'a.b'`` for a valid name, else the ``ascii()`` form of :func:`show_name`."""
    shown = show_name(name)
    return f"'{shown}'" if shown == name else shown


def _escape_char(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"


def escape_text(text: Any, *, keep_newlines: bool = False) -> str:
    """*text* with every non-printable character (controls, ESC, CR, bidi overrides, lone surrogates)
    shown as a visible ``\\xNN``/``\\uNNNN`` escape; ``keep_newlines`` keeps ``\\n``."""
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(c if c.isprintable() or (keep_newlines and c == "\n") else _escape_char(c) for c in s)


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


def imported_prefix(name: str) -> int:
    """How many leading parts of the dotted *name* form the longest module already in ``sys.modules``
    (0: none); found by slicing, so linear in the name's length, and importing nothing."""
    import sys

    dots = [i for i, c in enumerate(name) if c == "."]
    cut = len(dots)
    while cut > 0 and name[: dots[cut - 1]] not in sys.modules:
        cut -= 1
    return cut


def torch_key(entry: Any) -> Optional[str]:
    """The name torch's allowlist keys *entry* by: ``name`` of an ``(obj, name)`` pair, else
    ``obj.__module__ + "." + obj.__qualname__`` read as torch reads them; None without those strings."""
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[1]
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) and module else None


def qualified_name(obj: Any) -> str:
    """``module.qualname``: the spelling torch's weights-only unpickler matches *obj* by."""
    name = torch_key(obj)
    if name is None:
        from .errors import RoundTripConfigError

        raise RoundTripConfigError(
            f"safe global {obj!r} has no __module__/__qualname__; declare the class or function "
            "itself, a 'module.Name' string, or an (object, 'module.Name') tuple"
        )
    return name


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
