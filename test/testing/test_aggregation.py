"""Generated tests in aggregators and tracebacks (issue 17), in process.

``import_round_trip_tests`` binds whatever a module generated here -- under
every device filter, never an ImportError -- and generated methods point at
the author's code: pytest's location (``__wrapped__``) and unittest's
failure traceback (one library frame, then the author's, for plain unittest
and for pytorch's ``TestCase``).  The vendored-tree runs are in
``test/cli/test_vendoring.py``.
"""

from __future__ import annotations

import inspect
import io
import os
import re
import sys
import textwrap
import types
import unittest
from pathlib import Path
from unittest import mock

import torch_serial_testing
from torch_serial_testing import (
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    import_round_trip_tests,
    instantiate_round_trip_tests,
)

from test.helpers.source_lines import def_lines_of

FILTER_ENV = ("PYTORCH_TESTING_DEVICE_ONLY_FOR", "PYTORCH_TESTING_DEVICE_EXCEPT_FOR")


FAILING_LINE = next(
    i for i, ln in enumerate(Path(__file__).read_text().splitlines(), 1) if ln.endswith("# FAILING LINE")
)


class TestAttributionInProcess(unittest.TestCase):
    """Generated methods point at the author's code: pytest's location and unittest's traceback."""

    def generate(self, base: type = unittest.TestCase):
        class Failing(SerializationRoundTripTestCase, base):  # defined here: never collected
            devices = ("cpu",)
            load_modes = ("weights_only_false",)

            def test_fails_here(self, device):
                self.assertEqual(device, "not-" + device)  # FAILING LINE

        self.author = Failing.__dict__["test_fails_here"].__wrapped__  # under the mixin's wrapper
        scope = {"__name__": __name__, "Failing": Failing}
        env = {k: v for k, v in os.environ.items() if k not in FILTER_ENV}
        with mock.patch.dict(os.environ, env, clear=True):
            (cls,) = instantiate_round_trip_tests(Failing, scope)
        return cls

    def test_pytest_location_is_the_authors_def(self):
        from _pytest._code import getfslineno

        method = self.generate().test_fails_here_weights_only_false_cpu
        path, lineno = getfslineno(method)
        self.assertEqual(Path(path), Path(__file__).resolve())
        self.assertEqual(lineno + 1, def_lines_of(Path(__file__))["test_fails_here"])
        self.assertIs(inspect.unwrap(method), self.author)

    def test_unittest_traceback_holds_the_authors_frame(self):
        # the generated method's frames (the library's, parameterized's) come first; the traceback
        # ends at the author's failing line
        for base in (unittest.TestCase, pytorch_test_case()):
            with self.subTest(base=base.__module__):
                cls = self.generate(base)
                stream = io.StringIO()
                result = unittest.TextTestRunner(stream=stream, verbosity=2).run(
                    unittest.defaultTestLoader.loadTestsFromTestCase(cls)
                )
                self.assertEqual(len(result.failures), 1, stream.getvalue())
                tb = result.failures[0][1]
                frames = [(f, int(n)) for f, n in re.findall(r'File "([^"]+)", line (\d+)', tb)]
                author = (str(Path(__file__).resolve()), FAILING_LINE)
                self.assertIn(author, frames, tb)
                library = str(Path(torch_serial_testing.__file__).parent)
                after = [f for f, _ in frames[frames.index(author) + 1 :]]
                self.assertFalse([f for f in after if f.startswith(library) or "parameterized" in f], tb)


def pytorch_test_case() -> type:
    """pytorch's TestCase (wraps each test method in a policy frame); tests may import it, the library never."""
    from torch.testing._internal.common_utils import TestCase

    return TestCase


class TestImportRoundTripTests(unittest.TestCase):
    """The aggregator helper: whatever the module generated here, never an ImportError from a filter."""

    def module(self, name, **env):
        """A module defining a generic round-trip class (instantiated under *env*) and a plain test class."""
        mod = types.ModuleType(name)
        mod.__file__ = __file__
        source = textwrap.dedent("""
            import unittest
            from torch_serial_testing import SerializationRoundTripTestCase, instantiate_round_trip_tests

            class TestThing(SerializationRoundTripTestCase, unittest.TestCase):
                devices = ("cpu", "cuda")
                load_modes = ("default",)

                def test_x(self, device):
                    pass

            instantiate_round_trip_tests(TestThing, globals())

            class TestPlain(unittest.TestCase):
                def test_y(self):
                    pass
        """)
        base = {k: v for k, v in os.environ.items() if k not in FILTER_ENV}
        with mock.patch.dict(os.environ, {**base, **env}, clear=True):
            exec(compile(source, f"<{name}>", "exec"), mod.__dict__)
        sys.modules[name] = mod
        self.addCleanup(sys.modules.pop, name, None)
        return mod

    def test_every_filter(self):
        cases = {
            (): ["TestThingCPU", "TestThingCUDA", "TestPlain"],
            (("PYTORCH_TESTING_DEVICE_ONLY_FOR", "cuda"),): ["TestThingCUDA", "TestPlain"],
            (("PYTORCH_TESTING_DEVICE_EXCEPT_FOR", "cpu,cuda"),): ["TestPlain"],
            (("PYTORCH_TESTING_DEVICE_ONLY_FOR", "mps"),): ["TestPlain"],
        }
        for i, (env, expected) in enumerate(cases.items()):
            with self.subTest(env=env):
                name = f"_tst_agg_{i}"
                mod = self.module(name, **dict(env))
                scope = {"__name__": "__main__"}
                classes = import_round_trip_tests(name, scope)
                self.assertEqual([c.__name__ for c in classes], expected)
                self.assertEqual(sorted(k for k in scope if k != "__name__"), sorted(expected))
                for c in classes:
                    self.assertIs(scope[c.__name__], getattr(mod, c.__name__))
                # only the generated classes of one generic; by module object too
                only = import_round_trip_tests(mod, {}, "TestThing")
                self.assertEqual([c.__name__ for c in only], [n for n in expected if n != "TestPlain"])
                suite = unittest.TestSuite(unittest.defaultTestLoader.loadTestsFromTestCase(c) for c in classes)
                per_class = {"TestThingCPU": 1, "TestThingCUDA": 2, "TestPlain": 1}  # cuda: + its _to_cpu twin
                self.assertEqual(suite.countTestCases(), sum(per_class[n] for n in expected))

    def test_errors(self):
        mod = self.module("_tst_agg_err")
        with self.assertRaisesRegex(RoundTripConfigError, r"never passed TestOther .*instantiated there: TestThing"):
            import_round_trip_tests(mod, {}, "TestOther")
        with self.assertRaisesRegex(RoundTripConfigError, r"TestPlain from _tst_agg_err would replace"):
            import_round_trip_tests(mod, {"TestPlain": object()})
        with self.assertRaisesRegex(RoundTripConfigError, r"defines no unittest\.TestCase class"):
            import_round_trip_tests("json", {})
        with self.assertRaises(ModuleNotFoundError):  # a typo stays a real import error
            import_round_trip_tests("_tst_no_such_module", {})
        with self.assertRaisesRegex(RoundTripConfigError, "needs a module or its dotted name"):
            import_round_trip_tests(None, {})  # type: ignore[arg-type]


if __name__ == "__main__":
    unittest.main()
