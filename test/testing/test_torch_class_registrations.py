"""Every safe-globals registration is judged like a declaration, torch's own classes included.

``torch.jit.CompilationUnit`` is a class torch defines, and a weights-only load that may build it runs
TorchScript: refused as a declaration, it must not stand as a registration either -- registered in a
test body, by a module imported during a test, through a ``safe_globals`` context left open, or before
the test started.  Only what torch's own modules register themselves (``torch._dynamo``'s
``_DimRange``), under its own name and as the very object, is torch's responsibility.
"""

from __future__ import annotations

import unittest
from typing import Any

import torch

from torch_serial_testing import LeakedGlobalStateError, RoundTripConfigError, SerializationRoundTripTestCase
from torch_serial_testing.isolation import judge_registration
from torch_serial_testing.registry import preserved_registry, snapshot_registry

from test.helpers.isolation_fixtures import run_tests
from test.torch_facts import test_import_registrations as imports

COMPILATION_UNIT = "torch.jit.CompilationUnit"


def _names() -> set[str]:
    return {getattr(g, "__qualname__", repr(g)) for g in torch.serialization.get_safe_globals()}


class TestJudgement(unittest.TestCase):
    def test_torch_classes_that_run_code_are_refused(self) -> None:
        for obj in (torch.jit.CompilationUnit, torch._C.ScriptFunction, torch.jit.ScriptModule):
            with self.subTest(obj=obj):
                reason = judge_registration(obj)
                self.assertIsNotNone(reason)
                self.assertRegex(reason, r"torch\.jit")

    def test_a_harmless_torch_class_passes(self) -> None:
        self.assertIsNone(judge_registration(torch.nn.Linear))

    def test_torch_own_registration_is_torch_responsibility(self) -> None:
        import torch._dynamo.decorators as decorators

        dim_range = getattr(decorators, "_DimRange", None)
        if dim_range is None or dim_range not in torch.serialization.get_safe_globals():
            self.skipTest("this torch's torch._dynamo registers no _DimRange")
        self.assertIsNotNone(judge_registration((dim_range, "x._DimRange")), "renamed: not torch's registration")
        self.assertIsNone(judge_registration(dim_range))  # denylisted family, but torch registers it itself

    def test_forged_names_do_not_borrow_torch_registration(self) -> None:
        import torch._dynamo.decorators as decorators

        dim_range = getattr(decorators, "_DimRange", None)
        if dim_range is None:
            self.skipTest("this torch's torch._dynamo has no _DimRange")
        # another object under the name torch registers
        self.assertIsNotNone(judge_registration((torch.jit.CompilationUnit, "torch._dynamo.decorators._DimRange")))


class TestRegisteredInTheTest(unittest.TestCase):
    def setUp(self) -> None:
        self.registry = set(snapshot_registry())

    def tearDown(self) -> None:
        self.assertEqual(set(snapshot_registry()), self.registry)

    def run_hostile(self, fn: Any) -> str:
        seen: list[Any] = []

        class Registers(SerializationRoundTripTestCase, unittest.TestCase):
            def test_registers(self) -> None:
                fn()

            def test_next(self) -> None:
                seen.append(_names())

        result = run_tests(Registers("test_registers"), Registers("test_next"))
        self.assertEqual(result.errors, [])
        self.assertEqual(len(result.failures), 1, result.failures)
        self.assertEqual(len(seen), 1)
        self.assertNotIn("CompilationUnit", seen[0])
        message = result.failures[0][1]
        self.assertIn(LeakedGlobalStateError.__name__, message)
        return message

    def test_add_safe_globals_is_a_leak_naming_the_refusal(self) -> None:
        message = self.run_hostile(lambda: torch.serialization.add_safe_globals([torch.jit.CompilationUnit]))
        self.assertIn(f"added ['{COMPILATION_UNIT}']", message)
        self.assertRegex(message, rf"{COMPILATION_UNIT} is refused as a safe global: torch\.jit")
        self.assertIn("torch.serialization.safe_globals([...]) block", message)

    def test_safe_globals_context_left_open(self) -> None:
        def fn() -> None:
            torch.serialization.safe_globals([torch.jit.CompilationUnit]).__enter__()

        message = self.run_hostile(fn)
        self.assertIn(f"added ['{COMPILATION_UNIT}']", message)

    def test_private_add_is_a_leak_too(self) -> None:
        message = self.run_hostile(
            lambda: torch._weights_only_unpickler._add_safe_globals([(torch.jit.CompilationUnit, "a.Harmless")])
        )
        self.assertIn("added ['a.Harmless']", message)
        self.assertRegex(message, r"a\.Harmless is refused as a safe global")

    def test_registry_set_rebound(self) -> None:
        def fn() -> None:
            wou = torch._weights_only_unpickler
            wou._marked_safe_globals_set = wou._marked_safe_globals_set | {torch.jit.CompilationUnit}

        message = self.run_hostile(fn)
        self.assertIn(f"added ['{COMPILATION_UNIT}']", message)


class TestRegisteredBeforeTheTest(unittest.TestCase):
    def test_torch_class_registered_at_collection_time_errors_in_setup(self) -> None:
        class Probe(SerializationRoundTripTestCase, unittest.TestCase):
            def test_probe(self) -> None:
                pass

        with preserved_registry():
            torch.serialization.add_safe_globals([torch.jit.CompilationUnit])
            result = run_tests(Probe("test_probe"))
        self.assertEqual(len(result.errors), 1, result.failures)
        message = result.errors[0][1]
        self.assertIn(RoundTripConfigError.__name__, message)
        self.assertIn("registered before this test", message)
        self.assertRegex(message, rf"{COMPILATION_UNIT}: torch\.jit")


class TestRegisteredByAnImport(imports.ImportCase):
    check_refused = imports.TestImportTimeRegistrations.check_refused

    def test_compilation_unit_is_refused(self) -> None:
        self.check_refused(
            """
            import torch
            torch.serialization.add_safe_globals([torch.jit.CompilationUnit])
            """,
            COMPILATION_UNIT,
            r"torch\.jit",
        )

    def test_script_function_is_refused(self) -> None:
        self.check_refused(
            """
            import torch
            torch.serialization.add_safe_globals([torch._C.ScriptFunction])
            """,
            "torch.jit.ScriptFunction",
            r"torch\.jit",
        )

    def test_torch_class_under_a_borrowed_torch_name_is_refused(self) -> None:
        self.check_refused(
            """
            import torch
            torch.serialization.add_safe_globals([(torch.jit.CompilationUnit, "torch.nn.Linear")])
            """,
            "torch.nn.Linear",
            r"it is torch\.jit\.CompilationUnit: torch\.jit",
        )


if __name__ == "__main__":
    unittest.main()
