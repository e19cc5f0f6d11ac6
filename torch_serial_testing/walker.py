"""The opcode walker: torch's weights-only unpickler replayed over pickle bytes, nothing executed.

One pass collects every global a pickle names (as torch's weights-only unpickler spells it and as a full
unpickle resolves it) and, in torch's order, the checks it makes (:class:`~.model.Check`) under this torch's
rules (:mod:`.unpickler`).  Each opcode is one branch of one chain, the ones ``torch.save`` writes most first."""

from __future__ import annotations

import pickle
from typing import Any

from .errors import CheckpointFormatError
from .model import BOOL, BUILD_FREE, BYTES, FROZENSET, INT, LIST, PUSHES, STORAGE, STR, UNKNOWN, UNRESOLVED
from .model import DictValue, Global, Obj, ScanState, add_dict_keys, class_repr, container_check, describe_value
from .model import full_load_name, persid_refusal, reduce_result, state_shape, type_of
from .stream import ARG, NAMES, TruncatedStream, check_budget, checked_global_name, damaged, over_limit
from .stream import memo_error, memo_index, need, read_argument, stream_error, text_int, text_value, underflow
from .unpickler import walk_rules


def scan_pickle(data: bytes, pos: int, state: ScanState, *, zip_format: bool) -> tuple[int, Any]:
    """Walk one pickle of *data* from *pos* to its STOP into *state*, under this torch's rules
    (:func:`walk_rules`); return (end position, the modelled value at STOP)."""
    walk, limits, end = walk_rules(), state.limits, len(data)
    if pos >= end:
        raise TruncatedStream("the pickle stream ended early: the checkpoint is truncated")
    start = at = pos
    torch_rules: Any = walk.rules  # not None while wo is True
    wo, check = state.weights_only_live, state.check
    renames_always, import_map, name_map, blocked = True, {}, {}, frozenset[str]()
    if torch_rules is not None:
        renames_always, blocked = torch_rules.renames == "always", torch_rules.blocked_modules
        import_map, name_map = torch_rules.import_mapping, torch_rules.name_mapping
    elif wo:
        check("unknown", "", f"this torch's weights-only rules could not be probed: {walk.failure}")
        wo = False
    supported, storage_names = walk.supported, walk.storage_names
    globals_, full = state.globals, state.full_load_globals
    max_name, max_stack, max_memo = limits.max_name_length, limits.max_stack_depth, limits.max_memo_entries
    budget = limits.max_opcodes - state.opcodes
    unpack, arg_table, pushes = int.from_bytes, ARG, PUSHES
    stack: list[Any] = []
    push = stack.append
    memo: dict[int, Any] = {}
    marks: list[int] = []  # stack heights at each open MARK
    named: dict[Any, tuple[int, str, str, str]] = {}  # GLOBAL's raw argument -> (proto, its weights-only name)
    floor = n = proto = 0  # floor: the innermost open MARK's height (torch's unpickler starts a new stack at MARK)
    next_check = 1024

    def pop_mark() -> list[Any]:
        nonlocal floor
        if not marks:
            raise damaged("MARK missing", at)
        i = marks.pop()
        floor = marks[-1] if marks else 0
        items = stack[i:]
        del stack[i:]
        return items

    def add_global(module: str, name: str, via: str) -> tuple[str, str]:  # -> its weights-only spelling
        checked_global_name(module, name, at, limits)
        if not renames_always and proto != 2:  # torch 2.4 renames nothing outside protocol 2
            wo_module, wo_name = module, name
        elif (module, name) in name_map:
            wo_module, wo_name = name_map[(module, name)]
        else:
            wo_module, wo_name = import_map.get(module, module), name
        record(f"{wo_module}.{wo_name}", full_load_name(module, name, proto, zip_format, storage_names), via)
        return wo_module, wo_name

    def record(wo_name: str, full_name: str, via: str) -> None:  # every name counts toward max_globals
        globals_.add(wo_name)
        if len(globals_) > limits.max_globals:
            raise over_limit(limits, "max_globals", "the checkpoint names more than {} distinct globals", "need them")
        full.setdefault(full_name, via)

    def refuse(message: str, name: str = "") -> None:
        nonlocal wo
        check("refused", name, message)
        wo = False

    try:
        while True:
            code = data[pos]
            n += 1
            if n >= next_check:  # every 1024 opcodes (a GLOBAL counts 4: it costs as much)
                next_check = check_budget(n, budget, len(stack) + len(marks), len(memo), limits) + 1024
            at = pos
            if code not in supported:
                state.refused_opcodes.add(NAMES.get(code, str(code)))
                if wo and code in NAMES:
                    refuse(torch_rules.unsupported.format(code=code), NAMES[code])
            # -- the opcodes torch.save writes most, their small arguments decoded here --------
            if code == 0x71:  # BINPUT (1-byte index)
                if len(stack) <= floor:
                    raise underflow(1, at)
                memo[data[pos + 1]] = stack[-1]
                pos += 2
                continue
            if code == 0x68:  # BINGET (a missing entry: the KeyError handler below)
                push(memo[data[pos + 1]])
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
                    raise damaged("truncated length", at, truncated=True)
                length = unpack(data[pos + 1 : p], "little")
                pos = p + length
                if pos > end:
                    raise damaged("a string beyond the end of the stream", at, truncated=True)
                push(data[p:pos].decode("utf-8", "surrogatepass") if length <= max_name else STR)
                continue
            if code == 0x52:  # REDUCE
                if len(stack) - floor < 2:
                    raise underflow(2, at)
                args = stack.pop()
                func = stack[-1]
                pos += 1
                if type(func) is Global:
                    stack[-1] = Obj(reduce_result(func.name, args))
                else:
                    if wo:
                        refuse(torch_rules.reduce_refusal + describe_value(func))
                    stack[-1] = UNKNOWN
                continue
            if code == 0x29:  # EMPTY_TUPLE
                push(())
                pos += 1
                continue
            if code == 0x28:  # MARK
                floor = len(stack)
                marks.append(floor)
                pos += 1
                continue
            if code == 0x85:  # TUPLE1
                if len(stack) <= floor:
                    raise underflow(1, at)
                stack[-1] = (stack[-1],)
                pos += 1
                continue
            if code == 0x74:  # TUPLE
                pos += 1
                push(tuple(pop_mark()))
                continue
            if code == 0x72:  # LONG_BINPUT
                if len(stack) <= floor:
                    raise underflow(1, at)
                memo[unpack(data[pos + 1 : pos + 5], "little")] = stack[-1]
                pos += 5
                if len(memo) > max_memo:
                    raise memo_error(limits)
                continue
            if code == 0x89 or code == 0x88:  # NEWFALSE, NEWTRUE
                push(BOOL)
                pos += 1
                continue
            if code == 0x6A:  # LONG_BINGET
                push(memo[unpack(data[pos + 1 : pos + 5], "little")])
                pos += 5
                continue
            # -- every other opcode: its argument by the stdlib's layout, then its effect (short branches) --
            spec = arg_table.get(code)
            if spec is None:
                raise damaged(f"unknown opcode {code}", pos)
            arg, pos = read_argument(data, pos + 1, spec, limits, at)

            if code == 0x70 or code == 0x94:  # PUT, MEMOIZE
                if len(stack) <= floor:
                    raise underflow(1, at)
                memo[len(memo) if code == 0x94 else memo_index(arg, "PUT", at)] = stack[-1]
                if len(memo) > max_memo:
                    raise memo_error(limits)
            elif code == 0x67:  # GET
                push(memo[memo_index(arg, "GET", at)])
            elif code == 0x86:  # TUPLE2
                need(stack, 2, at, floor)
                stack[-2:] = [(stack[-2], stack[-1])]
            elif code == 0x87:  # TUPLE3
                need(stack, 3, at, floor)
                stack[-3:] = [(stack[-3], stack[-2], stack[-1])]
            elif code == 0x4D or code == 0x4A:  # BININT2, BININT
                push(unpack(arg, "little", signed=code == 0x4A))
            elif code == 0x63 or code == 0x69:  # GLOBAL, INST
                n += 3
                known = named.get(arg)  # a name repeated (a GLOBAL flood): decoded and judged once
                if known is None or known[0] != proto:
                    try:
                        module, name = arg[0].decode("utf-8"), arg[1].decode("utf-8")
                    except UnicodeDecodeError:
                        raise damaged("a global name that is not UTF-8", at) from None
                    wo_module, wo_attr = add_global(module, name, "GLOBAL" if code == 0x63 else "INST")
                    named[arg] = known = (proto, wo_module, wo_attr, f"{wo_module}.{wo_attr}")
                _, wo_module, wo_attr, wo_name = known
                if code == 0x69:
                    pop_mark()
                elif wo and wo_module in blocked:
                    refuse(f"Trying to load unsupported GLOBAL {wo_name} whose module {wo_module} is blocked.", wo_name)
                elif wo:
                    check("global", wo_name, wo_attr)
                push(Obj(wo_name) if code == 0x69 else Global(wo_name))
            elif code == 0x93:  # STACK_GLOBAL (counts 4, as a GLOBAL: its name is judged every time)
                n += 3
                need(stack, 2, at, floor)
                module, name = stack[-2], stack[-1]
                del stack[-2:]
                if isinstance(module, str) and isinstance(name, str):
                    push(Global(".".join(add_global(module, name, "STACK_GLOBAL"))))
                else:
                    record(UNRESOLVED, UNRESOLVED, "STACK_GLOBAL")
                    push(UNKNOWN)
            elif code == 0x81 or code == 0x92:  # NEWOBJ, NEWOBJ_EX
                need(stack, 3 if code == 0x92 else 2, at, floor)
                del stack[-2 if code == 0x92 else -1 :]
                cls = stack[-1]
                if wo and not isinstance(cls, Global):
                    refuse(torch_rules.newobj_refusal + describe_value(cls))
                stack[-1] = Obj(cls.name) if isinstance(cls, Global) else UNKNOWN
            elif code == 0x62:  # BUILD
                need(stack, 2, at, floor)
                build = stack.pop()
                if wo:
                    t = type_of(stack[-1])
                    if isinstance(stack[-1], Global) or (t is not None and t.startswith("builtins.")):
                        refuse(torch_rules.build_refusal + (class_repr(t) if t else "<class ?>"))
                    elif t is not None and t not in BUILD_FREE:
                        check("type", t)
                        # Counted as the work it is: a tuple described item by item, a new state one more check kept
                        shape = state_shape(build)
                        n += (5 * len(shape[1]) if shape[0] == "tuple" else 0) + 16 * check("build", t, "", shape)
            elif code == 0x61 or code == 0x65 or code == 0x73 or code == 0x75:  # APPEND(S), SETITEM(S)
                if code == 0x61:
                    need(stack, 2, at, floor)
                    stack.pop()
                elif code == 0x65:
                    pop_mark()
                    need(stack, 1, at, floor)
                else:
                    if code == 0x73:
                        need(stack, 3, at, floor)
                        keys: Any = stack[-2:-1]
                        del stack[-2:]
                    else:
                        keys = pop_mark()[0::2]
                        need(stack, 1, at, floor)
                    add_dict_keys(stack[-1], keys)  # a dict the pickle built: its keys, for BUILD states
                if wo:
                    target = container_check(torch_rules, NAMES[code], stack[-1])
                    if target is not None:
                        check(target.kind, target.name, target.message)
                        wo = target.kind != "refused"
            elif code == 0x51 or code == 0x50:  # BINPERSID, PERSID
                if code == 0x51:
                    need(stack, 1, at, floor)
                pid = stack.pop() if code == 0x51 else UNKNOWN
                if wo and (reason := persid_refusal(torch_rules, pid)):
                    refuse(reason)
                push(STORAGE)
            elif code == 0x7D:  # EMPTY_DICT
                push(DictValue())
            elif code in pushes:  # EMPTY_LIST, NONE and the rarer ones
                push(pushes[code])
            elif code == 0x8A:  # LONG1
                p, length = arg
                push(int.from_bytes(data[p : p + length], "little", signed=True) if length <= 32 else INT)
            elif code == 0x80:  # PROTO
                proto = arg[0]
                if proto > pickle.HIGHEST_PROTOCOL:
                    raise CheckpointFormatError(
                        f"the pickle uses protocol {proto}, newer than this Python's {pickle.HIGHEST_PROTOCOL}"
                    )
            elif code == 0x95:  # FRAME
                pass
            elif code == 0x2E:  # STOP
                if len(stack) <= floor:
                    raise damaged("STOP with no value above the last MARK" if marks else "STOP with an empty stack", at)
                state.opcodes += n
                state.bytes_scanned += pos - start
                state.max_memo = max(state.max_memo, len(memo))
                state.weights_only_live = wo
                return pos, stack[-1]
            elif code == 0x49 or code == 0x4C:  # INT, LONG (text)
                push(text_int(arg, code, at, limits))
            elif code == 0x53 or code == 0x55 or code == 0x54 or code == 0x56:
                # STRING, SHORT_BINSTRING, BINSTRING, UNICODE: torch decodes them as UTF-8 str.
                value = text_value(code, arg, data, max_name)
                push(STR if value is None else BYTES if type(value) is bytes else value)
            elif code == 0x98:  # READONLY_BUFFER
                need(stack, 1, at, floor)
            elif code == 0x90:  # ADDITEMS
                pop_mark()
                need(stack, 1, at, floor)
            elif code == 0x91 or code == 0x6C:  # FROZENSET, LIST
                pop_mark()
                push(FROZENSET if code == 0x91 else LIST)
            elif code == 0x64:  # DICT
                push(DictValue(pop_mark()[0::2]))
            elif code == 0x6F:  # OBJ
                items = pop_mark()
                if not items:
                    raise damaged("OBJ without a class", at)
                cls = items[0]
                push(Obj(cls.name) if isinstance(cls, Global) else UNKNOWN)
            elif code == 0x30 or code == 0x31:  # POP (of a MARK when one is on top, as pickle does), POP_MARK
                if code == 0x31 or (marks and marks[-1] == len(stack)):
                    pop_mark()
                else:
                    need(stack, 1, at, floor)
                    stack.pop()
            elif code == 0x32:  # DUP
                need(stack, 1, at, floor)
                push(stack[-1])
            elif code in (0x82, 0x83, 0x84):  # EXT1, EXT2, EXT4
                ext = f"<extension registry code {unpack(arg, 'little')}>"
                record(ext, ext, NAMES[code])
                push(UNKNOWN)
            else:  # pragma: no cover - every opcode of pickletools.opcodes is handled above
                raise damaged(f"opcode {NAMES.get(code, code)} not modelled", at)
            if len(stack) > max_stack:
                raise over_limit(limits, "max_stack_depth", f"the pickle stack grew past {{}} entries at byte {at}")
    except CheckpointFormatError:
        raise
    except (IndexError, KeyError, ValueError, TypeError, OverflowError) as e:  # UnicodeDecodeError is a ValueError
        raise stream_error(e, pos, end, at) from None
