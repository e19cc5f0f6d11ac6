"""torch_source.source_of: the text inspect.getblock would cut, read once per function."""

from __future__ import annotations

import importlib.util
import inspect
import linecache
import os
import sys
import tempfile
import textwrap
import types
import unittest
from unittest import mock

from torch_serial_testing import torch_source
from torch_serial_testing.torch_source import source_of

# Functions whose block ends in every way the fast path has to get right or hand over.
SAMPLES = textwrap.dedent('''\
    import functools


    def plain(a):
        return a + 1


    def trailing_body_comment(a):
        b = a * 2
        # kept: indented like the body
        return b
        # kept too

    # not kept: indented like the def


    def closing_bracket(a):
        x = (
            a
        )
        return [
            x,
        ]


    def ends_with_pass(a):
        if a:
            return 1
        else:
            pass


    def docstring_only():
        """Nothing else."""


    @functools.lru_cache(maxsize=None)
    def decorated(
        a,
        b=(1,
           2),
    ):
        def inner():
            return (a,
                    b)
        return inner


    class Holder:
        def method(self):
            return [x for x in range(3)]
        # a comment indented like the def

        def one_liner(self): return 1

        def multi_line_string(self):
            return """
    at column 0
    """


    def last_in_file(a):
        return a
    # after the last block
''')


class SourceOfTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.TemporaryDirectory()
        path = os.path.join(cls.tmp.name, "tst_source_samples.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(SAMPLES)
        spec = importlib.util.spec_from_file_location("tst_source_samples", path)
        cls.module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(cls.module)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.tmp.cleanup()

    @staticmethod
    def reference(fn: types.FunctionType) -> str:
        code = inspect.unwrap(fn).__code__
        lines = linecache.getlines(code.co_filename)
        return "".join(inspect.getblock(lines[code.co_firstlineno - 1:]))

    def samples(self) -> list[types.FunctionType]:
        m = self.module
        return [m.plain, m.trailing_body_comment, m.closing_bracket, m.ends_with_pass, m.docstring_only,
                m.decorated, m.decorated(1), m.Holder.method, m.Holder.one_liner, m.Holder.multi_line_string,
                m.last_in_file, lambda: 1]

    def test_same_text_as_inspect_getblock(self) -> None:
        for fn in self.samples():
            with self.subTest(fn=fn.__qualname__):
                self.assertEqual(source_of(fn), self.reference(fn))

    def test_trailing_comments_as_getblock_keeps_them(self) -> None:
        text = source_of(self.module.trailing_body_comment)
        self.assertTrue(text.rstrip().endswith("# kept too"), text)
        self.assertNotIn("not kept", text)

    def test_torch_functions_the_rules_read(self) -> None:
        import torch
        from torch import _weights_only_unpickler as wou

        for fn in (wou.Unpickler.load, torch.serialization.load, wou._get_user_allowed_globals):
            with self.subTest(fn=fn.__qualname__):
                self.assertEqual(source_of(fn), self.reference(fn))

    @unittest.skipUnless(sys.version_info >= (3, 11), "instruction end lines (co_positions) exist from Python 3.11")
    def test_fast_path_taken_where_the_end_is_certain(self) -> None:
        m = self.module

        def block_end(fn: types.FunctionType) -> object:
            code = inspect.unwrap(fn).__code__
            return torch_source._block_end(linecache.getlines(code.co_filename)[code.co_firstlineno - 1:], code)

        self.assertEqual(block_end(m.plain), 2)
        self.assertEqual(block_end(m.Holder.method), 2)  # a def-level comment after it does not stop it
        for fn in (m.trailing_body_comment, m.docstring_only, m.Holder.one_liner,
                   m.Holder.multi_line_string):
            with self.subTest(fn=fn.__qualname__):
                self.assertIsNone(block_end(fn))  # handed to inspect.getblock

    def test_read_once_per_function(self) -> None:
        fn = self.module.plain
        first = source_of(fn)
        with mock.patch.object(linecache, "getlines", side_effect=AssertionError("read again")):
            self.assertEqual(source_of(fn), first)

    def test_modules_and_errors(self) -> None:
        self.assertEqual(source_of(self.module), SAMPLES)
        with self.assertRaises(TypeError):
            source_of(len)
        fn = types.FunctionType(compile("def f():\n    return 1\n", "<nowhere>", "exec").co_consts[0], {})
        with self.assertRaises(OSError):
            source_of(fn)


class StatementsTest(unittest.TestCase):
    """torch_source.statements: ast.walk's statements, in its order, without the expressions."""

    SHAPES = textwrap.dedent('''
        import os
        class C:
            def m(self, x):
                if x:
                    try:
                        y = 1
                    except ValueError:
                        raise
                    else:
                        pass
                    finally:
                        del y
                elif x is None:
                    for i in x:
                        continue
                    else:
                        return [lambda: 1 for _ in ()]
                while x:
                    with open(x) as f:
                        break
                match x:
                    case [a, *rest] if a:
                        return rest
                    case _:
                        async def g():
                            async with x:
                                pass
                return x
        def top():
            def inner():
                nonlocal_value = 1
            return inner
    ''')

    def check(self, source: str) -> None:
        import ast

        tree = ast.parse(source)
        kinds = (ast.stmt, ast.excepthandler, ast.match_case)
        expected = [node for node in ast.walk(tree) if isinstance(node, kinds)]
        found = [node for node in torch_source.statements(tree) if node is not tree]
        self.assertEqual([type(n).__name__ for n in found], [type(n).__name__ for n in expected])
        self.assertEqual(found, expected)

    def test_every_kind_of_block(self) -> None:
        self.check(self.SHAPES)

    def test_torch_unpickler_module(self) -> None:
        from torch import _weights_only_unpickler as wou

        self.check(source_of(wou))


if __name__ == "__main__":
    unittest.main()
