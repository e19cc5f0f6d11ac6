"""What the running torch's weights-only unpickler enforces, asked of it by probes.

Probes are few-byte pickles fed to torch's real unpickler (only its constructor and ``load`` are assumed;
:class:`ProbeFailed` when they fail).  They read the rules that change between releases (its opcodes, the
container targets and persistent ids it refuses, how BUILD applies a state, when Python-2 names are renamed,
its words), which the static model (:mod:`.model`, :mod:`.walker`) replays; nothing falls back to another torch's."""

from __future__ import annotations

import collections
import io
import pickle
import pickletools
from dataclasses import dataclass
from typing import IO, Any, Callable, Optional

import torch
from torch import _weights_only_unpickler as wou

from .errors import ProbeFailed, innermost_frame
from .registry import allowlisted, registry_lock

STOP = pickle.STOP


class Outcome:
    """What torch's weights-only unpickler did with one probe: loaded ``value`` or raised ``error``; ``refused``
    when its own checks said no (``UnpicklingError``, or a ``RuntimeError`` its code raised: torch 2.4's).  The
    error keeps no traceback or context: a probe run during a load's rejection keeps no cycle through its frames."""

    __slots__ = ("value", "error", "loaded", "refused", "message")

    def __init__(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value, self.error, self.loaded = value, error, error is None
        self.message = "" if error is None else str(error)
        frame = innermost_frame(error) if type(error) is RuntimeError else None
        self.refused = isinstance(error, pickle.UnpicklingError) or (
            frame is not None and frame.f_globals.get("__name__") == "torch._weights_only_unpickler"
        )
        if error is not None:
            error.__traceback__ = error.__context__ = None

    def __repr__(self) -> str:
        return f"Outcome(value={self.value!r})" if self.error is None else f"Outcome(error={self.error!r})"


def global_op(obj: Any) -> bytes:
    """``GLOBAL module\\nname\\n`` for *obj*: its ``__module__``, ``__qualname__``."""
    return pickle.GLOBAL + obj.__module__.encode() + b"\n" + obj.__qualname__.encode() + b"\n"


def text(s: str) -> bytes:
    data = s.encode("utf-8")
    return pickle.BINUNICODE + len(data).to_bytes(4, "little") + data


def small_int(n: int) -> bytes:
    return pickle.BININT1 + bytes([n])


def unpickle(body: bytes, *, persistent_load: Optional[Callable[[Any], Any]] = None, proto: bool = True) -> Outcome:
    """Run ``PROTO 2`` + *body* (just *body* with ``proto=False``) through torch's weights-only
    unpickler; a persistent id is handed to *persistent_load*, as ``torch.load`` does."""
    try:
        unpickler = wou.Unpickler(io.BytesIO((pickle.PROTO + b"\x02" if proto else b"") + body), encoding="utf-8")
        if persistent_load is not None:  # pickle's documented hook: an instance attribute
            unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
        load = unpickler.load
    except Exception as e:  # noqa: BLE001 - any failure to call torch is the probe's failure
        raise ProbeFailed(
            f"cannot run torch's weights-only unpickler ({type(e).__name__}: {e}); this torch's "
            "torch._weights_only_unpickler.Unpickler(file, encoding=...).load() is not what the library asks"
        ) from None
    try:
        return Outcome(load())
    except Exception as e:  # noqa: BLE001 - the exception is the answer
        return Outcome(error=e)


def with_type(message: str, cls: type) -> str:
    """*message* up to the ``type()`` torch appends (``<class 'list'>``); ProbeFailed when it does not end so."""
    shown = repr(cls)
    if not message.endswith(shown):
        raise ProbeFailed(f"torch's message {message!r} does not end with the type it refused ({shown})")
    return message[: -len(shown)]


# The probes' classes (of this module, by name): list and dict subclasses, a plain class, slotted ones, and
# one recording its __setstate__.
ProbeList, ProbeDict = type("ProbeList", (list,), {}), type("ProbeDict", (dict,), {})
ProbeOther, ProbeSlotted = type("ProbeOther", (), {}), type("ProbeSlotted", (), {"__slots__": ("a",)})
ProbeSlotsAndDict = type("ProbeSlotsAndDict", (), {"__slots__": ("a", "__dict__")})


class ProbeWithSetstate:
    def __setstate__(self, state: Any) -> None:
        self.set_with = state


def unlisted_function() -> None: ...  # never allowlisted: REDUCE of it is refused


_MADE: dict[str, Callable[[], Any]] = {"list_subclass": ProbeList, "dict_subclass": ProbeDict, "other": ProbeOther}
_MADE.update(ordered_dict=collections.OrderedDict, counter=collections.Counter, other_class=lambda: ProbeOther)
_MADE["unlisted_function"] = lambda: unlisted_function


def made(kind: str) -> Any:
    return _MADE[kind]()


def made_op(kind: str) -> bytes:
    """The ops that push ``made(kind)``: REDUCE of the factory with ``(kind,)``."""
    return global_op(made) + text(kind) + pickle.TUPLE1 + pickle.REDUCE


@dataclass(frozen=True)
class ContainerRule:
    """The targets torch's check before one container opcode refuses (2.8 checks no SETITEM target; 2.14.1
    lets APPEND onto an allowlisted ``list`` subclass), and its message up to the type."""

    refused: frozenset[str]
    message: str


@dataclass(frozen=True)
class BuildRules:
    """How BUILD applies a state to an instance of an allowlisted class: torch 2.13 calls ``__setstate__``
    if any, else does what pickle's ``load_build`` does, also for torch's own allowlisted types; torch
    2.4 and 2.5 do ``inst.__dict__.update(state)`` whatever the state, for user-allowlisted types only."""

    calls_setstate: bool = True
    splits_slotstate: bool = True
    skips_falsy_state: bool = True
    torch_types_buildable: bool = True


@dataclass(frozen=True)
class PersidRules:
    """Which persistent ids torch refuses, in which words: torch 2.13 refuses an id neither tuple nor int,
    and a tuple not starting with ``"storage"``, naming that item's type; torch 2.8's inverted check
    refused only int ids, and named the item itself."""

    #: Of ``"tuple"``, ``"int"`` (exactly int) and ``"other"``: the id types refused.
    refused: frozenset[str] = frozenset(["other"])
    type_message: str = "persistent_load id must be tuple or int, but got "
    storage_message: str = "Only persistent_load of storage is allowed, but got "
    #: The storage refusal names the first item's type (True) or the item itself (False).
    names_type: bool = True


@dataclass(frozen=True)
class UnpicklerRules:
    """Everything the static model replays of this torch's weights-only unpickler."""

    opcodes: frozenset[str]
    #: ``str.format`` template of the refusal of an opcode it lacks, e.g. ``"Unsupported operand {code}"``.
    unsupported: str
    #: Target checks by opcode name (SETITEM, SETITEMS, APPEND, APPENDS); None: no check.
    containers: dict[str, Optional[ContainerRule]]
    persid: PersidRules
    build: BuildRules
    #: Refusals up to the object torch names: BUILD on a type, NEWOBJ of a class, REDUCE of a function.
    build_refusal: str
    newobj_refusal: str
    reduce_refusal: str
    #: When torch renames Python-2 globals (``copy_reg``, ``__builtin__``): "always" or "protocol_2".
    renames: str
    import_mapping: dict[str, str]
    name_mapping: dict[tuple[str, str], tuple[str, str]]
    blocked_modules: frozenset[str]


_known: dict[Any, Any] = {}


def unpickler_rules() -> UnpicklerRules:
    """This torch's :class:`UnpicklerRules`, asked once per unpickler; the same ProbeFailed every time."""
    cls = getattr(wou, "Unpickler", None)
    key = (cls, getattr(cls, "load", None), getattr(wou, "_get_allowed_globals", None), torch.__version__)
    if (known := _known.get(key)) is None:
        with registry_lock:
            if (known := _known.get(key)) is None:
                try:
                    known = _probe_rules()
                except ProbeFailed as e:
                    known = e
                _known.clear()
                _known[key] = known
    if isinstance(known, ProbeFailed):
        raise known
    return known  # type: ignore[no-any-return]


def _probe_rules() -> UnpicklerRules:
    outcome = unpickle(b"\xff")  # a byte that is no opcode: torch's refusal, a template of the byte's value
    if not outcome.refused or "255" not in outcome.message:
        raise ProbeFailed(f"torch's weights-only unpickler answered a byte that is no opcode with {outcome!r}")
    template = outcome.message.replace("255", "{code}")
    try:
        import_mapping, name_mapping = torch._utils.IMPORT_MAPPING, torch._utils.NAME_MAPPING
    except AttributeError as e:
        raise ProbeFailed(f"torch no longer has the table the library reads: {e}") from None
    fields = (_opcodes(template), template, _containers(), _persid(), _build(), *_refusal_prefixes(), _renames())
    return UnpicklerRules(*fields, dict(import_mapping), dict(name_mapping), _blocked_modules())  # (fields' order)


def _refusal(outcome: Outcome, what: str) -> str:
    if not outcome.refused:
        raise ProbeFailed(f"torch's weights-only unpickler did not refuse {what} ({outcome!r})")
    return outcome.message


def _blocked_modules() -> frozenset[str]:
    """Modules whose globals torch refuses whatever is allowlisted (``sys`` since torch 2.5), from its
    table; without one (2.4), torch must refuse ``sys.modules`` as any unlisted global."""
    table = getattr(wou, "_blocklisted_modules", None)
    if table is not None:
        return frozenset(table)
    outcome = unpickle(pickle.GLOBAL + b"sys\nmodules\n" + STOP)
    if not outcome.refused or "blocked" in outcome.message or "sys.modules" not in outcome.message:
        raise ProbeFailed(f"torch has no table of blocked modules, yet answered GLOBAL sys.modules with {outcome!r}")
    return frozenset()


def _opcodes(template: str) -> frozenset[str]:
    """The opcodes torch implements: those it does not refuse outright, given nothing after them."""

    def lacks(code: int) -> bool:
        outcome = unpickle(bytes([code]))
        return outcome.refused and outcome.message == template.format(code=code)

    opcodes = frozenset(op.name for op in pickletools.opcodes if not lacks(ord(op.code)))
    if not {"GLOBAL", "REDUCE", "BINPERSID", "STOP"} <= opcodes:
        raise ProbeFailed(f"torch's weights-only unpickler seems to lack basic opcodes (it has {sorted(opcodes)})")
    return opcodes


_CONTAINER_OPS = {"APPEND": small_int(1) + pickle.APPEND, "APPENDS": pickle.MARK + small_int(1) + pickle.APPENDS}
_CONTAINER_OPS["SETITEM"] = small_int(0) + small_int(0) + pickle.SETITEM
_CONTAINER_OPS["SETITEMS"] = pickle.MARK + small_int(0) + small_int(0) + pickle.SETITEMS

#: (kind, the opcodes it is a target of, its type); the first three again with their type allowlisted.
_TARGETS = [("list_subclass", "APPEND", ProbeList), ("dict_subclass", "SETITEM", ProbeDict), ("other", "", ProbeOther)]
_TARGETS += [("list", "APPEND", list), ("dict", "SETITEM", dict), ("ordered_dict", "SETITEM", collections.OrderedDict)]
_TARGETS.append(("counter", "SETITEM", collections.Counter))


def _containers() -> dict[str, Optional[ContainerRule]]:
    outcomes: dict[tuple[str, str], tuple[Outcome, type]] = {}
    for prefix, targets in (("", _TARGETS), ("allowlisted_", _TARGETS[:3])):
        also_allowed = [cls for _kind, _family, cls in targets] if prefix else []
        with allowlisted([made, *also_allowed]):
            for kind, family, cls in targets:
                target = {"list": pickle.EMPTY_LIST, "dict": pickle.EMPTY_DICT}.get(kind) or made_op(kind)
                for opcode, ops in _CONTAINER_OPS.items():
                    if opcode.startswith(family):
                        outcomes[prefix + kind, opcode] = (unpickle(target + ops + STOP), cls)
    rules: dict[str, Optional[ContainerRule]] = dict.fromkeys(_CONTAINER_OPS)  # None: no check
    for opcode in _CONTAINER_OPS:
        refused = {kind: (o, cls) for (kind, op), (o, cls) in outcomes.items() if op == opcode and o.refused}
        if not refused:
            continue
        if {"list", "dict"} & set(refused):
            raise ProbeFailed(f"torch refused {opcode} onto a plain {'list' if 'list' in refused else 'dict'}")
        messages = {with_type(o.message, cls) for o, cls in refused.values()}
        if len(messages) != 1:
            raise ProbeFailed(f"torch refuses {opcode} targets with different messages: {sorted(messages)}")
        rules[opcode] = ContainerRule(frozenset(refused), messages.pop())
    return rules


def _persid() -> PersidRules:
    def stub(pid: Any) -> Any:
        return None

    samples = {"tuple": text("storage") + pickle.TUPLE1, "int": small_int(0), "other": text("id")}
    outcomes = {kind: unpickle(ops + pickle.BINPERSID + STOP, persistent_load=stub) for kind, ops in samples.items()}
    refused = frozenset(kind for kind, o in outcomes.items() if o.refused)
    if "tuple" in refused:
        raise ProbeFailed(f"torch refused a ('storage',) persistent id ({outcomes['tuple']!r})")
    type_message = PersidRules.type_message
    if refused:
        kind = sorted(refused)[0]
        type_message = with_type(outcomes[kind].message, int if kind == "int" else str)
    marker = "tstprobe"
    storage = unpickle(text(marker) + pickle.TUPLE1 + pickle.BINPERSID + STOP, persistent_load=stub)
    message = _refusal(storage, "a persistent id that is not a storage")
    if message.endswith(repr(str)):
        return PersidRules(refused, type_message, with_type(message, str), True)
    if message.endswith(marker):
        return PersidRules(refused, type_message, message[: -len(marker)], False)
    raise ProbeFailed(f"torch's refusal of a non-storage persistent id names neither it nor its type: {message!r}")


def _build() -> BuildRules:
    def build(cls: Any, state_ops: bytes) -> Outcome:
        return unpickle(global_op(cls) + pickle.EMPTY_TUPLE + pickle.REDUCE + state_ops + pickle.BUILD + STOP)

    with allowlisted([ProbeWithSetstate, ProbeSlotsAndDict, ProbeSlotted, ProbeOther]):
        calls = build(ProbeWithSetstate, pickle.EMPTY_DICT)
        for what, o in (("a class with __setstate__", calls), ("a plain class", build(ProbeOther, pickle.EMPTY_DICT))):
            if o.refused:
                raise ProbeFailed(f"torch refused BUILD on an allowlisted {what} ({o!r})")
        one_slot = pickle.EMPTY_DICT + text("a") + small_int(1) + pickle.SETITEM
        splits = build(ProbeSlotsAndDict, pickle.EMPTY_DICT + one_slot + pickle.TUPLE2)
        allowed = wou._get_allowed_globals()  # does BUILD apply a state to a type only torch's allowlist has?
        torch_type = next((n for n in ("torch.Size", "collections.Counter") if isinstance(allowed.get(n), type)), None)
        if torch_type is None:
            raise ProbeFailed("torch's allowlist has neither torch.Size nor collections.Counter to probe BUILD with")
        return BuildRules(
            calls_setstate=calls.loaded and getattr(calls.value, "set_with", None) == {},
            splits_slotstate=splits.loaded and getattr(splits.value, "a", None) == 1,
            skips_falsy_state=build(ProbeSlotted, pickle.EMPTY_DICT).loaded,
            torch_types_buildable=not build(allowed[torch_type], pickle.EMPTY_DICT).refused,
        )


def _renames() -> str:
    """Whether torch renames Python-2 module names in every pickle ("always") or in protocol 2 ones."""
    probe = pickle.GLOBAL + b"__builtin__\ntstprobe\n" + STOP
    at_2, at_0 = unpickle(probe), unpickle(probe, proto=False)
    for o in (at_2, at_0):
        if not o.refused:
            raise ProbeFailed(f"torch did not refuse the unknown global __builtin__.tstprobe ({o!r})")
    if "__builtin__" in at_2.message:
        raise ProbeFailed("torch no longer renames Python-2 globals (__builtin__ -> builtins) in protocol 2")
    return "protocol_2" if "__builtin__" in at_0.message else "always"


def _refusal_prefixes() -> tuple[str, str, str]:
    """torch's words refusing BUILD on an unlisted type, NEWOBJ of a class, REDUCE of a function: up to the object."""

    def refused(kind: str, ops: bytes, what: str, cls: Optional[type] = None) -> str:
        message = _refusal(unpickle(made_op(kind) + ops + STOP), what)
        return with_type(message, cls) if cls else message

    shown = repr(unlisted_function)
    with allowlisted([made]):
        build = refused("other", pickle.EMPTY_DICT + pickle.BUILD, "BUILD on an unlisted type", ProbeOther)
        newobj = refused("other_class", pickle.EMPTY_TUPLE + pickle.NEWOBJ, "NEWOBJ of an unlisted class", ProbeOther)
        reduce = refused("unlisted_function", pickle.EMPTY_TUPLE + pickle.REDUCE, "REDUCE of an unlisted function")
        if shown not in reduce:
            raise ProbeFailed(f"torch's message {reduce!r} does not name the object it refused ({shown})")
    return build, newobj, reduce[: reduce.index(shown)]


def global_refusal(name: str, *, attr: Optional[str] = None, proto: bool = True) -> Optional[str]:
    """torch's own message refusing the global *name* (``module.attr``, Python-2 renames applied) here and now,
    or None when it accepts it.  *attr*: the GLOBAL's own name part (default: all after the first dot), which
    torch 2.4's hint names alone; ``proto=False`` asks without ``PROTO 2``, where torch 2.4 renames nothing."""
    if attr is None or not name.endswith(f".{attr}"):
        attr = name.partition(".")[2]
    module = name[: len(name) - len(attr) - 1]
    body = pickle.GLOBAL + module.encode("utf-8", "surrogatepass") + b"\n" + attr.encode("utf-8", "surrogatepass")
    with registry_lock:
        outcome = unpickle(body + b"\n" + STOP, proto=proto)
    if outcome.loaded:
        return None  # allowlisted right now
    if not outcome.refused:
        raise ProbeFailed(f"torch answered GLOBAL {name} with {outcome!r}, not a refusal")
    return outcome.message


class WalkRules:
    """*rules* (None: not probed, *failure* says why), with the opcode bytes they support."""

    __slots__ = ("rules", "supported", "failure", "storage_names")

    def __init__(self, rules: Optional[UnpicklerRules], failure: Optional[str]) -> None:
        self.rules, self.failure = rules, failure
        names = rules.opcodes if rules is not None else frozenset(op.name for op in pickletools.opcodes)
        self.supported = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in names)
        # the names torch.load resolves to its own StorageType, importing nothing
        self.storage_names = frozenset(getattr(torch.storage, "_storage_type_to_dtype_map", dict)())


_walk_rules: list[WalkRules] = []


def walk_rules() -> WalkRules:
    """This torch's rules for a walk, made once per probed :class:`UnpicklerRules`."""
    try:
        rules = unpickler_rules()
    except ProbeFailed as e:
        return WalkRules(None, str(e))
    if not _walk_rules or _walk_rules[0].rules is not rules:
        _walk_rules[:] = [WalkRules(rules, None)]
    return _walk_rules[0]


def zip_reader(f: IO[bytes]) -> Any:
    """torch's reader of the zip archive *f* (raises what torch raises for a damaged one)."""
    return torch._C.PyTorchFileReader(f)


def is_torchscript(reader: Any) -> bool:
    """torch.load's own test: a TorchScript archive holds a ``constants.pkl`` record."""
    test = getattr(torch.serialization, "_is_torchscript_zip", None)
    return bool(test(reader)) if test is not None else "constants.pkl" in reader.get_all_records()
