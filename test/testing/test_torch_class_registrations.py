"""Registrations of torch's own classes: who made them decides, not what they are.

``torch.jit.CompilationUnit`` is a class torch defines, and a weights-only load that may build it runs
TorchScript.  The mixin no longer judges registrations by a trust policy (that analysis belongs to the
tools, which judge bytes from strangers); what decides is who registered an entry, and when:

* the test's own code registering it and not undoing it -- ``add_safe_globals``, a ``safe_globals``
  context left open, torch's private add, a rebound registry set -- is a leak, whatever the entry:
  ``LeakedGlobalStateError``, the registry restored for the next test;
* registered before the test (at collection time, by whoever) is not the test's change: the test runs
  and passes, nothing is said, the entry stays;
* registered by a module imported during the test is kept, and named in verbose output;
* registered by code in torch's own modules (``torch._dynamo``'s ``_DimRange``, a ``torch.*`` module
  imported lazily during a test) is torch's doing: kept, silently.

Who registered what is noted from the caller of torch's ``_add_safe_globals`` while a test runs: no child
interpreter is asked, neither at the first test nor when the set of imported torch modules grows.

A class of torch's may also be declared (``safe_globals``): the declaration is then judged only against
what the checkpoint needs.
"""

from __future__ import annotations

import os
import subprocess
import sys
import unittest
from typing import Any
from unittest import mock

import torch

from torch_serial_testing import LeakedGlobalStateError, SerializationRoundTripTestCase
from torch_serial_testing.declarations import declaration_problem, normalize_safe_globals
from torch_serial_testing.errors import AllowlistError
from torch_serial_testing.registry import preserved_registry, registered_by_torch, registrar, snapshot_registry

from test.helpers.isolation_fixtures import run_tests
from test.helpers.roundtrip_fixtures import DEFAULT_REASON, RUNNABLE_MODES, SAFE_GLOBALS_SKIP
from test.torch_facts import test_import_registrations as imports

COMPILATION_UNIT = "torch.jit.CompilationUnit"


def registry_leak(added: str) -> str:
    """The leak line of a test that left *added* (a repr'd name) in the registry."""
    return (
        f"leaked global state (now restored): safe-globals registry changed (added [{added}], removed []); "
        "declare what a load needs (safe_globals), or register inside a torch.serialization.safe_globals([...]) "
        "block\n"
    )


class TestRegisteredInTheTest(unittest.TestCase):
    def setUp(self) -> None:
        self.registry = set(snapshot_registry())

    def tearDown(self) -> None:
        self.assertEqual(set(snapshot_registry()), self.registry)

    def run_hostile(self, fn: Any) -> str:
        """Run a test calling *fn*, then a clean test; the first fails as a leak (its traceback), the
        second starts without CompilationUnit registered."""
        seen: list[Any] = []

        class Registers(SerializationRoundTripTestCase, unittest.TestCase):
            def test_registers(self) -> None:
                fn()

            def test_next(self) -> None:
                seen.append(snapshot_registry())

        result = run_tests(Registers("test_registers"), Registers("test_next"))
        self.assertEqual(result.errors, [])
        self.assertEqual(len(result.failures), 1, result.failures)
        failed, message = result.failures[0]
        self.assertEqual(failed.id().rsplit(".", 1)[-1], "test_registers")
        self.assertIn(f"{LeakedGlobalStateError.__name__}: {failed.id()} leaked global state", message)
        self.assertEqual(len(seen), 1)
        self.assertEqual(set(seen[0]), self.registry)
        return message

    def test_add_safe_globals_is_a_leak(self) -> None:
        message = self.run_hostile(lambda: torch.serialization.add_safe_globals([torch.jit.CompilationUnit]))
        self.assertIn(registry_leak(f"'{COMPILATION_UNIT}'"), message)
        self.assertNotIn("refused", message)  # not judged: a leak like any other registration

    def test_safe_globals_context_left_open(self) -> None:
        if SAFE_GLOBALS_SKIP:  # torch < 2.5 has no such context
            self.skipTest(SAFE_GLOBALS_SKIP)

        def fn() -> None:
            torch.serialization.safe_globals([torch.jit.CompilationUnit]).__enter__()

        self.assertIn(registry_leak(f"'{COMPILATION_UNIT}'"), self.run_hostile(fn))

    def test_private_add_is_a_leak_too(self) -> None:
        message = self.run_hostile(
            lambda: torch._weights_only_unpickler._add_safe_globals([(torch.jit.CompilationUnit, "a.Harmless")])
        )
        self.assertIn(registry_leak("'a.Harmless'"), message)

    def test_registry_set_rebound(self) -> None:
        def fn() -> None:
            wou = torch._weights_only_unpickler
            wou._marked_safe_globals_set = wou._marked_safe_globals_set | {torch.jit.CompilationUnit}

        if not isinstance(getattr(torch._weights_only_unpickler, "_marked_safe_globals_set", None), set):
            self.skipTest("this torch keeps its registry in a list (torch < 2.5)")
        self.assertIn(registry_leak(f"'{COMPILATION_UNIT}'"), self.run_hostile(fn))

    def test_the_leaking_call_is_attributed_to_the_test(self) -> None:
        # The recorder names the test's module (past torch's own serialization frames), not at import.
        self.run_hostile(lambda: torch.serialization.add_safe_globals([torch.jit.CompilationUnit]))
        self.assertEqual(registrar(torch.jit.CompilationUnit), (__name__, False))
        # The replaced-loader note's view: a torch class, yet registered by the test, not by torch.
        self.assertFalse(registered_by_torch(torch.jit.CompilationUnit))

    def test_registered_and_undone_in_the_test_is_no_leak(self) -> None:
        class Undoes(SerializationRoundTripTestCase, unittest.TestCase):
            def test_in_a_block(self) -> None:
                if SAFE_GLOBALS_SKIP:
                    self.skipTest(SAFE_GLOBALS_SKIP)
                with torch.serialization.safe_globals([torch.jit.CompilationUnit]):
                    self.assertIn(torch.jit.CompilationUnit, torch.serialization.get_safe_globals())

            def test_removed_again(self) -> None:
                with preserved_registry():
                    torch.serialization.add_safe_globals([torch.jit.CompilationUnit])

        result = run_tests(Undoes("test_in_a_block"), Undoes("test_removed_again"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(result.testsRun, 2)


class TestRegisteredBeforeTheTest(imports.ImportCase):
    def test_a_torch_class_registered_at_collection_time_is_not_judged(self) -> None:
        ran: list[bool] = []

        class Probe(SerializationRoundTripTestCase, unittest.TestCase):
            def test_probe(self) -> None:
                ran.append(torch.jit.CompilationUnit in torch.serialization.get_safe_globals())
                state = {"w": torch.arange(3.0)}
                self.assertRoundTripEqual(self.round_trip(state, mode="weights_only_false"), state)

        torch.serialization.add_safe_globals([torch.jit.CompilationUnit])  # ImportCase restores the registry
        result, out = self.run_verbose(Probe("test_probe"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(ran, [True])
        self.assertEqual(
            imports.verbose_lines(out),
            ["... weights_only_false: loaded as expected (weights_only=False explicit) ... ok"],
        )
        self.assertIn(torch.jit.CompilationUnit, torch.serialization.get_safe_globals())


class TestRegisteredByAnImport(imports.ImportCase):
    def check_kept(self, body: str, name: str, entry: Any) -> None:
        """A helper module registering at its import, imported in a test: the test passes, the entry is
        kept and named once in verbose output."""
        module = self.helper(body)
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(module, seen)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(imports.verbose_lines(out), [f"... {imports.KEPT}{name} ... ok"])
        self.assertEqual(set(snapshot_registry()), {*self.registry, entry})
        self.assertEqual(registrar(entry), (module, True))

    def test_compilation_unit_is_kept(self) -> None:
        self.check_kept(
            """
            import torch
            torch.serialization.add_safe_globals([torch.jit.CompilationUnit])
            """,
            COMPILATION_UNIT,
            torch.jit.CompilationUnit,
        )

    def test_script_function_is_kept(self) -> None:
        self.check_kept(
            """
            import torch
            torch.serialization.add_safe_globals([torch._C.ScriptFunction])
            """,
            # the key torch's allowlist gives it: __module__ 'torch.jit' + __qualname__ 'torch.jit.ScriptFunction'
            f"{torch._C.ScriptFunction.__module__}.{torch._C.ScriptFunction.__qualname__}",
            torch._C.ScriptFunction,
        )

    def test_a_torch_class_under_a_borrowed_torch_name_is_kept_under_that_name(self) -> None:
        self.check_kept(
            """
            import torch
            torch.serialization.add_safe_globals([(torch.jit.CompilationUnit, "torch.nn.Linear")])
            """,
            "torch.nn.Linear",
            (torch.jit.CompilationUnit, "torch.nn.Linear"),
        )


class TestTorchsOwnRegistration(unittest.TestCase):
    def test_dim_range_is_torchs_registration(self) -> None:
        import torch._dynamo.decorators as decorators

        dim_range = getattr(decorators, "_DimRange", None)
        if dim_range is None or dim_range not in torch.serialization.get_safe_globals():
            self.skipTest("this torch's torch._dynamo registers no _DimRange")
        self.assertTrue(registered_by_torch(dim_range))
        seen = registrar(dim_range)  # recorded only if torch._dynamo was first imported during a test
        self.assertTrue(seen is None or seen[0].startswith("torch."), seen)


class TestNoChildInterpreter(imports.ImportCase):
    def test_a_torch_module_imported_during_round_trips_starts_no_subprocess(self) -> None:
        # Telling torch's registrations from others is asked of the caller, not of a fresh interpreter:
        # not at the first setUp, not when the set of imported torch modules grows.
        name = self.torch_module(
            """
            import torch
            class LazyMeta:
                pass
            torch.serialization.add_safe_globals([LazyMeta])
            """
        )

        class Lazy(SerializationRoundTripTestCase, unittest.TestCase):
            def test_lazy(self) -> None:
                __import__(name)
                for mode in RUNNABLE_MODES:
                    state = {"w": torch.arange(3.0)}
                    self.assertRoundTripEqual(self.round_trip(state, mode=mode), state)

        no_child = AssertionError("a child interpreter")
        with (
            mock.patch.object(subprocess, "Popen", side_effect=no_child) as popen,
            mock.patch.object(os, "posix_spawn", side_effect=no_child, create=True) as spawn,
            mock.patch.object(os, "fork", side_effect=no_child, create=True) as fork,
        ):
            result, out = self.run_verbose(Lazy("test_lazy"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual((popen.call_count, spawn.call_count, fork.call_count), (0, 0, 0))
        reasons = {
            "weights_only_false": "weights_only=False explicit",
            "safe_globals": "weights_only=True explicit",
            "default": DEFAULT_REASON,
        }
        said = " ... ".join(f"{m.value}: loaded as expected ({reasons[m.value]})" for m in RUNNABLE_MODES)
        self.assertEqual(imports.verbose_lines(out), [f"... {said} ... ok"])  # torch's registration: not named
        self.assertIn(sys.modules[name].LazyMeta, snapshot_registry())


class TestDeclaringTorchsClasses(unittest.TestCase):
    """The small check is all a declaration meets at class creation: any class of torch's may be declared."""

    def test_compilation_unit_may_be_declared(self) -> None:
        self.assertIsNone(declaration_problem(torch.jit.CompilationUnit, COMPILATION_UNIT, False))
        self.assertEqual([sg.name for sg in normalize_safe_globals([torch.jit.CompilationUnit])], [COMPILATION_UNIT])

    def test_an_unneeded_torch_class_is_over_trust_in_the_safe_globals_mode_only(self) -> None:
        class Declares(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = (torch.jit.CompilationUnit,)

            def test_safe_globals(self) -> None:
                self.round_trip({"w": torch.ones(2)}, mode="safe_globals")

            def test_weights_only_false(self) -> None:
                self.round_trip({"w": torch.ones(2)}, mode="weights_only_false")

        result = run_tests(Declares("test_safe_globals"), Declares("test_weights_only_false"))
        self.assertEqual(result.errors, [])
        if SAFE_GLOBALS_SKIP:
            self.assertEqual(result.failures, [])
            self.assertEqual([reason for _, reason in result.skipped], [SAFE_GLOBALS_SKIP])
            return
        self.assertEqual([t.id().rsplit(".", 1)[-1] for t, _ in result.failures], ["test_safe_globals"])
        self.assertIn(
            f"{AllowlistError.__name__}: Declares.safe_globals over-trusts: the checkpoint does not need "
            f"{COMPILATION_UNIT}.\n",
            result.failures[0][1],
        )


if __name__ == "__main__":
    unittest.main()
