"""The trust policy: which globals may ever be allowlisted, judged without running them.

A weights-only load calls every allowlisted global the pickle names, with arguments of its choosing,
and a list of known-bad callables is always one name short; so the policy is positive:

* a safe global must be a **class** (not a metaclass) importable under exactly the declared name
  and resolving to the very object declared -- ``__qualname__`` is never taken on trust;
* anything else is refused unless torch allowlists it itself or the author opts in with
  :class:`UnsafeCallable` (plain functions only), and is never suggested;
* the **denylist** (:mod:`.denylist`) refuses even classes, under every full-unpickle spelling, by
  the object's real identity and by every base class;
* "cannot tell" (a module not imported, a module ``__getattr__``) is dangerous.

Judging never imports or runs a checkpoint's names: ``sys.modules``, ``__dict__``\\ s and
``inspect.getattr_static`` only.
"""

from __future__ import annotations

import sys
import types
from dataclasses import dataclass
from typing import Any, Optional

from ...declarations import UnsafeCallable
from ...errors import escape_text, imported_prefix, is_marker, name_problem, show_name
from ...errors import ProbeFailed
from ...registry import torch_allowlist, torch_allowlist_table
from ..facts import torch_registers_itself
from ..names import FUNCTION_TYPES, identity, pickle_forms
from .denylist import denylist_reason
from .reach import TRUSTED_NATIVE
from .remedies import NUMPY_SCALAR_SOURCE, numpy_scalar_remedy
from .vouched import callable_reason, class_reason

__all__ = [
    "Verdict",
    "UnsafeCallable",
    "judge_name",
    "judge_global",
    "judge_registry_entry",
    "dangerous_reason",
    "describe",
]

#: Verdict kinds, from worst to best.
KINDS = ("malformed", "dangerous", "callable", "absent", "alias", "class", "documented", "allowlisted")
#: Said of every callable refused: the one way to allow a function, and that it never admits a dangerous one.
ESCAPE_HATCH = "only UnsafeCallable('{name}', reason='...') allows a function, if you trust it"
NEVER_ADMITTED = "UnsafeCallable, the opt-in for a trusted function, refuses it too"


@dataclass(frozen=True)
class Verdict:
    """What the policy says about one name: ``kind`` (see :data:`KINDS`) and why.  ``dangerous``
    includes "cannot tell"; ``callable`` only :class:`UnsafeCallable` may allow; ``absent`` names nothing
    here; ``alias`` is a class under another name than its own ``module.qualname``, which torch matches;
    ``documented`` is a function torch itself names as the remedy (numpy scalars' reconstructor)."""

    name: str
    kind: str
    reason: str
    #: ``dangerous`` only because a module it names is not imported here (judging never imports one):
    #: whoever trusts that module may import it and judge again.
    not_imported: bool = False
    #: A numpy 1 name judged by what numpy 2 forwards it to (that name): allowed only as ``(obj, name)``.
    moved: Optional[str] = None

    @property
    def suggestible(self) -> bool:
        """Only verified classes, and what torch itself names as the remedy, are ever suggested."""
        return self.kind in ("class", "documented")


class _CannotTell(str):
    """Why what a name refers to cannot be told statically (*not_imported*: because a module is not imported)."""

    not_imported = False

    @classmethod
    def module_missing(cls, reason: str) -> _CannotTell:
        told = cls(reason)
        told.not_imported = True
        return told


class _Absent(str):
    """Why a name refers to nothing in this process."""


def describe(obj: Any) -> str:
    """What *obj* is, in words ("a class", "a function", "a functools.partial object" ...)."""
    if isinstance(obj, types.ModuleType):
        return f"the module {escape_text(getattr(obj, '__name__', '?'))}"
    if isinstance(obj, type):
        return "a metaclass" if issubclass(obj, type) else "a class"
    if isinstance(obj, types.FunctionType):
        return "a function"
    if isinstance(obj, types.BuiltinFunctionType):
        owner = getattr(obj, "__self__", None)
        return (
            "a builtin function"
            if owner is None or isinstance(owner, types.ModuleType)
            else f"a bound method of a {type(owner).__name__} object"
        )
    if isinstance(obj, (types.MethodType, types.MethodWrapperType)):
        return f"a bound method ({type(obj).__name__}) of a {type(obj.__self__).__name__} object"
    kind = identity(type(obj)) or type(obj).__name__
    return f"an object of type {show_name(kind)}" + ("" if callable(obj) else " (not callable)")


def _denied(name: Optional[str]) -> Optional[str]:
    return denylist_reason(name) if name and name_problem(name) is None else None


def _documented(name: str) -> Optional[Any]:
    """The object torch names as the remedy under *name* (numpy scalars' reconstructor, ``numpy.dtype``,
    the dtype classes; before torch 2.5 also ``_codecs.encode``, which pickles their bytes), or None.  Asked
    of torch only for those names; imports numpy, nothing else."""
    if not name.startswith("numpy.") and name != "_codecs.encode":
        return None
    return numpy_scalar_remedy().get(name)


def _callable_refusal(obj: Any, reason: str) -> str:
    """*reason*, naming :class:`UnsafeCallable` when *obj* is a function (the one escape hatch)."""
    if isinstance(obj, type) or not callable(obj) or isinstance(obj, types.ModuleType):
        return reason
    return f"{reason}; {NEVER_ADMITTED}"


def _judge_object(obj: Any, depth: int = 0) -> tuple[str, str]:
    """(kind, reason) for an object already in hand; only "class" passes the policy."""
    if isinstance(obj, types.ModuleType):
        return "dangerous", (
            f"it is {describe(obj)}: a module hands the pickle every attribute it has, and torch.save never writes one"
        )
    real = identity(obj)
    why = _denied(real)
    if why:
        return "dangerous", f"it is {real}: {why}"
    if isinstance(obj, type):
        if issubclass(obj, type):
            return "dangerous", "it is a metaclass: the pickle could build new classes from its own data"
        for base in type.__getattribute__(obj, "__mro__")[1:]:
            base_name = identity(base)
            why = _denied(base_name)
            if why:
                return "dangerous", f"it subclasses {base_name}: {why}"
        why = class_reason(obj)
        if why:
            return "dangerous", (
                f"constructing or BUILD-ing it can do more than build a value ({why}); only a class torch "
                "allowlists itself may be like that"
            )
        trusted = TRUSTED_NATIVE.get(real or "")
        return "class", f"a compiled class the policy trusts: {trusted}" if trusted else "a class"
    why = None if isinstance(obj, FUNCTION_TYPES) else _denied(identity(type(obj)))
    if why:
        return "dangerous", f"it is {describe(obj)}: {why}"
    why = callable_reason(obj)
    if why:
        return "dangerous", f"{why}; {NEVER_ADMITTED}"
    owner = getattr(obj, "__self__", None) if isinstance(obj, FUNCTION_TYPES) else None
    if owner is not None and not isinstance(owner, types.ModuleType) and depth < 3:
        kind, reason = _judge_object(owner, depth + 1)
        if kind == "dangerous":
            return "dangerous", f"it is {describe(obj)}, and that object: {reason}"
    return "callable", (
        f"it is {describe(obj)}, not a class: the pickle would call it with arguments of its choosing; "
        + ESCAPE_HATCH.format(name=show_name(real) if real else "module.name")
    )


def _resolve_static(name: str) -> Any:
    """The object *name* names in this process (found importing and running nothing), or a
    :class:`_CannotTell` / :class:`_Absent` reason."""
    import importlib.machinery
    import inspect

    parts = name.split(".")
    cut = imported_prefix(name)
    if cut == 0:
        return _CannotTell.module_missing(
            f"module {parts[0]} is not imported in this process, and judging never imports what a checkpoint names"
        )
    path = ".".join(parts[:cut])
    obj: Any = sys.modules[path]
    for attr in parts[cut:]:
        if isinstance(obj, types.ModuleType):
            namespace = vars(obj)
            sub = sys.modules.get(f"{path}.{attr}")
            if attr in namespace:
                obj = namespace[attr]
            elif sub is not None:
                obj = sub
            elif "__getattr__" in namespace:
                return _CannotTell(f"{path} computes {attr!r} in a module-level __getattr__ at load time")
            else:
                search = getattr(obj, "__path__", None)
                try:
                    found = (
                        search is not None
                        and importlib.machinery.PathFinder.find_spec(f"{path}.{attr}", list(search)) is not None
                    )
                except (ImportError, ValueError, TypeError):
                    found = True  # an unusual package: do not guess
                if found:
                    return _CannotTell.module_missing(f"{path}.{attr} is a submodule that is not imported here")
                return _Absent(
                    f"{path} (imported) has no attribute {attr!r}: a forged name or one from "
                    "another version; no load mode can load it here"
                )
        else:
            try:
                obj = inspect.getattr_static(obj, attr)
            except AttributeError:
                return _Absent(f"{path} has no attribute {attr!r}: no load mode can load it here")
        path = f"{path}.{attr}"
    return obj


NUMPY1_NAME = (
    "a numpy 1 name: numpy 2 forwards numpy.core to numpy._core, so a full unpickle gets {new}; torch "
    "matches the name as written, so the allowlist needs the form (obj, name)"
)


def _numpy2() -> bool:
    """numpy 2 or newer is imported here (judging never imports numpy)."""
    version = getattr(sys.modules.get("numpy"), "__version__", "0")
    return isinstance(version, str) and version.split(".")[0].isdigit() and int(version.split(".")[0]) >= 2


def judge_name(name: Any, allowed: Optional[Any] = None) -> Verdict:
    """The verdict on a name read from a checkpoint (*allowed*: torch's own allowlist, None: asked)."""
    if is_marker(name):
        return Verdict(name, "dangerous", "built at unpickling time, so it cannot be named or checked statically")
    problem = name_problem(name)
    if problem:
        return Verdict(
            str(name) if isinstance(name, str) else repr(name),
            "malformed",
            f"not a dotted Python name ({problem}); nothing is suggested for it",
        )
    if allowed is None:
        allowed = torch_allowlist()
    if name in allowed:
        return Verdict(name, "allowlisted", "torch allowlists it itself")
    documented = _documented(name)
    if documented is not None and _resolve_static(name) is documented:
        kind = "class" if isinstance(documented, type) else "documented"
        return Verdict(name, kind, ("a class; " if kind == "class" else "") + NUMPY_SCALAR_SOURCE)
    why = denylist_reason(name)
    if why:
        return Verdict(name, "dangerous", _callable_refusal(_resolve_static(name), why))
    if name.startswith("numpy.core.") and _numpy2():
        # numpy 2 keeps numpy.core as a module whose __getattr__ forwards to numpy._core: judge what it
        # forwards to; torch matches the name as written, so only an (object, name) form allows it
        moved = judge_name("numpy._core." + name[len("numpy.core.") :], allowed)
        if moved.kind in ("dangerous", "absent", "malformed"):
            return Verdict(name, moved.kind, f"numpy 2 forwards it to {show_name(moved.name)}: {moved.reason}")
        return Verdict(
            name, moved.kind, f"{NUMPY1_NAME.format(new=show_name(moved.name))}; {moved.reason}", moved=moved.name
        )
    worst: Optional[Verdict] = None
    untold = []  # per dangerous form: only because a module is not imported?
    for form in pickle_forms(name):
        found = _resolve_static(form)
        prefix = "" if form == name else f"a full unpickle resolves it as {form}: "
        if isinstance(found, _CannotTell):
            verdict = Verdict(name, "dangerous", f"{prefix}cannot tell what it is ({found}); treated as dangerous")
            untold.append(found.not_imported)
        elif isinstance(found, _Absent):
            verdict = Verdict(name, "absent", f"{prefix}{found}")
        else:
            kind, reason = _judge_object(found)
            real = identity(found) if kind == "class" else form
            if real != form:
                kind, reason = (
                    "alias",
                    (
                        f"an alias of the class {show_name(real)}: torch matches a class by its "
                        "own name, so only an explicit (class, name) declaration would match it"
                    ),
                )
            verdict = Verdict(name, kind, prefix + reason)
            untold.append(kind != "dangerous")
        if worst is None or KINDS.index(verdict.kind) < KINDS.index(worst.kind):
            worst = verdict
    assert worst is not None
    if worst.kind == "dangerous" and all(untold):
        return Verdict(worst.name, worst.kind, worst.reason, not_imported=True)
    return worst


def judge_global(obj: Any, name: Optional[str] = None, *, opt_in: bool = False) -> Optional[str]:
    """Why *obj* may not be declared or registered as the safe global *name* (default its
    ``module.qualname``; an ``(obj, name)`` tuple is accepted as *obj*), or None when it may.

    The one check for declarations, ``UnsafeCallable`` opt-ins (*opt_in*: plain functions pass) and
    registry entries: *name* must resolve, among modules already imported, to the very same object.
    """
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], str) and name is None:
        obj, name = obj
    if name is None:
        name = identity(obj)
        if name is None:
            kind, reason = _judge_object(obj)
            if kind == "dangerous":
                return reason
            return f"{describe(obj)} has no module and qualified name of its own: declare a class"
    problem = name_problem(name)
    if problem:
        return f"the name {show_name(name)} is not a dotted Python name ({problem})"
    if torch_allowlist_table().get(name, judge_global) is obj:
        return None  # torch vouches for it itself
    documented = _documented(name)
    if documented is not None and documented is obj and _resolve_static(name) is obj:
        return None  # torch names it as the remedy itself
    why = denylist_reason(name)
    if why:
        return _callable_refusal(obj, why)
    kind, reason = _judge_object(obj)
    if kind == "dangerous":
        return reason
    if kind == "callable" and not (opt_in and _plain_function(obj)):
        if opt_in:
            return (
                f"it is {describe(obj)}: UnsafeCallable accepts only plain module-level functions "
                "and builtins, never bound methods, partials or other callable objects"
            )
        return reason
    found = _resolve_static(name)
    if isinstance(found, (_CannotTell, _Absent)):
        return (
            f"cannot verify that {name} is the declared object ({found}); declare the object "
            "under the name it is importable by"
        )
    if found is not obj:
        return (
            f"{name} resolves to {describe(found)}, not to the declared object: the name must "
            "resolve to exactly what is declared"
        )
    return None


def _plain_function(obj: Any) -> bool:
    return isinstance(obj, types.FunctionType) or (
        isinstance(obj, types.BuiltinFunctionType)
        and (obj.__self__ is None or isinstance(obj.__self__, types.ModuleType))
    )


def dangerous_reason(name: str) -> Optional[str]:
    """Why *name* must never be allowlisted (a ``dangerous`` or ``malformed`` verdict), or None."""
    verdict = judge_name(name)
    return verdict.reason if verdict.kind in ("dangerous", "malformed") else None


def judge_registry_entry(entry: Any) -> Optional[str]:
    """Why a safe-globals registration (object or ``(object, name)``) must not stand, or None.

    Judged like a declaration (plain functions accepted, as with ``UnsafeCallable``: torch and backends
    register rebuild functions such as ``_rebuild_njt``), whoever made it.  Being a class torch defines
    exempts nothing (``torch.jit.CompilationUnit`` runs TorchScript); only what torch's own modules
    register themselves is torch's responsibility (asked of a fresh interpreter); when that cannot be
    asked, for the entry or a class it reaches, the entry is refused saying so."""
    try:
        reason = judge_global(entry, opt_in=True)
    except ProbeFailed as e:  # a class on its path is trusted only if torch registers it itself
        return f"whether torch itself registers it or a class it reaches is unknown: {e}"
    if reason is None:
        return None
    try:
        if torch_registers_itself(entry):
            return None
    except ProbeFailed as e:
        return f"{reason} (and whether torch itself registers it is unknown: {e})"
    return reason
