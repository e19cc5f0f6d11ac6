"""What torch *should* do with one load, here and now: :func:`predict`.

Weights-only (as torch decides for the mode's call here), the scan's checks are replayed in torch's order
against what is allowed (torch's allowlist, the process-wide registry, the declared globals): the first
that fails is the rejection torch raises."""

from __future__ import annotations

import operator
import os
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence

import torch

from .checkpoint import Checkpoint, scan_checkpoint
from .declarations import declared_entries
from .errors import CheckpointFormatError, ProbeFailed, RoundTripConfigError, show_name, torch_key
from .model import Check, build_failure, class_repr, container_refused, default_scan_limits, loaded_class
from .modes import Decision, LoadMode, decide
from .registry import registered_globals, registry_lock, torch_allowlist, torch_allowlist_table, torch_allowlist_view
from .serialization import torch_load_replacement
from .unpickler import UnpicklerRules, global_refusal, unpickler_rules


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
    #: Why no allowlist can make it load weights-only (CheckpointInfo.weights_only_blocker), else None.
    blocker: Optional[str] = None
    #: The text torch's rejection must contain: the first check the weights-only unpickler fails.
    rejection: Optional[str] = None
    #: What torch raises rejecting it (RuntimeError for a TorchScript or tar archive, refused unread).
    error_type: str = "UnpicklingError"
    #: Why the outcome cannot be predicted here (a probe of this torch failed), else None.
    unknown: Optional[str] = None

    def summary(self, loaded: Optional[bool] = None, notes: Sequence[str] = (), warned: Optional[bool] = None) -> str:
        """``default: rejected as expected (weights_only=True since torch 2.6; X not allowlisted)``, with
        the *notes* of a replaced ``torch.load`` and what was *warned* when it differs from the prediction."""
        loaded = self.loads if loaded is None else loaded
        verb = "loaded" if loaded else "rejected"
        why = self.reason
        if self.unknown:
            return f"{self.mode.value}: {verb}, not predicted ({why}; {self.unknown})"
        if not loaded and self.missing:
            why += f"; {', '.join(map(show_name, self.missing))} not allowlisted"  # names are data: escaped
        if not loaded and self.unsupported_opcodes:
            why += f"; opcode {', '.join(self.unsupported_opcodes)} not supported by the weights-only unpickler"
        if not loaded and self.blocker and not self.unsupported_opcodes:
            why += f"; cannot load weights-only: {self.blocker}"
        if self.warns if warned is None else warned:
            why += "; torch warned"
        if self.replaced_by:
            why += f"; torch.load is replaced by {self.replaced_by}" + (", which " + "; ".join(notes) if notes else "")
        return f"{self.mode.value}: {verb} as expected ({why})"


def _as_checkpoint(checkpoint: Any, caller: str) -> Checkpoint:
    if isinstance(checkpoint, Checkpoint):
        return checkpoint
    names_a_mode = isinstance(checkpoint, str) and checkpoint.upper() in LoadMode.__members__  # LoadMode.parse reads it
    if isinstance(checkpoint, LoadMode) or (names_a_mode and not os.path.exists(checkpoint)):
        raise RoundTripConfigError(
            f"{caller}() got the load mode {str(checkpoint)!r} where the checkpoint goes: the order is "
            + ("predict(mode, checkpoint, ...)" if caller == "predict" else "load(checkpoint, mode, ...)")
        )
    if isinstance(checkpoint, (str, os.PathLike)):
        raise TypeError(
            f"{caller}() takes a Checkpoint (or, to predict, bytes or a buffer), not the path "
            f"{os.fspath(checkpoint)!r}: wrap a file with torch_serial_testing.tools.FileCheckpoint.from_path(path)"
        )
    if caller == "predict":  # predicting never unpickles: any form scan_checkpoint reads will do
        return Checkpoint.from_buffer(checkpoint)
    raise TypeError(
        f"load() takes a Checkpoint, got {type(checkpoint).__name__}; wrap foreign bytes with "
        "Checkpoint.from_bytes(...) (they will only be loaded weights-only)"
    )


def predict(
    mode: LoadMode | str, checkpoint: Any, safe_globals: Sequence[Any] = (), environ: Optional[Mapping[str, str]] = None
) -> Expectation:
    """What torch should do loading *checkpoint* (a :class:`Checkpoint` or anything :func:`scan_checkpoint`
    reads) in *mode*, here and now; *safe_globals* takes objects, ``'module.Name'`` and ``(obj, 'module.Name')``."""
    if isinstance(mode, Checkpoint):
        raise RoundTripConfigError(
            "predict() got a Checkpoint where the load mode goes: the order is predict(mode, checkpoint, ...)"
        )
    mode = LoadMode.parse(mode)
    return decided(mode, _as_checkpoint(checkpoint, "predict"), declared_entries(safe_globals), environ)[1]


def decided(
    mode: LoadMode, checkpoint: Checkpoint, declared: tuple[tuple[Any, str], ...], environ: Optional[Mapping] = None
) -> tuple[Optional[Decision], Expectation]:
    """(torch's decision for the call, None when it could not be asked; the expectation)."""
    try:
        decision = decide(mode, environ)
    except ProbeFailed as e:  # the call's argument, True for a bare call (foreign bytes are loaded weights-only)
        why, weights_only = "what torch.load decides here is unknown", mode.explicit_weights_only is not False
        return None, Expectation(mode, weights_only, False, False, (), why, torch_load_replacement(), unknown=str(e))
    reason, warns, replaced = decision.reason, decision.warns, decision.replaced_by
    if not decision.weights_only:  # a full load: nothing the checkpoint names can stop it (a decision: one mode's)
        if (full := _expected.get(decision)) is None:
            full = _expected[decision] = Expectation(mode, False, warns, True, (), reason, replaced)
        return decision, full
    declared = declared if mode is LoadMode.SAFE_GLOBALS else ()
    with registry_lock:  # no library round trip is inside its safe_globals context now
        try:  # what the expectation is a function of; a failed probe or something unhashable: not remembered
            scan, table, rules = checkpoint.scan_key, torch_allowlist_table(), unpickler_rules()  # bytes, or a scan
            small = scan if scan.__class__ is bytes else None  # a hit compares it whole: keyed by size and tail
            kept = (table, rules, default_scan_limits(), None if small is not None else scan)
            state = (tuple(torch.serialization.get_safe_globals()), declared, len(sys.modules), "numpy" in sys.modules)
            key: Any = (decision, small and (len(small), small[-256:]), type(checkpoint), *state, *map(id, kept))
            known = _expected.get(key)
        except (ProbeFailed, TypeError):
            key = known = None
        if known is not None and all(map(operator.is_, known[0], kept)) and known[2] == small:
            return decision, known[1]
        if len(_expected) >= 64:  # forgotten all at once, never between a look-up and its hit
            _expected.clear()
        try:  # (the scan itself raises no ProbeFailed)
            info = checkpoint.info
            # read by the tools: torch 2.4 hands a TorchScript archive to torch.jit.load
            if info.format == "torchscript" and any(c.kind == "jit" for c in info.checks):
                reason += "; this torch hands TorchScript archives to torch.jit.load whatever weights_only says"
                return decision, Expectation(mode, False, warns, True, (), reason, replaced)
            rules = unpickler_rules()
        except ProbeFailed as e:
            return decision, Expectation(mode, True, warns, False, (), reason, replaced, unknown=str(e))
        akey = key and ("allowed", *key[3:5], *key[7:9])  # by the registry, the declaration, the table, the rules
        if akey is None or (hit := _expected.get(akey)) is None or not all(map(operator.is_, hit[0], kept[:2])):
            hit = (kept[:2] if akey else None, _allowed(declared, rules))
            _expected.update({akey: hit} if akey else {})
        allowed = hit[1]
    missing, rejection, build, unknown = _replay(info.checks, allowed, rules)
    # Globals past the point where torch stops (an unsupported opcode...) are still reported.
    missing = tuple(sorted(set(missing) | {g for g in info.globals if g not in allowed.names}))
    raises = "RuntimeError" if info.format in ("torchscript", "tar") else build[0] if build else "UnpicklingError"
    blocker = info.weights_only_blocker or (build[1] if build else None)
    opcodes, loads = info.unsupported_opcodes, rejection is None and unknown is None
    expectation = Expectation(
        mode, True, warns, loads, missing, reason, replaced, opcodes, blocker, rejection, raises, unknown
    )
    if key is not None:
        _expected[key] = (kept, expectation, small)  # keeps them alive: their ids stay theirs
    return decision, expectation


#: A full load's expectation by its decision; a weights-only one by all it is a function of (see decided).
_expected: dict[Any, Any] = {}


@dataclass(eq=False)
class _Allowed:
    """What a weights-only load accepts here: global names, BUILD's types, their objects, user-allowlisted objects."""

    names: frozenset[str]
    types: frozenset[str]
    classes: dict[str, Any]
    user: dict[str, Any]


def _replay(
    checks: Sequence[Check], allowed: _Allowed, rules: UnpicklerRules
) -> tuple[tuple[str, ...], Optional[str], Optional[tuple[str, str]], Optional[str]]:
    """(every global/type not allowed, torch's message for the first failing check, (exception type, why) when
    that is BUILD failing on an allowed class, why it is unpredictable when a check before any failure is unknown)."""
    missing: list[str] = []
    rejection: Optional[str] = None
    build: Optional[tuple[str, str]] = None
    unknown: Optional[str] = None
    for c in checks:
        if c.kind == "global":
            if c.name in allowed.names:
                continue
            missing.append(c.name)
            if rejection is None and unknown is None:
                try:
                    rejection = global_refusal(c.name, attr=c.message or None, proto=rules.renames == "always")
                except ProbeFailed as e:
                    unknown = str(e)
                if rejection is None and unknown is None:  # allowlisted after all: torch loads it
                    missing.pop()
        elif c.kind == "type":
            if c.name in allowed.types:  # torch < 2.6 builds none of its own allowlist's types
                continue
            missing.append(c.name)
            if rejection is None:
                rejection = rules.build_refusal + class_repr(c.name)
        elif c.kind in ("append", "appends", "setitem", "setitems"):
            if not container_refused(rules, c, allowed.user):
                continue
            if c.name not in allowed.user and c.name not in missing:
                # Missing if allowlisting it lets it through (a list subclass): the class where it is
                # loaded, else the container it targets (an unknown class counts as a subclass of it).
                as_if = loaded_class(c.name) or (list if c.kind.startswith("append") else dict)
                if not container_refused(rules, c, {c.name: as_if}):
                    missing.append(c.name)
            if rejection is None:
                rejection = c.message
        elif c.kind == "build":
            # Its "type" check came first: an allowed class whose state this torch's BUILD may not apply.
            if rejection is None and c.name in allowed.classes:
                failure = build_failure(allowed.classes[c.name], c.shape, rules.build)
                if failure is not None:
                    error, rejection = failure
                    why = f"this torch's BUILD cannot apply the pickled state of {c.name}"
                    build = (error, f"{why} (it raises {error}: {rejection})")
        elif c.kind == "unknown":
            if rejection is None and unknown is None:
                unknown = c.message
        elif rejection is None:
            rejection = c.message
    return tuple(dict.fromkeys(missing)), rejection, build, unknown if rejection is None else None


def _allowed(declared: Sequence[tuple[Any, str]], rules: UnpicklerRules) -> _Allowed:
    """What torch accepts with *declared* added; torch matches types by object, the model by any of their names."""
    allowlist, torch_types, torch_classes = torch_allowlist_view()
    buildable, registry = rules.build.torch_types_buildable, torch.serialization.get_safe_globals()
    user_names = set(registered_globals()) | {name for _obj, name in declared}
    types = set(torch_types | allowlist) if buildable else set()
    classes: dict[str, Any] = dict(torch_classes) if buildable else {}
    user: dict[str, Any] = {}
    for entry in [*registry, *((o, n) for o, n in declared if o is not None)]:
        obj, entry_name = entry if isinstance(entry, tuple) else (entry, None)
        for n in (torch_key(obj), entry_name):
            if n:
                types.add(n)
                classes[n] = user[n] = obj
    return _Allowed(frozenset(allowlist | user_names), frozenset(types | user_names), classes, user)


_NOT_GIVEN: Any = object()


def required_globals(
    obj_or_buffer: Any = _NOT_GIVEN, *, obj: Any = _NOT_GIVEN, checkpoint: Any = _NOT_GIVEN
) -> list[str]:
    """Sorted globals a checkpoint needs beyond torch's own allowlist, found without unpickling.  ``obj=``
    is always ``torch.save``-d first (even a ``str`` or ``bytes``); ``checkpoint=`` (bytes, a buffer, a
    :class:`Checkpoint`) is scanned; positionally, those are scanned and any other object is saved."""
    args = {"positional": obj_or_buffer, "obj": obj, "checkpoint": checkpoint}
    given = {k: v for k, v in args.items() if v is not _NOT_GIVEN}
    if len(given) != 1:
        raise TypeError(
            "required_globals() takes exactly one of: an object (obj=...) or checkpoint bytes, a buffer or a "
            f"Checkpoint (checkpoint=...); got {', '.join(sorted(given)) or 'nothing'}"
        )
    ((kind, value),) = given.items()
    if kind != "obj" and isinstance(value, (str, os.PathLike)):
        raise TypeError(
            f"required_globals({value!r}): a file is read by torch_serial_testing.tools.required_globals(path); "
            "to get the globals of the str object itself, call required_globals(obj=...)"
        )
    readable = isinstance(value, (Checkpoint, bytes, bytearray, memoryview)) or hasattr(value, "read")
    scanned = kind == "checkpoint" or (kind == "positional" and readable)
    info = scan_checkpoint(value) if scanned else Checkpoint.save(value).info
    if info.format == "torchscript":
        raise CheckpointFormatError(
            "this is a TorchScript archive: load it with torch.jit.load; weights_only does not apply"
        )
    return needed_globals(info)


def needed_globals(info: Any, allowed: Any = None) -> list[str]:
    """Sorted globals the scanned checkpoint *info* needs beyond torch's allowlist (*allowed*, default
    asked): its GLOBALs and the types BUILD is applied to.  The one place this is computed."""
    allowed = torch_allowlist() if allowed is None else allowed
    needed = {g for g in info.globals if g not in allowed}
    # BUILD's types count too (numpy's Float64DType is no GLOBAL); torch's own where its BUILD refuses them (2.4, 2.5)
    types = set(info.type_checks)
    if types and unpickler_rules().build.torch_types_buildable:
        types -= set(allowed) | torch_allowlist_view()[1]
    return sorted(needed | types)
