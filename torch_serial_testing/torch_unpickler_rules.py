"""What the running torch's weights-only unpickler enforces, read from torch's own code.

``torch/_weights_only_unpickler.py`` changes between releases: which opcodes ``Unpickler.load``
implements, whether SETITEM/APPEND check their target (torch 2.8 checks no SETITEM target), how
a refused persistent id is reported and which id types are refused (2.8's inverted check refuses
only int ids), which globals are refused with a message that names none, which modules are
blocked.  Each rule is read from the installed torch -- its source through
:func:`~.torch_source.source_of`, or its tables -- with the current torch's rule as the fallback
when the source is unavailable, so the model (:mod:`.unpickler_model`) replays the torch that runs.
"""

from __future__ import annotations

import functools
import pickletools
import re
from dataclasses import dataclass
from typing import Any, Optional

from .torch_append_rules import (
    APPEND_TARGETS,
    AppendRule,
    UnpicklerMethods,
    append_rules_from_source,
    append_rules_from_tree,
)
from .torch_source import function_tree, parsed, source_of, statements

__all__ = [
    "WEIGHTS_ONLY_OPCODES",
    "weights_only_opcodes",
    "ContainerRules",
    "container_rules",
    "AppendRule",
    "APPEND_TARGETS",
    "append_rules_from_source",
    "persid_refused_from_source",
    "persid_refused_from_tree",
    "special_global_messages",
    "name_fixups_need_protocol_2",
    "message_drops_builtins_prefix",
    "torch_refuses_torchscript_weights_only",
    "BuildRules",
    "build_rules",
    "build_rules_from_source",
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

@functools.lru_cache(maxsize=1)
def weights_only_opcodes() -> frozenset[str]:
    """The opcodes this torch's weights-only unpickler accepts, read from its source."""
    try:
        from torch import _weights_only_unpickler as wou

        source = source_of(wou.Unpickler.load)
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


@dataclass(frozen=True)
class ContainerRules:
    """Which container and persistent-id checks this torch's weights-only unpickler makes.

    torch 2.13 refuses ``SETITEM(S)`` on anything but a dict, ``OrderedDict`` or ``Counter``,
    ``APPEND(S)`` on anything but a list, a persistent id that is neither a tuple nor an int,
    and names a refused id by its *type*.  torch 2.8 made no ``SETITEM`` check, named the id
    itself, and its id type check was inverted (``not type(pid) is not int``: it refused an
    int id and let every other type through to ``persistent_load``).  torch 2.14.1 lets
    APPEND(S) onto an allowlisted ``list`` subclass (:class:`AppendRule`).  Read from the
    running torch's source; without one, torch 2.13's rules.
    """

    setitem_checked: bool = True
    append_checked: bool = True
    persid_names_type: bool = True
    #: Which persistent ids the id type check refuses: of ``"tuple"``, ``"int"`` (exactly int)
    #: and ``"other"`` (any other type, bool included).
    persid_refused: frozenset[str] = frozenset(["other"])
    #: The target checks of APPEND and APPENDS.
    append: AppendRule = AppendRule()
    appends: AppendRule = AppendRule(message="Can only extend lists, but got ")

    def append_rule(self, opcode: str) -> AppendRule:
        """The :class:`AppendRule` of ``"APPEND"`` or ``"APPENDS"``."""
        return self.appends if opcode == "APPENDS" else self.append


#: What torch 2.13's unpickler says when the persistent id's type check refuses it.
_PERSID_TYPE_MESSAGE = "persistent_load id must be tuple or int"
# Sample ids, one per category of ContainerRules.persid_refused.
_PERSID_SAMPLES = {"tuple": ("storage",), "int": 0, "other": "id"}


def persid_refused_from_source(source: str) -> Optional[frozenset[str]]:
    """The id categories refused by the ``if <test>: raise ... "persistent_load id must be ..."``
    check in *source* (the unpickler module), or None when it cannot be read.

    The condition is evaluated for one sample id per category, after checking that it is made
    only of ``type(pid)`` / ``isinstance(pid, ...)`` comparisons with ``tuple`` and ``int``,
    ``not``, ``and`` and ``or``: nothing else of torch's code runs.
    """
    try:
        tree = parsed(source)
    except SyntaxError:
        return None
    return persid_refused_from_tree(tree)


def persid_refused_from_tree(tree: Any) -> Optional[frozenset[str]]:
    """:func:`persid_refused_from_source` of parsed source (a module or one function)."""
    import ast

    for node in statements(tree):
        if not isinstance(node, ast.If) or not any(
            isinstance(stmt, ast.Raise) and _PERSID_TYPE_MESSAGE in ast.dump(stmt) for stmt in node.body
        ):
            continue
        if not _plain_type_test(node.test):
            return None
        code = compile(ast.Expression(node.test), "<torch persistent id check>", "eval")
        refused = set()
        for category, sample in _PERSID_SAMPLES.items():
            names = {"type": type, "isinstance": isinstance, "tuple": tuple, "int": int, "pid": sample}
            if eval(code, {"__builtins__": {}}, names):  # noqa: S307 - validated by _plain_type_test
                refused.add(category)
        return frozenset(refused)
    return None


def _plain_type_test(node: Any) -> bool:
    """Whether *node* only compares ``pid``'s type with ``tuple``/``int`` (see persid_refused_from_source)."""
    import ast

    allowed = (
        ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare, ast.Is, ast.IsNot, ast.Eq, ast.NotEq,
        ast.Call, ast.Name, ast.Load, ast.Tuple,
    )
    for sub in ast.walk(node):
        if not isinstance(sub, allowed):
            return False
        if isinstance(sub, ast.Name) and sub.id not in ("type", "isinstance", "tuple", "int", "pid"):
            return False
        if isinstance(sub, ast.Call) and (
            not isinstance(sub.func, ast.Name) or sub.func.id not in ("type", "isinstance") or sub.keywords
        ):
            return False
    return True


@functools.lru_cache(maxsize=1)
def container_rules() -> ContainerRules:
    """This torch's :class:`ContainerRules`, read from ``torch/_weights_only_unpickler.py``."""
    try:
        from torch import _weights_only_unpickler as wou

        source = source_of(wou)
    except (ImportError, AttributeError, OSError, TypeError):
        return ContainerRules()
    # Both checks live in Unpickler.load (or a method it calls) on every torch read so far: read
    # from that function alone, and from the whole module only when it does not tell.
    load_tree = function_tree(wou.Unpickler.load, source_of)
    persid_refused = persid_refused_from_tree(load_tree) if load_tree is not None else None
    if persid_refused is None:
        persid_refused = persid_refused_from_source(source)
    appends = None
    if load_tree is not None:
        appends = append_rules_from_tree(load_tree, UnpicklerMethods(wou.Unpickler, source_of))
    if appends is None:
        appends = append_rules_from_source(source) or {}
    return ContainerRules(
        setitem_checked="collections.Counter, but got" in source,
        append_checked="Can only append to lists" in source,
        persid_names_type="persistent_load of storage is allowed, but got {type(" in source,
        persid_refused=ContainerRules.persid_refused if persid_refused is None else persid_refused,
        append=appends.get("APPEND", ContainerRules.append),
        appends=appends.get("APPENDS", ContainerRules.appends),
    )


@functools.lru_cache(maxsize=1)
def special_global_messages() -> dict[str, str]:
    """Globals this torch refuses, when not allowlisted, with a message naming no global."""
    try:
        from torch import _weights_only_unpickler as wou

        source = source_of(wou.Unpickler.load)
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
def _unpickler_source() -> Optional[str]:
    try:
        from torch import _weights_only_unpickler as wou

        return source_of(wou.Unpickler.load)
    except (ImportError, AttributeError, OSError, TypeError):
        return None


@functools.lru_cache(maxsize=1)
def name_fixups_need_protocol_2() -> bool:
    """Whether torch renames Python-2 globals only in a protocol-2 pickle (torch 2.4: ``if
    self.proto == 2``; a protocol 0/1 pickle keeps ``copy_reg``, ``__builtin__``), not in every one
    (the current torch).  Read from torch's source; the current rule without it."""
    source = _unpickler_source()
    return source is not None and bool(re.search(r"if self\.proto == 2:\s*\n\s*if \(module, name\) in NAME_MAPPING", source))


@functools.lru_cache(maxsize=1)
def message_drops_builtins_prefix() -> bool:
    """Whether torch's "Unsupported global" message spells ``builtins.set`` as ``set`` (its
    ``builtins_name`` fix-up: torch 2.7 on; 2.4 to 2.6 print the full path).  Read from torch's
    source; the current rule without it."""
    source = _unpickler_source()
    return source is None or "builtins_name" in source or "Unsupported global: GLOBAL {full_path}" not in source


@functools.lru_cache(maxsize=1)
def torch_refuses_torchscript_weights_only() -> bool:
    """Whether ``torch.load(..., weights_only=True)`` refuses a TorchScript archive (RuntimeError).
    torch 2.4 does not: it hands the archive to ``torch.jit.load`` whatever weights_only says.
    Read from ``torch.serialization.load``'s source; the current rule without it."""
    try:
        import torch

        source = source_of(torch.serialization.load)
    except (ImportError, AttributeError, OSError, TypeError):
        return True
    return "with TorchScript archives passed to" in source or "_is_torchscript_zip" not in source


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


@dataclass(frozen=True)
class BuildRules:
    """How this torch's BUILD applies a state to an instance of an allowlisted class.

    torch 2.13 calls ``inst.__setstate__(state)`` when the instance has one, else does what
    pickle's ``load_build`` does: splits a ``(state, slotstate)`` pair, updates ``__dict__``
    only with a truthy state and ``setattr``s each slot; it also builds instances of torch's
    own allowlisted classes.  torch 2.4 and 2.5 do ``inst.__dict__.update(state)`` whatever
    the state is (an instance with ``__slots__`` has no ``__dict__``: AttributeError, raised
    through ``torch.load`` as it is) and build only user-allowlisted classes.  Read from the
    running torch's source; without one, torch 2.13's rules.
    """

    #: ``if hasattr(inst, "__setstate__"): inst.__setstate__(state)``.
    calls_setstate: bool = True
    #: A ``(state, slotstate)`` pair is split and the slots are set one by one.
    splits_slotstate: bool = True
    #: ``if state: inst.__dict__.update(state)`` (an empty or None state is skipped).
    skips_falsy_state: bool = True
    #: Instances of torch's own allowlisted classes may be built, not only user-allowlisted ones.
    torch_types_buildable: bool = True


def build_rules_from_source(source: str) -> Optional[BuildRules]:
    """The :class:`BuildRules` of the ``BUILD`` branch of ``Unpickler.load``'s *source*, or None."""
    m = re.search(r"key\[0\] == BUILD\[0\]:(?P<body>.*?)(?:\n\s*elif key\[0\] ==|\Z)", source, re.S)
    if m is None or "__dict__" not in m.group("body"):
        return None
    body = m.group("body")
    return BuildRules(
        calls_setstate=bool(re.search(r"hasattr\(inst, [\"']__setstate__[\"']\)", body)),
        splits_slotstate="slotstate" in body,
        skips_falsy_state=bool(re.search(r"\n\s*if state:", body)),
        torch_types_buildable="_get_allowed_globals().values()" in body,
    )


@functools.lru_cache(maxsize=1)
def build_rules() -> BuildRules:
    """This torch's :class:`BuildRules`, read from ``Unpickler.load``; torch 2.13's without its source."""
    source = _unpickler_source()
    rules = build_rules_from_source(source) if source is not None else None
    return rules if rules is not None else BuildRules()
