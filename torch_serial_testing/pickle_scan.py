"""A static model of torch's weights-only unpickler, run over pickle opcodes without executing them.

One pass over a pickle stream (never importing or calling anything it names)
collects what a prediction needs:

* every global named (GLOBAL, INST, STACK_GLOBAL, OBJ-free extension codes), both as
  torch's weights-only unpickler spells it and as a *full* unpickle would resolve it
  (``_compat_pickle`` fix-ups for protocol < 3, torch's ``load_module_mapping``);
* the ordered checks the weights-only unpickler makes
  (``torch/_weights_only_unpickler.py``, ``Unpickler.load``): each GLOBAL against the
  allowlist, the *type* BUILD is applied to (e.g. ``numpy.dtypes.Float64DType``,
  which never appears as a GLOBAL), APPEND(S) only onto a real ``list``, SETITEM(S)
  only onto ``dict``/``OrderedDict``/``Counter``, persistent ids only of storages,
  and the opcodes it does not implement at all.

Checks that no allowlist can satisfy are ``refused``; the first of them is the
checkpoint's *weights-only blocker*.  The walker decodes only the arguments the
model needs (names, short strings, small ints) and skips the rest by length, so a
scan costs one pass of cheap byte arithmetic; :class:`ScanLimits` bound it.
"""

from __future__ import annotations

import _compat_pickle
import functools
import inspect
import pickle
import pickletools
import re
from dataclasses import dataclass, field
from typing import Any, Optional

from .errors import CheckpointFormatError
from .scan_limits import ScanLimits

__all__ = [
    "Check",
    "ScanState",
    "scan_pickle",
    "weights_only_opcodes",
    "WEIGHTS_ONLY_OPCODES",
    "numpy_dtype_class",
    "special_global_messages",
]

# The opcodes torch 2.13's weights-only unpickler handles (torch/_weights_only_unpickler.py,
# Unpickler.load); any other one makes it raise "Unsupported operand <code>".  Read from torch's
# own source when it is available (see weights_only_opcodes), this is the fallback.
WEIGHTS_ONLY_OPCODES = frozenset(
    "GLOBAL NEWOBJ REDUCE BUILD APPEND APPENDS SETITEM SETITEMS MARK TUPLE TUPLE1 TUPLE2 TUPLE3 "
    "NONE NEWFALSE NEWTRUE EMPTY_TUPLE EMPTY_LIST EMPTY_DICT EMPTY_SET BININT BININT1 BININT2 "
    "BINFLOAT BINUNICODE SHORT_BINSTRING BINPERSID BINGET LONG_BINGET BINPUT LONG_BINPUT LONG1 "
    "PROTO STOP".split()
)

UNRESOLVED = "<unresolved STACK_GLOBAL>"


@functools.lru_cache(maxsize=1)
def weights_only_opcodes() -> frozenset[str]:
    """The opcodes this torch's weights-only unpickler accepts, read from its source."""
    try:
        from torch import _weights_only_unpickler as wou

        source = inspect.getsource(wou.Unpickler.load)
    except (ImportError, AttributeError, OSError, TypeError):
        return WEIGHTS_ONLY_OPCODES
    found = frozenset(re.findall(r"\b([A-Z][A-Z0-9_]*)\[0\]", source)) & frozenset(
        op.name for op in pickletools.opcodes
    )
    return found if "GLOBAL" in found and "STOP" in found else WEIGHTS_ONLY_OPCODES


# torch 2.13's globals refused with a message that names no global (an NJT or DTensor checkpoint
# loaded before torch.nested / torch.distributed.tensor registered them).  Read from torch's source.
_SPECIAL_FALLBACK: dict[str, str] = {
    **dict.fromkeys(
        [
            "torch.nested._internal.nested_tensor.NestedTensor",
            "torch.nested._internal.nested_tensor._rebuild_njt",
            "torch._dynamo.decorators._DimRange",
        ],
        "``torch.nested`` and ``torch._dynamo`` must be imported to load nested jagged tensors (NJTs)",
    ),
    **dict.fromkeys(
        [
            "torch.distributed.device_mesh.DeviceMesh",
            "torch.distributed.tensor._dtensor_spec.DTensorSpec",
            "torch.distributed.tensor._dtensor_spec.TensorMeta",
            "torch.distributed.tensor.DTensor",
            "torch.distributed.tensor.placement_types.Partial",
            "torch.distributed.tensor.placement_types.Replicate",
            "torch.distributed.tensor.placement_types.Shard",
        ],
        "``torch.distributed.tensor`` must be imported to load DTensors",
    ),
}


@functools.lru_cache(maxsize=1)
def special_global_messages() -> dict[str, str]:
    """Globals this torch refuses, when not allowlisted, with a message naming no global."""
    try:
        from torch import _weights_only_unpickler as wou

        source = inspect.getsource(wou.Unpickler.load)
    except (ImportError, AttributeError, OSError, TypeError):
        return dict(_SPECIAL_FALLBACK)
    found: dict[str, str] = {}
    pattern = re.compile(
        r"elif full_path in \(\s*\[(?P<names>[^\]]*)\]\s*\):\s*raise UnpicklingError\(\s*(?P<msg>(?:\"[^\"]*\"\s*)+)\)"
    )
    for m in pattern.finditer(source):
        message = "".join(re.findall(r"\"([^\"]*)\"", m.group("msg")))
        for name in re.findall(r"\"([^\"]+)\"", m.group("names")):
            found[name] = message
    return found


@functools.lru_cache(maxsize=1)
def _blocked_modules() -> frozenset[str]:
    try:
        from torch import _weights_only_unpickler as wou

        return frozenset(wou._blocklisted_modules)
    except (ImportError, AttributeError):
        return frozenset(["sys", "os", "posix", "nt"])


@functools.lru_cache(maxsize=1)
def _torch_name_fixups() -> tuple[dict[str, str], dict[tuple[str, str], tuple[str, str]]]:
    """torch's copy of pickle's Python-2 name fix-ups, applied by the weights-only unpickler."""
    from torch._utils import IMPORT_MAPPING, NAME_MAPPING

    return IMPORT_MAPPING, NAME_MAPPING


@functools.lru_cache(maxsize=1)
def _storage_names() -> frozenset[str]:
    """Names torch.load resolves to its own StorageType without importing anything."""
    try:
        import torch

        return frozenset(torch.storage._storage_type_to_dtype_map())  # type: ignore[attr-defined]
    except (ImportError, AttributeError):
        return frozenset()


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
_MARK = object()  # separates MARK levels on the single abstract stack

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
    instance of this type: the type must be allowlisted) or ``"refused"`` (never
    loads, whatever is allowlisted; ``message`` is torch's reason).
    """

    kind: str
    name: str = ""
    message: str = ""


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

    def check(self, kind: str, name: str = "", message: str = "") -> None:
        key = (kind, name, message)
        if key not in self.seen:
            self.seen.add(key)
            self.checks.append(Check(kind, name, message))

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
            self.check(c.kind, c.name, c.message)
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


# -- the walker ---------------------------------------------------------------------------------

# Argument layout per opcode byte, derived from the stdlib's own opcode table.
_FIXED, _LINE, _TWO_LINES, _LEN1, _LEN4, _LEN8 = range(6)
_ARG: dict[int, tuple[int, int]] = {}
for _op in pickletools.opcodes:
    _a = _op.arg
    _code = ord(_op.code)
    if _a is None:
        _ARG[_code] = (_FIXED, 0)
    elif _a.n >= 0:
        _ARG[_code] = (_FIXED, _a.n)
    elif _a.name == "stringnl_noescape_pair":
        _ARG[_code] = (_TWO_LINES, 0)
    elif _a.n == pickletools.UP_TO_NEWLINE:
        _ARG[_code] = (_LINE, 0)
    elif _a.n == pickletools.TAKEN_FROM_ARGUMENT1:
        _ARG[_code] = (_LEN1, 0)
    elif _a.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
        _ARG[_code] = (_LEN4, 0)
    elif _a.n == pickletools.TAKEN_FROM_ARGUMENT8U:
        _ARG[_code] = (_LEN8, 0)
_NAMES = {ord(op.code): op.name for op in pickletools.opcodes}
del _op, _a, _code


def _damaged(what: str, pos: int) -> CheckpointFormatError:
    return CheckpointFormatError(f"the pickle stream is truncated or damaged: {what} at byte {pos}")


def scan_pickle(data: bytes, pos: int, state: ScanState, *, zip_format: bool) -> tuple[int, Any]:
    """Walk one pickle of *data* from *pos* to its STOP; return (end position, the value at STOP).

    The value is modelled (a small int or short str stays itself, anything else is abstract).
    Facts go to *state*.
    """
    limits = state.limits
    end = len(data)
    if pos >= end:
        raise CheckpointFormatError("the pickle stream ended early: the checkpoint is truncated")
    start = pos
    supported = _supported_codes()
    wo = state.weights_only_live
    check = state.check
    globals_ = state.globals
    full = state.full_load_globals
    stack: list[Any] = []
    push = stack.append
    memo: dict[int, Any] = {}
    proto = 0
    max_name = limits.max_name_length
    budget = limits.max_opcodes - state.opcodes
    n = 0
    max_stack = limits.max_stack_depth
    max_memo = limits.max_memo_entries
    import_map, name_map = _torch_name_fixups()
    blocked = _blocked_modules()
    arg_table = _ARG
    unpack = int.from_bytes

    marks: list[int] = []  # stack heights at each open MARK

    def pop_mark() -> list[Any]:
        if not marks:
            raise _damaged("MARK missing", pos)
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    def add_global(module: str, name: str, via: str) -> tuple[str, str]:
        """Record a global; return its weights-only spelling (module, name)."""
        if len(module) + len(name) + 1 > max_name:
            raise CheckpointFormatError(
                f"a global name of {len(module) + len(name) + 1} characters at byte {pos} exceeds "
                f"ScanLimits.max_name_length={max_name}; raise it with scan_limits(max_name_length=...)"
            )
        for part in (module, name):
            try:
                part.encode("utf-8")
            except UnicodeEncodeError:
                raise CheckpointFormatError(
                    f"a global name at byte {pos} contains a lone surrogate ({(module + '.' + name)!a}): "
                    "no module can have that name"
                ) from None
        if (module, name) in name_map:
            wo_module, wo_name = name_map[(module, name)]
        else:
            wo_module, wo_name = import_map.get(module, module), name
        globals_.add(f"{wo_module}.{wo_name}")
        full.setdefault(_full_load_name(module, name, proto, zip_format), via)
        return wo_module, wo_name

    fast = _FAST_CODES if _FAST_CODES <= supported else frozenset()
    at = pos
    try:
        while True:
            code = data[pos]
            n += 1
            if not n & 1023:
                _check_budget(n, budget, len(stack) + len(marks), len(memo), limits)
            at = pos
            if code in fast:
                # The opcodes torch.save writes most, decoded inline (all weights-only supported).
                if code == 0x71:  # BINPUT (1-byte index: at most 256 entries)
                    memo[data[pos + 1]] = stack[-1]
                    pos += 2
                elif code == 0x68:  # BINGET
                    push(memo[data[pos + 1]])
                    pos += 2
                elif code == 0x4B:  # BININT1
                    push(data[pos + 1])
                    pos += 2
                elif code == 0x58:  # BINUNICODE
                    length = unpack(data[pos + 1:pos + 5], "little")
                    p = pos + 5
                    pos = p + length
                    if pos > end:
                        raise _damaged("a string beyond the end of the stream", at)
                    push(data[p:pos].decode("utf-8", "surrogatepass") if length <= max_name else _STR)
                elif code == 0x52:  # REDUCE
                    args = stack.pop()
                    func = stack[-1]
                    pos += 1
                    if type(func) is _Global:
                        stack[-1] = _Obj(_reduce_result(func.name, args))
                    else:
                        if wo:
                            check("refused", "", f"Trying to call reduce for unrecognized function {_describe(func)}")
                            wo = False
                        stack[-1] = _UNKNOWN
                elif code == 0x29:  # EMPTY_TUPLE
                    push(())
                    pos += 1
                elif code == 0x28:  # MARK
                    marks.append(len(stack))
                    pos += 1
                elif code == 0x85:  # TUPLE1
                    stack[-1] = (stack[-1],)
                    pos += 1
                elif code == 0x74:  # TUPLE
                    push(tuple(pop_mark()))
                    pos += 1
                elif code == 0x72:  # LONG_BINPUT
                    memo[unpack(data[pos + 1:pos + 5], "little")] = stack[-1]
                    pos += 5
                    if len(memo) > max_memo:
                        raise _memo_error(limits)
                elif code == 0x89 or code == 0x88:  # NEWFALSE, NEWTRUE
                    push(_BOOL)
                    pos += 1
                elif code == 0x6A:  # LONG_BINGET
                    push(memo[unpack(data[pos + 1:pos + 5], "little")])
                    pos += 5
                continue
            spec = arg_table.get(code)
            if spec is None:
                raise _damaged(f"unknown opcode {code}", pos)
            kind, size = spec
            pos += 1
            arg: Any = None
            if kind == _FIXED:
                if size:
                    if pos + size > end:
                        raise _damaged("truncated argument", at)
                    arg = data[pos:pos + size]
                    pos += size
            elif kind == _LEN4 or kind == _LEN1 or kind == _LEN8:
                width = 4 if kind == _LEN4 else (1 if kind == _LEN1 else 8)
                if pos + width > end:
                    raise _damaged("truncated length", at)
                length = unpack(data[pos:pos + width], "little")
                pos += width
                if length > end - pos:
                    raise _damaged(f"a {length}-byte argument beyond the end of the stream", at)
                arg = (pos, length)
                pos += length
            else:
                nl = data.find(b"\n", pos, min(end, pos + max_name + limits.max_int_digits + 2))
                if nl < 0:
                    raise _damaged("a text argument without newline (or longer than the limits)", at)
                arg = data[pos:nl]
                pos = nl + 1
                if kind == _TWO_LINES:
                    nl = data.find(b"\n", pos, min(end, pos + max_name + 2))
                    if nl < 0:
                        raise _damaged("a global name without newline (or longer than ScanLimits.max_name_length)", at)
                    arg = (arg, data[pos:nl])
                    pos = nl + 1

            if code not in supported:
                state.refused_opcodes.add(_NAMES[code])
                if wo:
                    check("refused", _NAMES[code], f"Unsupported operand {code}")
                    wo = False

            # -- stack effects (and the weights-only checks) -------------------------------------
            if code == 0x71 or code == 0x72 or code == 0x70:  # BINPUT, LONG_BINPUT, PUT
                if not stack or stack[-1] is _MARK:
                    raise _damaged("PUT with an empty stack", at)
                if code == 0x70:
                    try:
                        idx = int(arg)
                    except ValueError:
                        raise _damaged("PUT with a non-integer index", at) from None
                else:
                    idx = unpack(arg, "little")
                memo[idx] = stack[-1]
                if len(memo) > max_memo:
                    raise _memo_error(limits)
            elif code == 0x94:  # MEMOIZE
                if not stack or stack[-1] is _MARK:
                    raise _damaged("MEMOIZE with an empty stack", at)
                memo[len(memo)] = stack[-1]
                if len(memo) > max_memo:
                    raise _memo_error(limits)
            elif code == 0x68 or code == 0x6A or code == 0x67:  # BINGET, LONG_BINGET, GET
                if code == 0x67:
                    try:
                        idx = int(arg)
                    except ValueError:
                        raise _damaged("GET with a non-integer index", at) from None
                else:
                    idx = unpack(arg, "little")
                try:
                    push(memo[idx])
                except KeyError:
                    raise _damaged(f"memo entry {idx} read before it was written", at) from None
            elif code == 0x58 or code == 0x8C or code == 0x8D:  # BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
                p, length = arg
                if length <= max_name:
                    try:
                        push(data[p:p + length].decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError:
                        raise _damaged("a string that is not UTF-8", at) from None
                else:
                    push(_STR)
            elif code == 0x28:  # MARK
                marks.append(len(stack))
            elif code == 0x74:  # TUPLE
                push(tuple(pop_mark()))
            elif code == 0x85:  # TUPLE1
                _need(stack, 1, at)
                stack[-1] = (stack[-1],)
            elif code == 0x86:  # TUPLE2
                _need(stack, 2, at)
                stack[-2:] = [(stack[-2], stack[-1])]
            elif code == 0x87:  # TUPLE3
                _need(stack, 3, at)
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif code == 0x4B or code == 0x4D or code == 0x4A:  # BININT1, BININT2, BININT
                push(unpack(arg, "little", signed=code == 0x4A))
            elif code == 0x63 or code == 0x69:  # GLOBAL, INST
                try:
                    module, name = arg[0].decode("utf-8"), arg[1].decode("utf-8")
                except UnicodeDecodeError:
                    raise _damaged("a global name that is not UTF-8", at) from None
                wo_module, wo_attr = add_global(module, name, "GLOBAL" if code == 0x63 else "INST")
                wo_name = f"{wo_module}.{wo_attr}"
                if code == 0x69:
                    pop_mark()
                    push(_Obj(wo_name))
                else:
                    if wo:
                        if wo_module in blocked:
                            check(
                                "refused",
                                wo_name,
                                f"Trying to load unsupported GLOBAL {wo_name} whose module {wo_module} is blocked.",
                            )
                            wo = False
                        else:
                            check("global", wo_name)
                    push(_Global(wo_name))
            elif code == 0x93:  # STACK_GLOBAL
                _need(stack, 2, at)
                module, name = stack[-2], stack[-1]
                del stack[-2:]
                if isinstance(module, str) and isinstance(name, str):
                    push(_Global(".".join(add_global(module, name, "STACK_GLOBAL"))))
                else:
                    globals_.add(UNRESOLVED)
                    full[UNRESOLVED] = "STACK_GLOBAL"
                    push(_UNKNOWN)
            elif code == 0x52:  # REDUCE
                _need(stack, 2, at)
                args = stack.pop()
                func = stack[-1]
                if isinstance(func, _Global):
                    stack[-1] = _Obj(_reduce_result(func.name, args))
                else:
                    if wo:
                        check("refused", "", f"Trying to call reduce for unrecognized function {_describe(func)}")
                        wo = False
                    stack[-1] = _UNKNOWN
            elif code == 0x81 or code == 0x92:  # NEWOBJ, NEWOBJ_EX
                _need(stack, 3 if code == 0x92 else 2, at)
                if code == 0x92:
                    del stack[-2:]
                else:
                    stack.pop()
                cls = stack[-1]
                if isinstance(cls, _Global):
                    stack[-1] = _Obj(cls.name)
                else:
                    if wo:
                        check(
                            "refused",
                            "",
                            "Can only create new object for nn.Parameter or classes allowlisted via "
                            f"`add_safe_globals` but got {_describe(cls)}",
                        )
                        wo = False
                    stack[-1] = _UNKNOWN
            elif code == 0x62:  # BUILD
                _need(stack, 2, at)
                stack.pop()
                if wo:
                    t = _type_of(stack[-1])
                    if isinstance(stack[-1], _Global) or (t is not None and t.startswith("builtins.")):
                        check(
                            "refused",
                            "",
                            "Can only build Tensor, Parameter, OrderedDict or types allowlisted via "
                            f"`add_safe_globals`, but got {class_repr(t) if t else '<class ?>'}",
                        )
                        wo = False
                    elif t is not None and t not in _BUILD_FREE:
                        check("type", t)
            elif code == 0x61 or code == 0x65:  # APPEND, APPENDS
                if code == 0x61:
                    _need(stack, 2, at)
                    stack.pop()
                else:
                    pop_mark()
                    _need(stack, 1, at)
                if wo:
                    t = _type_of(stack[-1])
                    if t is not None and t != "builtins.list":
                        what = "append to lists" if code == 0x61 else "extend lists"
                        check("refused", "", f"Can only {what}, but got {class_repr(t)}")
                        wo = False
            elif code == 0x73 or code == 0x75:  # SETITEM, SETITEMS
                if code == 0x73:
                    _need(stack, 3, at)
                    del stack[-2:]
                else:
                    pop_mark()
                    _need(stack, 1, at)
                if wo:
                    t = _type_of(stack[-1])
                    if t is not None and t not in _SETITEM_TYPES:
                        opname = "SETITEM" if code == 0x73 else "SETITEMS"
                        check(
                            "refused",
                            "",
                            f"Can only {opname} for dict, collections.OrderedDict, collections.Counter, "
                            f"but got {class_repr(t)}",
                        )
                        wo = False
            elif code == 0x51 or code == 0x50:  # BINPERSID, PERSID
                if code == 0x51:
                    _need(stack, 1, at)
                    pid = stack.pop()
                else:
                    pid = _UNKNOWN
                if wo:
                    reason = _persid_refusal(pid)
                    if reason:
                        check("refused", "", reason)
                        wo = False
                push(_STORAGE)
            elif code == 0x7D:  # EMPTY_DICT
                push(_DICT)
            elif code == 0x5D:  # EMPTY_LIST
                push(_LIST)
            elif code == 0x29:  # EMPTY_TUPLE
                push(())
            elif code == 0x89 or code == 0x88:  # NEWFALSE, NEWTRUE
                push(_BOOL)
            elif code == 0x4E:  # NONE
                push(_NONE)
            elif code == 0x8A:  # LONG1
                p, length = arg
                push(int.from_bytes(data[p:p + length], "little", signed=True) if length <= 32 else _INT)
            elif code == 0x8B:  # LONG4
                push(_INT)
            elif code == 0x47 or code == 0x46:  # BINFLOAT, FLOAT
                push(_FLOAT)
            elif code == 0x80:  # PROTO
                proto = arg[0]
                if proto > pickle.HIGHEST_PROTOCOL:
                    raise CheckpointFormatError(
                        f"the pickle uses protocol {proto}, newer than this Python's {pickle.HIGHEST_PROTOCOL}"
                    )
            elif code == 0x95:  # FRAME
                pass
            elif code == 0x2E:  # STOP
                if not stack:
                    raise _damaged("STOP with an empty stack", at)
                state.opcodes += n
                state.bytes_scanned += pos - start
                state.max_memo = max(state.max_memo, len(memo))
                state.weights_only_live = wo
                return pos, stack[-1]
            elif code == 0x49 or code == 0x4C:  # INT, LONG (text)
                text = arg[:-1] if code == 0x4C and arg.endswith(b"L") else arg
                if len(text) > limits.max_int_digits:
                    raise CheckpointFormatError(
                        f"an integer of {len(text)} digits at byte {at} exceeds ScanLimits.max_int_digits="
                        f"{limits.max_int_digits} (Python refuses to read it too)"
                    )
                if code == 0x49 and text in (b"00", b"01"):
                    push(_BOOL)
                else:
                    try:
                        push(int(text))
                    except ValueError:
                        raise _damaged("an integer that is not a number", at) from None
            elif code == 0x53 or code == 0x55 or code == 0x54 or code == 0x56:
                # STRING, SHORT_BINSTRING, BINSTRING, UNICODE: torch decodes them as UTF-8 str.
                if code == 0x53 or code == 0x56:
                    raw = arg
                    if code == 0x53 and len(raw) >= 2 and raw[:1] == raw[-1:] and raw[:1] in (b"'", b'"'):
                        raw = raw[1:-1]
                else:
                    p, length = arg
                    raw = data[p:p + length] if length <= max_name else b""
                try:
                    push(raw.decode("utf-8") if 0 < len(raw) <= max_name else _STR)
                except UnicodeDecodeError:
                    push(_BYTES)
            elif code in (0x42, 0x43, 0x8E):  # BINBYTES, SHORT_BINBYTES, BINBYTES8
                push(_BYTES)
            elif code == 0x96:  # BYTEARRAY8
                push(_BYTEARRAY)
            elif code == 0x97:  # NEXT_BUFFER
                push(_PICKLEBUFFER)
            elif code == 0x98:  # READONLY_BUFFER
                _need(stack, 1, at)
            elif code == 0x8F:  # EMPTY_SET
                push(_SET)
            elif code == 0x90:  # ADDITEMS
                pop_mark()
                _need(stack, 1, at)
            elif code == 0x91:  # FROZENSET
                pop_mark()
                push(_FROZENSET)
            elif code == 0x6C:  # LIST
                pop_mark()
                push(_LIST)
            elif code == 0x64:  # DICT
                pop_mark()
                push(_DICT)
            elif code == 0x6F:  # OBJ
                items = pop_mark()
                if not items:
                    raise _damaged("OBJ without a class", at)
                cls = items[0]
                push(_Obj(cls.name) if isinstance(cls, _Global) else _UNKNOWN)
            elif code == 0x30:  # POP (of a MARK when one is on top, as pickle does)
                if marks and marks[-1] == len(stack):
                    marks.pop()
                else:
                    _need(stack, 1, at)
                    stack.pop()
            elif code == 0x31:  # POP_MARK
                pop_mark()
            elif code == 0x32:  # DUP
                _need(stack, 1, at)
                push(stack[-1])
            elif code in (0x82, 0x83, 0x84):  # EXT1, EXT2, EXT4
                ext = f"<extension registry code {unpack(arg, 'little')}>"
                globals_.add(ext)
                full[ext] = _NAMES[code]
                push(_UNKNOWN)
            else:  # pragma: no cover - every opcode of pickletools.opcodes is handled above
                raise _damaged(f"opcode {_NAMES.get(code, code)} not modelled", at)
            if len(stack) > max_stack:
                raise CheckpointFormatError(
                    f"the pickle stack grew past ScanLimits.max_stack_depth={max_stack} entries at byte {at}"
                )
    except IndexError:
        if pos >= end:
            raise CheckpointFormatError(
                "the pickle stream ended early (no STOP opcode): the checkpoint is truncated"
            ) from None
        raise _damaged("stack underflow, or an argument past the end of the stream", at) from None
    except KeyError as e:
        raise _damaged(f"memo entry {e} read before it was written", at) from None
    except CheckpointFormatError:
        raise
    except UnicodeDecodeError:
        raise _damaged("a string that is not UTF-8", at) from None
    except (ValueError, TypeError, OverflowError) as e:
        raise _damaged(f"{type(e).__name__}: {e}", at) from None


def _check_budget(n: int, budget: int, depth: int, memo: int, limits: ScanLimits) -> None:
    """Checked every 1024 opcodes: the caps that bound time and memory."""
    if n > budget:
        raise CheckpointFormatError(
            f"the pickle has more than ScanLimits.max_opcodes={limits.max_opcodes} opcodes; "
            "raise it with scan_limits(max_opcodes=...) if the checkpoint is trusted to be that large"
        )
    if depth > limits.max_stack_depth:
        raise CheckpointFormatError(
            f"the pickle stack grew past ScanLimits.max_stack_depth={limits.max_stack_depth} entries"
        )
    if memo > limits.max_memo_entries:
        raise _memo_error(limits)


_FAST_CODES = frozenset([0x71, 0x68, 0x4B, 0x58, 0x52, 0x29, 0x28, 0x85, 0x74, 0x72, 0x89, 0x88, 0x6A])


@functools.lru_cache(maxsize=1)
def _supported_codes() -> frozenset[int]:
    names = weights_only_opcodes()
    return frozenset(ord(op.code) for op in pickletools.opcodes if op.name in names)


def _need(stack: list[Any], k: int, at: int) -> None:
    if len(stack) < k or any(v is _MARK for v in stack[-k:]):
        raise _damaged(f"stack underflow (needs {k} values)", at)


def _memo_error(limits: ScanLimits) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"the pickle stores more than ScanLimits.max_memo_entries={limits.max_memo_entries} memo entries; "
        "raise it with scan_limits(max_memo_entries=...) if the checkpoint is trusted to be that large"
    )


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


def _persid_refusal(pid: Any) -> Optional[str]:
    """torch's refusal of a persistent id (only storages may be persistent-loaded), or None."""
    if isinstance(pid, tuple):
        if pid and not (isinstance(pid[0], str) and pid[0] == "storage"):
            if isinstance(pid[0], str) or isinstance(pid[0], _Obj):
                t = _type_of(pid[0])
                return f"Only persistent_load of storage is allowed, but got {class_repr(t)}"
            return "Only persistent_load of storage is allowed"
        return None
    if isinstance(pid, int) and not isinstance(pid, bool):
        return None
    t = _type_of(pid)
    if t in ("builtins.tuple", "builtins.int"):
        return None
    return f"persistent_load id must be tuple or int, but got {class_repr(t)}"


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
