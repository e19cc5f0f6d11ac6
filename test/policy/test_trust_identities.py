"""Smuggled identities (issue #11.3): ``(obj, "harmless.Name")`` declarations.

A declaration is accepted only when ``obj`` is a class and the name resolves, among
modules already imported, to that very object; ``__qualname__``/``__module__`` are never
taken on trust.  Every public way of declaring a global goes through the same check.
"""

from __future__ import annotations

import functools
import operator
import os
import sys
import unittest
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import torch  # noqa: E402

from test.helpers import hostile_checkpoints as H  # noqa: E402
import torch_serial_testing as tst  # noqa: E402
from torch_serial_testing import Checkpoint, RoundTripConfigError, SerializationRoundTripTestCase
from torch_serial_testing.declarations import SafeGlobal, as_safe_globals, normalize_safe_globals
from torch_serial_testing.tools.policy.trust import judge_global

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP  # noqa: E402


def _forged(obj: Any, module: str, qualname: str) -> Any:
    obj.__module__, obj.__qualname__ = module, qualname
    return obj


def _function() -> None:
    """A harmless module-level function."""


class Callable:
    def __call__(self, *args: Any) -> None:
        pass


class LooksLikeLinear:
    """A class that claims to be torch.nn.Linear."""


LooksLikeLinear.__module__, LooksLikeLinear.__qualname__ = "torch.nn", "Linear"


#: (object, name) declarations that must be refused, by what each smuggles.
SMUGGLED = {
    "partial": (functools.partial(os.system, "echo pwned"), "harmless.Name"),
    "partial with forged names": (_forged(functools.partial(os.system, "x"), "torch.nn", "Linear"), "torch.nn.Linear"),
    "methodcaller": (operator.methodcaller("system", "echo pwned"), "torch.nn.Linear"),
    "attrgetter": (operator.attrgetter("system"), "torch.Size"),
    "bound __call__ of a builtin": (os.system.__call__, "harmless.Name"),
    "bound __call__ of print": (print.__call__, "torch.nn.Linear"),
    "module": (os, "mymod.Safe"),
    "torch submodule": (torch.nn, "torch.nn"),
    "function under a class name": (_forged(lambda: None, "torch.nn", "Linear"), "torch.nn.Linear"),
    "harmless function": (_function, f"{__name__}._function"),
    "builtin function": (len, "builtins.len"),
    "bound method": (torch.ones(1).add_, "torch.Tensor.add_"),
    "callable instance": (Callable(), f"{__name__}.Callable"),
    "staticmethod object": (staticmethod(_function), "harmless.Name"),
    "class with forged qualname": (LooksLikeLinear, "torch.nn.Linear"),
    "class under another class's name": (torch.nn.Linear, "torch.nn.Conv2d"),
    "builtin class under another name": (set, "builtins.frozenset"),
    "class under an unverifiable name": (torch.nn.Linear, "not_imported_anywhere.Linear"),
    "class under an absent name": (torch.nn.Linear, "torch.nn.NoSuchLayer"),
    "dangerous class under a harmless name": (__import__("subprocess").Popen, "torch.nn.Linear"),
    "os.system under its own module name": (os.system, "torch.nn.Linear"),
}

#: Declarations that must keep working: classes under a name that resolves to them.
GENUINE = {
    "class": torch.nn.Linear,
    "class by alias": (torch.nn.Linear, "torch.nn.Linear"),
    "class by its module path": (torch.nn.Linear, "torch.nn.modules.linear.Linear"),
    "string": "torch.nn.Linear",
    "builtin class": set,
    "ScriptObject": torch.ScriptObject,
    "module-level test class": (Callable, f"{__name__}.Callable"),
}


class TestSmuggledIdentities(unittest.TestCase):
    def test_judge_global_refuses_each(self) -> None:
        for label, (obj, name) in SMUGGLED.items():
            with self.subTest(label):
                reason = judge_global(obj, name)
                self.assertIsNotNone(reason)
                self.assertIsNotNone(judge_global((obj, name)))

    def test_declarations_are_refused_everywhere(self) -> None:
        for label, (obj, name) in SMUGGLED.items():
            entry = (obj, name)
            with self.subTest(label, via="normalize_safe_globals"):
                with self.assertRaisesRegex(RoundTripConfigError, "refusing to allowlist"):
                    normalize_safe_globals([entry])
            with self.subTest(label, via="SafeGlobal"):
                with self.assertRaisesRegex(RoundTripConfigError, "refusing to allowlist"):
                    as_safe_globals([SafeGlobal(obj, name, explicit_name=True)])
            with self.subTest(label, via="class creation"):
                with self.assertRaisesRegex(RoundTripConfigError, "refusing to allowlist"):
                    type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": (entry,)})

    def test_refusal_names_what_was_declared(self) -> None:
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["partial"]])
        self.assertIn("functools.partial", str(cm.exception))
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["class with forged qualname"]])
        self.assertIn("resolves to a class, not to the declared object", str(cm.exception))
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["bound __call__ of a builtin"]])
        self.assertIn("posix.system", str(cm.exception))
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["module"]])
        self.assertIn("the module os", str(cm.exception))

    def test_tuple_names_are_imported_like_string_declarations(self) -> None:
        # An author's (class, name) whose module is not imported yet is verified after importing
        # it, as a 'module.Name' string declaration would be; the identity must still match.
        import importlib
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            with open(os.path.join(tmp, "tst_alias_home.py"), "w") as fh:
                fh.write("class Moved:\n    pass\n")
            with open(os.path.join(tmp, "tst_alias_old.py"), "w") as fh:
                fh.write("from tst_alias_home import Moved\n")
            sys.path.insert(0, tmp)
            try:
                moved = importlib.import_module("tst_alias_home").Moved
                self.assertNotIn("tst_alias_old", sys.modules)
                (sg,) = normalize_safe_globals([(moved, "tst_alias_old.Moved")])
                self.assertEqual((sg.obj, sg.name, sg.explicit_name), (moved, "tst_alias_old.Moved", True))
                with self.assertRaisesRegex(RoundTripConfigError, "not to the declared object"):
                    normalize_safe_globals([(torch.nn.Linear, "tst_alias_old.Moved")])
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("tst_alias_home", None)
                sys.modules.pop("tst_alias_old", None)
        with self.assertRaisesRegex(RoundTripConfigError, "cannot verify"):
            normalize_safe_globals([(torch.nn.Linear, "tst_no_such_module_anywhere.Linear")])

    def test_plain_objects_without_names_are_refused(self) -> None:
        for obj in (functools.partial(print), operator.methodcaller("x"), os, print.__call__, Callable()):
            with self.subTest(obj=obj):
                with self.assertRaisesRegex(RoundTripConfigError, "refusing to allowlist"):
                    normalize_safe_globals([obj])

    def test_genuine_declarations_still_work(self) -> None:
        for label, entry in GENUINE.items():
            with self.subTest(label):
                (sg,) = normalize_safe_globals([entry])
                obj = entry[0] if isinstance(entry, tuple) else entry
                if not isinstance(entry, str):
                    self.assertIs(sg.obj, obj)
                self.assertIsNone(judge_global(sg.obj, sg.name))

    def test_doctor_judges_registered_objects(self) -> None:
        from torch_serial_testing.registry import preserved_registry
        from torch_serial_testing.tools.cli.doctor import doctor_report

        with preserved_registry():
            clean = [p for p in doctor_report()["problems"] if "trust policy" in p]
            self.assertEqual(clean, [])  # torch's own registrations (e.g. _rebuild_njt) pass
            torch.serialization.add_safe_globals([SMUGGLED["partial"], SMUGGLED["module"], torch.nn.Linear])
            problems = [p for p in doctor_report()["problems"] if "trust policy" in p]
        self.assertEqual(len(problems), 2, problems)
        self.assertTrue(any("functools.partial" in p for p in problems))
        self.assertTrue(any("the module os" in p for p in problems))

    def test_load_with_a_smuggled_identity_never_runs_it(self) -> None:
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        import tempfile

        with tempfile.TemporaryDirectory() as tmp:
            sentinel = os.path.join(tmp, "ran")
            data = H.torch_zip(
                H.proto(2) + H.call1(H.glob("harmless", "Name"), H.ustr(f"echo x >> {sentinel}")) + H.STOP
            )
            for obj in (functools.partial(os.system), os.system.__call__, operator.methodcaller("system")):
                with self.subTest(obj=obj):
                    with self.assertRaisesRegex(RoundTripConfigError, "refusing to allowlist"):
                        tst.load(Checkpoint.from_bytes(data), "safe_globals", [SafeGlobal(obj, "harmless.Name", True)])
            self.assertFalse(os.path.exists(sentinel))


if __name__ == "__main__":
    unittest.main()
