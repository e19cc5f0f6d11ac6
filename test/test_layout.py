"""The package's shape: layers import one way, torch's private API only in torch_facts, no source reading.

Read from the package's own files (a test may read source; the package never does): every
``import`` and every ``torch.<...>`` attribute chain of every module.
"""

from __future__ import annotations

import ast
import os
import unittest
from typing import Iterator, Optional

import torch_serial_testing

PACKAGE = os.path.dirname(os.path.abspath(torch_serial_testing.__file__))
NAME = "torch_serial_testing"

#: Each layer may import only itself and the layers listed before it; scan and policy are siblings.
LAYERS = ("core", "torch_facts", "scan", "policy", "loading", "testing", "audit", "cli")
MAY_IMPORT = {
    "core": {"core"},
    "torch_facts": {"core", "torch_facts"},
    "scan": {"core", "torch_facts", "scan"},
    "policy": {"core", "torch_facts", "policy"},
    "loading": {"core", "torch_facts", "scan", "policy", "loading"},
    "testing": {"core", "torch_facts", "scan", "policy", "loading", "testing"},
    "audit": {"core", "torch_facts", "scan", "policy", "loading", "testing", "audit"},
    "cli": set(LAYERS),
}
#: Text that reads source code (the package asks torch by probes instead).
SOURCE_READING = ("getsource", "getsourcelines", "getblock", "linecache", "co_filename", "ast.parse", "getfile")
MAX_LINES = 400


def modules() -> Iterator[tuple[str, str]]:
    """(dotted module name, path) of every module of the package."""
    for root, dirs, files in os.walk(PACKAGE):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        for f in sorted(files):
            if f.endswith(".py"):
                path = os.path.join(root, f)
                rel = os.path.relpath(path, os.path.dirname(PACKAGE))[:-3].replace(os.sep, ".")
                yield rel[: -len(".__init__")] if rel.endswith(".__init__") else rel, path


def imported(module: str, path: str) -> Iterator[tuple[str, int, bool]]:
    """(package module imported, line, at module level) for every import in *path*."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    top = {id(n) for n in tree.body}
    is_package = path.endswith("__init__.py")
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(NAME):
                    yield alias.name, node.lineno, id(node) in top
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: len(module.split(".")) - node.level + (1 if is_package else 0)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            if not target.startswith(NAME):
                continue
            for alias in node.names:  # `from .. import loading` imports a module too
                sub = f"{target}.{alias.name}"
                yield (sub if _is_module(sub) else target), node.lineno, id(node) in top


def _is_module(dotted: str) -> bool:
    rel = dotted.split(".")[1:]
    base = os.path.join(PACKAGE, *rel)
    return os.path.isfile(base + ".py") or os.path.isfile(os.path.join(base, "__init__.py"))


def layer(module: str) -> Optional[str]:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


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


class TestLayers(unittest.TestCase):
    def test_every_module_is_in_a_layer(self) -> None:
        loose = [m for m, _ in modules() if layer(m) is None and m not in (NAME, f"{NAME}.__main__")]
        self.assertEqual(loose, [], "every module belongs to one sub-package")

    def test_imports_go_one_way(self) -> None:
        wrong = []
        for module, path in modules():
            mine = layer(module)
            if mine is None:
                continue  # the package facade and __main__ may import any layer
            for target, line, _top in imported(module, path):
                theirs = layer(target)
                if target == NAME and mine != "cli":  # the facade imports every layer but cli
                    wrong.append(f"{module}:{line} imports the package facade")
                elif theirs is not None and theirs not in MAY_IMPORT[mine]:
                    wrong.append(f"{module}:{line} ({mine}) imports {target} ({theirs})")
        self.assertEqual(wrong, [])

    def test_no_import_cycles(self) -> None:
        graph: dict[str, set[str]] = {}
        for module, path in modules():
            graph[module] = {t for t, _line, top in imported(module, path) if top and t != module}
        cycles = []
        state: dict[str, int] = {}

        def visit(node: str, trail: list[str]) -> None:
            state[node] = 1
            for nxt in sorted(graph.get(node, ())):
                if state.get(nxt) == 1:
                    cycles.append(" -> ".join(trail[trail.index(nxt) :] + [nxt]) if nxt in trail else nxt)
                elif nxt in graph and state.get(nxt) is None:
                    visit(nxt, trail + [nxt])
            state[node] = 2

        for module in sorted(graph):
            if state.get(module) is None:
                visit(module, [module])
        self.assertEqual(cycles, [])

    def test_torch_private_api_only_in_torch_facts(self) -> None:
        found = [
            f"{m}:{line} {what}"
            for m, path in modules()
            if layer(m) != "torch_facts"
            for line, what in torch_private_uses(path)
        ]
        self.assertEqual(found, [])
        # and the check sees what it looks for
        facts = [what for m, path in modules() if layer(m) == "torch_facts" for _l, what in torch_private_uses(path)]
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
        big = {m: n for m, path in modules() if (n := sum(1 for _ in open(path, encoding="utf-8"))) > MAX_LINES}
        self.assertEqual(big, {}, f"a module past {MAX_LINES} lines usually holds two concepts: split it")


if __name__ == "__main__":
    unittest.main()
