"""What torch *should* do with one load, here and now: :func:`predict`.

The effective ``weights_only`` comes from torch's own precedence (explicit argument,
the ``TORCH_FORCE_*`` switches, the version default; see :mod:`.decision`).  With
``weights_only=True`` the checks the scan recorded (:attr:`CheckpointInfo.checks`)
are replayed in torch's order against what is allowed -- torch's allowlist, the
process-wide registry, the declared globals -- and the first one that fails is the
rejection torch will raise.  Nothing is loaded or refused here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

from .allowlist import (
    SafeGlobal,
    qualified_name,
    registered_globals,
    registry_lock,
    torch_allowlist,
    torch_allowlist_objects,
)
from .build_state import build_failure
from .checkpoint import Checkpoint
from .errors import RoundTripConfigError
from .modes import LoadMode
from .names import show_name
from .pickle_scan import Check, class_repr, special_global_messages
from .unpickler_model import append_refused
from .torch_unpickler_rules import build_rules, message_drops_builtins_prefix, torch_refuses_torchscript_weights_only
from .decision import Decision, decide

__all__ = ["Expectation", "declared_entries", "declared_names", "predict"]


@dataclass(frozen=True)
class Expectation:
    """What torch should do with one load, and why."""

    mode: LoadMode
    weights_only: bool
    warns: bool
    loads: bool
    missing: tuple[str, ...]
    reason: str
    replaced_by: Optional[str] = None
    unsupported_opcodes: tuple[str, ...] = ()
    #: torch's reason when no allowlist can make this checkpoint load weights-only (see
    #: CheckpointInfo.weights_only_blocker); None when allowlisting can help, or not weights-only.
    blocker: Optional[str] = None
    #: The text torch's rejection must contain: the first check the weights-only unpickler fails.
    rejection: Optional[str] = None
    #: The exception torch raises when it rejects: UnpicklingError from the weights-only unpickler,
    #: RuntimeError for a TorchScript or legacy tar archive refused before any unpickling.
    error_type: str = "UnpicklingError"

    def summary(self, loaded: Optional[bool] = None, notes: Sequence[str] = (), warned: Optional[bool] = None) -> str:
        """``default: rejected as expected (weights_only=True since torch 2.6; X not allowlisted)``.

        *notes* are the ways a replaced ``torch.load`` reported differently from torch's own
        (see :func:`load`); *warned* is what was observed when it differs from the prediction.
        """
        loaded = self.loads if loaded is None else loaded
        verb = "loaded" if loaded else "rejected"
        why = self.reason
        if not loaded and self.missing:
            why += f"; {', '.join(map(show_name, self.missing))} not allowlisted"  # names are data: escaped
        if not loaded and self.unsupported_opcodes:
            why += f"; opcode {', '.join(self.unsupported_opcodes)} not supported by the weights-only unpickler"
        if not loaded and self.blocker and not self.unsupported_opcodes:
            why += f"; cannot load weights-only: {self.blocker}"
        if self.warns if warned is None else warned:
            why += "; torch warned"
        if self.replaced_by:
            why += f"; torch.load is replaced by {self.replaced_by}"
            if notes:
                why += ", which " + "; ".join(notes)
        return f"{self.mode.value}: {verb} as expected ({why})"


def declared_entries(safe_globals: Any) -> tuple[tuple[Any, str], ...]:
    """``(object or None, name)`` for each safe global, in any form the mixin accepts.

    Objects are named by ``module.qualname``, as torch's ``_get_user_allowed_globals`` does (never
    an object's own ``.name`` attribute); ``'module.Name'`` strings are not imported (no object);
    ``(obj, 'module.Name')`` tuples keep both.  Nothing is refused here: deciding what may be
    trusted is :func:`load`'s job, a prediction only predicts.
    """
    if type(safe_globals) is tuple:
        known = _entries.get(id(safe_globals))
        if known is not None and known[0] is safe_globals:
            return known[1]
        entries = _declared_entries(safe_globals)
        if len(_entries) >= 256:
            _entries.clear()
        _entries[id(safe_globals)] = (safe_globals, entries)  # the tuple is kept: its id stays its own
        return entries
    return _declared_entries(safe_globals)


#: id(tuple) -> (the tuple, its entries): load() passes the same accepted declaration every time.
_entries: dict[int, tuple[tuple[Any, ...], tuple[tuple[Any, str], ...]]] = {}


def _declared_entries(safe_globals: Any) -> tuple[tuple[Any, str], ...]:
    if isinstance(safe_globals, (str, bytes)) or not hasattr(safe_globals, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(safe_globals).__name__}; "
            "write safe_globals=[MyModule] (objects, 'module.Name' strings or (obj, 'module.Name') tuples)"
        )
    entries: list[tuple[Any, str]] = []
    for item in safe_globals:
        if isinstance(item, SafeGlobal):
            entries.append((item.obj, item.name))
        elif isinstance(item, str):
            entries.append((None, item))
        elif isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], str):
                raise RoundTripConfigError(f"safe global tuple {item!r} must be (object, 'module.Name')")
            entries.append((item[0], item[1]))
        else:
            entries.append((item, qualified_name(item)))
    return tuple(entries)


def declared_names(safe_globals: Any) -> tuple[str, ...]:
    """The names torch matches *safe_globals* by (see :func:`declared_entries`)."""
    return tuple(name for _obj, name in declared_entries(safe_globals))


def _as_checkpoint(checkpoint: Any, caller: str) -> Checkpoint:
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    if isinstance(checkpoint, LoadMode) or (isinstance(checkpoint, str) and not os.path.exists(checkpoint)):
        try:
            LoadMode.parse(checkpoint)
        except RoundTripConfigError:
            pass
        else:
            raise RoundTripConfigError(
                f"{caller}() got the load mode {str(checkpoint)!r} where the checkpoint goes: the order is "
                + ("predict(mode, checkpoint, ...)" if caller == "predict" else "load(checkpoint, mode, ...)")
            )
    if caller == "predict":
        # Predicting never unpickles, so any checkpoint form scan_checkpoint reads will do.
        return Checkpoint.from_buffer(checkpoint)
    raise TypeError(
        f"load() takes a Checkpoint, got {type(checkpoint).__name__}; wrap foreign bytes with "
        "Checkpoint.from_bytes(...) (they will only be loaded weights-only)"
    )


def predict(
    mode: LoadMode | str,
    checkpoint: Any,
    safe_globals: Sequence[Any] = (),
    environ: Optional[Mapping[str, str]] = None,
) -> Expectation:
    """What torch should do loading *checkpoint* in *mode*, here and now.

    With ``weights_only=True`` the checkpoint's scanned checks (:attr:`CheckpointInfo.checks`)
    are replayed in torch's order against what is allowed: the first one that fails is the
    rejection torch raises; a :attr:`CheckpointInfo.weights_only_blocker` means no allowlist helps.

    *checkpoint* is a :class:`Checkpoint` or anything :func:`scan_checkpoint` reads (bytes, a
    buffer, a path); *safe_globals* takes objects, ``'module.Name'`` strings and
    ``(obj, 'module.Name')`` tuples.  It only predicts: nothing is refused or loaded.
    """
    if isinstance(mode, Checkpoint):
        raise RoundTripConfigError(
            "predict() got a Checkpoint where the load mode goes: the order is predict(mode, checkpoint, ...)"
        )
    return _predict(LoadMode.parse(mode), _as_checkpoint(checkpoint, "predict"), declared_entries(safe_globals), environ)


def _predict(
    mode: LoadMode, checkpoint: Checkpoint, declared: tuple[tuple[Any, str], ...], environ: Optional[Mapping[str, str]]
) -> Expectation:
    """:func:`predict` once its arguments are checked (load() calls this with its own checked ones)."""
    return _expected(mode, checkpoint, declared, decide(mode, environ))


def _expected(
    mode: LoadMode, checkpoint: Checkpoint, declared: tuple[tuple[Any, str], ...], decision: Decision
) -> Expectation:
    """The expectation of loading *checkpoint* under *decision*."""
    if not decision.weights_only:  # a full load: nothing the checkpoint names can stop it
        full = decision.full
        if full is None:
            full = decision.full = Expectation(mode, False, decision.warns, True, (), decision.reason,
                                               decision.replaced_by)
        return full
    reason = decision.reason
    if not torch_refuses_torchscript_weights_only() and checkpoint.format == "torchscript":
        # This torch hands a TorchScript archive to torch.jit.load whatever weights_only says.
        reason += "; this torch hands TorchScript archives to torch.jit.load whatever weights_only says"
        return Expectation(mode, False, decision.warns, True, (), reason, decision.replaced_by)
    info = checkpoint.info
    # Under the registry lock: no library round trip is inside its safe_globals context now.
    with registry_lock:
        allowed = _allowed(declared if mode is LoadMode.SAFE_GLOBALS else ())
    # The same facts, the same allowed set, the same decision: the same prediction.
    key = (id(decision), id(info), id(allowed))
    hit = _expectations.get(key)
    if hit is not None and hit[0] is info and hit[1] is allowed and hit[2] is decision:
        return hit[3]
    expectation = _expect(mode, decision.warns, reason, decision.replaced_by, info, *allowed)
    if len(_expectations) >= 256:
        _expectations.clear()
    _expectations[key] = (info, allowed, decision, expectation)  # keeps them alive: ids stay theirs
    return expectation


#: (id(decision), id(info), id(allowed)) -> (info, allowed, decision, the expectation).
_expectations: dict[tuple[int, int, int], tuple[Any, Any, Decision, Expectation]] = {}


def _expect(
    mode: LoadMode, warns: bool, reason: str, replaced: Optional[str], info: Any,
    names: frozenset[str], types: frozenset[str], classes: Mapping[str, Any],
    user_classes: Optional[dict[str, bool]] = None,
) -> Expectation:
    """A weights-only load: replay the checkpoint's checks against what is allowed."""
    missing, rejection, build = _replay(info.checks, names, types, classes, user_classes or {})
    error_type = build[0] if build else None
    # Globals past the point where torch stops (an unsupported opcode...) are still reported.
    missing = tuple(sorted(set(missing) | {g for g in info.globals if g not in names}))
    return Expectation(
        mode,
        True,
        warns,
        rejection is None,
        missing,
        reason,
        replaced,
        info.unsupported_opcodes,
        info.weights_only_blocker or (build[1] if build else None),
        rejection,
        "RuntimeError" if info.format in ("torchscript", "tar") else error_type or "UnpicklingError",
    )


_BUILD_REFUSAL = "Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got "


def _replay(
    checks: Sequence[Check], names: frozenset[str], types: frozenset[str], classes: Mapping[str, Any] = {},
    user_classes: Optional[dict[str, bool]] = None,
) -> tuple[tuple[str, ...], Optional[str], Optional[tuple[str, str]]]:
    """(every global/type not allowed, torch's message for the first failing check or None, and
    when that check is BUILD failing on an allowed class: (the exception type, why)).

    *classes*: the allowed classes by name (what BUILD applies a state to); *user_classes*: the
    user-allowlisted names and whether each is a ``list`` subclass (what an APPEND target check
    asks, see :func:`.unpickler_model.append_refused`).
    """
    missing: list[str] = []
    rejection: Optional[str] = None
    build: Optional[tuple[str, str]] = None
    for c in checks:
        if c.kind == "global":
            if c.name in names:
                continue
            missing.append(c.name)
            if rejection is None:
                spelled = c.name
                if c.name.startswith("builtins.") and message_drops_builtins_prefix():
                    spelled = c.name[len("builtins."):]
                rejection = special_global_messages().get(c.name) or (
                    f"Unsupported global: GLOBAL {spelled} was not an allowed global by default"
                )
        elif c.kind == "type":
            if c.name in types or c.name in names:
                continue
            if c.name not in missing:
                missing.append(c.name)
            if rejection is None:
                rejection = _BUILD_REFUSAL + class_repr(c.name)
        elif c.kind in ("append", "appends"):
            known = user_classes or {}
            if not append_refused(c, known):
                continue
            if c.name not in known and not append_refused(c, {c.name: True}) and c.name not in missing:
                missing.append(c.name)  # allowlisting it (a list subclass) lets it through
            if rejection is None:
                rejection = c.message
        elif c.kind == "build":
            # Its "type" check came first: an allowed class whose state this torch's BUILD may not apply.
            if rejection is None and c.name in classes:
                failure = build_failure(classes[c.name], c.shape)
                if failure is not None:
                    rejection = failure[1]
                    build = (failure[0], f"this torch's BUILD cannot apply the pickled state of {c.name} "
                             f"(it raises {failure[0]}: {failure[1]})")
        elif rejection is None:
            rejection = c.message
    return tuple(dict.fromkeys(missing)), rejection, build


def _real_name(obj: Any) -> Optional[str]:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None


_torch_type_cache: dict[int, tuple[Any, frozenset[str]]] = {}


def _torch_type_names() -> frozenset[str]:
    """Real ``module.qualname`` of every value on torch's allowlist (cached per allowlist object)."""
    from torch import _weights_only_unpickler as wou

    table = wou._get_allowed_globals()
    cached = _torch_type_cache.get(id(table))
    if cached is None or cached[0] is not table:
        cached = (table, frozenset(n for n in map(_real_name, table.values()) if n))
        _torch_type_cache.clear()
        _torch_type_cache[id(table)] = cached
    return cached[1]


_allowed_cache: dict[Any, tuple[frozenset[str], frozenset[str], dict[str, Any], dict[str, bool]]] = {}



def _allowed(
    declared: Sequence[tuple[Any, str]],
) -> tuple[frozenset[str], frozenset[str], dict[str, Any], dict[str, bool]]:
    """(global names torch accepts, names of the types BUILD accepts, those types' classes by
    name, user-allowlisted names -> whether the object is a ``list`` subclass) with *declared* added.

    Types are matched by object in torch (``type(inst) in allowed.values()``); the model
    matches them by the objects' real ``module.qualname`` and by any name they are allowed
    under (a key's value is always among the values).  torch before 2.6 builds only
    user-allowlisted types (:func:`.build_rules`).  Cached while torch's allowlist, the
    process-wide registry and the declaration are the same.
    """
    import torch

    try:
        registry = torch.serialization.get_safe_globals()
        key: Any = (
            id(torch._weights_only_unpickler._get_allowed_globals()),
            torch_allowlist,
            registered_globals,
            frozenset(registry) if registry else None,
            tuple(declared),
        )
        hit = _allowed_cache.get(key)
    except TypeError:  # something unhashable registered or declared: compute every time
        key, hit = None, None
    if hit is None:
        hit = _compute_allowed(declared)
        if key is not None:
            if len(_allowed_cache) > 64:
                _allowed_cache.clear()
            _allowed_cache[key] = hit
    return hit


def _compute_allowed(
    declared: Sequence[tuple[Any, str]],
) -> tuple[frozenset[str], frozenset[str], dict[str, Any], dict[str, bool]]:
    import torch

    user = set(registered_globals()) | {name for _obj, name in declared}
    names = set(torch_allowlist()) | user
    types: set[str] = set()
    classes: dict[str, Any] = {}
    user_classes: dict[str, bool] = {}
    if build_rules().torch_types_buildable:
        types |= _torch_type_names() | set(torch_allowlist())
        for name, obj in torch_allowlist_objects().items():
            classes[name] = classes[_real_name(obj) or name] = obj
    entries = [*torch.serialization.get_safe_globals(), *((obj, name) for obj, name in declared if obj is not None)]
    for entry in entries:
        obj, name = entry if isinstance(entry, tuple) else (entry, None)
        real = _real_name(obj)
        for n in (real, name):
            if n:
                types.add(n)
                classes[n] = obj
                user_classes[n] = isinstance(obj, type) and issubclass(obj, list)
    types |= user
    return frozenset(names), frozenset(types), classes, user_classes
