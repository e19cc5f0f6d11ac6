"""The walker's abstract machine (:mod:`.walker`): values, checks, torch's rules applied to them, the caps.

A value is a global by name, an object by its type, a dict with its few known keys, a small int or short
str as itself.  Which container targets and persistent ids torch refuses, and in which words, are the
running torch's (:class:`~.unpickler.UnpicklerRules`); so is what its BUILD does with a state."""

from __future__ import annotations

import _compat_pickle
import itertools
import re
import sys
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from typing import Any, Iterator, Optional

from .unpickler import BuildRules, UnpicklerRules


@dataclass(frozen=True)
class ScanLimits:
    """Upper bounds for one :func:`~torch_serial_testing.scan_checkpoint` call; going over one ends the
    scan with a ``CheckpointFormatError`` naming it and how to raise it.  The defaults are far above what
    ``torch.save`` writes for real models and keep a worst-case scan to seconds (``bench/scan_bounds.py``)."""

    max_pickle_bytes: int = 256 * 1024 * 1024  #: Bytes of one pickle, decompressed (``data.pkl``, tar member, stream).
    max_scan_bytes: int = 512 * 1024 * 1024  #: Bytes of pickle read in total, over every pickle of the checkpoint.
    #: Opcodes walked in total (GLOBAL and INST count 4): the cap that bounds time, ~1 us each at worst.
    max_opcodes: int = 3_000_000
    max_memo_entries: int = 2_000_000  #: Memo entries (PUT/MEMOIZE) held at once by one pickle.
    max_name_length: int = 1024  #: Characters of one global name (``module.qualname``).
    max_globals: int = 10_000  #: Distinct global names over the checkpoint (torch's allowlist has a few hundred).
    max_int_digits: int = 4300  #: Digits of an integer written as text (protocol 0/1); Python refuses more.
    max_stack_depth: int = 1_000_000  #: Stack depth (values plus MARK levels) of one pickle.

    def __post_init__(self) -> None:
        for name, value in self.__dict__.items():
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"ScanLimits.{name} must be a positive int, got {value!r}")


_current = ScanLimits()


def default_scan_limits() -> ScanLimits:  # the limits scans use when none are passed
    return _current


@contextmanager
def scan_limits(**overrides: Any) -> Iterator[ScanLimits]:
    """Change the default caps inside a ``with`` block, e.g. ``scan_limits(max_opcodes=10**8)``;
    restored on exit.  Checkpoints already scanned keep their result."""
    global _current
    previous, _current = _current, replace(_current, **overrides)
    try:
        yield _current
    finally:
        _current = previous


UNRESOLVED = "<unresolved STACK_GLOBAL>"

_NUMPY_DTYPE_STR = re.compile(r"[biufcMmOUSV]\d{0,6}")


def numpy_dtype_class(spec: Any) -> Optional[str]:
    """``numpy.dtypes.<X>DType``, the type BUILD sees after REDUCE of ``numpy.dtype(spec, ...)``: numpy's
    own answer; None if unknown, or numpy is absent or has no ``numpy.dtypes`` (torch imports numpy
    whenever it is installed, and without it loads no numpy global)."""
    numpy: Any = sys.modules.get("numpy")
    if not (isinstance(spec, str) and _NUMPY_DTYPE_STR.fullmatch(spec) and hasattr(numpy, "dtypes")):
        return None
    try:
        t = type(numpy.dtype(spec))
    except (TypeError, ValueError):
        return None
    return f"{t.__module__}.{t.__qualname__}"


class Global:
    __slots__ = ("name",)  # a global pushed by GLOBAL: its weights-only name

    def __init__(self, name: str) -> None:
        self.name = name


class Obj:
    __slots__ = ("type",)  # an object, by the name of its type (None: cannot tell statically)

    def __init__(self, type_name: Optional[str]) -> None:
        self.type = type_name


#: Keys kept per dict while scanning: a BUILD state of more keys has an unknown size.
_DICT_KEYS_KEPT = 16
_NO_KEYS: Any = frozenset()  # shared until a key is added


class DictValue(Obj):
    """A dict the pickle builds (EMPTY_DICT, DICT), with its keys while they are few and known."""

    __slots__ = ("keys",)

    def __init__(self, keys: Any = ()) -> None:  # made for every EMPTY_DICT: kept cheap
        self.type = "builtins.dict"
        self.keys: Optional[set[Any]] = _NO_KEYS
        if keys:
            add_dict_keys(self, keys)


def add_dict_keys(target: Any, keys: Any) -> None:  # SETITEM(S) onto target
    if type(target) is not DictValue or target.keys is None:
        return
    known = target.keys
    if known is _NO_KEYS:
        known = target.keys = set()
    for k in keys:
        if (type(k) is not str and type(k) is not int) or (k not in known and len(known) >= _DICT_KEYS_KEPT):
            target.keys = None
            return
        known.add(k)


LIST, SET, FROZENSET = Obj("builtins.list"), Obj("builtins.set"), Obj("builtins.frozenset")
BOOL, NONE, FLOAT = Obj("builtins.bool"), Obj("builtins.NoneType"), Obj("builtins.float")
INT, STR = Obj("builtins.int"), Obj("builtins.str")  # an int the model did not decode, a str too long to keep
BYTES, BYTEARRAY, PICKLEBUFFER = Obj("builtins.bytes"), Obj("builtins.bytearray"), Obj("pickle.PickleBuffer")
UNKNOWN, STORAGE = Obj(None), Obj("torch.storage.TypedStorage")
#: Opcodes that push one constant abstract value (EMPTY_LIST, NONE, LONG4, floats, bytes, buffers, EMPTY_SET).
PUSHES = {0x5D: LIST, 0x4E: NONE, 0x8B: INT, 0x47: FLOAT, 0x46: FLOAT, 0x42: BYTES, 0x43: BYTES, 0x8E: BYTES}
PUSHES.update({0x96: BYTEARRAY, 0x97: PICKLEBUFFER, 0x8F: SET})
TENSOR, PARAMETER = "torch.Tensor", "torch.nn.parameter.Parameter"

#: Types whose BUILD torch handles itself, never through the allowlist.
BUILD_FREE = frozenset([TENSOR, PARAMETER, "collections.OrderedDict"])

# What REDUCE of these (allowlisted) callables returns, for the type checks after it.
_REBUILT_TENSOR = "tensor tensor_v2 tensor_v3 qtensor sparse_tensor nested_tensor meta_tensor_no_storage"
_REBUILT_TENSOR += " device_tensor_from_numpy device_tensor_from_cpu_tensor"
_REDUCE_RESULT = {f"torch._utils._rebuild_{n}": TENSOR for n in _REBUILT_TENSOR.split()}
_REDUCE_RESULT.update({f"torch._utils._rebuild_{n}": PARAMETER for n in ("parameter", "parameter_with_state")})
_REDUCE_RESULT.update({"_codecs.encode": "builtins.bytes", "torch.serialization._get_layout": "torch.layout"})
# REDUCE of these returns an instance of the class given as their argument 0 (or 1).
_REDUCE_ARG_TYPE = {"copyreg._reconstructor": 0, "copyreg.__newobj__": 0, "torch._tensor._rebuild_from_type_v2": 1}
_REDUCE_ARG_TYPE.update({f"numpy.{m}.multiarray._reconstruct": 0 for m in ("core", "_core")})
_REDUCE_ARG_TYPE["torch._utils._rebuild_wrapper_subclass"] = 0

#: The concrete values the walk keeps as themselves.
_CONCRETE = {str: "builtins.str", bool: "builtins.bool", int: "builtins.int", tuple: "builtins.tuple"}


def type_of(v: Any) -> Optional[str]:
    """The type name of an abstract value (None: a global, or a type the scan cannot tell)."""
    return v.type if isinstance(v, Obj) else _CONCRETE.get(type(v))


def class_repr(type_name: Optional[str]) -> str:
    """How torch's messages print ``type(x)``: ``<class 'collections.deque'>``, ``<class 'list'>``."""
    name = "?" if type_name is None else type_name.removeprefix("builtins.")
    return f"<class '{name}'>"


def describe_value(v: Any) -> str:
    t = type_of(v)
    return f"an object of {class_repr(t)}" if t else "an object the scan cannot name"


def reduce_result(func: str, args: Any) -> Optional[str]:
    """The type REDUCE of the allowlisted *func* builds, or None when it cannot be told statically."""
    if func in _REDUCE_RESULT:
        return _REDUCE_RESULT[func]
    if func == "numpy.dtype":
        return numpy_dtype_class(args[0]) if isinstance(args, tuple) and args else None
    index = _REDUCE_ARG_TYPE.get(func)
    if index is None:
        return func  # calling a class builds an instance of it
    known = isinstance(args, tuple) and len(args) > index and isinstance(args[index], Global)
    return args[index].name if known else None


@dataclass(frozen=True)
class Check:
    """One thing torch's weights-only unpickler verifies, by ``kind``: ``"global"`` (*name* allowlisted;
    *message*: the GLOBAL's own name part, which torch 2.4's hint names alone), ``"type"`` (BUILD onto a
    *name*, allowlisted), ``"build"`` (its state's *shape*), ``"append(s)"``/``"setitem(s)"`` (onto a
    *name*, refused with *message* depending on the allowlist), ``"refused"`` (never loads: *message*
    says why), ``"unknown"`` (a rule not probed), ``"jit"`` (a TorchScript archive)."""

    kind: str
    name: str = ""
    message: str = ""
    shape: Any = None


@dataclass
class ScanState:
    """Facts gathered over every pickle of one checkpoint (and the work spent so far)."""

    limits: ScanLimits
    checks: list[Check] = field(default_factory=list)
    seen: set[Any] = field(default_factory=set)
    globals: set[str] = field(default_factory=set)
    full_load_globals: dict[str, str] = field(default_factory=dict)
    refused_opcodes: set[str] = field(default_factory=set)
    opcodes: int = 0
    bytes_scanned: int = 0
    max_memo: int = 0
    #: False once the weights-only unpickler would have stopped: no more weights-only checks.
    weights_only_live: bool = True
    #: The formats torch may read these bytes as, depending on the source it is given (a polyglot: two).
    readings: tuple[str, ...] = ()

    def check(self, kind: str, name: str = "", message: str = "", shape: Any = None) -> bool:  # True: a new one
        if new := (key := (kind, name, message, shape)) not in self.seen:
            self.seen.add(key)
            self.checks.append(Check(kind, name, message, shape))
        return new


def loaded_class(name: str) -> Optional[type]:
    """The class *name* if its module is already imported, else None; read from ``__dict__``\\ s, so
    nothing is imported and no module ``__getattr__`` runs."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        obj: Any = sys.modules.get(".".join(parts[:cut]))
        if obj is None:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, "__dict__", {}).get(attr)
            if obj is None:
                return None
        return obj if isinstance(obj, type) else None
    return None


#: Per container family: the builtin it targets, and the target kinds of exact types by name.
_DICT_KINDS = {"builtins.dict": "dict", "collections.OrderedDict": "ordered_dict", "collections.Counter": "counter"}
_CONTAINERS = {"list": (list, {"builtins.list": "list"}), "dict": (dict, _DICT_KINDS)}


def _target_kinds(opcode: str, type_name: str, user_classes: Optional[dict[str, Any]] = None) -> tuple[str, ...]:
    """The target kinds (:mod:`.unpickler`) of a *type_name* instance for *opcode*; *user_classes* is None in a scan."""
    family = "list" if opcode.startswith("APPEND") else "dict"
    base, exact = _CONTAINERS[family]
    if type_name in exact:
        return (exact[type_name],)
    sub = f"{family}_subclass"
    if user_classes is not None and type_name in user_classes:
        obj = user_classes[type_name]
        return (f"allowlisted_{sub}",) if isinstance(obj, type) and issubclass(obj, base) else ("allowlisted_other",)
    cls = loaded_class(type_name)
    is_sub = None if cls is None else issubclass(cls, base)
    kinds = (sub,) if is_sub else ("other",) if is_sub is False else (sub, "other")  # a scan: allowlisted or not
    return kinds if user_classes is not None else kinds + tuple(f"allowlisted_{kind}" for kind in kinds)


def container_check(rules: UnpicklerRules, opcode: str, target: Any) -> Optional[Check]:
    """The check before *opcode* (APPEND(S), SETITEM(S)) onto the value *target*: None when it passes
    whatever is allowlisted (or its type is unknown), ``"refused"`` when it never does (a deque), else
    one the allowlist decides at load time (torch 2.14.1 lets an allowlisted list subclass through)."""
    type_name, rule = type_of(target), rules.containers.get(opcode)
    if type_name is None or rule is None:
        return None
    refused = [kind in rule.refused for kind in _target_kinds(opcode, type_name)]
    if not any(refused):
        return None
    message = rule.message + class_repr(type_name)
    return Check("refused", "", message) if all(refused) else Check(opcode.lower(), type_name, message)


def container_refused(rules: UnpicklerRules, check: Check, user_classes: dict[str, Any]) -> bool:
    """Whether torch refuses the container *check* given *user_classes* (allowlisted names -> objects)."""
    opcode = check.kind.upper()
    rule = rules.containers.get(opcode)
    return rule is not None and any(kind in rule.refused for kind in _target_kinds(opcode, check.name, user_classes))


def persid_refusal(rules: UnpicklerRules, pid: Any) -> Optional[str]:
    """torch's refusal of a persistent id, or None: first its type, then a tuple's first item must be
    ``"storage"`` (one that passes may still fail in ``torch.load``'s ``persistent_load``: a damaged file)."""
    persid = rules.persid  # a tuple (what torch.save writes) is decided without a call
    category = "tuple" if isinstance(pid, tuple) else "int" if type_of(pid) == "builtins.int" else "other"
    if category in persid.refused:
        return persid.type_message + class_repr(type_of(pid))
    if isinstance(pid, tuple) and pid and not (isinstance(pid[0], str) and pid[0] == "storage"):
        if isinstance(pid[0], (str, Obj)):
            return persid.storage_message + (class_repr(type_of(pid[0])) if persid.names_type else str(pid[0]))
        return persid.storage_message.rstrip()  # still a part of what torch says
    return None


def full_load_name(module: str, name: str, proto: int, zip_format: bool, storage_names: frozenset[str]) -> str:
    """The global a full unpickle in torch.load resolves for GLOBAL *module* *name*."""
    if "Storage" in name and name in storage_names:
        return f"torch.{name}"  # torch.load's find_class returns its own StorageType, importing nothing
    if zip_format and module == "torch.tensor":  # torch.serialization._load's load_module_mapping
        module = "torch._tensor"
    if proto < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"


def state_shape(value: Any, depth: int = 0) -> tuple[Any, ...]:
    """A hashable description of a BUILD state: ``("dict", n)`` (n keys, None: not known), ``("none",)``,
    ``("value", v)`` (a small str or int), ``("tuple", (shape, ...))`` or ``("type", "module.Name")`` (an
    object known only by its type; None: not even that)."""
    if type(value) is DictValue:
        return ("dict", None if value.keys is None else len(value.keys))
    if isinstance(value, tuple):
        if depth < 2 and len(value) <= 4:
            return ("tuple", tuple(state_shape(v, depth + 1) for v in value))
        return ("type", "builtins.tuple")
    if type(value) is str or type(value) is int:
        return ("value", value)
    if isinstance(value, Obj):
        if value.type == "builtins.NoneType":
            return ("none",)
        return ("dict", None) if value.type == "builtins.dict" else ("type", value.type)
    return ("type", None)  # a Global, or nothing the scan models


# What an object known only by its type may be, for the truthiness and iteration BUILD uses.
_TYPE_STANDINS: dict[str, list[Any]] = {
    "builtins.bool": [False, True],
    "builtins.int": [0, 1],
    "builtins.float": [0.0, 1.0],
    "builtins.str": ["?" * 1024],  # a string too long for the scan to keep: never empty
}
_MAX_STANDINS = 32


def _standins(shape: tuple[Any, ...]) -> Optional[list[Any]]:
    """Concrete values of *shape* that cover what BUILD's outcome depends on; None: cannot stand in."""
    kind = shape[0]
    if kind == "none":
        return [None]
    if kind == "value":
        return [shape[1]]
    if kind == "dict":
        return [{i: i for i in range(n)} for n in ([shape[1]] if shape[1] is not None else [0, 1, 2, 3])]
    if kind == "tuple":
        options = [_standins(s) for s in shape[1]]
        if any(o is None for o in options):
            return None
        combos = list(itertools.islice(itertools.product(*options), _MAX_STANDINS + 1))  # type: ignore[arg-type]
        return combos if len(combos) <= _MAX_STANDINS else None
    return _TYPE_STANDINS.get(shape[1]) if kind == "type" and shape[1] else None


def _apply(rules: BuildRules, has_dict: bool, no_dict: str, state: Any) -> Optional[tuple[str, str]]:
    """This torch's BUILD of *state* onto an instance without ``__setstate__``: None or (type, message)."""
    slotstate = None
    if rules.splits_slotstate and isinstance(state, tuple) and len(state) == 2:
        state, slotstate = state
    if state or not rules.skips_falsy_state:
        if not has_dict:
            return ("AttributeError", no_dict)
        try:
            {}.update(state)  # torch's inst.__dict__.update(state), on a plain stand-in
        except Exception as e:  # noqa: BLE001 - the error is the answer
            return (type(e).__name__, str(e))
    if slotstate:
        try:
            slotstate.items()  # torch: for k, v in slotstate.items(): setattr(inst, k, v)
        except AttributeError as e:
            return ("AttributeError", str(e))
    return None


def build_failure(cls: Any, shape: tuple[Any, ...], rules: BuildRules) -> Optional[tuple[str, str]]:
    """``(exception type name, message)`` when this torch's BUILD of a state of *shape* onto an instance of
    the allowlisted *cls* raises; None when it does not, or cannot be told without running code or the contents."""
    if (
        not isinstance(cls, type)
        or not cls.__flags__ & (1 << 9)  # a C type: no Py_TPFLAGS_HEAPTYPE
        or hasattr(cls, "__getattr__")
        or cls.__getattribute__ is not object.__getattribute__
        or (hasattr(cls, "__setstate__") and rules.calls_setstate)  # its own code applies it, as in a full load
    ):
        return None
    standins = _standins(shape)
    if not standins:
        return None
    no_dict = f"'{cls.__name__}' object has no attribute '__dict__'"  # Python's, for a slotted class (asked below)
    try:
        object.__new__(type(cls.__name__, (), {"__slots__": ()})).__dict__  # noqa: B018 - the error is the point
    except AttributeError as e:
        no_dict = str(e)
    has_dict = getattr(cls, "__dictoffset__", 0) != 0
    outcomes = {_apply(rules, has_dict, no_dict, s) for s in standins}
    return outcomes.pop() if len(outcomes) == 1 else None
