"""Which process-wide safe globals are torch's own, and the replaced-loader note built from that.

torch registers globals itself (torch 2.6 on: the NJT globals from ``torch.nested``; torch 2.13: the
mesh layouts of ``torch.distributed``; torch 2.14: every builtin exception class and
``traceback.StackSummary``/``FrameSummary``, from ``torch.distributed.distributed_c10d``); the outcome
note of a replaced ``torch.load`` must list only what was added beyond those, on every torch.

Two answers, for two places:

* **in a test process** (the core, no child process): ``registry.registered_by_torch(entry)``.  A
  registration made while a test ran is judged by who made it (``registry.registrar``: code in a
  ``torch.*`` module, or not); one made before (at ``import torch``, at collection time) by what it
  is: an object defined in ``torch.*`` or in Python's standard library.  The note uses this one.
* **in the tools** (``inspect``, ``audit``, ``doctor``): ``tools.facts.torch_own_registrations()`` asks
  a fresh interpreter importing the same ``torch.*`` modules for its registry, once per set of
  modules; ``torch_registers_itself(entry)`` checks one entry against it.

Nothing of torch's source is read.
"""

from __future__ import annotations

import builtins
import collections
import json
import subprocess
import sys
import textwrap
import traceback
import types
import unittest
from typing import Any
from unittest import mock

import torch

from npu_backend import fake_torch_npu
from torch_serial_testing import registry
from torch_serial_testing.loading import registered_entries, replacement_notes
from torch_serial_testing.unpickler import ProbeFailed
from torch_serial_testing.registry import (
    registered_by_torch,
    registered_globals,
    registrar,
    restore_registry,
    snapshot_registry,
    start_recording,
    stop_recording,
)
from torch_serial_testing.tools import facts
from torch_serial_testing.tools.facts import torch_own_registrations, torch_registers_itself

from test.helpers.isolation_fixtures import only_torchs_registrations
from test.helpers.subprocess_env import child_env

NOTE = "runs with process-wide safe globals "


class Mine:
    """A class of user code."""


def note_of(entries: list[Any]) -> str:
    """The replaced loader's note about *entries* (the registry a load ran with)."""
    named = sorted(((registry.torch_key(e) or "?", e) for e in entries), key=lambda pair: pair[0])
    notes = replacement_notes(False, None, False, False, named)
    return next((n for n in notes if n.startswith(NOTE)), "")


def forget_own() -> None:
    """Forget the tools' answers of fresh interpreters (remembered per set of torch modules)."""
    facts._own.clear()
    facts._confirmed_own.clear()


#: torch 2.14's distributed_c10d registers these at import; a stand-in torch does the same.
BUILTIN_EXCEPTIONS = sorted(
    (t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)),
    key=lambda t: t.__qualname__,
)


def torch_code(name: str, source: str, **bound: Any) -> types.ModuleType:
    """A module named *name* (``torch.<something>``) running *source* (with *bound* as globals): code
    torch's own modules could hold."""
    module = types.ModuleType(name)
    vars(module).update(bound)
    exec(compile(textwrap.dedent(source), f"<{name}>", "exec"), vars(module))  # noqa: S102 - the test's own text
    return module


class RegistryCase(unittest.TestCase):
    def setUp(self) -> None:
        only_torchs_registrations(self)
        # who registered what, as this test's recorder sees it only
        patch = mock.patch.dict(registry._registrars, clear=True)
        patch.start()
        self.addCleanup(patch.stop)

    def recording(self) -> None:
        """Note who registers what until the end of the test, as while a round-trip test runs."""
        start_recording()
        self.addCleanup(stop_recording)


@unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
class TestRegisteredByTorch(RegistryCase):
    """The core's answer: no child process, no probe."""

    def test_registered_before_any_test_judged_by_what_it_is(self) -> None:
        # Not seen by the recorder (registered at import torch, or at collection time).
        internal = getattr(getattr(torch, "nested", None), "_internal", None)  # (torch >= 2.5)
        njt = getattr(internal.nested_tensor, "NestedTensor", None) if internal is not None else None
        owned = [torch.nn.Linear, ZeroDivisionError, traceback.StackSummary, collections.OrderedDict]
        owned += [njt] if njt is not None else []
        for entry in owned:
            with self.subTest(entry=entry):
                self.assertIsNone(registrar(entry))
                self.assertTrue(registered_by_torch(entry))
        foreign = [Mine, fake_torch_npu._rebuild_npu_tensor, (Mine, "torch.nn.modules.linear.Linear"), object()]
        for entry in foreign:
            with self.subTest(entry=entry):
                self.assertFalse(registered_by_torch(entry))

    def test_registered_while_a_test_runs_judged_by_who_registered_it(self) -> None:
        self.recording()
        # a torch class registered by the test's code decides what loads: not torch's
        torch.serialization.add_safe_globals([torch.nn.Linear])
        self.assertEqual(registrar(torch.nn.Linear), (__name__, False))
        self.assertFalse(registered_by_torch(torch.nn.Linear))
        # a user class registered by code in a torch.* module (torch's lazy imports): torch's doing
        lazy = torch_code(
            "torch._tst_lazy",
            """
            import torch
            class LazyMeta:
                pass
            torch.serialization.add_safe_globals([LazyMeta])
            """,
        )
        self.assertEqual(registrar(lazy.LazyMeta), ("torch._tst_lazy", False))
        self.assertTrue(registered_by_torch(lazy.LazyMeta))
        torch_code("torch._tst_lazy_too", "import torch\ntorch.serialization.add_safe_globals([Mine])", Mine=Mine)
        self.assertTrue(registered_by_torch(Mine))

    def test_every_registration_at_import_of_torchs_modules_is_its_own(self) -> None:
        # A fresh process importing the torch modules that register something (where this torch has
        # them): everything registered is torch's own, to the core's rule and to the tools' probe alike.
        script = textwrap.dedent("""
            import importlib, json
            import torch
            for name in ("torch._dynamo", "torch.distributed.tensor", "torch.nested"):
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
            from torch_serial_testing.registry import registered_by_torch, registered_globals, torch_key
            from torch_serial_testing.tools.facts import torch_own_registrations
            entries = torch.serialization.get_safe_globals()
            print(json.dumps({
                "registered": sorted(registered_globals()),
                "not_torchs": sorted(torch_key(e) for e in entries if not registered_by_torch(e)),
                "own": sorted(torch_own_registrations()),
            }))
        """)
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=child_env(),
            stdin=subprocess.DEVNULL,
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        report = json.loads(proc.stdout.strip().splitlines()[-1])
        if not report["registered"]:  # torch 2.4/2.5 register nothing themselves: nothing to recognize (2.6 on: NJT)
            self.skipTest(
                f"torch {torch.__version__} registers no safe globals itself: nothing to recognize as its own"
            )
        self.assertEqual(report["not_torchs"], [])
        self.assertEqual(sorted(set(report["registered"]) - set(report["own"])), [])

    def test_no_child_process(self) -> None:
        # The fresh interpreter's answer is the tools'; the core never asks for it.
        forget_own()
        self.addCleanup(forget_own)
        started: list[str] = []

        def refuse(*args: Any, **kwargs: Any) -> Any:
            started.append(repr(args)[:200])
            raise AssertionError("the core started a child process")

        torch.serialization.add_safe_globals([Mine])
        with (
            mock.patch.object(subprocess.Popen, "_execute_child", refuse),
            mock.patch.object(facts, "torch_own_registrations", refuse),
        ):
            answers = {registry.torch_key(e): registered_by_torch(e) for e in snapshot_registry()}
            note = note_of(snapshot_registry())
        self.assertEqual(started, [])
        self.assertEqual([n for n, own in answers.items() if not own], [f"{__name__}.Mine"])
        self.assertEqual(note, f"{NOTE}{__name__}.Mine")


@unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
class TestTheNote(RegistryCase):
    def test_lists_only_what_was_added_beyond_torchs_own(self) -> None:
        # While a test runs: a torch class registered by user code decides what loads too: listed.
        self.recording()
        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        listed = sorted([f"{torch.nn.Linear.__module__}.Linear", f"{__name__}.Mine"])
        self.assertEqual(note_of(snapshot_registry()), NOTE + ", ".join(listed))

    def test_outside_a_test_a_torch_class_counts_as_torchs(self) -> None:
        # Registered with nobody noting who did (before any test): judged by what it is.
        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        self.assertEqual(note_of(snapshot_registry()), f"{NOTE}{__name__}.Mine")

    def test_nothing_added_no_note(self) -> None:
        own = [e for e in snapshot_registry() if registered_by_torch(e)]
        self.assertEqual(note_of(own), "")
        self.assertEqual(note_of([]), "")

    def test_the_fake_torch_npus_global_is_listed(self) -> None:
        fake_torch_npu.install()
        self.addCleanup(fake_torch_npu.uninstall)
        named = registered_entries()
        self.assertEqual([name for name, _ in named], sorted(registered_globals()))
        self.assertIn(fake_torch_npu.registered_name(), [name for name, _ in named])
        self.assertEqual(note_of([e for _, e in named]), NOTE + fake_torch_npu.registered_name())

    def test_torch_214s_builtin_exceptions_are_torchs(self) -> None:
        # torch 2.14's distributed_c10d registers every builtin exception at import: before any test
        # (at import torch), they are known by what they are; registered by a torch module while a test
        # runs (a lazy import), by who registered them.  Either way only the user's class is listed.
        torch.serialization.add_safe_globals(BUILTIN_EXCEPTIONS + [Mine])
        registered = sorted(registered_globals())
        self.assertIn("builtins.ZeroDivisionError", registered)
        self.assertEqual(note_of(snapshot_registry()), f"{NOTE}{__name__}.Mine")
        restore_registry([e for e in snapshot_registry() if e not in BUILTIN_EXCEPTIONS])
        self.recording()
        torch_code(
            "torch.distributed._tst_c10d",
            "import builtins, torch\ntorch.serialization.add_safe_globals("
            "[t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)])\n",
        )
        self.assertEqual(registrar(ZeroDivisionError), ("torch.distributed._tst_c10d", False))
        self.assertEqual(note_of(snapshot_registry()), f"{NOTE}{__name__}.Mine")


class TestToolsAskAFreshInterpreter(unittest.TestCase):
    """``tools.facts``: what torch registers itself, reported by a fresh interpreter (for the tools only)."""

    def test_this_process(self) -> None:
        import torch.nested  # registers its NJT globals at import (torch 2.6 on)

        own = torch_own_registrations()
        from torch.nested._internal import nested_tensor

        if any(e is nested_tensor.NestedTensor for e in getattr(torch.serialization, "get_safe_globals", list)()):
            self.assertIn("torch.nested._internal.nested_tensor.NestedTensor", own)
            self.assertTrue(torch_registers_itself(nested_tensor.NestedTensor))
            # registered under its own name only: another object under that name is not torch's
            self.assertFalse(torch_registers_itself((Mine, "torch.nested._internal.nested_tensor.NestedTensor")))
        self.assertNotIn(f"{__name__}.Mine", own)
        self.assertFalse(torch_registers_itself(Mine))

    @unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
    def test_what_this_process_registers_is_not_torchs(self) -> None:
        snap = snapshot_registry()
        self.addCleanup(restore_registry, snap)
        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        own = torch_own_registrations()
        self.assertNotIn(f"{__name__}.Mine", own)
        self.assertNotIn("torch.nn.modules.linear.Linear", own)
        self.assertFalse(torch_registers_itself(torch.nn.Linear))

    def test_asked_once_per_set_of_torch_modules(self) -> None:
        forget_own()
        self.addCleanup(forget_own)
        real_run = subprocess.run
        calls = []

        def counting_run(*args, **kwargs):
            calls.append(args)
            return real_run(*args, **kwargs)

        with mock.patch.object(subprocess, "run", counting_run):
            first = torch_own_registrations()
            self.assertIs(torch_own_registrations(), first)
            self.assertEqual(len(calls), 1)
            modules = json.loads(calls[0][0][-1])
            self.assertIn("torch", modules)
            self.assertEqual(
                set(modules),
                {n for n, m in sys.modules.items() if m is not None and (n == "torch" or n.startswith("torch."))},
            )
            # a torch module imported since: asked again, of a fresh interpreter importing it too
            name = next(
                n
                for n in ("torch.utils.file_baton", "torch.utils.show_pickle", "torch.utils.bundled_inputs")
                if n not in sys.modules
            )
            __import__(name)
            torch_own_registrations()
            self.assertEqual(len(calls), 2)
            self.assertIn(name, json.loads(calls[1][0][-1]))

    @unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
    def test_torch_214s_builtin_exceptions(self) -> None:
        # Where this torch does not register them itself, a stand-in torch does (the fresh interpreter's
        # torch registering them at import, as 2.14's does, and so this process's).
        snap = snapshot_registry()
        self.addCleanup(restore_registry, snap)
        own = torch_own_registrations()
        if not any(n.startswith("builtins.") and n.endswith("Error") for n in own):
            forget_own()
            self.addCleanup(forget_own)
            child = facts._CHILD.replace(
                "import torch\n",
                "import torch, builtins\ntorch.serialization.add_safe_globals("
                "[t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)])\n",
                1,
            )
            self.assertNotEqual(child, facts._CHILD)
            patch = mock.patch.object(facts, "_CHILD", child)
            patch.start()
            self.addCleanup(patch.stop)
            torch.serialization.add_safe_globals(BUILTIN_EXCEPTIONS)
            own = torch_own_registrations()
        self.assertIn("builtins.ZeroDivisionError", own)
        self.assertNotIn(f"{__name__}.Mine", own)

    def test_when_the_fresh_interpreter_cannot_answer(self) -> None:
        forget_own()
        self.addCleanup(forget_own)
        # the fresh interpreter reports nothing
        with mock.patch.object(facts, "_CHILD", "raise SystemExit(3)"):
            with self.assertRaisesRegex(
                ProbeFailed,
                r"^a fresh interpreter could not report torch's own registrations \(ValueError: exit status 3: ",
            ):
                torch_own_registrations()
            self.assertFalse(torch_registers_itself(Mine))  # not a torch object: nothing to ask
            with self.assertRaises(ProbeFailed):
                torch_registers_itself(torch.nn.Linear)
        # a torch module it cannot import (here: one that exists only in this process)
        forget_own()
        fake = types.ModuleType("torch._tst_only_here")
        with mock.patch.dict(sys.modules, {"torch._tst_only_here": fake}):
            with self.assertRaisesRegex(
                ProbeFailed,
                r"^a fresh interpreter could not import torch\._tst_only_here: ModuleNotFoundError to report "
                r"torch's own registrations$",
            ):
                torch_own_registrations()
        # and once it can run again, it answers
        forget_own()
        self.assertNotIn(f"{__name__}.Mine", torch_own_registrations())

    def test_a_backends_device_module_is_none_of_torchs(self) -> None:
        # torch._register_device_module (as torch_npu does) puts torch.<device> in sys.modules; a
        # fresh interpreter without the backend cannot find it, and torch registers nothing from it
        forget_own()
        self.addCleanup(forget_own)
        own = torch_own_registrations()
        forget_own()
        fake = types.ModuleType("torch.hpu")
        with mock.patch.dict(sys.modules, {"torch.hpu": fake, "torch.hpu.amp": types.ModuleType("torch.hpu.amp")}):
            with mock.patch.object(torch, "hpu", fake, create=True):
                self.assertEqual(torch_own_registrations(), own)
            forget_own()  # the same module, not registered with torch as a device's: not skipped
            with self.assertRaisesRegex(ProbeFailed, "could not import torch.hpu"):
                torch_own_registrations()


if __name__ == "__main__":
    unittest.main()
