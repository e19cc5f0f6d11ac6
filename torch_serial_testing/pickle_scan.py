"""The opcode walker: torch's weights-only unpickler replayed over pickle bytes without executing them.

One pass over a pickle stream (never importing or calling anything it names)
collects what a prediction needs:

* every global named (GLOBAL, INST, STACK_GLOBAL, OBJ-free extension codes), both as
  torch's weights-only unpickler spells it and as a *full* unpickle would resolve it
  (``_compat_pickle`` fix-ups for protocol < 3, torch's ``load_module_mapping``);
* the ordered checks the weights-only unpickler makes
  (``torch/_weights_only_unpickler.py``, ``Unpickler.load``): each GLOBAL against the
  allowlist, the *type* BUILD is applied to (e.g. ``numpy.dtypes.Float64DType``,
  which never appears as a GLOBAL), APPEND(S) only onto a real ``list`` (or, on torch
  2.14.1, an allowlisted ``list`` subclass), SETITEM(S)
  only onto ``dict``/``OrderedDict``/``Counter``, persistent ids only of storages,
  and the opcodes it does not implement at all.

Checks that no allowlist can satisfy are ``refused``; the first of them is the
checkpoint's *weights-only blocker*.  The walker decodes only the arguments the
model needs (names, short strings, small ints) and skips the rest by length, so a
scan costs one pass of cheap byte arithmetic; :class:`ScanLimits` bound it.  The
rules themselves (what torch checks, and its messages) live in :mod:`.unpickler_model`;
for each BUILD the shape of its state is recorded too (whether this torch can apply it
is :mod:`.build_state`'s question).
"""

from __future__ import annotations

import functools
import pickle
import pickletools
from typing import Any

from .build_state import _Dict, add_dict_keys, dict_value, state_shape
from .errors import CheckpointFormatError
from .scan_limits import ScanLimits
from .torch_unpickler_rules import (
    WEIGHTS_ONLY_OPCODES,
    _blocked_modules,
    _torch_name_fixups,
    name_fixups_need_protocol_2,
    container_rules,
    special_global_messages,
    weights_only_opcodes,
)
from .unpickler_model import (
    _BOOL,
    _BUILD_FREE,
    _BYTEARRAY,
    _BYTES,
    _FLOAT,
    _FROZENSET,
    _INT,
    _LIST,
    _NONE,
    _PICKLEBUFFER,
    _SET,
    _SETITEM_TYPES,
    _STORAGE,
    _STR,
    _UNKNOWN,
    UNRESOLVED,
    Check,
    ScanState,
    append_check,
    _describe,
    _full_load_name,
    _Global,
    _Obj,
    _persid_refusal,
    _reduce_result,
    _type_of,
    class_repr,
    numpy_dtype_class,
)

__all__ = [
    "Check",
    "ScanState",
    "scan_pickle",
    "weights_only_opcodes",
    "WEIGHTS_ONLY_OPCODES",
    "numpy_dtype_class",
    "special_global_messages",
    "class_repr",
]

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
    fixups_at_2 = name_fixups_need_protocol_2()
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
        if fixups_at_2 and proto != 2:  # torch 2.4 renames nothing outside protocol 2
            wo_module, wo_name = module, name
        elif (module, name) in name_map:
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
                if not stack:
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
                if not stack:
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
                build_state = stack.pop()
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
                        check("build", t, "", state_shape(build_state))
            elif code == 0x61 or code == 0x65:  # APPEND, APPENDS
                if code == 0x61:
                    _need(stack, 2, at)
                    stack.pop()
                else:
                    pop_mark()
                    _need(stack, 1, at)
                if wo and container_rules().append_checked:
                    t = _type_of(stack[-1])
                    target = append_check("APPEND" if code == 0x61 else "APPENDS", t) if t is not None else None
                    if target is not None:
                        check(target.kind, target.name, target.message)
                        wo = target.kind != "refused"
            elif code == 0x73 or code == 0x75:  # SETITEM, SETITEMS
                if code == 0x73:
                    _need(stack, 3, at)
                    keys: Any = stack[-2:-1]
                    del stack[-2:]
                else:
                    keys = pop_mark()
                    _need(stack, 1, at)
                if type(stack[-1]) is _Dict:  # a dict the pickle built: its keys, for BUILD states
                    add_dict_keys(stack[-1], keys if code == 0x73 else keys[0::2])
                if wo and container_rules().setitem_checked:
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
                push(_Dict())
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
                push(dict_value(pop_mark()[0::2]))
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
    if len(stack) < k:
        raise _damaged(f"stack underflow (needs {k} values)", at)


def _memo_error(limits: ScanLimits) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"the pickle stores more than ScanLimits.max_memo_entries={limits.max_memo_entries} memo entries; "
        "raise it with scan_limits(max_memo_entries=...) if the checkpoint is trusted to be that large"
    )
