"""The running torch's own source text, read straight from its files.

Several rules are read from torch's source rather than assumed from its version (how
``torch.load`` reads the ``TORCH_FORCE_*`` switches, which opcodes and globals the
weights-only unpickler handles).  ``inspect.getsource`` would do, but it first looks for the
module owning the code by walking every entry of ``sys.modules`` -- thousands once torch is
imported, about 20 ms per process.  A function's code object already names its file and first
line, so this reads those lines (through ``linecache``, as ``inspect`` does) and cuts the
block where ``inspect.getblock`` would: the same text, without the walk.

``inspect.getblock`` finds the end with Python's pure-Python tokenizer, several milliseconds
for a long function such as ``Unpickler.load``, and three rules read that one function.  So a
function's text is read once per process, and where the code object records where every
instruction ends (Python >= 3.11) the end comes from there: the last line any instruction of
the function (or of a function nested in it) covers, taken only when every later line up to
the next statement indented no deeper than the ``def`` is blank or a comment indented no deeper
than the ``def`` (which getblock leaves out too).  Anything else after it (a comment indented
like the body, a ``pass``, a closing bracket on its own line) is left to ``inspect.getblock``.
"""

from __future__ import annotations

import functools
import inspect
import linecache
import types
from typing import Any, Callable, Iterator, Optional

__all__ = ["function_tree", "parsed", "source_of", "statements"]


def source_of(obj: Any) -> str:
    """The source of a function (or method) or a module; raises ``OSError`` when it is unavailable."""
    if isinstance(obj, types.ModuleType):
        filename = getattr(obj, "__file__", None)
        lines = linecache.getlines(filename) if filename else []
        if not lines:
            raise OSError(f"no source for module {obj.__name__}")
        return "".join(lines)
    fn = inspect.unwrap(obj)
    code = getattr(fn, "__code__", None)
    if code is None:
        raise TypeError(f"{obj!r} is not a function")
    text = _code_source(code)
    if text is None:
        raise OSError(f"no source for {getattr(fn, '__qualname__', fn)!r}")
    return text


@functools.lru_cache(maxsize=32)
def _code_source(code: types.CodeType) -> Optional[str]:
    """The block of lines *code* was compiled from (None: its file's lines are unavailable)."""
    lines = linecache.getlines(code.co_filename)
    if len(lines) < code.co_firstlineno:
        return None
    lines = lines[code.co_firstlineno - 1:]
    end = _block_end(lines, code)
    return "".join(lines[:end] if end is not None else inspect.getblock(lines))


def _block_end(lines: list[str], code: types.CodeType) -> Optional[int]:
    """How many of *lines* (starting at *code*'s first line) ``inspect.getblock`` keeps, or None
    when that cannot be told from *code*'s instruction positions alone (see the module docstring)."""
    if code.co_name == "<lambda>":
        return None  # getblock ends a lambda at its first line's end
    last = _last_line(code)
    if last is None:
        return None
    end = last - code.co_firstlineno + 1
    if end < 1 or end > len(lines):
        return None
    base = _indent(lines[0])
    if _indent(lines[end - 1]) <= base:
        return None  # the last line covered is not in the body (a body of a docstring alone)
    for line in lines[end:]:
        stripped = line.strip()
        if not stripped:
            continue
        if _indent(line) > base:
            return None  # a comment getblock may keep, or a line of the block no instruction covers
        if not stripped.startswith("#"):  # the next statement outside the block
            return end
        # a comment indented no deeper than the def is not the block's: look further
    return end


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def _last_line(code: types.CodeType) -> Optional[int]:
    """The last source line any instruction of *code* or its nested code covers (None before 3.11)."""
    if not hasattr(code, "co_positions"):
        return None
    last = None
    for c in _codes(code):
        for _start, stop, _col, _end_col in c.co_positions():
            if stop is not None and (last is None or stop > last):
                last = stop
    return last


def _codes(code: types.CodeType) -> Iterator[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def function_tree(fn: Any, reader: Callable[[Any], str] = source_of) -> Optional[Any]:
    """The parsed source of one function alone (dedented), or None when it cannot be read.

    A rule that lives in one function (``Unpickler.load``) is read from that function's text:
    parsing all of ``torch/_weights_only_unpickler.py`` instead costs four times as much.
    *reader* gives the text (:func:`source_of` unless a caller reads source its own way)."""
    import textwrap

    try:
        return parsed(textwrap.dedent(reader(fn)))
    except (OSError, TypeError, SyntaxError):
        return None


def statements(tree: Any) -> Iterator[Any]:
    """The statements under *tree* (and its except handlers and match cases), in ``ast.walk``'s
    order, without visiting a single expression node: the rules look for ``if``/``def``
    statements, and ``ast.walk`` over every node of a module costs more than parsing it."""
    import ast
    from collections import deque

    kinds = (ast.stmt, ast.excepthandler, ast.match_case)
    todo = deque([tree])
    while todo:
        node = todo.popleft()
        for name in node._fields:
            value = getattr(node, name, None)
            if type(value) is list and value and isinstance(value[0], kinds):
                todo.extend(value)
        yield node


@functools.lru_cache(maxsize=4)
def parsed(source: str) -> Any:
    """``ast.parse(source)``, once per text: several rules are read from the same torch module
    (its unpickler's persistent-id and append checks), and parsing it is most of their cost.
    Raises ``SyntaxError`` like ``ast.parse``; callers only read the tree."""
    import ast

    return ast.parse(source)
