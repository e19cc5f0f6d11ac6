"""The package's shape: a small core that never imports the tools, every import counted, no cycles.

Read from the package's own files (a test may read source; the package never does): every ``import``
(at module level or inside a function) and every ``torch.<...>`` attribute chain of every module.

* The **core** is the package's top-level modules (what ``vendor`` copies into pytorch's ``test/``):
  at most :data:`CORE_LINES` lines in at most :data:`CORE_MODULES` modules.  The **tools** are
  ``torch_serial_testing.tools`` and ``__main__``.
* The **paths** (``torch_serial_testing.paths``) are the serialization paths beyond an in-process
  ``torch.save``/``torch.load``: loads in a fresh interpreter, TorchScript, ``torch.export``, ranks on
  ``torch.distributed``.  They build on the core and are not vendored; they never import the tools nor
  pytorch's test helpers (``torch.testing._internal``).
* The core never imports the tools nor the paths; nothing imports ``__main__``; no module imports
  itself back through any chain of imports.
* torch's private API only in the modules that ask torch facts (:data:`TORCH_FACTS`); no source
  reading; the warnings filters are never touched.
"""

from __future__ import annotations

import ast
import os
import unittest
from typing import Iterator

import torch_serial_testing

PACKAGE = os.path.dirname(os.path.abspath(torch_serial_testing.__file__))
NAME = "torch_serial_testing"
TOOLS = f"{NAME}.tools"
PATHS = f"{NAME}.paths"
#: The issue's bound on the vendored core (issue 37): lines, and modules.
CORE_LINES = 5000
CORE_MODULES = 21
#: Core modules that may use torch's private API: they are the library's questions to torch.
TORCH_FACTS = {"dimensions", "registry", "serialization", "unpickler"}
#: Text that reads source code (the package asks torch by probes instead).
SOURCE_READING = ("getsource", "getsourcelines", "getblock", "linecache", "co_filename", "ast.parse", "getfile")
MAX_LINES = 450


def modules() -> Iterator[tuple[str, str]]:
    """(dotted module name, path) of every module of the package."""
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                yield rel[: -len(".__init__")] if rel.endswith(".__init__") else rel, path


def is_tools(module: str) -> bool:
    return module == TOOLS or module.startswith(TOOLS + ".") or module == f"{NAME}.__main__"


def is_paths(module: str) -> bool:
    return module == PATHS or module.startswith(PATHS + ".")


def core_modules() -> list[tuple[str, str]]:
    return [(m, p) for m, p in modules() if not is_tools(m) and not is_paths(m)]


def imported(module: str, path: str) -> Iterator[tuple[str, int]]:
    """(package module imported, line) for every import in *path*, at any depth."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(NAME):
                    yield alias.name, node.lineno
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(NAME):
                continue
            for alias in node.names:  # `from . import loading` imports a module too
                sub = f"{target}.{alias.name}"
                yield (sub if _is_module(sub) else target), node.lineno


def _is_module(dotted: str) -> bool:
    base = os.path.join(PACKAGE, *dotted.split(".")[1:])
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def import_graph() -> dict[str, set[str]]:
    return {m: {t for t, _line in imported(m, p) if t != m} for m, p in modules()}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def torch_private_uses(path: str) -> Iterator[tuple[int, str]]:
    """``torch._x``, ``torch.serialization._y``, ``from torch import _z`` ...: torch's private API."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute):
            chain = []
            cur: ast.AST = node
            while isinstance(cur, ast.Attribute):
                chain.append(cur.attr)
                cur = cur.value
            if isinstance(cur, ast.Name) and cur.id == "torch":
                chain.reverse()
                if any(p.startswith("_") and not (p.startswith("__") and p.endswith("__")) for p in chain):
                    yield node.lineno, "torch." + ".".join(chain)
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "torch":
            names = [node.module, *(a.name for a in node.names)]
            if any(p.startswith("_") for n in names for p in n.split(".")):
                yield node.lineno, f"from {node.module} import {', '.join(a.name for a in node.names)}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("torch.") and any(p.startswith("_") for p in alias.name.split(".")):
                    yield node.lineno, f"import {alias.name}"


INTERNAL = "torch.testing._internal"  #: pytorch's test helpers: for tests, not for the paths


def torch_imports(path: str) -> Iterator[tuple[int, str]]:
    """(line, module) of every ``import torch...`` and ``from torch... import x`` (as ``torch....x``) in *path*."""
    for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "torch")
        elif isinstance(node, ast.ImportFrom) and not node.level and (node.module or "").split(".")[0] == "torch":
            yield from ((node.lineno, f"{node.module}.{a.name}") for a in node.names)


def lines(path: str) -> int:
    with open(path, encoding="utf-8") as fh:
        return sum(1 for _ in fh)


class TestCoreAndTools(unittest.TestCase):
    def test_the_core_is_flat_and_the_tools_are_one_sub_package(self) -> None:
        core = [m for m, _ in core_modules()]
        self.assertTrue(all(m == NAME or m.count(".") == 1 for m in core), core)
        self.assertIn(f"{NAME}.case", core)

    def test_the_core_is_small(self) -> None:
        core = core_modules()
        total = sum(lines(p) for _m, p in core)
        self.assertLessEqual(len(core), CORE_MODULES, [m for m, _ in core])
        self.assertLessEqual(total, CORE_LINES, "the vendored core: lines over the bound of issue 37")

    def test_the_core_never_imports_the_tools(self) -> None:
        wrong = [
            f"{module}:{line} imports {target}"
            for module, path in core_modules()
            for target, line in imported(module, path)
            if is_tools(target) or is_paths(target)
        ]
        self.assertEqual(wrong, [])

    def test_the_paths_never_import_the_tools(self) -> None:
        wrong = [
            f"{module}:{line} imports {target}"
            for module, path in modules()
            if is_paths(module)
            for target, line in imported(module, path)
            if is_tools(target)
        ]
        self.assertEqual(wrong, [])

    def test_the_paths_never_import_pytorchs_test_helpers(self) -> None:
        wrong = [
            f"{module}:{line} imports {name}"
            for module, path in modules()
            if is_paths(module)
            for line, name in torch_imports(path)
            if name == INTERNAL or name.startswith(INTERNAL + ".")
        ]
        self.assertEqual(wrong, [])
        # and the check sees what it looks for: the core asks pytorch's device filter (dimensions)
        core = [name for m, path in core_modules() for _l, name in torch_imports(path)]
        self.assertIn(f"{INTERNAL}.common_device_type", core)

    def test_nothing_imports_main(self) -> None:
        wrong = [f"{m}" for m, deps in import_graph().items() if f"{NAME}.__main__" in deps]
        self.assertEqual(wrong, [])

    def test_no_import_cycles_counting_every_import(self) -> None:
        self.assertEqual(cycles(import_graph()), [])

    def test_the_cycle_check_sees_function_level_imports(self) -> None:
        graph = {"a": {"b"}, "b": {"a"}, "c": set()}
        self.assertEqual(cycles(graph), [["a", "b"]])
        # and the graph holds imports written inside functions (the loads import their machinery there)
        self.assertIn(f"{NAME}.loading", import_graph()[f"{NAME}.outcomes"])

    def test_torch_private_api_only_in_the_torch_facts(self) -> None:
        found = [
            f"{m}:{line} {what}"
            for m, path in core_modules()
            if m.split(".")[-1] not in TORCH_FACTS
            for line, what in torch_private_uses(path)
        ]
        self.assertEqual(found, [])
        # and the check sees what it looks for
        facts = [what for m, path in core_modules() for _l, what in torch_private_uses(path)]
        self.assertTrue(any("_weights_only_unpickler" in w for w in facts), facts)

    def test_nothing_reads_source_text(self) -> None:
        found = []
        for module, path in modules():
            for n, line in enumerate(open(path, encoding="utf-8"), 1):
                code = line.split("#", 1)[0]
                found += [f"{module}:{n} {word}" for word in SOURCE_READING if word in code]
        self.assertEqual(found, [])

    def test_no_warnings_filters_touched(self) -> None:
        # catch_warnings / filterwarnings / simplefilter reset Python's once-per-location memory
        touching = {"catch_warnings", "filterwarnings", "simplefilter", "resetwarnings"}
        found = []
        for module, path in modules():
            for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                name = node.attr if isinstance(node, ast.Attribute) else node.id if isinstance(node, ast.Name) else None
                if name in touching:
                    found.append(f"{module}:{node.lineno} {name}")
        self.assertEqual(found, [])

    def test_modules_stay_small(self) -> None:
        big = {m: n for m, path in modules() if (n := lines(path)) > MAX_LINES}
        self.assertEqual(big, {}, f"a module past {MAX_LINES} lines usually holds two concepts: split it")


if __name__ == "__main__":
    unittest.main()
