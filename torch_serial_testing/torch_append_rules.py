"""What torch's weights-only unpickler accepts as an APPEND / APPENDS target, read from its code.

torch 2.4 to 2.13 and 2.15 refuse both opcodes on anything but exactly a ``list`` (APPENDS with
"Can only extend lists"); torch 2.14.1 checks both in ``_check_append_target``, which also lets
an allowlisted ``list`` subclass through and words both refusals "Can only append to lists".
Each opcode's check is found in ``Unpickler.load`` (or the method its branch calls) and its
condition evaluated for one sample target per kind, so whichever torch runs, the model
(:mod:`.unpickler_model`) knows which targets each opcode accepts and what it says.
"""

from __future__ import annotations

import types
from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping, Optional

from .torch_source import function_tree, parsed, source_of, statements

__all__ = ["APPEND_TARGETS", "AppendRule", "UnpicklerMethods", "append_rules_from_source", "append_rules_from_tree"]

#: What an APPEND / APPENDS target can be, as torch's target check tells them apart: exactly a
#: ``list``, a ``list`` subclass, or any other type; "allowlisted_" when the type is in the user
#: allowlist (``add_safe_globals`` or an open ``safe_globals`` context).
APPEND_TARGETS = ("list", "list_subclass", "allowlisted_list_subclass", "other", "allowlisted_other")


@dataclass(frozen=True)
class AppendRule:
    """Which targets torch's check before one of APPEND / APPENDS refuses, and its message.

    torch 2.4 to 2.13 and 2.15 refuse anything but exactly a ``list`` (APPENDS saying "Can only
    extend lists"); torch 2.14.1 also lets an allowlisted ``list`` subclass through, and both
    opcodes say "Can only append to lists".
    """

    refused: frozenset[str] = frozenset(APPEND_TARGETS[1:])
    #: The message up to the target's ``type()``, which torch appends (``<class 'collections.deque'>``).
    message: str = "Can only append to lists, but got "


class _ListSubclass(list):
    """A sample ``list`` subclass for evaluating torch's APPEND target check."""


class _OtherType:
    """A sample type that is no ``list`` (``collections.deque``, a dict) for the same."""


def _append_samples() -> dict[str, tuple[Any, dict[str, Any]]]:
    """One sample target per :data:`APPEND_TARGETS` kind, with the user allowlist it is checked under."""
    return {
        "list": ([], {}),
        "list_subclass": (_ListSubclass(), {}),
        "allowlisted_list_subclass": (_ListSubclass(), {"sample.ListSubclass": _ListSubclass}),
        "other": (_OtherType(), {}),
        "allowlisted_other": (_OtherType(), {"sample.OtherType": _OtherType}),
    }


def append_rules_from_source(source: str) -> Optional[dict[str, AppendRule]]:
    """The target checks of ``APPEND`` and ``APPENDS`` in *source* (the unpickler module), or None.

    Each opcode's branch of ``Unpickler.load`` refuses with ``if <test>: raise
    UnpicklingError(f"<message>{type(<target>)}")``, written in the branch or in a method the
    branch calls (``self._check_append_target(list_obj)``, torch 2.14.1).  The test is evaluated
    for one sample target per kind of :data:`APPEND_TARGETS`, with torch's allowlist lookups
    answered by stubs, after checking it is made only of ``type``/``isinstance`` tests, ``list``,
    the allowlist lookups and ``not``/``and``/``or``: nothing else of torch's code runs.
    """
    import ast

    try:
        tree = parsed(source)
    except SyntaxError:
        return None
    methods = {node.name: node for node in statements(tree) if isinstance(node, ast.FunctionDef)}
    return append_rules_from_tree(tree, methods)


def append_rules_from_tree(tree: Any, methods: Mapping[str, Any]) -> Optional[dict[str, AppendRule]]:
    """:func:`append_rules_from_source` of parsed source (the module, or ``Unpickler.load``
    alone), with *methods* giving the ``def`` of a method a branch calls by its name."""
    rules: dict[str, AppendRule] = {}
    for node in statements(tree):
        opcode = _opcode_branch(node)
        if opcode not in ("APPEND", "APPENDS") or opcode in rules:
            continue
        found = _refusal_in(node.body, methods)
        if found is None:
            return None
        test, message, target_names = found
        refused = _refused_targets(test, target_names)
        if refused is None or "list" in refused:
            return None
        rules[opcode] = AppendRule(refused=refused, message=message)
    return rules if len(rules) == 2 else None


class UnpicklerMethods(Mapping[str, Any]):
    """The ``def`` of each method of a class, parsed from that method's source on first use:
    ``Unpickler.load``'s APPEND branch may call one (``self._check_append_target``, torch 2.14.1).
    *reader* gives a function's source (see :func:`.torch_source.function_tree`)."""

    def __init__(self, cls: type, reader: Callable[[Any], str] = source_of) -> None:
        self._cls = cls
        self._reader = reader
        self._defs: dict[str, Any] = {}

    def __getitem__(self, name: str) -> Any:
        import ast

        if name not in self._defs:
            fn = self._cls.__dict__.get(name)
            tree = function_tree(fn, self._reader) if isinstance(fn, types.FunctionType) else None
            self._defs[name] = next(
                (node for node in statements(tree) if isinstance(node, ast.FunctionDef) and node.name == name), None
            ) if tree is not None else None
        if self._defs[name] is None:
            raise KeyError(name)
        return self._defs[name]

    def __contains__(self, name: object) -> bool:
        try:
            self[name]  # type: ignore[index]
        except KeyError:
            return False
        return True

    def __iter__(self) -> Iterator[str]:
        return iter(name for name in vars(self._cls) if name in self)

    def __len__(self) -> int:
        return sum(1 for _ in self)


def _opcode_branch(node: Any) -> Optional[str]:
    """``X`` for the branch ``if key[0] == X[0]:`` of ``Unpickler.load``, else None."""
    import ast

    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare) or len(node.test.comparators) != 1:
        return None
    right = node.test.comparators[0]
    if isinstance(node.test.ops[0], ast.Eq) and isinstance(right, ast.Subscript) and isinstance(right.value, ast.Name):
        return right.value.id
    return None


def _refusal_in(body: list[Any], methods: Mapping[str, Any]) -> Optional[tuple[Any, str, frozenset[str]]]:
    """(test, message prefix, names the target goes by) of the first ``if <test>: raise`` in *body*,
    looking into a ``self.<method>(...)`` it calls; None when there is none of the expected shape."""
    import ast

    names = {"list_obj"}  # the branch's own variable, however it is assigned
    for stmt in body:
        if isinstance(stmt, ast.Assign):
            names.update(t.id for t in stmt.targets if isinstance(t, ast.Name))
        if isinstance(stmt, ast.If) and stmt.body and isinstance(stmt.body[0], ast.Raise):
            message = _message_prefix(stmt.body[0])
            return None if message is None else (stmt.test, message, frozenset(names))
        call = stmt.value if isinstance(stmt, ast.Expr) else None
        if (
            isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name) and call.func.value.id == "self"
            and call.func.attr in methods
        ):
            method = methods[call.func.attr]
            params = frozenset(a.arg for a in method.args.args[1:])
            found = _refusal_in(method.body, {})
            if found is not None:  # else a method that checks nothing: read on
                return found[0], found[1], found[2] | params
    return None


def _message_prefix(raise_stmt: Any) -> Optional[str]:
    """``"Can only append to lists, but got "`` of ``raise UnpicklingError(f"...{type(x)}")``."""
    import ast

    exc = raise_stmt.exc
    if not isinstance(exc, ast.Call) or len(exc.args) != 1 or not isinstance(exc.args[0], ast.JoinedStr):
        return None
    parts = exc.args[0].values
    if not parts or not isinstance(parts[-1], ast.FormattedValue):
        return None
    value = parts[-1].value
    if not (isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id == "type"):
        return None
    if not all(isinstance(p, ast.Constant) and isinstance(p.value, str) for p in parts[:-1]):
        return None
    return "".join(p.value for p in parts[:-1])


_APPEND_TEST_CALLS = ("type", "isinstance", "_get_user_allowed_globals", "_get_allowed_globals")


def _refused_targets(test: Any, target_names: frozenset[str]) -> Optional[frozenset[str]]:
    """The :data:`APPEND_TARGETS` kinds for which *test* (torch's refusal condition) holds."""
    import ast
    from types import SimpleNamespace

    allowed_names = frozenset(_APPEND_TEST_CALLS) | {"list", "self"} | target_names
    plain = (
        ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.USub, ast.Compare, ast.Is, ast.IsNot,
        ast.In, ast.NotIn, ast.Call, ast.Name, ast.Load, ast.Attribute, ast.Subscript, ast.Constant,
        ast.List, ast.Tuple,
    )
    for sub in ast.walk(test):
        if not isinstance(sub, plain):
            return None
        if isinstance(sub, ast.Name) and sub.id not in allowed_names:
            return None
        if isinstance(sub, ast.Attribute) and sub.attr not in ("values", "keys", "stack"):
            return None
        if isinstance(sub, ast.Constant) and not isinstance(sub.value, int):
            return None
        if isinstance(sub, ast.Call) and (sub.keywords or not (
            (isinstance(sub.func, ast.Name) and sub.func.id in _APPEND_TEST_CALLS)
            or (isinstance(sub.func, ast.Attribute) and sub.func.attr in ("values", "keys") and not sub.args)
        )):
            return None
    code = compile(ast.Expression(test), "<torch append target check>", "eval")
    refused = set()
    for kind, (target, user_allowed) in _append_samples().items():
        names: dict[str, Any] = dict.fromkeys(target_names, target)
        names.update(
            type=type, isinstance=isinstance, list=list, self=SimpleNamespace(stack=[target]),
            _get_user_allowed_globals=lambda allowed=user_allowed: allowed, _get_allowed_globals=dict,
        )
        try:
            if eval(code, {"__builtins__": {}}, names):  # noqa: S307 - validated above
                refused.add(kind)
        except Exception:  # noqa: BLE001 - a shape the samples cannot answer: not understood
            return None
    return frozenset(refused)
