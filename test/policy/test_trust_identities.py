"""Smuggled identities (issue #11.3): ``(obj, "harmless.Name")`` declarations.

The tools' trust policy (``judge_global``: what ``inspect``, ``audit`` and snippets use for bytes from
strangers) accepts a global only when ``obj`` is a class and the name resolves, among modules already
imported, to that very object; ``__qualname__``/``__module__`` are never taken on trust.

A test author's declaration gets the small check only (issue 37), the same on every public way of
declaring a global: modules and known code-running callables are refused, however they are named or
wrapped (a ``functools.partial``, an ``operator.methodcaller``, a bound ``__call__``); an
``(obj, 'module.Name')`` pair is otherwise taken as the author says, as torch takes it.
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


#: (object, name) declarations the tools' policy must refuse, by what each smuggles.
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

#: The smuggled declarations the small check refuses too, and how (the others are the author's to trust).
CODE_RUNNING = "runs code or reaches the system when a pickle calls it"
MODULE = "a pickle names globals in modules, never a module itself"
REFUSED_DECLARATIONS = {
    "partial": f"^refusing to allowlist harmless.Name: functools.partial {CODE_RUNNING}$",
    "partial with forged names": f"^refusing to allowlist torch.nn.Linear: functools.partial {CODE_RUNNING}$",
    "methodcaller": f"^refusing to allowlist torch.nn.Linear: operator.methodcaller {CODE_RUNNING}$",
    "attrgetter": f"^refusing to allowlist torch.Size: operator.attrgetter {CODE_RUNNING}$",
    "bound __call__ of a builtin": f"^refusing to allowlist harmless.Name: posix.system {CODE_RUNNING}$",
    "module": f"^refusing to allowlist mymod.Safe: it is the module 'os': {MODULE}$",
    "torch submodule": f"^refusing to allowlist torch.nn: it is the module torch.nn: {MODULE}$",
    "dangerous class under a harmless name": f"^refusing to allowlist torch.nn.Linear: subprocess.Popen {CODE_RUNNING}$",
    "os.system under its own module name": f"^refusing to allowlist torch.nn.Linear: posix.system {CODE_RUNNING}$",
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

    def test_declarations_are_judged_alike_everywhere(self) -> None:
        self.assertLess(set(REFUSED_DECLARATIONS), set(SMUGGLED))
        for label, (obj, name) in SMUGGLED.items():
            entry = (obj, name)
            refusal = REFUSED_DECLARATIONS.get(label)
            declared = (SafeGlobal(obj, name, explicit_name=True),)
            with self.subTest(label, via="normalize_safe_globals"):
                if refusal:
                    with self.assertRaisesRegex(RoundTripConfigError, refusal):
                        normalize_safe_globals([entry])
                else:  # taken as the author says, as torch takes an (obj, name) pair
                    self.assertEqual(normalize_safe_globals([entry]), declared)
            with self.subTest(label, via="SafeGlobal"):
                if refusal:
                    with self.assertRaisesRegex(RoundTripConfigError, refusal):
                        as_safe_globals([SafeGlobal(obj, name, explicit_name=True)])
                else:
                    self.assertEqual(as_safe_globals(list(declared)), declared)
            with self.subTest(label, via="class creation"):
                if refusal:
                    with self.assertRaisesRegex(RoundTripConfigError, refusal):
                        type("Bad", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": (entry,)})
                else:
                    cls = type(
                        "Trusted", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": (entry,)}
                    )
                    self.assertEqual(cls._tst_safe_globals, declared)

    def test_refusal_names_what_was_declared(self) -> None:
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["partial"]])
        self.assertIn("functools.partial", str(cm.exception))
        with self.assertRaises(RoundTripConfigError) as cm:  # its forged name, not a pair: checked by importing it
            normalize_safe_globals([LooksLikeLinear])
        self.assertEqual(
            str(cm.exception),
            "refusing to allowlist torch.nn.Linear: torch.nn.Linear resolves to another object: a pickle names it "
            "by its module and qualified name, so declare it as (LooksLikeLinear, '<the name the checkpoint uses>')",
        )
        self.assertIn(
            "resolves to a class, not to the declared object", judge_global(*SMUGGLED["class with forged qualname"])
        )
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["bound __call__ of a builtin"]])
        self.assertIn("posix.system", str(cm.exception))
        with self.assertRaises(RoundTripConfigError) as cm:
            normalize_safe_globals([SMUGGLED["module"]])
        self.assertIn("the module 'os'", str(cm.exception))

    def test_tuple_names_are_taken_as_the_author_says(self) -> None:
        # An author's (class, name) is what torch matches: the name is neither imported nor resolved
        # (a class pickled under an old module path); a 'module.Name' string is imported to find the
        # object.  The tools' policy verifies the name against the object, among modules imported.
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
                self.assertEqual(sg, SafeGlobal(moved, "tst_alias_old.Moved", True))
                (sg,) = normalize_safe_globals([(torch.nn.Linear, "tst_alias_old.Moved")])
                self.assertEqual(sg, SafeGlobal(torch.nn.Linear, "tst_alias_old.Moved", True))
                self.assertNotIn("tst_alias_old", sys.modules)
                self.assertRegex(judge_global(moved, "tst_alias_old.Moved"), "^cannot verify that tst_alias_old.Moved")
                (sg,) = normalize_safe_globals(["tst_alias_old.Moved"])  # a string: imported
                self.assertEqual(sg, SafeGlobal(moved, "tst_alias_old.Moved", True))
                self.assertIsNone(judge_global(moved, "tst_alias_old.Moved"))
                self.assertIn("not to the declared object", judge_global(torch.nn.Linear, "tst_alias_old.Moved"))
            finally:
                sys.path.remove(tmp)
                sys.modules.pop("tst_alias_home", None)
                sys.modules.pop("tst_alias_old", None)
        entry = (torch.nn.Linear, "tst_no_such_module_anywhere.Linear")
        self.assertEqual(normalize_safe_globals([entry]), (SafeGlobal(*entry, True),))
        self.assertRegex(judge_global(entry), "^cannot verify that tst_no_such_module_anywhere.Linear")
        with self.assertRaisesRegex(
            RoundTripConfigError,
            "^safe global 'tst_no_such_module_anywhere.Linear' is not importable; fix the spelling",
        ):
            normalize_safe_globals(["tst_no_such_module_anywhere.Linear"])

    def test_plain_objects_without_names_are_refused(self) -> None:
        for obj in (functools.partial(print), operator.methodcaller("x"), print.__call__, Callable()):
            with self.subTest(obj=obj):
                self.assertIsNotNone(judge_global(obj))
                with self.assertRaisesRegex(
                    RoundTripConfigError,
                    r"^refusing to allowlist .*: it has no __module__/__qualname__ of its own; declare a class or "
                    r"function itself, a 'module.Name' string, or an \(object, 'module.Name'\) tuple$",
                ):
                    normalize_safe_globals([obj])
        # a module has no name of its own either, but the message says what it is
        self.assertIsNotNone(judge_global(os))
        with self.assertRaisesRegex(
            RoundTripConfigError,
            r"^refusing to allowlist 'os': it is the module 'os': a pickle names globals in modules, never a module itself$",
        ):
            normalize_safe_globals([os])

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
            for obj, runs in (
                (functools.partial(os.system), "functools.partial"),
                (os.system.__call__, "posix.system"),
                (operator.methodcaller("system"), "operator.methodcaller"),
            ):
                with self.subTest(obj=obj):
                    with self.assertRaisesRegex(
                        RoundTripConfigError, f"^refusing to allowlist harmless.Name: {runs} {CODE_RUNNING}$"
                    ):
                        tst.load(Checkpoint.from_bytes(data), "safe_globals", [SafeGlobal(obj, "harmless.Name", True)])
            self.assertFalse(os.path.exists(sentinel))


class TestTheDeclarationCheck(unittest.TestCase):
    """The small check on a test author's own declarations (issue 37), next to the tools' verdicts."""

    def test_torch_testing_two_tensor_is_declarable(self) -> None:
        from torch.testing._internal.two_tensor import TwoTensor

        name = "torch.testing._internal.two_tensor.TwoTensor"
        for entry in (TwoTensor, name):
            with self.subTest(entry=entry):
                self.assertEqual(normalize_safe_globals([entry]), (SafeGlobal(TwoTensor, name),))

        class DeclaresTwoTensor(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (TwoTensor,)

            def runTest(self) -> None:  # noqa: N802
                pass

        self.assertEqual(DeclaresTwoTensor._tst_safe_globals, (SafeGlobal(TwoTensor, name),))
        # the tools, judging bytes from strangers, still refuse it (torch.testing runs code)
        self.assertEqual(judge_global(TwoTensor), "torch.testing compiles, imports or runs code")
        if SAFE_GLOBALS_SKIP:
            return
        probe = DeclaresTwoTensor()
        probe.setUp()
        try:
            loaded = probe.round_trip(TwoTensor(torch.ones(2), torch.zeros(2)), mode="safe_globals")
        finally:
            probe.doCleanups()
        self.assertIs(type(loaded), TwoTensor)
        self.assertEqual((loaded.a.tolist(), loaded.b.tolist()), ([1.0, 1.0], [0.0, 0.0]))

    def test_a_plain_function_is_declarable_without_unsafe_callable(self) -> None:
        name = f"{__name__}._function"
        for entry in (_function, name):
            with self.subTest(entry=entry):
                self.assertEqual(normalize_safe_globals([entry]), (SafeGlobal(_function, name),))
        self.assertIn("only UnsafeCallable", judge_global(_function) or "")  # the tools ask for the opt-in

    def test_code_running_callables_under_a_harmless_name_are_refused(self) -> None:
        for obj, runs in ((os.system, "posix.system"), (eval, "builtins.eval"), (exec, "builtins.exec")):
            for entry in ((obj, "mymod.Safe"), SafeGlobal(obj, "mymod.Safe", True)):
                with self.subTest(entry=entry):
                    with self.assertRaisesRegex(
                        RoundTripConfigError, f"^refusing to allowlist mymod.Safe: {runs} {CODE_RUNNING}$"
                    ):
                        normalize_safe_globals([entry])

    def test_code_running_objects_are_refused_by_their_own_identity(self) -> None:
        # declared as objects, these carry a module and qualified name other than the public one the
        # check lists (builtins.open is io.open; importlib._bootstrap is _frozen_importlib ...)
        import importlib._bootstrap

        for obj, own in (
            (open, "io.open"),
            (torch.jit.load, "torch.jit._serialization.load"),
            (torch.package.PackageImporter, "torch.package.package_importer.PackageImporter"),
            (importlib._bootstrap._gcd_import, "_frozen_importlib._gcd_import"),
        ):
            for entry in (obj, (obj, "mymod.Safe")):
                with self.subTest(entry=entry):
                    declared = own if entry is obj else "mymod.Safe"
                    with self.assertRaisesRegex(
                        RoundTripConfigError, f"^refusing to allowlist {declared}: {own} {CODE_RUNNING}$"
                    ):
                        normalize_safe_globals([entry])
                    self.assertIsNotNone(judge_global(obj))

    def test_function_local_classes_are_refused(self) -> None:
        class Local:
            pass

        with self.assertRaisesRegex(
            RoundTripConfigError,
            r"^refusing to allowlist '.*<locals>.Local': safe global '.*<locals>.Local' is not a dotted Python "
            r"name \(part '<locals>' is not a Python identifier\)",
        ):
            normalize_safe_globals([Local])
        with self.assertRaisesRegex(
            RoundTripConfigError,
            r"^DeclaresLocal.safe_globals lists .*<locals>.Local, which is not importable: .* is defined inside a "
            r"function \('<locals>' in its name\)",
        ):
            type("DeclaresLocal", (SerializationRoundTripTestCase, unittest.TestCase), {"safe_globals": (Local,)})


if __name__ == "__main__":
    unittest.main()
