"""Load modes, and what torch *should* do with each of them here and now.

A round trip is loaded in one of three modes, each an exact ``torch.load`` call:

* ``weights_only_false``: ``torch.load(buf, weights_only=False)``
* ``safe_globals``: ``with torch.serialization.safe_globals([...]): torch.load(buf, weights_only=True)``
* ``default``: ``torch.load(buf)``, no ``weights_only`` argument at all

Before loading, :func:`predict` works out the effective ``weights_only`` with
torch's own rules (version default, explicit argument, the two
``TORCH_FORCE_*`` switches) and whether the checkpoint's globals are all
allowed.  :func:`load` then performs the call and asserts that torch did
exactly that -- loaded, or rejected naming a missing global -- so a test is
green for the right reason in every environment.

When ``torch.load`` is not torch's own (torch_npu replaces it), the outcome is
still judged on what matters: loaded, or rejected naming a missing global.  How
the replacement *reports* may differ -- the TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD
notice printed instead of warned, a reworded rejection message, globals it
registered process-wide -- and those differences are recorded in the outcome
text, never turned into skips or failures.
"""

from __future__ import annotations

import enum
import functools
import os
import pickle
import re
import unittest
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional, Sequence

from .allowlist import (
    SafeGlobal,
    as_safe_globals,
    preserved_registry,
    qualified_name,
    registered_globals,
    registry_lock,
    torch_allowlist,
)
from .checkpoint import Checkpoint
from .pickle_scan import Check, class_repr, special_global_messages
from .errors import CheckpointFormatError, ConflictingEnvironmentError, RoundTripConfigError, UnexpectedLoadOutcome, UnsafeLoadRefused
from .names import show_name
from .thread_warnings import observe_force_no_warning
from .replaced_loader import FORCE_NO_NOTICE, replacement_notes, torch_load_replacement, watch_stdout

__all__ = [
    "LoadMode",
    "WeightsOnlySwitches",
    "Expectation",
    "LoadResult",
    "TRUE_VALUES",
    "SwitchReading",
    "is_truthy",
    "switch_readings_from_source",
    "torch_switch_readings",
    "torch_default_weights_only",
    "torch_reads_force_no_weights_only",
    "torch_load_replacement",
    "declared_names",
    "predict",
    "load",
    "round_trip",
]

#: torch's truthy spellings for the TORCH_FORCE_* switches (the fallback when its source is unreadable).
TRUE_VALUES = ("1", "y", "yes", "true")
FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
_FORCE_NO_WARNING = FORCE_NO_NOTICE


class LoadMode(enum.Enum):
    """How a round trip is loaded; the value is the stable name used in test ids."""

    WEIGHTS_ONLY_FALSE = "weights_only_false"
    SAFE_GLOBALS = "safe_globals"
    DEFAULT = "default"

    @property
    def explicit_weights_only(self) -> Optional[bool]:
        """The ``weights_only`` argument this mode passes (None: not passed at all)."""
        return {"weights_only_false": False, "safe_globals": True, "default": None}[self.value]

    @classmethod
    def parse(cls, value: "LoadMode | str") -> "LoadMode":
        if isinstance(value, LoadMode):
            return value
        for mode in cls:
            if value == mode.value or (isinstance(value, str) and value.upper() == mode.name):
                return mode
        raise RoundTripConfigError(
            f"unknown load mode {value!r}; use one of {', '.join(m.value for m in cls)} "
            "(or LoadMode.WEIGHTS_ONLY_FALSE / SAFE_GLOBALS / DEFAULT)"
        )

    def __str__(self) -> str:
        return self.value


@dataclass(frozen=True)
class SwitchReading:
    """How one torch build reads one TORCH_FORCE_* variable.

    torch 2.13 compares ``value.lower()`` with its truthy list; torch 2.8 compared the raw
    value (``TRUE`` was not set there).  The rule is read from the running torch's source so
    a prediction never assumes another torch's spelling rules.
    """

    name: str
    true_values: tuple[str, ...] = TRUE_VALUES
    #: str methods torch applies to the value before comparing, in order (e.g. ``("lower",)``).
    transforms: tuple[str, ...] = ("lower",)

    def is_set(self, value: Optional[str]) -> bool:
        if value is None:
            return False
        for method in self.transforms:
            value = getattr(value, method)()
        return value in self.true_values

    def describe(self) -> str:
        """``1, y, yes, true (any case)`` -- the spellings torch counts as set, for messages."""
        spelled = ", ".join(self.true_values)
        if "lower" in self.transforms or "casefold" in self.transforms:
            how = "any case"
        elif "upper" in self.transforms:
            how = "any case"
        else:
            how = "exactly as written, case-sensitive"
        if "strip" in self.transforms:
            how += ", surrounding spaces ignored"
        return f"{spelled} ({how})"


_STR_TRANSFORMS = ("lower", "upper", "casefold", "strip")


def switch_readings_from_source(source: str) -> dict[str, SwitchReading]:
    """The TORCH_FORCE_* readings in *source* (torch.serialization.load's code), by variable.

    Recognises ``os.getenv(NAME, d)[.lower()...] in <list or name of a list>`` (and
    ``os.environ.get``); a variable torch does not read is absent from the result.  Pure
    parsing, so torch-2.8-like source can be fed in without installing that torch.
    """
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    lists: dict[str, tuple[str, ...]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _str_sequence(node.value)
            if values is not None:
                lists.setdefault(node.targets[0].id, values)
    found: dict[str, SwitchReading] = {}
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In)):
            continue
        transforms: list[str] = []
        expr = node.left
        while (
            isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in _STR_TRANSFORMS and not expr.args
        ):
            transforms.append(expr.func.attr)
            expr = expr.func.value
        name = _getenv_name(expr)
        if name is None or not name.startswith("TORCH_FORCE_"):
            continue
        comparator = node.comparators[0]
        values = _str_sequence(comparator)
        if values is None and isinstance(comparator, ast.Name):
            values = lists.get(comparator.id)
        if values is None:
            continue
        found.setdefault(name, SwitchReading(name, values, tuple(reversed(transforms))))
    return found


def _str_sequence(node: Any) -> Optional[tuple[str, ...]]:
    import ast

    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)
    return None


def _getenv_name(node: Any) -> Optional[str]:
    """NAME from ``os.getenv("NAME", ...)`` / ``os.environ.get("NAME", ...)``, else None."""
    import ast

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
        return None
    func = node.func
    is_getenv = func.attr == "getenv"
    is_environ_get = func.attr == "get" and isinstance(func.value, ast.Attribute) and func.value.attr == "environ"
    first = node.args[0]
    if (is_getenv or is_environ_get) and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


@functools.lru_cache(maxsize=1)
def torch_switch_readings() -> dict[str, SwitchReading]:
    """How the running torch's ``torch.load`` reads each TORCH_FORCE_* variable.

    Read from torch's own source.  Without the source (a frozen build) the version decides:
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD exists from torch 2.6, and both are read lower-cased as in
    current torch.
    """
    import inspect

    import torch

    try:
        readings = switch_readings_from_source(inspect.getsource(torch.serialization.load))
    except (OSError, TypeError, SyntaxError):
        readings = {}
    if FORCE_WO not in readings:
        major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
        readings = {FORCE_WO: SwitchReading(FORCE_WO)}
        if (major, minor) >= (2, 6):
            readings[FORCE_NO_WO] = SwitchReading(FORCE_NO_WO)
    return readings


def is_truthy(value: Optional[str], name: str = FORCE_WO) -> bool:
    """Whether the running torch counts *value* of the switch *name* as set.

    A switch this torch does not read at all is never set.
    """
    reading = torch_switch_readings().get(name)
    return reading is not None and reading.is_set(value)


@dataclass(frozen=True)
class WeightsOnlySwitches:
    """The two TORCH_FORCE_* switches as torch reads them."""

    force_weights_only: bool = False
    force_no_weights_only: bool = False
    raw: Mapping[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "WeightsOnlySwitches":
        env = os.environ if environ is None else environ
        raw = {FORCE_WO: env.get(FORCE_WO), FORCE_NO_WO: env.get(FORCE_NO_WO)}
        # A torch before 2.6 does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (so it neither
        # warns nor refuses both switches): there it is never set, whatever its spelling.
        return cls(is_truthy(raw[FORCE_WO], FORCE_WO), is_truthy(raw[FORCE_NO_WO], FORCE_NO_WO), raw)

    @property
    def conflict(self) -> bool:
        return self.force_weights_only and self.force_no_weights_only

    def conflict_message(self) -> str:
        return (
            f"{FORCE_WO}={self.raw.get(FORCE_WO)!s} and {FORCE_NO_WO}={self.raw.get(FORCE_NO_WO)!s} "
            "are both set: torch.load raises RuntimeError on every load. Unset one of them."
        )


def torch_reads_force_no_weights_only() -> bool:
    """Whether this torch's ``torch.load`` reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch >= 2.6).

    Read from torch's own source; the version decides only when the source is unavailable.
    """
    return FORCE_NO_WO in torch_switch_readings()


def torch_default_weights_only() -> tuple[bool, str]:
    """torch's default for a bare ``torch.load`` and why, derived from torch's own code."""
    import torch

    default_fn = getattr(torch.serialization, "_default_to_weights_only", None)
    if default_fn is not None:
        if default_fn(None):
            return True, "since torch 2.6"
        return False, "this torch build (fbcode) keeps the old default"
    major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if (major, minor) >= (2, 6):
        return True, "since torch 2.6"
    return False, f"the default before torch 2.6 (torch {torch.__version__})"


def mode_skip_reason(mode: LoadMode) -> Optional[str]:
    """Why *mode* cannot run on this torch (the ``safe_globals`` context is torch >= 2.5), or None."""
    import torch

    if mode is LoadMode.SAFE_GLOBALS and not hasattr(torch.serialization, "safe_globals"):
        return (
            f"the safe_globals mode needs torch.serialization.safe_globals (torch >= 2.5); "
            f"torch {torch.__version__} lacks it"
        )
    return None


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


@dataclass
class LoadResult:
    """A performed load: the object (when it loaded) and the expectation it met."""

    expectation: Expectation
    loaded: bool
    value: Any = None
    error: Optional[BaseException] = None
    #: How a replaced ``torch.load`` reported differently from torch's own (empty otherwise).
    notes: tuple[str, ...] = ()
    warned: Optional[bool] = None

    @property
    def summary(self) -> str:
        return self.expectation.summary(self.loaded, self.notes, self.warned)


def _decide(mode: LoadMode, switches: WeightsOnlySwitches) -> tuple[bool, bool, str]:
    """(effective weights_only, torch warns, reason) with torch.load's own precedence."""
    explicit = mode.explicit_weights_only
    if switches.conflict:
        raise ConflictingEnvironmentError(switches.conflict_message())
    if switches.force_weights_only:
        over = " over explicit weights_only=False" if explicit is False else ""
        return True, False, f"weights_only=True forced by {FORCE_WO}={switches.raw[FORCE_WO]}{over}"
    if explicit is not None:
        return explicit, False, f"weights_only={explicit} explicit"
    if switches.force_no_weights_only:
        return False, True, f"weights_only=False forced by {FORCE_NO_WO}={switches.raw[FORCE_NO_WO]}"
    default, why = torch_default_weights_only()
    return default, False, f"weights_only={default} {why}"


def declared_names(safe_globals: Any) -> tuple[str, ...]:
    """The names torch matches *safe_globals* by, in any form the mixin accepts.

    Objects (by ``module.qualname``, as torch's ``_get_user_allowed_globals`` does -- never an
    object's own ``.name`` attribute), ``'module.Name'`` strings (not imported) and
    ``(obj, 'module.Name')`` tuples.  Nothing is refused here: deciding what may be trusted is
    :func:`load`'s job, a prediction only predicts.
    """
    if isinstance(safe_globals, (str, bytes)) or not hasattr(safe_globals, "__iter__"):
        raise RoundTripConfigError(
            f"safe_globals must be a tuple or list of globals, got {type(safe_globals).__name__}; "
            "write safe_globals=[MyModule] (objects, 'module.Name' strings or (obj, 'module.Name') tuples)"
        )
    names: list[str] = []
    for item in safe_globals:
        if isinstance(item, SafeGlobal):
            names.append(item.name)
        elif isinstance(item, str):
            names.append(item)
        elif isinstance(item, tuple):
            if len(item) != 2 or not isinstance(item[1], str):
                raise RoundTripConfigError(f"safe global tuple {item!r} must be (object, 'module.Name')")
            names.append(item[1])
        else:
            names.append(qualified_name(item))
    return tuple(names)


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
    mode = LoadMode.parse(mode)
    checkpoint = _as_checkpoint(checkpoint, "predict")
    declared_names(safe_globals)  # every form the mixin accepts, validated; _allowed() reads them
    weights_only, warns, reason = _decide(mode, WeightsOnlySwitches.from_environ(environ))
    info = checkpoint.info
    if not weights_only:
        return Expectation(mode, weights_only, warns, True, (), reason, torch_load_replacement())
    # Under the registry lock: no library round trip is inside its safe_globals context now.
    with registry_lock:
        names, types = _allowed(safe_globals if mode is LoadMode.SAFE_GLOBALS else ())
    missing, rejection = _replay(info.checks, names, types)
    # Globals past the point where torch stops (an unsupported opcode...) are still reported.
    missing = tuple(sorted(set(missing) | {g for g in info.globals if g not in names}))
    return Expectation(
        mode,
        weights_only,
        warns,
        rejection is None,
        missing,
        reason,
        torch_load_replacement(),
        info.unsupported_opcodes,
        info.weights_only_blocker,
        rejection,
        "RuntimeError" if info.format in ("torchscript", "tar") else "UnpicklingError",
    )


_BUILD_REFUSAL = "Can only build Tensor, Parameter, OrderedDict or types allowlisted via `add_safe_globals`, but got "


def _replay(checks: Sequence[Check], names: frozenset[str], types: frozenset[str]) -> tuple[tuple[str, ...], Optional[str]]:
    """(every global/type not allowed, torch's message for the first failing check or None)."""
    missing: list[str] = []
    rejection: Optional[str] = None
    for c in checks:
        if c.kind == "global":
            if c.name in names:
                continue
            missing.append(c.name)
            if rejection is None:
                spelled = c.name[len("builtins."):] if c.name.startswith("builtins.") else c.name
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
        elif rejection is None:
            rejection = c.message
    return tuple(dict.fromkeys(missing)), rejection


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


_allowed_cache: dict[Any, tuple[frozenset[str], frozenset[str]]] = {}


def _allowed(declared: Sequence[Any]) -> tuple[frozenset[str], frozenset[str]]:
    """(global names torch accepts, names of the types BUILD accepts) with *declared* added.

    Types are matched by object in torch (``type(inst) in allowed.values()``); the model
    matches them by the objects' real ``module.qualname`` and by any name they are allowed
    under (a key's value is always among the values).  Cached while torch's allowlist, the
    process-wide registry and the declaration are the same.
    """
    import torch
    from torch import _weights_only_unpickler as wou

    try:
        key: Any = (
            id(wou._get_allowed_globals()),
            torch_allowlist,
            registered_globals,
            frozenset(torch.serialization.get_safe_globals()),
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


def _compute_allowed(declared: Sequence[Any]) -> tuple[frozenset[str], frozenset[str]]:
    import torch

    names = set(torch_allowlist()) | set(registered_globals())
    types = set(_torch_type_names())
    entries: list[Any] = list(torch.serialization.get_safe_globals())
    for sg in declared:
        if isinstance(sg, SafeGlobal):
            names.add(sg.name)
            entries.append(sg.obj)
        elif isinstance(sg, str):
            names.add(sg)
        elif isinstance(sg, tuple) and len(sg) == 2 and isinstance(sg[1], str):
            names.add(sg[1])
            entries.append(sg[0])
        else:
            real = _real_name(sg)
            if real:
                names.add(real)
            entries.append(sg)
    for entry in entries:
        real = _real_name(entry[0] if isinstance(entry, tuple) else entry)
        if real:
            types.add(real)
    types |= names
    return frozenset(names), frozenset(types)


def load(
    checkpoint: Checkpoint,
    mode: LoadMode | str,
    safe_globals: Sequence[Any] = (),
    map_location: Any = None,
) -> LoadResult:
    """Load *checkpoint* in *mode* and assert torch did what :func:`predict` says.

    ``weights_only=False`` is applied only to a checkpoint this process saved
    (:meth:`Checkpoint.save`); anything else raises :class:`UnsafeLoadRefused`
    before torch sees it (the ``weights_only_false`` mode always, other modes when
    the environment makes them full loads).  Foreign bytes are always passed to
    ``torch.load`` with an explicit ``weights_only=True`` -- the same effective call
    as the predicted bare one, but robust to a replaced ``torch.load`` or an
    environment changed by another thread.  Dangerous *safe_globals* are refused.
    A legacy tar checkpoint raises :class:`CheckpointFormatError` (torch reads it
    only from a real file, never weights-only).  A rejection never leads to a
    retry in another mode.
    """
    import torch

    if isinstance(checkpoint, (LoadMode, str)) and isinstance(mode, Checkpoint):
        raise RoundTripConfigError(
            "load() got the load mode first: the order is load(checkpoint, mode, ...)"
        )
    mode = LoadMode.parse(mode)
    checkpoint = _as_checkpoint(checkpoint, "load")
    reason = mode_skip_reason(mode)
    if reason:
        raise unittest.SkipTest(reason)
    safe_globals = as_safe_globals(safe_globals)
    with registry_lock:
        expectation = predict(mode, checkpoint, safe_globals)
        if not checkpoint.owned and (mode is LoadMode.WEIGHTS_ONLY_FALSE or not expectation.weights_only):
            raise UnsafeLoadRefused(
                f"refusing a weights_only=False load ({expectation.reason}) of bytes this process did "
                "not just produce: only Checkpoint.save() output may be fully unpickled"
            )
        if checkpoint.info.format == "torchscript":
            raise CheckpointFormatError(
                "this is a TorchScript archive: load it with torch.jit.load; torch.load would hand it "
                "to torch.jit.load, and weights_only does not apply"
            )
        if checkpoint.info.format == "tar":
            raise CheckpointFormatError(
                "this is a legacy tar checkpoint (torch < 0.4): torch.load reads that format only from a "
                "real file and never with weights_only=True; re-save it with a current torch"
            )
        kwargs: dict[str, Any] = {}
        if map_location is not None:
            kwargs["map_location"] = map_location
        value: Any = None
        error: Optional[BaseException] = None
        registered = sorted(registered_globals()) if expectation.replaced_by else []
        watch = expectation.replaced_by is not None and expectation.warns
        # Not warnings.catch_warnings: it rewrites the process's filters, so other threads'
        # warnings would be recorded here and their -W error ignored (see thread_warnings).
        with preserved_registry(), observe_force_no_warning() as observed, watch_stdout(watch) as printed:
            buf = checkpoint.rewound()
            try:
                if mode is LoadMode.WEIGHTS_ONLY_FALSE:
                    value = torch.load(buf, weights_only=False, **kwargs)
                elif mode is LoadMode.SAFE_GLOBALS:
                    with torch.serialization.safe_globals([sg.torch_entry for sg in safe_globals]):
                        value = torch.load(buf, weights_only=True, **kwargs)
                elif checkpoint.owned:
                    value = torch.load(buf, **kwargs)
                else:
                    # Foreign bytes: the predicted effective call, made explicit.
                    value = torch.load(buf, weights_only=True, **kwargs)
            except pickle.UnpicklingError as e:
                error = e
            except Warning:
                raise  # a warning the caller's filters turned into an error (-W error): theirs, as raised
            except Exception as e:  # noqa: BLE001 - reported as an unexpected outcome below
                raise UnexpectedLoadOutcome(
                    f"{mode.value}: expected to be {'loaded' if expectation.loads else 'rejected'} "
                    f"({expectation.reason}); torch.load raised {type(e).__name__}: {e}"
                ) from e
    notice_printed = bool(_FORCE_NO_WARNING.search(printed.getvalue())) if printed is not None else False
    return _verify(expectation, value, error, observed.seen, notice_printed, registered)


def _torch_spellings(name: str) -> tuple[str, ...]:
    """How torch's rejection message may spell *name* (it drops the ``builtins.`` prefix)."""
    if name.startswith("builtins."):
        return (name, f"GLOBAL {name[len('builtins.'):]} ")
    return (name,)


def _names_a_cause(exp: Expectation, message: str) -> bool:
    """Whether torch's rejection names one of the predicted causes (a global or an opcode).

    The unpickler stops at the first cause it meets: the predicted rejection text, or any
    missing global or refused opcode, will do.
    """
    if exp.rejection and exp.rejection in message:
        return True
    if any(s in message for name in exp.missing for s in _torch_spellings(name)):
        return True
    codes = {getattr(pickle, op)[0] for op in exp.unsupported_opcodes if hasattr(pickle, op)}
    return any(f"Unsupported operand {code}" in message for code in codes)


def _verify(
    exp: Expectation,
    value: Any,
    error: Optional[BaseException],
    warned: bool,
    printed: bool = False,
    registered: Sequence[str] = (),
) -> LoadResult:
    """Judge one load: loaded or rejected as predicted, and rejected for a predicted cause.

    Under a replaced ``torch.load`` the warning is not judged: how the replacement
    reports is recorded in the outcome (:func:`.replaced_loader.replacement_notes`) instead.
    """
    loaded = error is None
    notes = replacement_notes(exp.warns, error, warned, printed, registered) if exp.replaced_by else ()
    problem: Optional[str] = None
    if exp.loads and not loaded:
        problem = f"expected to load ({exp.reason}); torch rejected it:\n{error}"
    elif not exp.loads and loaded:
        problem = (
            f"expected rejection ({exp.summary(False).partition('(')[2].rstrip(')')}); "
            "torch loaded it: unexpected success"
        )
    elif not loaded and not _names_a_cause(exp, str(error)):
        problem = (
            f"rejected, but the message names none of the predicted causes (globals {list(exp.missing)}, "
            f"opcodes {list(exp.unsupported_opcodes)}):\n{error}"
        )
    elif loaded and exp.warns != warned and not exp.replaced_by:
        problem = (
            f"expected torch {'to' if exp.warns else 'not to'} warn about {FORCE_NO_WO}; "
            f"it {'did' if warned else 'did not'}"
        )
    if problem is not None:
        if exp.replaced_by:
            problem = (
                f"torch.load is replaced by {exp.replaced_by}"
                + (f" (which {'; '.join(notes)})" if notes else "")
                + f", and it did not do what torch's own rules require: {problem}"
            )
        raise UnexpectedLoadOutcome(f"{exp.mode.value}: {problem}")
    return LoadResult(exp, loaded, value, error, notes, warned if exp.replaced_by and warned != exp.warns else None)


def round_trip(
    obj: Any,
    mode: LoadMode | str,
    safe_globals: Sequence[Any] = (),
    map_location: Any = None,
) -> LoadResult:
    """``torch.save`` *obj* to memory and :func:`load` it back in *mode* (outside any test class)."""
    return load(Checkpoint.save(obj), mode, safe_globals, map_location)
