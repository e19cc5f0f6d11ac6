"""The single probes of torch's weights-only unpickler: one check of it each.

Each function feeds torch's real unpickler a few pickles (:mod:`.probes`) and reads one rule
from what it did: which opcodes it lacks and how it words that, which modules it blocks, which
container targets it refuses (and in which words), which persistent ids, how BUILD applies a
state, when it renames Python-2 globals, how it words a refused BUILD, NEWOBJ and REDUCE.
:func:`.unpickler.unpickler_rules` puts the answers together.  An answer that cannot be read
raises :class:`~.probes.ProbeFailed`.
"""

from __future__ import annotations

import pickle
import pickletools
from dataclasses import dataclass
from typing import Any, Callable, Optional

from . import probes
from .probes import (
    Outcome,
    ProbeDict,
    ProbeFailed,
    ProbeList,
    ProbeOther,
    ProbePlain,
    ProbeSlotted,
    ProbeWithSetstate,
    global_op,
    small_int,
    text,
    unpickle,
    with_type,
)
from .registry import allowlisted

__all__ = [
    "APPEND_TARGETS",
    "SETITEM_TARGETS",
    "ContainerRule",
    "BuildRules",
    "PersidRules",
    "unsupported_template",
    "supported_opcodes",
    "blocked_modules",
    "container_rules",
    "refusal_prefixes",
    "persid_rules",
    "build_rules",
    "renames",
]

#: What an APPEND(S) target can be, as torch's check tells them apart: exactly a ``list``, a
#: ``list`` subclass, anything else; "allowlisted_" when its type is in the user allowlist.
APPEND_TARGETS = ("list", "list_subclass", "allowlisted_list_subclass", "other", "allowlisted_other")
#: The same for SETITEM(S): a ``dict``, torch's own ``OrderedDict`` and ``Counter``, others.
SETITEM_TARGETS = ("dict", "ordered_dict", "counter", "dict_subclass", "allowlisted_dict_subclass", "other",
                   "allowlisted_other")


@dataclass(frozen=True)
class ContainerRule:
    """Which targets torch's check before one container opcode refuses, and its message up to
    the target's ``type()``, which torch appends (``<class 'collections.deque'>``)."""

    refused: frozenset[str]
    message: str


@dataclass(frozen=True)
class BuildRules:
    """How this torch's BUILD applies a state to an instance of an allowlisted class.

    torch 2.13 calls ``inst.__setstate__(state)`` when the instance has one, else does what
    pickle's ``load_build`` does (splits a ``(state, slotstate)`` pair, updates ``__dict__``
    only with a truthy state, ``setattr``s each slot) and builds instances of torch's own
    allowlisted types too; torch 2.4 and 2.5 do ``inst.__dict__.update(state)`` whatever the
    state and build only user-allowlisted types.
    """

    calls_setstate: bool = True
    splits_slotstate: bool = True
    skips_falsy_state: bool = True
    torch_types_buildable: bool = True


@dataclass(frozen=True)
class PersidRules:
    """Which persistent ids torch refuses and how it says so.

    torch 2.13 refuses an id that is neither a tuple nor an int, and a tuple whose first item
    is not ``"storage"``, naming that item's type; torch 2.8's inverted check refused only int
    ids and named the item itself.
    """

    #: Of ``"tuple"``, ``"int"`` (exactly int) and ``"other"``: the id types refused.
    refused: frozenset[str] = frozenset(["other"])
    type_message: str = "persistent_load id must be tuple or int, but got "
    storage_message: str = "Only persistent_load of storage is allowed, but got "
    #: The storage refusal names the first item's type (True) or the item itself (False).
    names_type: bool = True


def _refusal(outcome: Outcome, what: str) -> str:
    if not outcome.refused:
        raise ProbeFailed(f"torch's weights-only unpickler did not refuse {what} ({outcome!r})")
    return outcome.message


def _ending(message: str, shown: str) -> str:
    """*message* up to the object torch names (*shown*); ProbeFailed when it does not name it."""
    if shown not in message:
        raise ProbeFailed(f"torch's message {message!r} does not name the object it refused ({shown})")
    return message[: message.index(shown)]


def blocked_modules() -> frozenset[str]:
    """The modules whose globals torch refuses whatever is allowlisted (``sys`` since torch 2.5).

    Read from torch's table; a torch without that table (2.4) must then refuse a ``sys`` global
    as it refuses any unlisted one, which is asked of it.
    """
    from torch import _weights_only_unpickler as wou

    table = getattr(wou, "_blocklisted_modules", None)
    if table is not None:
        return frozenset(table)
    outcome = unpickle(pickle.GLOBAL + b"sys\nmodules\n" + probes.STOP)
    if not outcome.refused or "blocked" in outcome.message or "sys.modules" not in outcome.message:
        raise ProbeFailed(f"torch has no table of blocked modules, yet answered GLOBAL sys.modules with {outcome!r}")
    return frozenset()


# -- opcodes -------------------------------------------------------------------------------------

_NOT_AN_OPCODE = 0xFF


def unsupported_template() -> str:
    """torch's refusal of a byte that is no opcode at all, as a template of the byte's value."""
    outcome = unpickle(bytes([_NOT_AN_OPCODE]))
    message = outcome.message
    if not outcome.refused or str(_NOT_AN_OPCODE) not in message:
        raise ProbeFailed(f"torch's weights-only unpickler answered a byte that is no opcode with {outcome!r}")
    return message.replace(str(_NOT_AN_OPCODE), "{code}")


def _lacks(template: str, op: Any) -> bool:
    """Whether the unpickler refuses opcode *op* outright (given nothing after it)."""
    code = ord(op.code)
    outcome = unpickle(bytes([code]))
    return outcome.refused and outcome.message == template.format(code=code)


# -- container targets ------------------------------------------------------------------------------


def _make_probe_other_class() -> type:
    return ProbeOther


def _unlisted_function() -> None:
    """Never allowlisted: REDUCE of it is refused."""


def _make_unlisted_function() -> Callable[[], Any]:
    return _unlisted_function


def _built_by(factory: Callable[[], Any]) -> bytes:
    return global_op(factory) + pickle.EMPTY_TUPLE + pickle.REDUCE


def _build_on(factory: Callable[[], Any]) -> Outcome:
    return unpickle(_built_by(factory) + pickle.EMPTY_DICT + pickle.BUILD + probes.STOP)


def _newobj_of_unlisted_class() -> Outcome:
    return unpickle(_built_by(_make_probe_other_class) + pickle.EMPTY_TUPLE + pickle.NEWOBJ + probes.STOP)


def _reduce_of_unlisted_function() -> Outcome:
    return unpickle(_built_by(_make_unlisted_function) + pickle.EMPTY_TUPLE + pickle.REDUCE + probes.STOP)


def _targets(allowlisted_types: bool) -> dict[str, tuple[str, bytes, type]]:
    """(opcode family, the ops building the target, its type) per target kind."""
    pre = "allowlisted_" if allowlisted_types else ""
    out = {
        f"{pre}list_subclass": ("append", _built_by(probes.make_probe_list), ProbeList),
        f"{pre}dict_subclass": ("setitem", _built_by(probes.make_probe_dict), ProbeDict),
        f"{pre}other": ("both", _built_by(probes.make_probe_other), ProbeOther),
    }
    if not allowlisted_types:
        out.update({
            "list": ("append", pickle.EMPTY_LIST, list),
            "dict": ("setitem", pickle.EMPTY_DICT, dict),
            "ordered_dict": ("setitem", _built_by(probes.make_ordered_dict), type(probes.make_ordered_dict())),
            "counter": ("setitem", _built_by(probes.make_counter), type(probes.make_counter())),
        })
    return out


_CONTAINER_OPS = {
    "APPEND": small_int(1) + pickle.APPEND,
    "APPENDS": pickle.MARK + small_int(1) + pickle.APPENDS,
    "SETITEM": small_int(0) + small_int(0) + pickle.SETITEM,
    "SETITEMS": pickle.MARK + small_int(0) + small_int(0) + pickle.SETITEMS,
}


def _container_outcomes(allowlisted_types: bool) -> dict[tuple[str, str], tuple[Outcome, type]]:
    out = {}
    for kind, (family, target, cls) in _targets(allowlisted_types).items():
        for opcode, ops in _CONTAINER_OPS.items():
            if family == "both" or opcode.lower().startswith(family):
                out[(opcode, kind)] = (unpickle(target + ops + probes.STOP), cls)
    return out


def _container_rules(outcomes: dict[tuple[str, str], tuple[Outcome, type]]) -> dict[str, Optional[ContainerRule]]:
    rules: dict[str, Optional[ContainerRule]] = {}
    for opcode in _CONTAINER_OPS:
        refused = {kind: (o, cls) for (op, kind), (o, cls) in outcomes.items() if op == opcode and o.refused}
        if not refused:
            rules[opcode] = None
            continue
        if {"list", "dict"} & set(refused):
            raise ProbeFailed(f"torch refused {opcode} onto a plain {'list' if 'list' in refused else 'dict'}")
        messages = {with_type(o.message, cls) for o, cls in refused.values()}
        if len(messages) != 1:
            raise ProbeFailed(f"torch refuses {opcode} targets with different messages: {sorted(messages)}")
        rules[opcode] = ContainerRule(frozenset(refused), messages.pop())
    return rules


# -- persistent ids -----------------------------------------------------------------------------------


def persid_rules() -> PersidRules:
    def stub(pid: Any) -> Any:
        return None

    samples = {"tuple": text("storage") + pickle.TUPLE1, "int": small_int(0), "other": text("id")}
    outcomes = {kind: unpickle(ops + pickle.BINPERSID + probes.STOP, persistent_load=stub)
                for kind, ops in samples.items()}
    refused = frozenset(kind for kind, o in outcomes.items() if o.refused)
    if "tuple" in refused:
        raise ProbeFailed(f"torch refused a ('storage',) persistent id ({outcomes['tuple']!r})")
    type_message = PersidRules.type_message
    if refused:
        kind = sorted(refused)[0]
        type_message = with_type(outcomes[kind].message, int if kind == "int" else str)
    marker = "tstprobe"
    storage = unpickle(text(marker) + pickle.TUPLE1 + pickle.BINPERSID + probes.STOP, persistent_load=stub)
    message = _refusal(storage, "a persistent id that is not a storage")
    if message.endswith(repr(str)):
        return PersidRules(refused, type_message, with_type(message, str), True)
    if message.endswith(marker):
        return PersidRules(refused, type_message, message[: -len(marker)], False)
    raise ProbeFailed(f"torch's refusal of a non-storage persistent id names neither it nor its type: {message!r}")


# -- BUILD ------------------------------------------------------------------------------------------------


class _ProbeSlotsAndDict:
    """A slot and a ``__dict__``: a ``({}, {"a": 1})`` state loads wherever BUILD splits slot state."""

    __slots__ = ("a", "__dict__")


def _build_with(cls: type, state_ops: bytes) -> Outcome:
    return unpickle(global_op(cls) + pickle.EMPTY_TUPLE + pickle.REDUCE + state_ops + pickle.BUILD + probes.STOP)


def _build_rules() -> BuildRules:
    one_slot = pickle.EMPTY_DICT + text("a") + small_int(1) + pickle.SETITEM
    calls = _build_with(ProbeWithSetstate, pickle.EMPTY_DICT)
    splits = _build_with(_ProbeSlotsAndDict, pickle.EMPTY_DICT + one_slot + pickle.TUPLE2)
    skips = _build_with(ProbeSlotted, pickle.EMPTY_DICT)
    for what, o in (("a class with __setstate__", calls), ("a plain class", _build_with(ProbePlain, pickle.EMPTY_DICT))):
        if o.refused:
            raise ProbeFailed(f"torch refused BUILD on an allowlisted {what} ({o!r})")
    return BuildRules(
        calls_setstate=calls.loaded and getattr(calls.value, "set_with", None) == {},
        splits_slotstate=splits.loaded and getattr(splits.value, "a", None) == 1,
        skips_falsy_state=skips.loaded,
        torch_types_buildable=_torch_type_buildable(),
    )


def _torch_type_buildable() -> bool:
    """Whether BUILD applies a state to an instance of a type only torch's own allowlist has."""
    from torch import _weights_only_unpickler as wou

    allowed = wou._get_allowed_globals()
    name = next((n for n in ("torch.Size", "collections.Counter") if isinstance(allowed.get(n), type)), None)
    if name is None:
        raise ProbeFailed("torch's allowlist has neither torch.Size nor collections.Counter to probe BUILD with")
    outcome = unpickle(global_op(name) + pickle.EMPTY_TUPLE + pickle.REDUCE + pickle.EMPTY_DICT + pickle.BUILD
                       + probes.STOP)
    return not outcome.refused


# -- names ----------------------------------------------------------------------------------------------------


def renames() -> str:
    """When torch renames Python-2 module names: in every pickle, or only in protocol 2 ones."""
    probe = pickle.GLOBAL + b"__builtin__\ntstprobe\n" + probes.STOP
    at_2, at_0 = unpickle(probe), unpickle(probe, proto=False)
    for o in (at_2, at_0):
        if not o.refused:
            raise ProbeFailed(f"torch did not refuse the unknown global __builtin__.tstprobe ({o!r})")
    renamed_2, renamed_0 = "__builtin__" not in at_2.message, "__builtin__" not in at_0.message
    if not renamed_2:
        raise ProbeFailed("torch no longer renames Python-2 globals (__builtin__ -> builtins) in protocol 2")
    return "always" if renamed_0 else "protocol_2"


# -- the probes put together per rule ---------------------------------------------------------------

_FACTORIES = [probes.make_probe_list, probes.make_probe_dict, probes.make_probe_other, probes.make_defaultdict,
              probes.make_counter, probes.make_ordered_dict]


def supported_opcodes(template: str) -> frozenset[str]:
    """The opcodes torch's unpickler implements (those it does not refuse outright)."""
    opcodes = frozenset(op.name for op in pickletools.opcodes if not _lacks(template, op))
    if not {"GLOBAL", "REDUCE", "BINPERSID", "STOP"} <= opcodes:
        raise ProbeFailed(f"torch's weights-only unpickler seems to lack basic opcodes (it has {sorted(opcodes)})")
    return opcodes


def container_rules() -> dict[str, Optional[ContainerRule]]:
    """Per container opcode, the targets torch refuses and its words (None: no check)."""
    with allowlisted(_FACTORIES):
        plain = _container_outcomes(allowlisted_types=False)
    with allowlisted([*_FACTORIES, ProbeList, ProbeDict, ProbeOther]):
        listed = _container_outcomes(allowlisted_types=True)
    return _container_rules({**plain, **listed})


def refusal_prefixes() -> tuple[str, str, str]:
    """torch's words refusing BUILD on an unlisted type, NEWOBJ of an unlisted class, REDUCE of an
    unlisted function, each up to the object it names."""
    with allowlisted([*_FACTORIES, _make_probe_other_class, _make_unlisted_function]):
        build = with_type(_refusal(_build_on(probes.make_probe_other), "BUILD on an unlisted type"), ProbeOther)
        newobj = with_type(_refusal(_newobj_of_unlisted_class(), "NEWOBJ of an unlisted class"), ProbeOther)
        reduce = _ending(_refusal(_reduce_of_unlisted_function(), "REDUCE of an unlisted function"),
                         repr(_unlisted_function))
    return build, newobj, reduce


def build_rules() -> BuildRules:
    """How torch's BUILD applies a state to an instance of an allowlisted class."""
    with allowlisted([ProbeWithSetstate, _ProbeSlotsAndDict, ProbeSlotted, ProbePlain]):
        return _build_rules()
