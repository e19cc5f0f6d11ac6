"""Safe globals registered while a test runs: who registered them decides, nothing is judged.

While a test runs, torch's ``_add_safe_globals`` notes who registers each entry
(``registry.registrar``).  At the end of the test:

* what code in a ``torch.*`` module registered (a lazy ``import torch.distributed.tensor``,
  ``torch._dynamo``) is torch's doing, whenever it happens: kept, silently;
* what another module registered at its import (a device backend, a helper module) is kept and
  named in verbose output ("kept safe globals registered at import time: X");
* anything else added or removed (the test's own ``add_safe_globals``, or a function of a module
  imported before the test) is a leak: ``LeakedGlobalStateError``, and the registry restored.

No registration is judged by the trust policy: a code-running callable registered at import is
kept like any other, and an entry registered before the test (at collection time) is none of the
test's business.
"""

from __future__ import annotations

import io
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import textwrap
import unittest
from typing import Any
from unittest import mock

import torch

from torch_serial_testing import LeakedGlobalStateError, SerializationRoundTripTestCase, registry
from torch_serial_testing.errors import qualified_name
from torch_serial_testing.registry import registrar, restore_registry, snapshot_registry

from test.helpers.roundtrip_fixtures import NO_TORCH_REGISTRATIONS
from test.helpers.isolation_fixtures import run_tests
from test.helpers.subprocess_env import child_env

KEPT = "kept safe globals registered at import time: "


def _names() -> set[str]:
    return {qualified_name(g) for g in torch.serialization.get_safe_globals()}


#: A test's header in ``unittest -v`` output (its class is defined in a function here: ``<locals>``).
HEADER = r"^test\w+ \([^)]*\) "


def verbose_lines(out: str) -> list[str]:
    """What ``unittest -v`` printed for each test after its header (``... ok``, ``... kept ... ok``)."""
    return [m.group("rest") for m in re.finditer(HEADER + r"(?P<rest>\.\.\. .*)$", out, re.M)]


class ImportCase(unittest.TestCase):
    def setUp(self) -> None:
        self.registry = snapshot_registry()
        self.addCleanup(restore_registry, self.registry)  # what a test kept, gone for the next test
        # and who registered it, forgotten too (the library keeps that for the process's life)
        remembered = mock.patch.dict(registry._registrars)
        remembered.start()
        self.addCleanup(remembered.stop)
        self.tmp = tempfile.mkdtemp(prefix="tst-import-reg-")
        self.addCleanup(shutil.rmtree, self.tmp, True)
        sys.path.insert(0, self.tmp)
        self.addCleanup(sys.path.remove, self.tmp)
        self.counter = 0

    def unique(self, stem: str) -> str:
        self.counter += 1
        return f"{stem}_{os.getpid()}_{id(self)}_{self.counter}"

    def helper(self, body: str) -> str:
        """Write a helper module (outside torch) with *body* and return its (unique) name."""
        name = self.unique("tst_helper")
        with open(os.path.join(self.tmp, name + ".py"), "w") as fh:
            fh.write(textwrap.dedent(body))
        self.addCleanup(sys.modules.pop, name, None)
        return name

    def torch_module(self, body: str) -> str:
        """Write a module importable as ``torch.<unique>`` (a folder added to ``torch.__path__`` for the
        test) with *body*; its full name."""
        short = self.unique("_tst_torch_part")
        folder = os.path.join(self.tmp, "torch_part")
        os.makedirs(folder, exist_ok=True)
        with open(os.path.join(folder, short + ".py"), "w") as fh:
            fh.write(textwrap.dedent(body))
        patch = mock.patch.object(torch, "__path__", [*torch.__path__, folder])
        patch.start()
        self.addCleanup(patch.stop)
        name = f"torch.{short}"
        self.addCleanup(sys.modules.pop, name, None)
        self.addCleanup(lambda: vars(torch).pop(short, None))  # the import binds it on the package
        return name

    def importing(self, module: str, seen: list[Any], then: Any = None) -> type:
        class Imports(SerializationRoundTripTestCase, unittest.TestCase):
            def test_import(self) -> None:
                __import__(module)
                if then is not None:
                    then()
                seen.append(set(_names()))

        return Imports

    def run_verbose(self, test: unittest.TestCase) -> tuple[unittest.TestResult, str]:
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2).run(test)
        return result, stream.getvalue()


class TestImportTimeRegistrations(ImportCase):
    def test_a_modules_registration_at_import_is_kept_and_named_in_verbose_output(self) -> None:
        name = self.helper(
            """
            import torch
            class BackendMeta:
                pass
            torch.serialization.add_safe_globals([BackendMeta])
            """
        )
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(name, seen)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(verbose_lines(out), [f"... {KEPT}{name}.BackendMeta ... ok"])
        self.assertEqual(seen, [{*map(qualified_name, self.registry), f"{name}.BackendMeta"}])
        self.assertEqual(registrar(sys.modules[name].BackendMeta), (name, True))
        # kept after the test, like a device backend's
        self.assertEqual(_names(), {*map(qualified_name, self.registry), f"{name}.BackendMeta"})

    def test_code_running_callables_registered_at_import_are_kept_too(self) -> None:
        # Nothing is judged: the module that registers them is trusted as torch trusts it.
        name = self.helper(
            """
            import os, torch
            torch.serialization.add_safe_globals([exec, (os.system, "helpers.Safe")])
            """
        )
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(name, seen)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(verbose_lines(out), [f"... {KEPT}builtins.exec, helpers.Safe ... ok"])
        after = set(snapshot_registry())
        self.assertEqual(after, {*self.registry, exec, (os.system, "helpers.Safe")})

    def test_a_torch_modules_registration_at_import_is_kept_silently(self) -> None:
        # What a torch.* module registers when it is first imported during a test (torch.export
        # importing torch.distributed.tensor) is torch's doing: no leak, nothing said.
        name = self.torch_module(
            """
            import torch
            class LazyMeta:
                pass
            torch.serialization.add_safe_globals([LazyMeta])
            """
        )
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(name, seen)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(verbose_lines(out), ["... ok"])
        self.assertNotIn(KEPT, out)
        self.assertEqual(registrar(sys.modules[name].LazyMeta), (name, True))
        self.assertEqual(_names(), {*map(qualified_name, self.registry), f"{name}.LazyMeta"})

    def test_a_torch_function_registering_during_the_test_is_kept_silently(self) -> None:
        # Not at import: torch's own code registering when the test calls it is torch's doing too.
        name = self.torch_module(
            """
            import torch
            class OnFirstUse:
                pass
            def use():
                torch.serialization.add_safe_globals([OnFirstUse])
            """
        )
        module = __import__(name, fromlist=["use"])  # imported before the test: only the call is in it
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(name, seen, then=module.use)("test_import"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(verbose_lines(out), ["... ok"])
        self.assertEqual(registrar(module.OnFirstUse), (name, False))
        self.assertIn(module.OnFirstUse, snapshot_registry())

    def test_registration_in_the_test_body_is_a_leak_not_an_import(self) -> None:
        class Registers(SerializationRoundTripTestCase, unittest.TestCase):
            def test_register(self) -> None:
                torch.serialization.add_safe_globals([exec])

        result = run_tests(Registers("test_register"))
        self.assertEqual(result.errors, [])
        self.assertEqual(len(result.failures), 1)
        message = result.failures[0][1]
        self.assertIn(LeakedGlobalStateError.__name__, message)
        self.assertRegex(
            message,
            r"leaked global state \(now restored\): safe-globals registry changed "
            r"\(added \['builtins\.exec'\], removed \[\]\); declare what a load needs \(safe_globals\), "
            r"or register inside a torch\.serialization\.safe_globals\(\[\.\.\.\]\) block",
        )
        self.assertEqual(set(snapshot_registry()), set(self.registry))

    def test_a_modules_function_registering_during_the_test_is_a_leak(self) -> None:
        # Registered by a module outside torch, but not at its import: the test's own doing.
        name = self.helper(
            """
            import torch
            class Registered:
                pass
            def register():
                torch.serialization.add_safe_globals([Registered])
            """
        )
        module = __import__(name)
        seen: list[Any] = []
        result, out = self.run_verbose(self.importing(name, seen, then=module.register)("test_import"))
        self.assertEqual(len(result.failures), 1, result.failures + result.errors)
        self.assertIn(
            f"leaked global state (now restored): safe-globals registry changed (added ['{name}.Registered'], "
            "removed [])",
            result.failures[0][1],
        )
        self.assertNotIn(KEPT, out)
        self.assertEqual(registrar(module.Registered), (name, False))
        self.assertEqual(set(snapshot_registry()), set(self.registry))

    def test_only_the_bodys_registration_is_the_leak(self) -> None:
        # An import-time registration and one by the test itself in the same test: the first is kept
        # (and named), the second is the leak, restored.
        name = self.helper(
            """
            import torch
            class AtImport:
                pass
            torch.serialization.add_safe_globals([AtImport])
            """
        )

        class ByTheTest:
            pass

        seen: list[Any] = []
        test = self.importing(name, seen, then=lambda: torch.serialization.add_safe_globals([ByTheTest]))
        result, out = self.run_verbose(test("test_import"))
        self.assertEqual(len(result.failures), 1, result.failures + result.errors)
        self.assertIn(
            f"safe-globals registry changed (added ['{qualified_name(ByTheTest)}'], removed [])",
            result.failures[0][1],
        )
        self.assertEqual(verbose_lines(out), [f"... {KEPT}{name}.AtImport ... FAIL"])
        self.assertEqual(set(snapshot_registry()), {*self.registry, sys.modules[name].AtImport})


class TestEntryRegisteredBeforeTheTest(ImportCase):
    def test_a_code_running_entry_is_not_judged(self) -> None:
        # Registered before the test (at collection time, by whoever): not the test's change, not judged.
        class Probe(SerializationRoundTripTestCase, unittest.TestCase):
            ran: list[bool] = []

            def test_probe(self) -> None:
                self.ran.append(True)

        torch.serialization.add_safe_globals([exec])
        before = snapshot_registry()
        result, out = self.run_verbose(Probe("test_probe"))
        self.assertTrue(result.wasSuccessful(), result.failures + result.errors)
        self.assertEqual(Probe.ran, [True])
        self.assertEqual(verbose_lines(out), ["... ok"])
        self.assertEqual(set(snapshot_registry()), set(before))
        self.assertIn(exec, snapshot_registry())


#: A test importing torch.distributed.tensor for the first time in a fresh process (torch registers
#: DTensor, DeviceMesh, Shard... at that import); what the run says and the registry before and after.
LAZY_TORCH_IMPORT = """
import io, json, sys, unittest
import torch
from torch_serial_testing import SerializationRoundTripTestCase

assert "torch.distributed.tensor" not in sys.modules

def names():
    return sorted(f"{g.__module__}.{g.__qualname__}" for g in torch.serialization.get_safe_globals())

class Lazy(SerializationRoundTripTestCase, unittest.TestCase):
    def test_lazy(self):
        import torch.distributed.tensor  # noqa: F401

before = names()
stream = io.StringIO()
result = unittest.TextTestRunner(stream=stream, verbosity=2).run(Lazy("test_lazy"))
print(json.dumps({"ok": result.wasSuccessful(), "out": stream.getvalue(), "before": before, "after": names()}))
"""


class TestARealLazyTorchImport(unittest.TestCase):
    def test_torch_distributed_tensor_imported_during_a_test(self) -> None:
        if not torch.distributed.is_available():
            self.skipTest("torch.distributed is not available in this build")
        if NO_TORCH_REGISTRATIONS:
            self.skipTest(NO_TORCH_REGISTRATIONS)
        proc = subprocess.run(
            [sys.executable, "-c", LAZY_TORCH_IMPORT],
            capture_output=True,
            text=True,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-3000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        self.assertTrue(report["ok"], report["out"])
        self.assertEqual(verbose_lines(report["out"]), ["... ok"])
        added = sorted(set(report["after"]) - set(report["before"]))
        self.assertIn("torch.distributed.tensor.DTensor", added)
        self.assertEqual([n for n in added if not n.startswith("torch.")], [])


if __name__ == "__main__":
    unittest.main()
