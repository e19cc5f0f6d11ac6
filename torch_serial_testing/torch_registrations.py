"""The safe globals torch registers process-wide itself, read from torch's own code.

torch's modules call ``add_safe_globals`` at import: ``torch.nested`` its NJT globals,
``torch._dynamo`` its ``_DimRange``, ``torch.distributed`` its device-mesh layouts and, from
torch 2.14, every builtin exception class plus ``traceback.StackSummary``/``FrameSummary``.
Those are torch's defaults; anything else in the registry was put there by a backend
(torch_npu's ``_rebuild_npu_tensor``) or by user code, and decides what loads.  Which is which
cannot be told from the registry, nor from the names (builtins, traceback), so the call sites are
read from the source of the torch modules imported now: each module-level
``add_safe_globals([...])`` argument is evaluated again in its module's namespace, after
checking it is only names, attributes, lists and comprehensions with ``vars``/``isinstance``/
``issubclass`` tests -- the expression torch itself ran at import, and nothing else.
"""

from __future__ import annotations

import ast
import os
import sys
import threading
import types
from typing import Any, Optional

__all__ = ["torch_registered_names"]

_SITE_CALLS = frozenset(["add_safe_globals", "_add_safe_globals"])
_PURE_CALLS = frozenset(["vars", "isinstance", "issubclass", "list", "tuple", "getattr", "hasattr"])
_PLAIN = (
    ast.Expression, ast.List, ast.Tuple, ast.Set, ast.Name, ast.Attribute, ast.Load, ast.Store, ast.ListComp,
    ast.GeneratorExp, ast.comprehension, ast.BoolOp, ast.And, ast.Or, ast.UnaryOp, ast.Not, ast.Compare,
    ast.Is, ast.IsNot, ast.In, ast.NotIn, ast.Eq, ast.NotEq, ast.Call, ast.BinOp, ast.Add, ast.Constant,
    ast.Starred,
)

#: module name -> (names its module-level calls register, whether every call site was read).
_by_module: dict[str, tuple[frozenset[str], bool]] = {}
_lock = threading.Lock()


def torch_registered_names() -> tuple[frozenset[str], bool]:
    """(names torch's imported modules register process-wide at import, whether every call site
    in them could be read).  A name is ``module.qualname``, or the name given in an
    ``(obj, "name")`` entry, as :func:`.allowlist.registered_globals` spells it."""
    names: set[str] = set()
    complete = True
    for mod_name, module in list(sys.modules.items()):
        if not isinstance(module, types.ModuleType) or not (mod_name == "torch" or mod_name.startswith("torch.")):
            continue
        found = _by_module.get(mod_name)
        if found is None:
            found = _registered_by(module)
            with _lock:
                _by_module[mod_name] = found
        names |= found[0]
        complete = complete and found[1]
    return frozenset(names), complete


def _registered_by(module: Any) -> tuple[frozenset[str], bool]:
    filename = getattr(module, "__file__", None)
    if not isinstance(filename, str) or not filename.endswith(".py") or not os.path.isabs(filename):
        # an extension module, a namespace package, or a stand-in (torch.ops says "_ops.py"): no call sites
        return frozenset(), True
    try:
        with open(filename, "rb") as fh:
            data = fh.read()
    except OSError:
        return frozenset(), False
    if b"safe_globals(" not in data:  # most modules: no parse at all
        return frozenset(), True
    try:
        tree = _statements_calling(data.decode("utf-8"))
    except (SyntaxError, ValueError):
        return frozenset(), False
    names: set[str] = set()
    complete = True
    for call in _module_level_calls(tree):
        entries = _evaluate(call.args[0], vars(module)) if len(call.args) == 1 and not call.keywords else None
        if entries is None:
            complete = False
            continue
        names.update(n for n in map(_entry_name, entries) if n)
    return frozenset(names), complete


_CONTINUES = ("else", "elif", "except", "finally", "#", ")", "]", "}")


def _statements_calling(text: str) -> ast.Module:
    """The top-level statements of *text* that contain ``safe_globals(``, parsed.

    Parsing all of a large module (``distributed_c10d.py``) takes a tenth of a second: only the
    statements around each occurrence are parsed, from the column-0 line that starts the
    statement to the next one (``else:``/``except:`` lines continue a statement); the whole
    text when such a cut does not parse.
    """
    lines = text.splitlines(keepends=True)
    starts = [
        i for i, line in enumerate(lines)
        if line[:1] not in ("", " ", "\t", "\n", "\r") and not line.startswith(_CONTINUES)
    ]
    body: list[ast.stmt] = []
    taken: set[int] = set()
    for at, line in enumerate(lines):
        if "safe_globals(" not in line:
            continue
        first = max((i for i in starts if i <= at), default=0)
        if first in taken:
            continue
        taken.add(first)
        end = min((i for i in starts if i > at), default=len(lines))
        try:
            body.extend(ast.parse("".join(lines[first:end])).body)
        except SyntaxError:
            return ast.parse(text)
    return ast.Module(body=body, type_ignores=[])


def _module_level_calls(tree: ast.AST) -> list[ast.Call]:
    """``add_safe_globals(...)`` calls that run at import: not inside a function or class body."""
    found: list[ast.Call] = []
    todo: list[ast.AST] = [tree]
    while todo:
        node = todo.pop()
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)):
                continue
            if isinstance(child, ast.Call):
                func = child.func
                called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else None
                if called in _SITE_CALLS:
                    found.append(child)
            todo.append(child)
    return found


def _evaluate(node: ast.expr, namespace: dict[str, Any]) -> Optional[list[Any]]:
    """The entries *node* (torch's argument) stands for in *namespace*, or None when it is not a
    plain expression (see the module docstring) or fails."""
    for sub in ast.walk(node):
        if not isinstance(sub, _PLAIN):
            return None
        if isinstance(sub, ast.Call) and (sub.keywords or not (
            (isinstance(sub.func, ast.Name) and sub.func.id in _PURE_CALLS)
            or (isinstance(sub.func, ast.Attribute) and sub.func.attr in ("values", "keys", "items") and not sub.args)
        )):
            return None
    try:
        value = eval(compile(ast.Expression(node), "<torch add_safe_globals argument>", "eval"), namespace)  # noqa: S307
        return list(value)
    except Exception:  # noqa: BLE001 - a name bound only inside a branch not taken, ...: not read
        return None


def _entry_name(entry: Any) -> Optional[str]:
    if isinstance(entry, tuple) and len(entry) == 2 and isinstance(entry[1], str):
        return entry[1]
    module, qualname = getattr(entry, "__module__", None), getattr(entry, "__qualname__", None)
    return f"{module}.{qualname}" if isinstance(module, str) and isinstance(qualname, str) else None
