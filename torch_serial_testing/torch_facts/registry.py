"""torch's allowlists: its built-in one (``_get_allowed_globals()``), the process-wide registry
(``add_safe_globals``, or an open ``safe_globals`` context), and changes made to them.

Every change the library makes is serialised behind :data:`registry_lock`; registrations made by
modules imported during a test are noted, and torch's own are told apart from the rest.
"""

from __future__ import annotations

import os
import sys
import threading
from contextlib import contextmanager
from typing import Any, Iterator, Optional, Sequence

from ..core.errors import RoundTripConfigError
from ..core.interrupts import deferred_interrupts
from ..core.names import torch_key

__all__ = [
    "registry_lock",
    "torch_allowlist",
    "torch_allowlist_objects",
    "torch_allowlist_table",
    "torch_allowed_type_names",
    "registered_globals",
    "snapshot_registry",
    "restore_registry",
    "preserved_registry",
    "allowlisted",
    "registry_takes_named_entries",
    "safe_globals_context_missing",
    "start_recording",
    "stop_recording",
    "recording_active",
    "torch_own_registrations",
    "registered_by_torch",
]

#: Held while the library reads or changes torch's process-wide registry, and around each prediction
#: and the load it predicts, so both see the same registry.
registry_lock = threading.RLock()


def _wou() -> Any:
    from torch import _weights_only_unpickler as wou

    return wou


def torch_allowlist_table() -> Any:
    """torch's own allowlist (name -> object) as torch holds it: the same object while it is unchanged."""
    return _wou()._get_allowed_globals()


def torch_allowlist_objects() -> dict[str, Any]:
    return dict(_wou()._get_allowed_globals())


def torch_allowlist() -> frozenset[str]:
    """Names torch's weights-only unpickler accepts without any registration."""
    return frozenset(_wou()._get_allowed_globals())


def torch_allowed_type_names() -> frozenset[str]:
    """Real ``module.qualname`` of every value on torch's own allowlist (BUILD accepts instances of
    the types among them)."""
    return frozenset(n for n in map(torch_key, _wou()._get_allowed_globals().values()) if n)


def registered_globals() -> frozenset[str]:
    """Names registered process-wide right now (``add_safe_globals`` or an open context)."""
    import torch

    return frozenset(torch_key(g) or f"<unnamed {type(g).__name__}>" for g in torch.serialization.get_safe_globals())


def snapshot_registry() -> list[Any]:
    import torch

    with registry_lock:
        return list(torch.serialization.get_safe_globals())


def restore_registry(snapshot: Sequence[Any]) -> None:
    """Make the registry equal *snapshot* again: one rebinding of torch's registry (a set since torch
    2.5, a list before), so an interrupt never leaves it half restored; else add and remove entries."""
    import torch

    wou = _wou()
    with registry_lock:
        current = torch.serialization.get_safe_globals()
        if set(current) == set(snapshot):
            return
        for attr, kind in (("_marked_safe_globals_set", set), ("_marked_safe_globals_list", list)):
            if isinstance(getattr(wou, attr, None), kind):
                setattr(wou, attr, kind(snapshot))
                return
        missing = [g for g in snapshot if g not in current]
        if missing:
            wou._add_safe_globals(missing)
        extra = [g for g in current if g not in snapshot]
        if extra:
            wou._remove_safe_globals(extra)


@contextmanager
def preserved_registry() -> Iterator[None]:
    """Restore the registry on exit, whatever happened inside."""
    with registry_lock:
        snap = snapshot_registry()
        try:
            yield
        finally:
            restore_registry(snap)


def safe_globals_context_missing() -> Optional[str]:
    """Why this torch has no ``torch.serialization.safe_globals`` context (torch < 2.5), or None."""
    import torch

    if hasattr(torch.serialization, "safe_globals"):
        return None
    return (
        f"the safe_globals mode needs torch.serialization.safe_globals (torch >= 2.5); "
        f"torch {torch.__version__} lacks it"
    )


_named_entries: dict[Any, bool] = {}


def registry_takes_named_entries() -> bool:
    """Whether torch's allowlist takes ``(obj, "module.Name")`` entries (torch 2.4 keys every entry by
    its own ``__module__.__name__``): registers ``(obj, "<its module>.RenamedProbe")`` and unpickles it."""
    wou = _wou()
    key = wou._get_user_allowed_globals
    known = _named_entries.get(key)
    if known is None:
        from .probes import STOP, ProbeFailed, ProbeOther, global_op, unpickle

        name = f"{ProbeOther.__module__}.RenamedProbe"
        with preserved_registry():
            try:
                wou._add_safe_globals([(ProbeOther, name)])
                outcome = unpickle(global_op(name) + STOP)
            except ProbeFailed:
                raise
            except Exception as e:  # noqa: BLE001 - a registry that rejects the tuple form says no
                outcome = None
                if not isinstance(e, (TypeError, ValueError, AttributeError)):
                    raise ProbeFailed(f"registering an (obj, name) entry raised {type(e).__name__}: {e}") from None
        known = _named_entries[key] = outcome is not None and outcome.loaded and outcome.value is ProbeOther
    return known


@contextmanager
def allowlisted(entries: Sequence[Any]) -> Iterator[None]:
    """Trust *entries* for the weights-only loads inside the block: ``safe_globals`` where torch has it
    (>= 2.5), else ``add_safe_globals``, undone on exit.  For probes and oracles; the ``safe_globals``
    load mode itself never falls back like this."""
    import torch

    with preserved_registry():
        context = getattr(torch.serialization, "safe_globals", None)
        if context is not None:
            with context(list(entries)):
                yield
        else:
            named = [e for e in entries if isinstance(e, tuple)]
            if named and not registry_takes_named_entries():
                raise RoundTripConfigError(
                    f"torch {torch.__version__} allowlists objects only, by their own __module__.__name__: "
                    f"{', '.join(repr(n) for _, n in named)} cannot be allowlisted as (obj, name) here"
                )
            torch.serialization.add_safe_globals(list(entries))
            yield


# -- registrations made by modules imported during a test ------------------------------------------


class ImportRegistrations:
    """What modules imported during one test registered with ``add_safe_globals`` (a plain class:
    one is made per test, and a dataclass costs its methods' compilation at import)."""

    __slots__ = ("kept", "refused", "judge")

    def __init__(self, judge: Any = None) -> None:
        self.kept: list[Any] = []
        #: (name, importing module, why refused) for every dangerous entry that was not registered.
        self.refused: list[tuple[str, str, str]] = []
        #: entry -> why it must not be registered, or None (the trust policy's judgement).
        self.judge = judge

    def __repr__(self) -> str:
        return f"ImportRegistrations(kept={self.kept!r}, refused={self.refused!r})"

    def __eq__(self, other: object) -> bool:  # by value, as GlobalState's fields are compared
        if not isinstance(other, ImportRegistrations):
            return NotImplemented
        return (self.kept, self.refused) == (other.kept, other.refused)

    __hash__ = None  # type: ignore[assignment]


_recorders: list[ImportRegistrations] = []
_original_add: Any = None


def _importer() -> Optional[str]:
    """The module whose import is running ``add_safe_globals`` (None: no import on the stack)."""
    frame: Any = sys._getframe(2)
    caller: Optional[str] = None
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if name.startswith("importlib._bootstrap") or name == "_frozen_importlib":
            return caller or "?"
        if caller is None and not name.startswith(("torch.serialization", "torch._weights_only_unpickler")):
            caller = name
        frame = frame.f_back
    return None


def _recording_add(safe_globals: Any) -> Any:
    """torch's ``_add_safe_globals`` while recording: an import's registrations are judged like declarations."""
    importer = _importer() if _recorders else None
    if importer is None:
        return _original_add(safe_globals)
    accepted = []
    judge = _recorders[0].judge
    for entry in list(safe_globals):
        reason = judge(entry) if judge is not None else None
        for recorder in list(_recorders):
            if reason:
                recorder.refused.append((torch_key(entry) or repr(entry), importer, reason))
            else:
                recorder.kept.append(entry)
        if not reason:
            accepted.append(entry)
    return _original_add(accepted)


def start_recording(judge: Any) -> ImportRegistrations:
    """Note globals registered by module imports (a backend's import-time ``add_safe_globals``);
    *judge* (entry -> reason or None) decides which are refused."""
    global _original_add
    wou = _wou()
    with registry_lock, deferred_interrupts():
        recorder = ImportRegistrations(judge)
        if not _recorders:
            _original_add = wou._add_safe_globals
            _recorders.append(recorder)
            wou._add_safe_globals = _recording_add
        else:
            _recorders.append(recorder)
        return recorder


def stop_recording(recorder: ImportRegistrations) -> None:
    wou = _wou()
    with registry_lock:  # one rebinding each: an interrupt leaves the hook either installed or not
        _recorders[:] = [r for r in _recorders if r is not recorder]
        if not _recorders and wou._add_safe_globals is _recording_add:
            wou._add_safe_globals = _original_add


def recording_active() -> bool:
    """Whether torch's ``_add_safe_globals`` is currently replaced by the import recorder."""
    return bool(_wou()._add_safe_globals is _recording_add)


# -- torch's own registrations -----------------------------------------------------------------------

_CHILD = """
import json, sys
import torch
failed = []
devices = json.loads(sys.argv[1])
def within(name, top):
    return name == top or name.startswith(top + ".")
for name in json.loads(sys.argv[2]):
    try:
        __import__(name)
    except ModuleNotFoundError as e:  # a backend's device module (torch.npu) is none of torch's
        if not any(within(name, d) and within(e.name or "", d) for d in devices):
            failed.append(f"{name}: {type(e).__name__}")
    except Exception as e:
        failed.append(f"{name}: {type(e).__name__}")
def key(g):
    if isinstance(g, tuple) and len(g) == 2 and isinstance(g[1], str):
        return g[1]
    return f"{getattr(g, '__module__', '?')}.{getattr(g, '__qualname__', '?')}"
print(json.dumps({"names": sorted(key(g) for g in torch.serialization.get_safe_globals()), "failed": failed}))
"""


def _device_modules(modules: frozenset[str]) -> list[str]:
    """The ``torch.<device>`` modules among *modules* that are a device's runtime module, as
    ``torch._register_device_module`` puts an out-of-tree backend's (``torch.npu``) there."""
    import torch

    found = []
    for top in sorted({n.split(".")[1] for n in modules if "." in n}):
        module = sys.modules.get(f"torch.{top}")
        try:
            if module is None or vars(torch).get(top) is not module or torch.device(top).type != top:
                continue
        except (RuntimeError, ValueError, TypeError):  # not a device type
            continue
        found.append(f"torch.{top}")
    return found


_own: dict[frozenset[str], frozenset[str]] = {}


def torch_own_registrations() -> frozenset[str]:
    """The names torch itself registers for the ``torch.*`` modules imported here: reported by a fresh
    interpreter (backend autoload off) importing the same ones, remembered per set of modules.  A
    backend's device module it cannot find is none of torch's; any other it cannot import: ProbeFailed."""
    modules = frozenset(
        n for n, m in list(sys.modules.items()) if m is not None and (n == "torch" or n.startswith("torch."))
    )
    known = _own.get(modules)
    if known is not None:
        return known
    import json
    import subprocess

    from .probes import FRESH_PROBE_ENV, ProbeFailed

    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    }
    env["TORCH_DEVICE_BACKEND_AUTOLOAD"] = "0"
    env[FRESH_PROBE_ENV] = "own_registrations"
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _CHILD, json.dumps(_device_modules(modules)), json.dumps(sorted(modules))],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
            stdin=subprocess.DEVNULL,
        )
        lines = proc.stdout.strip().splitlines()
        if not lines:
            last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
            raise ValueError(f"exit status {proc.returncode}: {last}")
        report = json.loads(lines[-1])
    except (OSError, subprocess.SubprocessError, ValueError) as e:
        raise ProbeFailed(
            f"a fresh interpreter could not report torch's own registrations ({type(e).__name__}: {e})"
        ) from None
    if report["failed"]:
        raise ProbeFailed(
            "a fresh interpreter could not import "
            + ", ".join(report["failed"][:3])
            + " to report torch's own registrations"
        )
    known = _own[modules] = frozenset(report["names"])
    return known


_confirmed_own: dict[Any, bool] = {}


def registered_by_torch(entry: Any) -> bool:
    """Whether *entry* is one torch's own modules register: a ``torch.*`` object registered under its
    own ``module.qualname``, which resolves to that very object here and which a fresh interpreter
    importing the same ``torch.*`` modules registers too (:func:`torch_own_registrations`; asked
    only for such entries, and a confirmed one is remembered).  Cannot tell: :class:`ProbeFailed`."""
    obj, name = entry if isinstance(entry, tuple) and len(entry) == 2 else (entry, None)
    real = torch_key(obj)
    if real is None or not real.startswith("torch.") or (name is not None and name != real):
        return False
    try:
        if _confirmed_own.get(entry):
            return True
    except TypeError:  # unhashable: never registered by torch
        return False
    module_name, _, qualname = real.rpartition(".")
    module = sys.modules.get(module_name)
    while module is None and "." in module_name:  # a nested qualname: Outer.Inner
        module_name, _, outer = module_name.rpartition(".")
        qualname = f"{outer}.{qualname}"
        module = sys.modules.get(module_name)
    target: Any = module
    for part in qualname.split("."):
        target = vars(target).get(part) if hasattr(target, "__dict__") else None
    if target is not obj or real not in torch_own_registrations():
        return False
    _confirmed_own[entry] = True
    return True
