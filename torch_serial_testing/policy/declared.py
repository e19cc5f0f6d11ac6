"""A declaration of safe globals, read once: what each entry is, the name torch matches it by.

Entries are objects, ``'module.Name'`` strings, ``(object, 'module.Name')`` pairs (torch's form for a
class pickled under another name) or :class:`UnsafeCallable` wrappers (accepted as plain entries).
The author's declaration is trusted as torch trusts it, with one small check
(:func:`declaration_problem`): what can never be a safe global is refused, saying the fix.
"""

from __future__ import annotations

import importlib
import types
from dataclasses import dataclass
from typing import Any, Iterable, Optional

from ..core.errors import RoundTripConfigError
from ..core.names import name_problem, qualified_name, quote_name, show_name, torch_key

__all__ = [
    "SafeGlobal",
    "UnsafeCallable",
    "split_entry",
    "normalize_safe_globals",
    "as_safe_globals",
    "declared_entries",
    "declaration_problem",
    "resolve_global",
]


@dataclass(frozen=True)
class SafeGlobal:
    """One declared safe global: the object and the name torch matches it by."""

    obj: Any
    name: str
    explicit_name: bool = False
    #: The author's reason, for an :class:`UnsafeCallable` entry.
    unsafe_reason: Optional[str] = None

    @property
    def torch_entry(self) -> Any:
        """The form ``torch.serialization.safe_globals`` takes."""
        return (self.obj, self.name) if self.explicit_name else self.obj


class UnsafeCallable:
    """A function declared with the reason the checkpoint calls it:
    ``UnsafeCallable("numpy._core.multiarray._reconstruct", reason="numpy arrays")``.  Functions may be
    declared plainly too; the tools (``inspect``, ``audit``) ask for this form before suggesting one."""

    __slots__ = ("target", "reason")

    def __init__(self, target: Any, *, reason: str) -> None:
        if not isinstance(reason, str) or not reason.strip():
            raise RoundTripConfigError(
                "UnsafeCallable needs reason='why this checkpoint legitimately calls it' (a non-empty string)"
            )
        self.target = target
        self.reason = reason

    def __repr__(self) -> str:
        target = self.target if isinstance(self.target, str) else torch_key(self.target) or type(self.target).__name__
        return f"UnsafeCallable({show_name(target)}, reason={self.reason!r})"


def _check_declaration(declared: Any) -> None:
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(declared).__name__}; "
            "write safe_globals = (MyModule,) (objects, 'module.Name' strings or (obj, 'module.Name') tuples)"
        )


def split_entry(item: Any) -> tuple[Any, Optional[str], bool, Optional[str]]:
    """(object or None for a bare name, the name torch matches it by or None when the object has none,
    whether that name was explicit, the :class:`UnsafeCallable` reason) of one entry; imports nothing."""
    if isinstance(item, SafeGlobal):
        return item.obj, item.name, item.explicit_name, item.unsafe_reason
    if isinstance(item, UnsafeCallable):
        if isinstance(item.target, str):
            return None, item.target, True, item.reason
        return item.target, torch_key(item.target), False, item.reason
    if isinstance(item, str):
        return None, item, True, None
    if isinstance(item, tuple):
        if len(item) != 2 or not isinstance(item[1], str):
            raise RoundTripConfigError(
                f"safe global tuple {show_name(repr(item)[:80])} must be (object, 'module.Name')"
            )
        return item[0], item[1], True, None
    return item, torch_key(item), False, None


def resolve_global(name: str) -> Any:
    """Import ``module.attr[.attr]`` (longest importable module prefix) of an author's declaration."""
    problem = name_problem(name)
    if problem:
        raise RoundTripConfigError(
            f"safe global {quote_name(name)} is not a dotted Python name ({problem}); write 'package.module.Name'"
        )
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        try:
            obj: Any = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise RoundTripConfigError(
        f"safe global {quote_name(name)} is not importable; fix the spelling ('package.module.Name') or "
        "declare the object itself"
    )


#: Modules whose every global runs code or reaches the system, and globals elsewhere that do (or
#: build calls of anything: partial, attrgetter): never a safe global, however it is declared.
CODE_RUNNING_MODULES = frozenset(
    {"os", "posix", "nt", "subprocess", "_posixsubprocess", "pty", "runpy", "code", "codeop", "ctypes", "marshal"}
    | {"pickle", "_pickle", "shutil", "importlib", "sys", "socket", "webbrowser", "pdb", "multiprocessing"}
)
CODE_RUNNING = frozenset(
    {f"builtins.{n}" for n in ("eval", "exec", "compile", "__import__", "open", "breakpoint", "input", "exit")}
    | {f"builtins.{n}" for n in ("getattr", "setattr", "delattr", "globals", "locals", "vars", "quit", "help")}
    | {"functools.partial", "operator.attrgetter", "operator.methodcaller", "operator.itemgetter"}
    | {"torch.load", "torch.serialization.load", "torch.jit.load", "torch.hub.load", "torch.package.PackageImporter"}
)


def _code_running(name: Optional[str]) -> bool:
    if not name:
        return False
    module = name.rpartition(".")[0]
    return name in CODE_RUNNING or any(module == m or module.startswith(m + ".") for m in CODE_RUNNING_MODULES)


def declaration_problem(obj: Any, name: str, explicit: bool) -> Optional[str]:
    """Why *obj* can never be the safe global *name* (*explicit*: the author wrote the name), or None.

    Refused: a module; a known code-running callable (``eval``, ``os.system``, ``subprocess.*``), by its
    own identity and by the declared name; an object that is not importable under the name it pickles
    by (``module.qualname``).  Anything else the author may trust, as torch lets them: their classes,
    torch's (``torch.testing._internal.two_tensor.TwoTensor`` included), functions."""
    if isinstance(obj, types.ModuleType):
        return f"it is the module {show_name(obj.__name__)}: a pickle names globals in modules, never a module itself"
    real = torch_key(obj)
    for n in {real, name}:
        if _code_running(n):
            return f"{show_name(n)} runs code or reaches the system when a pickle calls it"
    if explicit:
        return None  # (obj, 'module.Name'): torch matches the name the pickle wrote, as the author says
    try:
        found = resolve_global(name)
    except RoundTripConfigError as e:
        return str(e)
    if found is not obj:
        return (
            f"{name} resolves to another object: a pickle names it by its module and qualified name, so "
            f"declare it as ({getattr(obj, '__name__', 'obj')}, '<the name the checkpoint uses>')"
        )
    return None


def normalize_safe_globals(declared: Iterable[Any]) -> tuple[SafeGlobal, ...]:
    """A declaration as :class:`SafeGlobal` entries; what can never be a safe global is refused here."""
    _check_declaration(declared)
    out: list[SafeGlobal] = []
    for item in declared:
        obj, name, explicit, unsafe = split_entry(item)
        if obj is None:  # a name the author wrote: imported to find the object
            obj = resolve_global(name)  # type: ignore[arg-type]
            explicit = torch_key(obj) != name
        elif name is None:
            raise RoundTripConfigError(
                f"refusing to allowlist {obj!r}: it has no __module__/__qualname__ of its own; declare a "
                "class or function itself, a 'module.Name' string, or an (object, 'module.Name') tuple"
            )
        elif explicit and name_problem(name):
            raise RoundTripConfigError(
                f"safe global tuple names {quote_name(name)}, not a dotted Python name ({name_problem(name)})"
            )
        problem = declaration_problem(obj, name, explicit)  # type: ignore[arg-type]
        if problem:
            raise RoundTripConfigError(f"refusing to allowlist {show_name(name)}: {problem}")
        out.append(SafeGlobal(obj, name, explicit, unsafe))  # type: ignore[arg-type]
    names = [sg.name for sg in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RoundTripConfigError(f"safe global declared twice: {', '.join(map(show_name, dupes))}")
    return tuple(out)


as_safe_globals = normalize_safe_globals


def declared_entries(safe_globals: Any) -> tuple[tuple[Any, str], ...]:
    """``(object or None, name)`` per entry, refusing nothing (a prediction only predicts).  Objects are
    named by ``module.qualname`` as torch's ``_get_user_allowed_globals`` does (never their ``.name``);
    ``'module.Name'`` strings are not imported."""
    _check_declaration(safe_globals)
    entries = (split_entry(item)[:2] for item in safe_globals)
    return tuple((obj, qualified_name(obj) if name is None else name) for obj, name in entries)  # raises, saying why
