"""A model of torch's weights-only unpickler, as facts derived from torch's own code.

``torch/_weights_only_unpickler.py`` (``Unpickler.load``) decides what a
``weights_only=True`` load accepts.  This module holds what the static walker
(:mod:`.pickle_scan`) needs to replay it without running it, beyond the rules read
from the running torch (:mod:`.torch_unpickler_rules`: opcodes, messages, blocked
modules, container and persistent-id checks): the abstract values the walker
pushes, the type each allowlisted callable builds (``numpy.dtype('f8')`` builds a
``numpy.dtypes.Float64DType``), the container and persistent-id rules, and the
names a *full* unpickle resolves instead (``_compat_pickle``, torch's
``load_module_mapping``).
"""

from __future__ import annotations

import _compat_pickle
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .scan_limits import ScanLimits
from .torch_unpickler_rules import (  # noqa: F401 - the public rules are re-exported here too
    _PERSID_TYPE_MESSAGE,
    APPEND_TARGETS,
    WEIGHTS_ONLY_OPCODES,
    _storage_names,
    container_rules,
    special_global_messages,
    weights_only_opcodes,
)

__all__ = [
    "Check",
    "ScanState",
    "weights_only_opcodes",
    "WEIGHTS_ONLY_OPCODES",
    "numpy_dtype_class",
    "special_global_messages",
    "class_repr",
    "append_check",
    "append_refused",
]

UNRESOLVED = "<unresolved STACK_GLOBAL>"


# torch.serialization._load's module renames for a full unpickle of a zip checkpoint.
_LOAD_MODULE_MAPPING = {"torch.tensor": "torch._tensor"}


# -- numpy dtypes: the type BUILD sees after REDUCE of numpy.dtype('<str>', ...) ---------------

_NUMPY_NUMERIC = {
    "b": {1: "BoolDType"},
    "i": {1: "Int8DType", 2: "Int16DType", 4: "Int32DType", 8: "Int64DType"},
    "u": {1: "UInt8DType", 2: "UInt16DType", 4: "UInt32DType", 8: "UInt64DType"},
    "f": {2: "Float16DType", 4: "Float32DType", 8: "Float64DType", 12: "LongDoubleDType", 16: "LongDoubleDType"},
    "c": {8: "Complex64DType", 16: "Complex128DType", 24: "CLongDoubleDType", 32: "CLongDoubleDType"},
    "M": {8: "DateTime64DType"},
    "m": {8: "TimeDelta64DType"},
}
_NUMPY_FLEXIBLE = {"O": "ObjectDType", "U": "StrDType", "S": "BytesDType", "V": "VoidDType"}
_NUMPY_DTYPE_STR = re.compile(r"([biufcMmOUSV])(\d{0,6})")


def numpy_dtype_class(spec: Any) -> Optional[str]:
    """``numpy.dtypes.<X>DType`` for the type ``numpy.dtype(spec)`` builds, or None if unknown.

    Derived from the string alone, without importing numpy (numpy >= 1.25 naming); when numpy
    is already imported its own answer is used for strings of the validated shape.
    """
    if not isinstance(spec, str):
        return None
    m = _NUMPY_DTYPE_STR.fullmatch(spec)
    if m is None:
        return None
    import sys

    numpy = sys.modules.get("numpy")
    if numpy is not None and hasattr(numpy, "dtypes"):
        try:
            t = type(numpy.dtype(spec))
            return f"{t.__module__}.{t.__qualname__}"
        except (TypeError, ValueError):
            return None
    kind, size = m.group(1), m.group(2)
    if kind in _NUMPY_FLEXIBLE:
        return f"numpy.dtypes.{_NUMPY_FLEXIBLE[kind]}"
    name = _NUMPY_NUMERIC[kind].get(int(size)) if size else None
    return f"numpy.dtypes.{name}" if name else None


# -- abstract values ----------------------------------------------------------------------------


class _Global:
    """A global pushed by GLOBAL: its weights-only name."""

    __slots__ = ("name",)

    def __init__(self, name: str) -> None:
        self.name = name


class _Obj:
    """An object whose type the model knows by name (None: cannot tell statically)."""

    __slots__ = ("type",)

    def __init__(self, type_name: Optional[str]) -> None:
        self.type = type_name


_LIST = _Obj("builtins.list")
_DICT = _Obj("builtins.dict")
_SET = _Obj("builtins.set")
_FROZENSET = _Obj("builtins.frozenset")
_BOOL = _Obj("builtins.bool")
_NONE = _Obj("builtins.NoneType")
_FLOAT = _Obj("builtins.float")
_INT = _Obj("builtins.int")  # an int the model did not decode
_BYTES = _Obj("builtins.bytes")
_BYTEARRAY = _Obj("builtins.bytearray")
_STR = _Obj("builtins.str")  # a str too long to keep
_PICKLEBUFFER = _Obj("pickle.PickleBuffer")
_UNKNOWN = _Obj(None)
_STORAGE = _Obj("torch.storage.TypedStorage")

_TENSOR = "torch.Tensor"
_PARAMETER = "torch.nn.parameter.Parameter"
_SETITEM_TYPES = frozenset(["builtins.dict", "collections.OrderedDict", "collections.Counter"])
_BUILD_FREE = frozenset([_TENSOR, _PARAMETER, "collections.OrderedDict"])

# What REDUCE of these (allowlisted) callables returns, for the type checks after it.
_REDUCE_RESULT = {
    **dict.fromkeys(
        [
            "torch._utils._rebuild_tensor",
            "torch._utils._rebuild_tensor_v2",
            "torch._utils._rebuild_tensor_v3",
            "torch._utils._rebuild_qtensor",
            "torch._utils._rebuild_sparse_tensor",
            "torch._utils._rebuild_meta_tensor_no_storage",
            "torch._utils._rebuild_nested_tensor",
            "torch._utils._rebuild_device_tensor_from_numpy",
            "torch._utils._rebuild_device_tensor_from_cpu_tensor",
        ],
        _TENSOR,
    ),
    "torch._utils._rebuild_parameter": _PARAMETER,
    "torch._utils._rebuild_parameter_with_state": _PARAMETER,
    "_codecs.encode": "builtins.bytes",
    "torch.serialization._get_layout": "torch.layout",
}
# REDUCE of these returns an instance of the class given as the first (or second) argument.
_REDUCE_ARG_TYPE = {
    "copyreg._reconstructor": 0,
    "copyreg.__newobj__": 0,
    "torch._utils._rebuild_wrapper_subclass": 0,
    "numpy.core.multiarray._reconstruct": 0,
    "numpy._core.multiarray._reconstruct": 0,
    "torch._tensor._rebuild_from_type_v2": 1,
}
_NUMPY_DTYPE = "numpy.dtype"


def _type_of(v: Any) -> Optional[str]:
    if isinstance(v, _Obj):
        return v.type
    if isinstance(v, str):
        return "builtins.str"
    if isinstance(v, bool):
        return "builtins.bool"
    if isinstance(v, int):
        return "builtins.int"
    if isinstance(v, tuple):
        return "builtins.tuple"
    if isinstance(v, _Global):
        return None  # a class or a function: cannot tell without importing it
    return None


def class_repr(type_name: Optional[str]) -> str:
    """How torch's messages print ``type(x)``: ``<class 'collections.deque'>``, ``<class 'list'>``."""
    if type_name is None:
        return "<class '?'>"
    if type_name.startswith("builtins."):
        type_name = type_name[len("builtins."):]
    return f"<class '{type_name}'>"


@dataclass(frozen=True)
class Check:
    """One thing torch's weights-only unpickler verifies, in the order it meets them.

    ``kind`` is ``"global"`` (the name must be allowlisted), ``"type"`` (BUILD on an
    instance of this type: the type must be allowlisted), ``"build"`` (then BUILD applies
    a state of ``shape``: see :mod:`.build_state`), ``"append"`` / ``"appends"``
    (APPEND / APPENDS onto an instance of this type: whether it passes depends on what is
    allowlisted, see :func:`append_refused`; ``message`` is torch's refusal) or
    ``"refused"`` (never loads, whatever is allowlisted; ``message`` is torch's reason).
    """

    kind: str
    name: str = ""
    message: str = ""
    #: For ``"build"`` (BUILD on an instance of ``name``, which passed its ``"type"`` check): the
    #: shape of the state (:func:`.build_state.state_shape`), which this torch may fail to apply.
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
    #: False once the weights-only unpickler would have stopped (an unsupported opcode, a damaged
    #: stream): later pickles and opcodes no longer add weights-only checks.
    weights_only_live: bool = True

    def check(self, kind: str, name: str = "", message: str = "", shape: Any = None) -> None:
        key = (kind, name, message, shape)
        if key not in self.seen:
            self.seen.add(key)
            self.checks.append(Check(kind, name, message, shape))

    def merge(self, other: "ScanState") -> None:
        """Add the facts of a scan done on its own (a cached one) after this one's."""
        if not self.checks and not self.globals:  # nothing before: take copies wholesale
            self.checks = list(other.checks)
            self.seen = set(other.seen)
            self.globals = set(other.globals)
            self.full_load_globals = dict(other.full_load_globals)
            self.refused_opcodes = set(other.refused_opcodes)
            self.opcodes += other.opcodes
            self.bytes_scanned += other.bytes_scanned
            self.max_memo = max(self.max_memo, other.max_memo)
            self.weights_only_live = self.weights_only_live and other.weights_only_live
            return
        for c in other.checks:
            self.check(c.kind, c.name, c.message, c.shape)
        self.globals |= other.globals
        for name, via in other.full_load_globals.items():
            self.full_load_globals.setdefault(name, via)
        self.refused_opcodes |= other.refused_opcodes
        self.opcodes += other.opcodes
        self.bytes_scanned += other.bytes_scanned
        self.max_memo = max(self.max_memo, other.max_memo)
        self.weights_only_live = self.weights_only_live and other.weights_only_live

    @property
    def blocker(self) -> Optional[str]:
        return next((c.message for c in self.checks if c.kind == "refused"), None)


def _describe(v: Any) -> str:
    t = _type_of(v)
    return f"an object of {class_repr(t)}" if t else "an object the scan cannot name"


def _reduce_result(func: str, args: Any) -> Optional[str]:
    """The type REDUCE of the allowlisted *func* builds, or None when it cannot be told statically."""
    if func in _REDUCE_RESULT:
        return _REDUCE_RESULT[func]
    if func == _NUMPY_DTYPE:
        return numpy_dtype_class(args[0]) if isinstance(args, tuple) and args else None
    index = _REDUCE_ARG_TYPE.get(func)
    if index is not None:
        if isinstance(args, tuple) and len(args) > index and isinstance(args[index], _Global):
            return args[index].name
        return None
    return func  # calling a class builds an instance of it


def _loaded_class(name: str) -> Optional[type]:
    """The class *name* (``module.qualname``) if its module is already imported, else None.

    Read from the modules' and classes' ``__dict__``: nothing is imported and no module
    ``__getattr__`` runs.
    """
    import sys

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


def _target_kinds(type_name: str, user_classes: Optional[dict[str, bool]] = None) -> tuple[str, ...]:
    """The :data:`APPEND_TARGETS` kinds an instance of *type_name* may be, as far as is known.

    *user_classes* maps the names of user-allowlisted types to whether they subclass ``list``
    (at prediction time); without it the allowlist is not known (at scan time).
    """
    if type_name == "builtins.list":
        return ("list",)
    if user_classes is not None and type_name in user_classes:
        return ("allowlisted_list_subclass",) if user_classes[type_name] else ("allowlisted_other",)
    cls = _loaded_class(type_name)
    is_list = None if cls is None else issubclass(cls, list)
    if user_classes is not None:  # known not to be allowlisted
        return ("list_subclass",) if is_list else ("other",) if is_list is False else ("list_subclass", "other")
    if is_list is None:
        return APPEND_TARGETS[1:]
    return ("list_subclass", "allowlisted_list_subclass") if is_list else ("other", "allowlisted_other")


def append_check(opcode: str, type_name: str) -> Optional[Check]:
    """The check torch makes before *opcode* (APPEND or APPENDS) onto an instance of *type_name*.

    None when it passes whatever is allowlisted, ``"refused"`` when it never does (a deque on any
    torch), else an ``"append"``/``"appends"`` check decided by the allowlist at load time (torch
    2.14.1 lets an allowlisted list subclass through).
    """
    rule = container_rules().append_rule(opcode)
    refused = [kind in rule.refused for kind in _target_kinds(type_name)]
    if not any(refused):
        return None
    message = rule.message + class_repr(type_name)
    return Check("refused", "", message) if all(refused) else Check(opcode.lower(), type_name, message)


def append_refused(check: Check, user_classes: dict[str, bool]) -> bool:
    """Whether torch refuses the ``"append"``/``"appends"`` *check* given the user allowlist
    (*user_classes*: allowlisted type names -> whether they subclass ``list``)."""
    rule = container_rules().append_rule(check.kind.upper())
    return any(kind in rule.refused for kind in _target_kinds(check.name, user_classes))


def _persid_refusal(pid: Any) -> Optional[str]:
    """torch's refusal of a persistent id (only storages may be persistent-loaded), or None.

    First the id's type (see :class:`ContainerRules`), then a tuple's first item must be
    ``"storage"``.  An id that passes both may still fail in ``torch.load``'s own
    ``persistent_load`` (a damaged file, which no load mode reads).
    """
    rules = container_rules()
    if isinstance(pid, tuple):
        category = "tuple"
    elif (isinstance(pid, int) and not isinstance(pid, bool)) or (isinstance(pid, _Obj) and pid.type == "builtins.int"):
        category = "int"
    else:
        category = "other"
    if category in rules.persid_refused:
        return f"{_PERSID_TYPE_MESSAGE}, but got {class_repr(_type_of(pid))}"
    if isinstance(pid, tuple) and pid and not (isinstance(pid[0], str) and pid[0] == "storage"):
        if isinstance(pid[0], str) or isinstance(pid[0], _Obj):
            if not rules.persid_names_type:  # torch before 2.9: the id itself
                return f"Only persistent_load of storage is allowed, but got {pid[0]}"
            return f"Only persistent_load of storage is allowed, but got {class_repr(_type_of(pid[0]))}"
        return "Only persistent_load of storage is allowed"
    return None


def _full_load_name(module: str, name: str, proto: int, zip_format: bool) -> str:
    """The global a full unpickle in torch.load resolves for GLOBAL *module* *name*."""
    if "Storage" in name and name in _storage_names():
        return f"torch.{name}"  # torch.load's find_class returns its own StorageType, importing nothing
    if zip_format:
        module = _LOAD_MODULE_MAPPING.get(module, module)
    if proto < 3:
        if (module, name) in _compat_pickle.NAME_MAPPING:
            module, name = _compat_pickle.NAME_MAPPING[(module, name)]
        elif module in _compat_pickle.IMPORT_MAPPING:
            module = _compat_pickle.IMPORT_MAPPING[module]
    return f"{module}.{name}"
