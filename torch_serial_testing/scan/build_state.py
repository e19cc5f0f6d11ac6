"""Whether this torch's BUILD can apply a pickled state to an allowlisted class, and how it fails.

torch's weights-only unpickler applies a BUILD state (a ``__dict__`` dict, a ``(dict_or_None,
slotstate)`` pair...) itself, per release (:class:`~..torch_facts.unpickler.BuildRules`, probed):
torch 2.4 and 2.5 do ``inst.__dict__.update(state)`` for every state, so a slotted instance raises
``AttributeError`` and a slot pair ``TypeError`` or ``ValueError``, through ``torch.load`` as they are.
The scan records each state's *shape* (:func:`state_shape`); a prediction replays this torch's BUILD
on stand-ins of that shape (:func:`build_failure`) with the real ``dict.update``: Python's own error.
"""

from __future__ import annotations

import itertools
from typing import Any, Optional

from ..torch_facts.unpickler import BuildRules
from .model import DictValue, Obj

__all__ = ["StateShape", "state_shape", "build_failure"]

#: A hashable description of a BUILD state: ``("dict", n)`` (n keys, None: not known),
#: ``("none",)``, ``("value", v)`` (a small str or int), ``("tuple", (shape, ...))`` or
#: ``("type", "module.Name")`` (an object known only by its type; None: not even that).
StateShape = tuple

_HEAPTYPE = 1 << 9  # Py_TPFLAGS_HEAPTYPE: a class made by a class statement


def state_shape(value: Any, depth: int = 0) -> StateShape:
    """The shape of a BUILD state on the scan's stack (see :data:`StateShape`)."""
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
        if value.type == "builtins.dict":
            return ("dict", None)
        return ("type", value.type)
    return ("type", None)  # a Global, or nothing the scan models


# What an object known only by its type may be, for the truthiness and iteration BUILD uses.
_TYPE_STANDINS: dict[str, list[Any]] = {
    "builtins.bool": [False, True],
    "builtins.int": [0, 1],
    "builtins.float": [0.0, 1.0],
    "builtins.str": ["?" * 1024],  # a string too long for the scan to keep: never empty
}
_MAX_STANDINS = 32


def _standins(shape: StateShape) -> Optional[list[Any]]:
    """Concrete values of *shape* that cover what BUILD's outcome depends on; None: cannot stand in."""
    kind = shape[0]
    if kind == "none":
        return [None]
    if kind == "value":
        return [shape[1]]
    if kind == "dict":
        sizes = [shape[1]] if shape[1] is not None else [0, 1, 2, 3]
        return [{i: i for i in range(n)} for n in sizes]
    if kind == "tuple":
        options = [_standins(s) for s in shape[1]]
        if any(o is None for o in options):
            return None
        combos = list(itertools.islice(itertools.product(*options), _MAX_STANDINS + 1))  # type: ignore[arg-type]
        return combos if len(combos) <= _MAX_STANDINS else None
    return _TYPE_STANDINS.get(shape[1]) if kind == "type" and shape[1] else None


def _class_facts(cls: Any) -> Optional[tuple[bool, bool, str]]:
    """(has ``__setstate__``, instances have a ``__dict__``, the message of a missing ``__dict__``) of a
    class made by a class statement; None when only running its code could tell (a C type, a custom
    ``__getattr__``/``__getattribute__``)."""
    if (
        not isinstance(cls, type)
        or not cls.__flags__ & _HEAPTYPE
        or hasattr(cls, "__getattr__")
        or cls.__getattribute__ is not object.__getattribute__
    ):
        return None
    return hasattr(cls, "__setstate__"), getattr(cls, "__dictoffset__", 0) != 0, _no_dict_message(cls.__name__)


def _no_dict_message(name: str) -> str:
    """Python's message for ``inst.__dict__`` of a slotted class *name*, from a bare stand-in of that name."""
    standin = type(name, (), {"__slots__": ()})
    try:
        object.__new__(standin).__dict__  # noqa: B018 - the error is the point
    except AttributeError as e:
        return str(e)
    return f"'{name}' object has no attribute '__dict__'"  # pragma: no cover - a slotted class has none


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


def build_failure(cls: Any, shape: StateShape, rules: BuildRules) -> Optional[tuple[str, str]]:
    """``(exception type name, message)`` when this torch's BUILD of a state of *shape* onto an instance
    of the allowlisted *cls* raises; None when it does not or cannot be told statically (its own
    ``__setstate__`` runs, the outcome depends on unknown contents): the prediction stays "loads"."""
    facts = _class_facts(cls)
    if facts is None:
        return None
    has_setstate, has_dict, no_dict = facts
    if has_setstate and rules.calls_setstate:
        return None  # the class's own code applies it, as in a full load
    standins = _standins(shape)
    if not standins:
        return None
    outcomes = {_apply(rules, has_dict, no_dict, s) for s in standins}
    return outcomes.pop() if len(outcomes) == 1 else None
