"""A declaration of safe globals, read once: each entry and the name torch matches it by.  It is trusted as
torch trusts it, with one small check (:func:`declaration_problem`), and judged against what loads needed."""

from __future__ import annotations

import functools
import importlib
import sys
import types
from dataclasses import dataclass
from typing import Any, Iterable, Optional, Sequence

from .errors import AllowlistError, RoundTripConfigError, imported_prefix, is_marker, name_problem
from .errors import qualified_name, quote_name, show_name, torch_key
from .registry import registered_globals, safe_globals_context_missing, torch_allowlist

#: Modules whose every global runs code or reaches the system, and globals elsewhere that do (or
#: build calls of anything: partial, attrgetter): never a safe global, however it is declared.
CODE_RUNNING_MODULES = frozenset(
    {"os", "posix", "nt", "subprocess", "_posixsubprocess", "pty", "runpy", "code", "codeop", "ctypes", "marshal"}
    | {"pickle", "_pickle", "shutil", "importlib", "sys", "socket", "webbrowser", "pdb", "multiprocessing"}
    # the compiled or frozen modules the ones above are implemented by (their objects' own identity)
    | {"_ctypes", "_socket", "_imp", "_frozen_importlib", "_frozen_importlib_external"}
)

CODE_RUNNING = frozenset(
    {f"builtins.{n}" for n in ("eval", "exec", "compile", "__import__", "open", "breakpoint", "input", "exit")}
    | {f"builtins.{n}" for n in ("getattr", "setattr", "delattr", "globals", "locals", "vars", "quit", "help")}
    | {"functools.partial", "operator.attrgetter", "operator.methodcaller", "operator.itemgetter"}
    | {"torch.load", "torch.serialization.load", "torch.jit.load", "torch.hub.load", "torch.package.PackageImporter"}
    | {"torch.storage._load_from_bytes", "builtins.function", "builtins.code", "types.FunctionType", "types.CodeType"}
    # the same objects by their own module and qualified name (what declaring the object itself gives)
    | {"io.open", "_io.open", "torch.jit._serialization.load", "torch.package.package_importer.PackageImporter"}
)

#: Globals a later torch allowlists itself (``builtins.set``: 2.6).  Declaring one is never over-trust: one
#: declaration serves every torch and module, whether its checkpoint names it or not.
LATER_ALLOWLISTED = frozenset({"builtins.set"})

_Names = Iterable[str]


@dataclass(frozen=True)
class SafeGlobal:
    """One declared safe global: the object and the name torch matches it by."""

    obj: Any
    name: str
    explicit_name: bool = False
    unsafe_reason: Optional[str] = None  # the author's reason, for an UnsafeCallable entry

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
        self.target, self.reason = target, reason

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
    """(object or None, the name torch matches it by or None, explicit name?, UnsafeCallable reason); no import."""
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
    if problem := name_problem(name):
        raise RoundTripConfigError(
            f"safe global {quote_name(name)} is not a dotted Python name ({problem}); write 'package.module.Name'"
        )
    parts = name.split(".")
    for find in (sys.modules.get, importlib.import_module):  # an imported module first, without the import machinery
        for cut in range(len(parts) - 1, 0, -1):
            try:
                module = find(".".join(parts[:cut]))
            except ImportError:
                continue
            if module is not None:
                try:
                    return functools.reduce(getattr, parts[cut:], module)
                except AttributeError:
                    break
    raise RoundTripConfigError(
        f"safe global {quote_name(name)} is not importable; fix the spelling ('package.module.Name') or "
        "declare the object itself"
    )


def _code_running(name: Optional[str]) -> bool:
    parts = (name or "").split(".")[:-1]  # the module and each package above it
    return name in CODE_RUNNING or any(".".join(parts[:i]) in CODE_RUNNING_MODULES for i in range(1, len(parts) + 1))


def _runs_as(obj: Any, depth: int = 0) -> list[Optional[str]]:
    """What calling *obj* calls if not *obj*: a call-building instance's class, a bound method's owner."""
    if isinstance(obj, (type, types.ModuleType, types.FunctionType)) or depth > 3:
        return []
    owner = getattr(obj, "__self__", None)
    if owner is None or isinstance(owner, types.ModuleType):
        return [torch_key(type(obj))]
    return [torch_key(type(obj)), torch_key(owner), *_runs_as(owner, depth + 1)]


def declaration_problem(obj: Any, name: str, explicit: bool) -> Optional[str]:
    """Why *obj* can never be the safe global *name* (*explicit*: the author wrote it): a module, a known
    code-running callable (by identity and by name), an object not importable under its pickled name."""
    if isinstance(obj, types.ModuleType):
        return f"it is the module {show_name(obj.__name__)}: a pickle names globals in modules, never a module itself"
    for n in dict.fromkeys((torch_key(obj), name, *_runs_as(obj))):
        if _code_running(n):
            return f"{show_name(n)} runs code or reaches the system when a pickle calls it"
    if explicit:
        return None  # (obj, 'module.Name'): torch matches the name the pickle wrote, as the author says
    try:
        if resolve_global(name) is obj:
            return None
    except RoundTripConfigError as e:
        return str(e)
    return (
        f"{name} resolves to another object: a pickle names it by its module and qualified name, so "
        f"declare it as ({getattr(obj, '__name__', 'obj')}, '<the name the checkpoint uses>')"
    )


def normalize_safe_globals(declared: Iterable[Any], label: Optional[str] = None) -> tuple[SafeGlobal, ...]:
    """A declaration as :class:`SafeGlobal` entries; what can never be a safe global is refused here, a
    function-local class first if the declaration has a *label* (``TestFoo.safe_globals``)."""
    if _returned.get(id(declared)) is declared:
        return declared  # type: ignore[return-value]  # this function's own result (the mixin's, every load)
    _check_declaration(declared)
    entries = (label, *declared)  # read every time: a name resolves to what its module holds now
    for item in entries[1:] if label else ():
        try:
            obj, name = split_entry(item)[:2]
        except RoundTripConfigError:
            continue  # named below
        named = {name, torch_key(obj) if obj is not None else None}
        if local := sorted(n for n in named if isinstance(n, str) and "<locals>" in n):
            raise RoundTripConfigError(
                f"{label} lists {local[0]}, which is not importable: " + local_class_message(local[0])
            )
    out: list[SafeGlobal] = []
    for item in entries[1:]:
        obj, name, explicit, unsafe = split_entry(item)
        if isinstance(obj, types.ModuleType):  # refused below, named even without a name of its own
            name = name or obj.__name__
        elif obj is None:  # a name the author wrote: imported to find the object
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
        if problem := declaration_problem(obj, name, explicit):  # type: ignore[arg-type]
            raise RoundTripConfigError(f"refusing to allowlist {show_name(name)}: {problem}")
        out.append(SafeGlobal(obj, name, explicit, unsafe))  # type: ignore[arg-type]
    names = [sg.name for sg in out]
    if dupes := sorted({n for n in names if names.count(n) > 1}):
        raise RoundTripConfigError(f"safe global declared twice: {', '.join(map(show_name, dupes))}")
    if len(_returned) >= 256:
        _returned.clear()
    result = tuple(out)
    _returned[id(result)] = result
    return result


#: The tuples :func:`normalize_safe_globals` returned, by id (kept alive: an id stays its own).  Handed back,
#: they are read already; anything else (a tuple the author wrote, entries made by hand) is read every time.
_returned: dict[int, tuple[SafeGlobal, ...]] = {}


as_safe_globals = normalize_safe_globals


def declared_entries(safe_globals: Any) -> tuple[tuple[Any, str], ...]:
    """``(object or None, name)`` per entry as torch names it (``module.qualname``), refusing nothing."""
    _check_declaration(safe_globals)
    entries = (split_entry(item)[:2] for item in safe_globals)
    return tuple((obj, qualified_name(obj) if name is None else name) for obj, name in entries)  # raises, saying why


def allowed_anyway() -> frozenset[str]:
    """What declaring changes nothing for: torch's allowlist (now or later) and the registry."""
    return torch_allowlist() | registered_globals() | LATER_ALLOWLISTED


def names_used(info: Any) -> set[str]:
    """Every name a weights-only load of *info* may need allowed (globals, BUILD types, container targets)."""
    kinds = ("type", "append", "appends", "setitem", "setitems")
    return set(info.globals) | {c.name for c in info.checks if c.kind in kinds}


def paste_parts(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(import lines, references) naming *names* in code, each imported from its longest imported module."""
    imports: set[str] = set()
    refs: list[str] = []
    bound: dict[str, str] = {"torch": "torch"}  # a name in the snippet -> what it names
    for name in sorted(names, key=lambda n: (not n.startswith("builtins."), n)):
        module, _, attr = name.rpartition(".")
        if module in ("builtins", "torch"):
            refs.append(attr if module == "builtins" else name)
            bound.setdefault(attr, name)
            continue
        parts = name.split(".")
        cut = imported_prefix(name) or len(parts) - 1
        module, head, rest = ".".join(parts[:cut]), parts[cut], parts[cut + 1 :]
        local, n = head, 1
        while bound.setdefault(local, f"{module}.{head}") != f"{module}.{head}":
            n += 1
            local = f"{head}_{n}"
        imports.add(f"from {module} import {head}" + (f" as {local}" if local != head else ""))
        ref, found = ".".join([local, *rest]), sys.modules.get(module)
        for part in parts[cut:]:  # looked up, never imported (a module's __getattr__ is not called)
            found = vars(found).get(part) if hasattr(found, "__dict__") else None
        # torch keys an object by its own module.qualname: another spelling (numpy 1's) needs (object, 'name')
        refs.append(ref if torch_key(found) == name else f"({ref}, {name!r})")
    return sorted(imports), refs


@dataclass(frozen=True)
class Declaration:
    """Globals a load trusts (*entries*), declared in *owner*'s *attribute* or (None) *method*'s argument."""

    owner: str
    attribute: Optional[str]
    method: str = "round_trip"
    entries: Sequence[SafeGlobal] = ()

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.attribute}" if self.attribute else f"the safe_globals= argument of {self.method}()"

    def fix(self, names: Sequence[str]) -> str:
        """The declaration of exactly *names*, where it lives, then the plain ``torch.load`` form."""
        imports, refs = paste_parts(names)
        listed = ", ".join(refs)
        tuple_text = f"({listed}{',' if len(refs) == 1 else ''})"
        if self.attribute:
            where = f"class {self.owner}(...):\n    {self.attribute} = {tuple_text}"
        else:
            where = f"self.{self.method}(..., safe_globals={tuple_text})"
        if safe_globals_context_missing() is None:
            call = f"with torch.serialization.safe_globals([{listed}]):\n    obj = torch.load(f, weights_only=True)"
        else:
            call = f"torch.serialization.add_safe_globals([{listed}])\nobj = torch.load(f, weights_only=True)"
        head = "\n".join(["import torch", *imports, ""])
        return f"{head}\n{where}\n\n(outside a test class, the same globals in a torch.load call:)\n{head}\n{call}"

    def error(
        self, declared: _Names, missing: _Names = (), unneeded: _Names = (), saved_types: Sequence[Optional[str]] = ()
    ) -> AllowlistError:
        """One error for what the declaration misses and over-trusts, and the declaration fixing both."""
        missing, unneeded = sorted(set(missing)), sorted(set(unneeded))
        keep = sorted((set(declared) - set(unneeded)) | set(missing))
        shown_missing, shown_unneeded = ", ".join(map(show_name, missing)), ", ".join(map(show_name, unneeded))
        if missing:
            text = f"{self.label} misses {len(missing)} global(s) the checkpoint needs: {shown_missing}"
            text += f" and over-trusts {len(unneeded)} it does not need: {shown_unneeded}" if unneeded else ""
        else:
            text = f"{self.label} over-trusts: the checkpoint does not need {shown_unneeded}." if unneeded else ""
        # a name no declaration may hold (attacker text, a code-running callable) never reaches the code
        if refused := [f"{show_name(n)}: {why}" for n in missing if (why := _undeclarable(n))]:
            return AllowlistError(
                f"{text}\nNo declaration can make this checkpoint load: {'; '.join(refused)}. Never declare it; "
                "only a checkpoint from a trusted source is worth a declaration."
            )
        saved_type = next((t for t in saved_types if t is not None), None)
        hint = (
            f"\nClass-level safe_globals apply to every round_trip in the class; this one saves a "
            f"{saved_type}, not a module: pass safe_globals=() (or the globals it needs) to this "
            "call, or use round_trip_state_dict (which uses state_dict_safe_globals)."
            if unneeded and self.attribute == "safe_globals" and saved_type is not None
            else ""
        )
        fixing = "" if missing else "Remove them, or set allow_unneeded_safe_globals = True on the class. "
        return AllowlistError(
            f"{text}\n{fixing}The exact declaration (declare only what you trust):{hint}\n\n{self.fix(keep)}"
        )

    def blocked(self, blocker: str, named: Sequence[str]) -> AllowlistError:
        also = f" (it also names {', '.join(map(show_name, named))} beyond torch's allowlist)" if named else ""
        return AllowlistError(
            f"{self.label}: this checkpoint cannot load weights-only, whatever is allowlisted: {blocker}{also}\n"
            "The safe_globals mode cannot pass for it. Save something weights-only can load (a "
            "state_dict, plain containers), or drop this test's safe_globals mode with "
            "@round_trip_dims(load_modes=('weights_only_false', 'default'))."
        )


def _undeclarable(name: str) -> Optional[str]:  # of a global a checkpoint needs
    if is_marker(name):
        return "built at unpickling time, so no name can allow it"
    if problem := name_problem(name):
        return f"not a dotted Python name ({problem})"
    return "it runs code or reaches the system when a pickle calls it" if _code_running(name) else None


def local_class_message(name: str) -> str:
    return (
        f"{name} is defined inside a function ('<locals>' in its name): pickle, and so torch.save, "
        "can only store classes importable by module path, so no checkpoint can name it.  Move the "
        "class to module level -- checkpointed classes belong in an importable module."
    )
