"""Globals registered with add_safe_globals by module imports go through the danger check.

A module imported during a test may register safe globals at import time (a
device backend, ``torch.distributed.tensor``): harmless ones are kept (they are
not the test's leak) and named in verbose output; dangerous ones -- judged like
a declaration, by name and by real identity -- are never registered, and the
test that imported the module fails saying which module tried what.  A
dangerous entry already in the registry when a test starts (registered at
collection time) makes that test error in ``setUp``.
"""

from __future__ import annotations

import io
import os
import shutil
import sys
import tempfile
import textwrap
import unittest
from typing import Any

import torch

from torch_serial_testing import LeakedGlobalStateError, RoundTripConfigError, SerializationRoundTripTestCase
from torch_serial_testing.errors import qualified_name
from torch_serial_testing.registry import snapshot_registry

from test.helpers.isolation_fixtures import run_tests


def _names() -> set[str]:
    return {qualified_name(g) for g in torch.serialization.get_safe_globals()}


class ImportCase(unittest.TestCase):
    def setUp(self) -> None:
        self.registry = snapshot_registry()
        self.tmp = tempfile.mkdtemp(prefix="tst-import-reg-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        sys.path.insert(0, self.tmp)
        self.addCleanup(sys.path.remove, self.tmp)
        self.counter = 0

    def tearDown(self) -> None:
        self.assertEqual(set(snapshot_registry()), set(self.registry))

    def helper(self, body: str) -> str:
        """Write a helper module with *body* and return its (unique) name."""
        self.counter += 1
        name = f"tst_helper_{os.getpid()}_{id(self)}_{self.counter}"
        with open(os.path.join(self.tmp, name + ".py"), "w") as fh:
            fh.write(textwrap.dedent(body))
        self.addCleanup(sys.modules.pop, name, None)
        return name

    def importing(self, module: str, seen: list[Any]) -> type:
        class Imports(SerializationRoundTripTestCase, unittest.TestCase):
            def test_import(self) -> None:
                __import__(module)
                seen.append(set(_names()))

        return Imports


class TestImportTimeRegistrations(ImportCase):
    def check_refused(self, body: str, refused: str, reason: str) -> None:
        name = self.helper(body)
        seen: list[Any] = []
        result = run_tests(self.importing(name, seen)("test_import"))
        self.assertEqual(result.errors, [])
        self.assertEqual(len(result.failures), 1, result.failures)
        message = result.failures[0][1]
        self.assertIn(LeakedGlobalStateError.__name__, message)
        self.assertRegex(message, r"refused safe globals registered by modules imported during the test")
        self.assertIn(refused, message)
        self.assertRegex(message, reason)
        self.assertIn(f"add_safe_globals in {name}", message)
        self.assertEqual(len(seen), 1)
        self.assertNotIn(refused.split(" ")[0], seen[0])  # never registered, not even during the test

    def test_builtins_exec_is_refused(self) -> None:
        self.check_refused(
            """
            import torch
            torch.serialization.add_safe_globals([exec])
            """,
            "builtins.exec",
            r"runs code",
        )

    def test_smuggled_under_a_harmless_name_is_refused(self) -> None:
        self.check_refused(
            """
            import os, torch
            torch.serialization.add_safe_globals([(os.system, "helpers.Safe")])
            """,
            "helpers.Safe",
            r"it is (posix|nt)\.system",
        )

    def test_mixed_list_keeps_the_harmless_entry(self) -> None:
        name = self.helper(
            """
            import torch
            class Harmless:
                pass
            torch.serialization.add_safe_globals([Harmless, eval])
            """
        )
        seen: list[Any] = []
        result = run_tests(self.importing(name, seen)("test_import"))
        self.assertEqual(len(result.failures), 1)
        self.assertIn("builtins.eval", result.failures[0][1])
        self.assertIn(f"{name}.Harmless", seen[0])
        self.assertNotIn("builtins.eval", seen[0])
        self.assertIn(f"{name}.Harmless", _names())  # kept after the test, like a backend's
        self.assertNotIn("builtins.eval", _names())
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(self.registry)

    def test_harmless_registration_is_kept_and_named_in_verbose_output(self) -> None:
        name = self.helper(
            """
            import torch
            class BackendMeta:
                pass
            torch.serialization.add_safe_globals([BackendMeta])
            """
        )
        seen: list[Any] = []
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(self.importing(name, seen)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertIn(f"kept safe globals registered at import time: {name}.BackendMeta ... ok", stream.getvalue())
        self.assertIn(f"{name}.BackendMeta", _names())
        torch.serialization.clear_safe_globals()
        torch.serialization.add_safe_globals(self.registry)

    def test_registration_in_the_test_body_is_a_leak_not_an_import(self) -> None:
        class Registers(SerializationRoundTripTestCase, unittest.TestCase):
            def test_register(self) -> None:
                torch.serialization.add_safe_globals([exec])

        result = run_tests(Registers("test_register"))
        self.assertEqual(len(result.failures), 1)
        self.assertRegex(
            result.failures[0][1],
            r"leaked global state \(now restored\): safe-globals registry changed "
            r"\(added \['builtins\.exec'\], removed \[\]\)",
        )
        self.assertNotIn("builtins.exec", _names())


class TestDangerousEntryRegisteredBeforeTheTest(ImportCase):
    def test_setup_errors_naming_the_entry(self) -> None:
        class Probe(SerializationRoundTripTestCase, unittest.TestCase):
            ran: list[bool] = []

            def test_probe(self) -> None:
                self.ran.append(True)

        torch.serialization.add_safe_globals([exec])
        try:
            result = run_tests(Probe("test_probe"))
        finally:
            torch.serialization.clear_safe_globals()
            torch.serialization.add_safe_globals(self.registry)
        self.assertEqual(Probe.ran, [])
        self.assertEqual(len(result.errors), 1)
        message = result.errors[0][1]
        self.assertIn(RoundTripConfigError.__name__, message)
        self.assertRegex(message, r"registry holds dangerous entries, registered before this test.*builtins\.exec")
        self.assertIn("Remove that add_safe_globals call", message)


if __name__ == "__main__":
    unittest.main()
