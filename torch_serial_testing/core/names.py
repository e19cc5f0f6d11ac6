"""Names are data: validating the dotted names a checkpoint carries, and escaping text.

A GLOBAL's module and name are bytes an attacker wrote.  Before such a name may
appear in a snippet, a message or a report it must be a dotted sequence of
plain Python identifiers; anything else is *malformed* and is only ever shown
through :func:`show_name` (``ascii()``-escaped, quoted, shortened).  Free text
that may carry such bytes (error messages, report fields) goes through
:func:`escape_text`, so a name can neither run as code when pasted nor repaint
a terminal (escape sequences, carriage returns, bidi overrides).

Pure string work: nothing here imports or runs what a name refers to.  Every
function is linear in the length of its input.
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
    "qualified_name",
    "torch_key",
    "identity",
    "FUNCTION_TYPES",
]

#: Longer names are malformed: no real class path comes near it, and a report
#: must stay readable (the scanner has its own, separate cap on what it reads).
MAX_NAME_LENGTH = 512
#: How much of a malformed name a report shows.
_SHOWN = 160
# Placeholders the scanner writes for globals it cannot name, e.g. "<unresolved STACK_GLOBAL>".
_MARKER = re.compile(r"<[A-Za-z0-9_ ]{1,80}>\Z")


def name_problem(name: Any) -> Optional[str]:
    """Why *name* is not a dotted sequence of ASCII Python identifiers, or None when it is.

    ASCII only: Python folds non-ASCII identifiers with NFKC when it compiles a
    snippet (``ｅｖａｌ`` *is* ``eval`` there) and lookalike letters would make
    a report lie to its reader, so such names are malformed here.
    """
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
        if not part.isidentifier():
            return f"part {_quote(part)} is not a Python identifier"
        if keyword.iskeyword(part):
            return f"part {_quote(part)} is a Python keyword"
    if "." not in name:
        return "has no module part ('module.Name')"
    return None


def _quote(s: str) -> str:
    return ascii(s) if len(s) <= 40 else f"{ascii(s[:40])}..."


def is_valid_name(name: Any) -> bool:
    """True for ``module.Name`` spelled with ASCII identifiers only (see :func:`name_problem`)."""
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
    """*name* in quotes for a message: ``'a.b'`` when valid, else the ``ascii()`` form of :func:`show_name`."""
    shown = show_name(name)
    return f"'{shown}'" if shown == name else shown


def _escape_char(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def escape_text(text: Any, *, keep_newlines: bool = False) -> str:
    """*text* with every non-printable character (controls, ESC, CR, bidi overrides, lone
    surrogates) replaced by a visible ``\\xNN``/``\\uNNNN`` escape.

    ``keep_newlines`` keeps ``\\n`` (multi-line messages); everything else is escaped.
    """
    s = text if isinstance(text, str) else str(text)
    if s.isprintable():
        return s
    return "".join(
        c if c.isprintable() or (keep_newlines and c == "\n") else _escape_char(c) for c in s
    )


def pickle_forms(name: str) -> tuple[str, ...]:
    """*name* and every spelling a full unpickle may resolve it to (first: *name* itself).

    ``pickle`` rewrites Python 2 names under protocol < 3 (``_compat_pickle``:
    ``cPickle.loads`` -> ``pickle.loads``, ``urllib.urlretrieve`` ->
    ``urllib.request.urlretrieve``) and ``torch.load`` maps ``torch.tensor`` to
    ``torch._tensor``; a judgement must cover each form.  Pure string work.
    """
    import _compat_pickle

    forms = [name]
    candidates: list[str] = []
    # A GLOBAL's module/name split is not known from the dotted form: try every split.
    start = 0
    while True:
        cut = name.find(".", start)
        if cut < 0:
            break
        mod, rest = name[:cut], name[cut + 1:]
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
    for c in candidates:
        if c not in forms:
            forms.append(c)
    return tuple(forms)


# -- the names objects go by ------------------------------------------------------------------


def torch_key(entry: Any) -> Optional[str]:
    """The name torch's allowlist keys *entry* by: ``name`` of an ``(obj, name)`` pair, else
    ``obj.__module__ + "." + obj.__qualname__`` read as torch reads them (plain attributes);
    None when the object has no such pair of strings."""
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
    types.FunctionType, types.BuiltinFunctionType, types.MethodType, types.WrapperDescriptorType,
    types.MethodWrapperType, types.MethodDescriptorType, types.ClassMethodDescriptorType,
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
            if module is None and isinstance(getattr(obj, "__self__", None), types.ModuleType):
                module = obj.__self__.__name__
        else:
            return None
    except Exception:  # noqa: BLE001 - an object that cannot say what it is
        return None
    if isinstance(module, str) and isinstance(qualname, str):
        return f"{module}.{qualname}"
    return None
