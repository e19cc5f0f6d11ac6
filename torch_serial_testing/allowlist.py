"""Which globals a checkpoint needs, which are allowed, and the registry they live in.

torch's weights-only unpickler accepts a global when it is on torch's built-in
allowlist, registered process-wide (``add_safe_globals``), or added by a
``safe_globals`` context.  This module computes each of those sets by the same
``module.qualname`` spelling torch uses, so predictions match torch exactly,
and it serialises every change the library makes to the process-wide registry
behind one lock.
"""

from __future__ import annotations

import importlib
import sys
import threading
from dataclasses import dataclass
from contextlib import contextmanager
from typing import Any, Iterable, Iterator, Optional, Sequence

from .checkpoint import Checkpoint, scan_checkpoint
from .errors import RoundTripConfigError

__all__ = [
    "SafeGlobal",
    "normalize_safe_globals",
    "refuse_dangerous",
    "as_safe_globals",
    "qualified_name",
    "torch_allowlist",
    "registered_globals",
    "required_globals",
    "dangerous_reason",
    "safe_globals_snippet",
    "registry_lock",
    "snapshot_registry",
    "restore_registry",
]

#: Held while the library reads or changes torch's process-wide safe-globals registry
#: and while it loads, so a prediction and the load it predicts see the same registry.
registry_lock = threading.RLock()

# Modules and callables that no allowlist should ever contain: they execute code,
# touch the file system or the process, or reach arbitrary attributes.
_DANGEROUS_MODULES = frozenset(
    "os posix nt sys subprocess shutil socket pty runpy importlib ctypes code codeop "
    "webbrowser marshal pickle _pickle dill multiprocessing signal threading asyncio "
    "pathlib tempfile io _io platform commands popen2 __builtin__".split()
)
_DANGEROUS_BUILTINS = frozenset(
    "eval exec compile getattr setattr delattr __import__ open globals locals vars input "
    "breakpoint memoryview exit quit help".split()
)
_DANGEROUS_QUALIFIED = frozenset(
    [
        "operator.attrgetter",
        "operator.methodcaller",
        "operator.itemgetter",
        "functools.partial",
        "functools.reduce",
        "types.FunctionType",
        "types.CodeType",
        "types.LambdaType",
        "torch.load",
        "torch.serialization.load",
        "torch.jit.load",
        "torch.hub.load",
        "torch._C._jit_set_profiling_executor",
    ]
)


def dangerous_reason(name: str) -> Optional[str]:
    """Why *name* must never be allowlisted, or None when nothing is known against it."""
    if name.startswith("<"):
        return "built at unpickling time, so it cannot be named or checked statically"
    parts = name.split(".")
    if parts[0] in ("builtins", "__builtin__") and len(parts) >= 2 and parts[1] in _DANGEROUS_BUILTINS:
        return f"builtins.{parts[1]} can execute code or reach arbitrary attributes"
    for part in parts[:-1]:
        if part in _DANGEROUS_MODULES:
            return f"module {part!r} gives access to the process, the file system or code execution"
    if name in _DANGEROUS_QUALIFIED:
        return "it calls or reaches arbitrary code"
    return None


@dataclass(frozen=True)
class SafeGlobal:
    """One declared safe global: the object and the name torch matches it by."""

    obj: Any
    name: str
    explicit_name: bool = False

    @property
    def torch_entry(self) -> Any:
        """The form ``torch.serialization.safe_globals`` takes."""
        return (self.obj, self.name) if self.explicit_name else self.obj


def qualified_name(obj: Any) -> str:
    """``module.qualname``: the spelling torch's weights-only unpickler matches."""
    if isinstance(obj, tuple) and len(obj) == 2 and isinstance(obj[1], str):
        return obj[1]
    module = getattr(obj, "__module__", None)
    qualname = getattr(obj, "__qualname__", None)
    if not module or not qualname:
        raise RoundTripConfigError(
            f"safe global {obj!r} has no __module__/__qualname__; declare the class or function "
            "itself, a 'module.Name' string, or an (object, 'module.Name') tuple"
        )
    return f"{module}.{qualname}"


def resolve_global(name: str) -> Any:
    """Import ``module.attr[.attr]`` (longest importable module prefix)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        module_name = ".".join(parts[:cut])
        try:
            obj: Any = importlib.import_module(module_name)
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            break
        return obj
    raise RoundTripConfigError(
        f"safe global {name!r} is not importable; fix the spelling ('package.module.Name') or "
        "declare the object itself"
    )


def normalize_safe_globals(declared: Iterable[Any]) -> tuple[SafeGlobal, ...]:
    """Validate a declaration: objects, 'module.Name' strings or (object, name) tuples.

    Dangerous entries are refused here, long before any load.
    """
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(declared).__name__}; "
            "write safe_globals = (MyModule,)"
        )
    out: list[SafeGlobal] = []
    for item in declared:
        if isinstance(item, str):
            sg = SafeGlobal(resolve_global(item), item)
            if qualified_name(sg.obj) != item:
                sg = SafeGlobal(sg.obj, item, explicit_name=True)
        elif isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], str):
                raise RoundTripConfigError(
                    f"safe global tuple {item!r} must be (object, 'module.Name')"
                )
            sg = SafeGlobal(item[0], item[1], explicit_name=True)
        else:
            sg = SafeGlobal(item, qualified_name(item))
        refuse_dangerous(sg)
        out.append(sg)
    names = [sg.name for sg in out]
    dupes = sorted({n for n in names if names.count(n) > 1})
    if dupes:
        raise RoundTripConfigError(f"safe global declared twice: {', '.join(dupes)}")
    return tuple(out)


def refuse_dangerous(sg: SafeGlobal) -> None:
    """Raise :class:`RoundTripConfigError` if *sg* names or *is* something dangerous.

    The object's own ``module.qualname`` is checked too, so ``(os.system, "mymod.Safe")``
    cannot smuggle ``os.system`` in under a harmless-looking name.
    """
    reason = dangerous_reason(sg.name)
    real = None
    if not reason:
        module = getattr(sg.obj, "__module__", None)
        qualname = getattr(sg.obj, "__qualname__", None)
        if isinstance(module, str) and isinstance(qualname, str):
            real = f"{module}.{qualname}"
            reason = dangerous_reason(real)
    if reason:
        alias = f" (which is {real})" if real and real != sg.name else ""
        raise RoundTripConfigError(f"refusing to allowlist {sg.name}{alias}: {reason}")


def as_safe_globals(safe_globals: Sequence[Any]) -> tuple[SafeGlobal, ...]:
    """*safe_globals* as SafeGlobal entries, refusing dangerous ones (however they are named)."""
    if isinstance(safe_globals, (str, bytes)):
        return normalize_safe_globals(safe_globals)  # raises, naming the fix
    out: list[SafeGlobal] = []
    for sg in safe_globals:
        if isinstance(sg, SafeGlobal):
            refuse_dangerous(sg)
            out.append(sg)
        else:
            out.extend(normalize_safe_globals([sg]))
    return tuple(out)


def torch_allowlist() -> frozenset[str]:
    """Names torch's weights-only unpickler accepts without any registration."""
    from torch import _weights_only_unpickler as wou

    return frozenset(wou._get_allowed_globals())


def registered_globals() -> frozenset[str]:
    """Names registered process-wide right now (``add_safe_globals`` or an open context)."""
    import torch

    return frozenset(qualified_name(g) for g in torch.serialization.get_safe_globals())


def required_globals(obj_or_buffer: Any) -> list[str]:
    """Sorted globals a checkpoint needs beyond torch's own allowlist, found without unpickling.

    Accepts a checkpoint (bytes, buffer, path, :class:`Checkpoint`) or any object,
    which is ``torch.save``-d into memory first.
    """
    if isinstance(obj_or_buffer, (Checkpoint, bytes, bytearray, memoryview, str)) or hasattr(
        obj_or_buffer, "read"
    ):
        info = scan_checkpoint(obj_or_buffer)
    else:
        info = Checkpoint.save(obj_or_buffer).info
    if info.format == "torchscript":
        from .errors import CheckpointFormatError

        raise CheckpointFormatError(
            "this is a TorchScript archive: load it with torch.jit.load; weights_only does not apply"
        )
    allowed = torch_allowlist()
    # Types BUILD is applied to count too (numpy.dtypes.Float64DType never appears as a GLOBAL).
    needed = set(info.globals) | set(getattr(info, "type_checks", ()))
    return sorted(g for g in needed if g not in allowed and g not in _torch_allowed_type_names())


def _torch_allowed_type_names() -> frozenset[str]:
    """``module.qualname`` of the types on torch's own allowlist (BUILD accepts their instances)."""
    from torch import _weights_only_unpickler as wou

    return frozenset(
        f"{v.__module__}.{v.__qualname__}" for v in wou._get_allowed_globals().values() if isinstance(v, type)
    )


def safe_globals_snippet(names: Sequence[str], *, context: Optional[bool] = None) -> str:
    """A ready-to-paste ``with torch.serialization.safe_globals([...]):`` block with its imports.

    Pure string work: nothing is imported, so it is safe on names from a hostile file.
    Dangerous names are left out, each with a comment saying why.  Where torch has no
    ``safe_globals`` context (torch < 2.5; *context* None detects it) the snippet uses
    ``add_safe_globals`` instead.
    """
    if context is None:
        import torch

        context = hasattr(torch.serialization, "safe_globals")
    imports: set[str] = set()
    refs: list[str] = []
    skipped: list[str] = []
    for name in sorted(names):
        if dangerous_reason(name):
            skipped.append(name)
            continue
        if name.startswith("torch.") and name.count(".") == 1:
            refs.append(name)  # torch.ScriptObject, torch.Size: reachable as torch.<attr>
            continue
        if name.startswith("builtins.") and name.count(".") == 1:
            refs.append(name.split(".", 1)[1])  # set, complex: no import needed
            continue
        module, attr_path = _split_module(name)
        imports.add(f"from {module} import {attr_path.split('.')[0]}")
        refs.append(attr_path)
    lines = ["import torch", *sorted(imports), ""]
    if context:
        lines.append(f"with torch.serialization.safe_globals([{', '.join(refs)}]):")
        lines.append("    obj = torch.load(f, weights_only=True)")
    else:
        lines.append("# this torch has no safe_globals context (torch < 2.5): register process-wide")
        lines.append(f"torch.serialization.add_safe_globals([{', '.join(refs)}])")
        lines.append("obj = torch.load(f, weights_only=True)")
    for name in skipped:
        lines.append(f"# NOT allowlisted, dangerous: {name} ({dangerous_reason(name)})")
    return "\n".join(lines)


def _split_module(name: str) -> tuple[str, str]:
    """Split 'pkg.mod.Outer.Inner' at the longest already-imported module (never imports)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:cut]) in sys.modules:
            return ".".join(parts[:cut]), ".".join(parts[cut:])
    return ".".join(parts[:-1]), parts[-1]


def snapshot_registry() -> list[Any]:
    """A copy of torch's process-wide safe-globals registry."""
    import torch

    with registry_lock:
        return list(torch.serialization.get_safe_globals())


def restore_registry(snapshot: Sequence[Any]) -> None:
    """Make the registry equal *snapshot* again (re-adding what torch's context exit removed)."""
    import torch

    with registry_lock:
        current = torch.serialization.get_safe_globals()
        if set(current) == set(snapshot):
            return
        torch.serialization.clear_safe_globals()
        if snapshot:
            # Restoring a snapshot, not trusting anything new.
            torch.serialization.add_safe_globals(list(snapshot))


@contextmanager
def preserved_registry() -> Iterator[None]:
    """Restore the registry on exit, whatever happened inside."""
    with registry_lock:
        snap = snapshot_registry()
        try:
            yield
        finally:
            restore_registry(snap)
