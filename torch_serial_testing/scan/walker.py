"""The opcode walker: torch's weights-only unpickler replayed over pickle bytes without executing them.

One pass over a pickle stream (never importing or calling anything it names) collects what a
prediction needs:

* every global named (GLOBAL, INST, STACK_GLOBAL, extension codes), both as torch's
  weights-only unpickler spells it and as a *full* unpickle would resolve it;
* the ordered checks the weights-only unpickler makes (:class:`~.model.Check`): each GLOBAL
  against the allowlist, the *type* BUILD is applied to (``numpy.dtypes.Float64DType``, which
  never appears as a GLOBAL), the target of every container opcode, persistent ids, and the
  opcodes it does not implement at all, following this torch's rules
  (:func:`~..torch_facts.unpickler.unpickler_rules`).

Checks no allowlist can satisfy are ``refused``; the first is the checkpoint's *weights-only
blocker*.  The walker decodes only the arguments the model needs (names, short strings, small
ints) and skips the rest by length; :class:`~..core.limits.ScanLimits` bound it.  Each opcode is
one branch of one chain, the ones ``torch.save`` writes most first.
"""

from __future__ import annotations

import pickle
import pickletools
from typing import Any, Optional

from ..core.errors import CheckpointFormatError
from ..core.limits import ScanLimits
from ..torch_facts.probes import ProbeFailed
from ..torch_facts.records import storage_type_names
from ..torch_facts.unpickler import UnpicklerRules, unpickler_rules
from .build_state import state_shape
from .model import (
    BOOL, BUILD_FREE, BYTEARRAY, BYTES, FLOAT, FROZENSET, INT, LIST, NONE, PICKLEBUFFER, SET, STORAGE, STR,
    UNKNOWN, UNRESOLVED, DictValue, Global, Obj, ScanState, add_dict_keys, class_repr, container_check,
    describe_value, full_load_name, persid_refusal, reduce_result, type_of,
)

__all__ = ["scan_pickle", "walk_rules"]

# Opcode byte -> how its argument is laid out, from the stdlib's own opcode table.
_FIXED, _LINE, _TWO_LINES, _LEN1, _LEN4, _LEN8 = range(6)
_ARG: dict[int, tuple[int, int]] = {}
for _op in pickletools.opcodes:
    _a = _op.arg
    _c = ord(_op.code)
    if _a is None:
        _ARG[_c] = (_FIXED, 0)
    elif _a.n >= 0:
        _ARG[_c] = (_FIXED, _a.n)
    elif _a.name == "stringnl_noescape_pair":
        _ARG[_c] = (_TWO_LINES, 0)
    elif _a.n == pickletools.UP_TO_NEWLINE:
        _ARG[_c] = (_LINE, 0)
    elif _a.n == pickletools.TAKEN_FROM_ARGUMENT1:
        _ARG[_c] = (_LEN1, 0)
    elif _a.n in (pickletools.TAKEN_FROM_ARGUMENT4, pickletools.TAKEN_FROM_ARGUMENT4U):
        _ARG[_c] = (_LEN4, 0)
    elif _a.n == pickletools.TAKEN_FROM_ARGUMENT8U:
        _ARG[_c] = (_LEN8, 0)
_NAMES = {ord(op.code): op.name for op in pickletools.opcodes}
del _op, _a, _c


class WalkRules:
    """The rules one walk follows: this torch's, or None when they could not be probed
    (the walk then records one ``"unknown"`` check and no weights-only checks)."""

    __slots__ = ("rules", "supported", "failure", "storage_names")

    def __init__(self, rules: Optional[UnpicklerRules], failure: Optional[str]) -> None:
        self.rules = rules
        self.failure = failure
        names = rules.opcodes if rules is not None else frozenset(op.name for op in pickletools.opcodes)
        self.supported = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in names)
        try:
            self.storage_names = storage_type_names()
        except ProbeFailed:
            self.storage_names = frozenset()


_walk_rules: list[tuple[Any, WalkRules]] = []


def walk_rules() -> WalkRules:
    """The rules of this torch for a walk (probed once per unpickler; see :func:`unpickler_rules`)."""
    try:
        rules: Optional[UnpicklerRules] = unpickler_rules()
        failure = None
    except ProbeFailed as e:
        rules, failure = None, str(e)
    if _walk_rules and _walk_rules[0][0] is rules and rules is not None:
        return _walk_rules[0][1]
    made = WalkRules(rules, failure)
    _walk_rules[:] = [(rules, made)]
    return made


def _damaged(what: str, pos: int) -> CheckpointFormatError:
    return CheckpointFormatError(f"the pickle stream is truncated or damaged: {what} at byte {pos}")


def _need(stack: list[Any], k: int, at: int) -> None:
    if len(stack) < k:
        raise _damaged(f"stack underflow (needs {k} values)", at)


def _memo_error(limits: ScanLimits) -> CheckpointFormatError:
    return CheckpointFormatError(
        f"the pickle stores more than ScanLimits.max_memo_entries={limits.max_memo_entries} memo entries; "
        "raise it with scan_limits(max_memo_entries=...) if the checkpoint is trusted to be that large"
    )


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


def _text_int(raw: bytes, code: int, at: int, limits: ScanLimits) -> Any:
    """The value of INT / LONG written as text (protocol 0/1)."""
    text = raw[:-1] if code == 0x4C and raw.endswith(b"L") else raw
    if len(text) > limits.max_int_digits:
        raise CheckpointFormatError(
            f"an integer of {len(text)} digits at byte {at} exceeds ScanLimits.max_int_digits="
            f"{limits.max_int_digits} (Python refuses to read it too)"
        )
    if code == 0x49 and text in (b"00", b"01"):
        return BOOL
    try:
        return int(text)
    except ValueError:
        raise _damaged("an integer that is not a number", at) from None


def scan_pickle(data: bytes, pos: int, state: ScanState, *, zip_format: bool,
                rules: Optional[WalkRules] = None) -> tuple[int, Any]:
    """Walk one pickle of *data* from *pos* to its STOP; return (end position, the value at STOP).

    The value is modelled (a small int or short str stays itself, anything else is abstract).
    Facts go to *state*; *rules* default to this torch's (:func:`walk_rules`).
    """
    walk = rules or walk_rules()
    limits = state.limits
    end = len(data)
    if pos >= end:
        raise CheckpointFormatError("the pickle stream ended early: the checkpoint is truncated")
    start = pos
    torch_rules = walk.rules
    wo = state.weights_only_live
    check = state.check
    if wo and torch_rules is None:
        check("unknown", "", f"this torch's weights-only rules could not be probed: {walk.failure}")
        wo = False
    supported = walk.supported
    globals_ = state.globals
    full = state.full_load_globals
    stack: list[Any] = []
    push = stack.append
    memo: dict[int, Any] = {}
    marks: list[int] = []  # stack heights at each open MARK
    proto = 0
    max_name = limits.max_name_length
    max_stack = limits.max_stack_depth
    max_memo = limits.max_memo_entries
    budget = limits.max_opcodes - state.opcodes
    n = 0
    unpack = int.from_bytes
    arg_table = _ARG
    renames_always = torch_rules is None or torch_rules.renames == "always"
    import_map = torch_rules.import_mapping if torch_rules is not None else {}
    name_map = torch_rules.name_mapping if torch_rules is not None else {}
    blocked = torch_rules.blocked_modules if torch_rules is not None else frozenset()
    storage_names = walk.storage_names

    def pop_mark() -> list[Any]:
        if not marks:
            raise _damaged("MARK missing", at)
        i = marks.pop()
        items = stack[i:]
        del stack[i:]
        return items

    def add_global(module: str, name: str, via: str) -> tuple[str, str]:
        """Record a global; return its weights-only spelling (module, name)."""
        if len(module) + len(name) + 1 > max_name:
            raise CheckpointFormatError(
                f"a global name of {len(module) + len(name) + 1} characters at byte {at} exceeds "
                f"ScanLimits.max_name_length={max_name}; raise it with scan_limits(max_name_length=...)"
            )
        for part in (module, name):
            try:
                part.encode("utf-8")
            except UnicodeEncodeError:
                raise CheckpointFormatError(
                    f"a global name at byte {at} contains a lone surrogate ({(module + '.' + name)!a}): "
                    "no module can have that name"
                ) from None
        if not renames_always and proto != 2:  # torch 2.4 renames nothing outside protocol 2
            wo_module, wo_name = module, name
        elif (module, name) in name_map:
            wo_module, wo_name = name_map[(module, name)]
        else:
            wo_module, wo_name = import_map.get(module, module), name
        globals_.add(f"{wo_module}.{wo_name}")
        full.setdefault(full_load_name(module, name, proto, zip_format, storage_names), via)
        return wo_module, wo_name

    def refuse(message: str, name: str = "") -> None:
        nonlocal wo
        check("refused", name, message)
        wo = False

    at = pos
    try:
        while True:
            code = data[pos]
            n += 1
            if not n & 1023:
                _check_budget(n, budget, len(stack) + len(marks), len(memo), limits)
            at = pos
            if code not in supported:
                state.refused_opcodes.add(_NAMES.get(code, str(code)))
                if wo and code in _NAMES:
                    refuse(torch_rules.unsupported.format(code=code), _NAMES[code])  # type: ignore[union-attr]
            # -- the opcodes torch.save writes most, their small arguments decoded here --------
            if code == 0x71:  # BINPUT (1-byte index)
                memo[data[pos + 1]] = stack[-1]
                pos += 2
                continue
            if code == 0x68:  # BINGET
                try:
                    push(memo[data[pos + 1]])
                except KeyError:
                    raise _damaged(f"memo entry {data[pos + 1]} read before it was written", at) from None
                pos += 2
                continue
            if code == 0x4B:  # BININT1
                push(data[pos + 1])
                pos += 2
                continue
            if code == 0x58 or code == 0x8C or code == 0x8D:  # BINUNICODE, SHORT_BINUNICODE, BINUNICODE8
                width = 4 if code == 0x58 else (1 if code == 0x8C else 8)
                p = pos + 1 + width
                if p > end:
                    raise _damaged("truncated length", at)
                length = unpack(data[pos + 1:p], "little")
                pos = p + length
                if pos > end:
                    raise _damaged("a string beyond the end of the stream", at)
                if length <= max_name:
                    try:
                        push(data[p:pos].decode("utf-8", "surrogatepass"))
                    except UnicodeDecodeError:
                        raise _damaged("a string that is not UTF-8", at) from None
                else:
                    push(STR)
                continue
            if code == 0x52:  # REDUCE
                args = stack.pop()
                func = stack[-1]
                pos += 1
                if type(func) is Global:
                    stack[-1] = Obj(reduce_result(func.name, args))
                else:
                    if wo:
                        refuse(torch_rules.reduce_refusal + describe_value(func))  # type: ignore[union-attr]
                    stack[-1] = UNKNOWN
                continue
            if code == 0x29:  # EMPTY_TUPLE
                push(())
                pos += 1
                continue
            if code == 0x28:  # MARK
                marks.append(len(stack))
                pos += 1
                continue
            if code == 0x85:  # TUPLE1
                stack[-1] = (stack[-1],)
                pos += 1
                continue
            if code == 0x74:  # TUPLE
                pos += 1
                push(tuple(pop_mark()))
                continue
            if code == 0x72:  # LONG_BINPUT
                memo[unpack(data[pos + 1:pos + 5], "little")] = stack[-1]
                pos += 5
                if len(memo) > max_memo:
                    raise _memo_error(limits)
                continue
            if code == 0x89 or code == 0x88:  # NEWFALSE, NEWTRUE
                push(BOOL)
                pos += 1
                continue
            if code == 0x6A:  # LONG_BINGET
                idx = unpack(data[pos + 1:pos + 5], "little")
                try:
                    push(memo[idx])
                except KeyError:
                    raise _damaged(f"memo entry {idx} read before it was written", at) from None
                pos += 5
                continue
            # -- every other opcode: its argument by the stdlib's layout, then its effect ---------
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

            if code == 0x70 or code == 0x94:  # PUT, MEMOIZE
                if not stack:
                    raise _damaged(f"{'PUT' if code == 0x70 else 'MEMOIZE'} with an empty stack", at)
                if code == 0x94:
                    idx = len(memo)
                else:
                    try:
                        idx = int(arg)
                    except ValueError:
                        raise _damaged("PUT with a non-integer index", at) from None
                memo[idx] = stack[-1]
                if len(memo) > max_memo:
                    raise _memo_error(limits)
            elif code == 0x67:  # GET
                try:
                    idx = int(arg)
                except ValueError:
                    raise _damaged("GET with a non-integer index", at) from None
                try:
                    push(memo[idx])
                except KeyError:
                    raise _damaged(f"memo entry {idx} read before it was written", at) from None
            elif code == 0x86:  # TUPLE2
                _need(stack, 2, at)
                stack[-2:] = [(stack[-2], stack[-1])]
            elif code == 0x87:  # TUPLE3
                _need(stack, 3, at)
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif code == 0x4D or code == 0x4A:  # BININT2, BININT
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
                    push(Obj(wo_name))
                else:
                    if wo:
                        if wo_module in blocked:
                            refuse(f"Trying to load unsupported GLOBAL {wo_name} whose module {wo_module} is blocked.",
                                   wo_name)
                        else:
                            check("global", wo_name)
                    push(Global(wo_name))
            elif code == 0x93:  # STACK_GLOBAL
                _need(stack, 2, at)
                module, name = stack[-2], stack[-1]
                del stack[-2:]
                if isinstance(module, str) and isinstance(name, str):
                    push(Global(".".join(add_global(module, name, "STACK_GLOBAL"))))
                else:
                    globals_.add(UNRESOLVED)
                    full[UNRESOLVED] = "STACK_GLOBAL"
                    push(UNKNOWN)
            elif code == 0x81 or code == 0x92:  # NEWOBJ, NEWOBJ_EX
                _need(stack, 3 if code == 0x92 else 2, at)
                del stack[-2 if code == 0x92 else -1:]
                cls = stack[-1]
                if isinstance(cls, Global):
                    stack[-1] = Obj(cls.name)
                else:
                    if wo:
                        refuse(torch_rules.newobj_refusal + describe_value(cls))  # type: ignore[union-attr]
                    stack[-1] = UNKNOWN
            elif code == 0x62:  # BUILD
                _need(stack, 2, at)
                build = stack.pop()
                if wo:
                    t = type_of(stack[-1])
                    if isinstance(stack[-1], Global) or (t is not None and t.startswith("builtins.")):
                        refuse(torch_rules.build_refusal + (class_repr(t) if t else "<class ?>"))  # type: ignore[union-attr]
                    elif t is not None and t not in BUILD_FREE:
                        check("type", t)
                        check("build", t, "", state_shape(build))
            elif code == 0x61 or code == 0x65:  # APPEND, APPENDS
                if code == 0x61:
                    _need(stack, 2, at)
                    stack.pop()
                else:
                    pop_mark()
                    _need(stack, 1, at)
                t = type_of(stack[-1]) if wo else None
                if t is not None:
                    target = container_check(torch_rules, "APPEND" if code == 0x61 else "APPENDS", t)  # type: ignore[arg-type]
                    if target is not None:
                        check(target.kind, target.name, target.message)
                        wo = target.kind != "refused"
            elif code == 0x73 or code == 0x75:  # SETITEM, SETITEMS
                if code == 0x73:
                    _need(stack, 3, at)
                    keys: Any = stack[-2:-1]
                    del stack[-2:]
                else:
                    keys = pop_mark()[0::2]
                    _need(stack, 1, at)
                add_dict_keys(stack[-1], keys)  # a dict the pickle built: its keys, for BUILD states
                t = type_of(stack[-1]) if wo else None
                if t is not None:
                    target = container_check(torch_rules, "SETITEM" if code == 0x73 else "SETITEMS", t)  # type: ignore[arg-type]
                    if target is not None:
                        check(target.kind, target.name, target.message)
                        wo = target.kind != "refused"
            elif code == 0x51 or code == 0x50:  # BINPERSID, PERSID
                if code == 0x51:
                    _need(stack, 1, at)
                    pid = stack.pop()
                else:
                    pid = UNKNOWN
                if wo:
                    reason = persid_refusal(torch_rules, pid)  # type: ignore[arg-type]
                    if reason:
                        refuse(reason)
                push(STORAGE)
            elif code == 0x7D:  # EMPTY_DICT
                push(DictValue())
            elif code == 0x5D:  # EMPTY_LIST
                push(LIST)
            elif code == 0x4E:  # NONE
                push(NONE)
            elif code == 0x8A:  # LONG1
                p, length = arg
                push(int.from_bytes(data[p:p + length], "little", signed=True) if length <= 32 else INT)
            elif code == 0x8B:  # LONG4
                push(INT)
            elif code == 0x47 or code == 0x46:  # BINFLOAT, FLOAT
                push(FLOAT)
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
                push(_text_int(arg, code, at, limits))
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
                    push(raw.decode("utf-8") if 0 < len(raw) <= max_name else STR)
                except UnicodeDecodeError:
                    push(BYTES)
            elif code in (0x42, 0x43, 0x8E):  # BINBYTES, SHORT_BINBYTES, BINBYTES8
                push(BYTES)
            elif code == 0x96:  # BYTEARRAY8
                push(BYTEARRAY)
            elif code == 0x97:  # NEXT_BUFFER
                push(PICKLEBUFFER)
            elif code == 0x98:  # READONLY_BUFFER
                _need(stack, 1, at)
            elif code == 0x8F:  # EMPTY_SET
                push(SET)
            elif code == 0x90:  # ADDITEMS
                pop_mark()
                _need(stack, 1, at)
            elif code == 0x91:  # FROZENSET
                pop_mark()
                push(FROZENSET)
            elif code == 0x6C:  # LIST
                pop_mark()
                push(LIST)
            elif code == 0x64:  # DICT
                push(DictValue(pop_mark()[0::2]))
            elif code == 0x6F:  # OBJ
                items = pop_mark()
                if not items:
                    raise _damaged("OBJ without a class", at)
                cls = items[0]
                push(Obj(cls.name) if isinstance(cls, Global) else UNKNOWN)
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
                push(UNKNOWN)
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
