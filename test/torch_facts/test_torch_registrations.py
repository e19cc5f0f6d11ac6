"""Which process-wide safe globals are torch's own, and the replaced-loader note built from that.

torch registers globals itself at import (torch 2.6 on: the NJT globals from ``torch.nested``;
torch 2.14: every builtin exception class and ``traceback.StackSummary``/``FrameSummary``, from
``torch.distributed.distributed_c10d``); the outcome note of a replaced ``torch.load`` must list
only what was added beyond those, on every torch.  torch's own registrations are asked of torch
(``torch_facts.registry.torch_own_registrations``): a fresh interpreter imports the same torch
modules and reports its registry.  Nothing of torch's source is read.
"""

from __future__ import annotations

import builtins
import json
import subprocess
import sys
import textwrap
import types
import unittest
from unittest import mock

import torch

from torch_serial_testing.loading import replacement_notes
from torch_serial_testing import registry
from torch_serial_testing.probes import ProbeFailed
from torch_serial_testing.registry import registered_globals, restore_registry, snapshot_registry
from torch_serial_testing.tools.facts import torch_own_registrations

from test.helpers.subprocess_env import child_env

NOTE = "runs with process-wide safe globals "


class Mine:
    """A class of user code."""


def note_of(registered: list[str]) -> str:
    notes = replacement_notes(False, None, False, False, registered)
    return next((n for n in notes if n.startswith(NOTE)), "")


def forget_own() -> None:
    """Forget the answers of the fresh interpreters (remembered per set of torch modules)."""
    registry._own.clear()


#: torch 2.14's distributed_c10d registers these at import; a stand-in torch does the same.
BUILTIN_EXCEPTIONS = sorted(
    (t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)),
    key=lambda t: t.__qualname__,
)


class TestTorchsOwnRegistrations(unittest.TestCase):
    def test_a_fresh_torchs_registry_is_all_its_own(self) -> None:
        # In a fresh process only torch has registered anything (with the modules that register
        # something imported, where this torch has them): all of it is recognized as torch's.
        script = textwrap.dedent("""
            import importlib, json
            import torch
            for name in ("torch._dynamo", "torch.distributed.tensor", "torch.nested"):
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
            from torch_serial_testing.torch_facts.registry import registered_globals, torch_own_registrations
            print(json.dumps([sorted(registered_globals()), sorted(torch_own_registrations())]))
        """)
        proc = subprocess.run(
            [sys.executable, "-c", script],
            capture_output=True,
            text=True,
            env=child_env(),
            timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        registered, own = json.loads(proc.stdout.strip().splitlines()[-1])
        if not registered:  # torch 2.4/2.5 register nothing themselves: nothing to recognize (2.6 on: NJT)
            self.skipTest(
                f"torch {torch.__version__} registers no safe globals itself: nothing to recognize as its own"
            )
        self.assertEqual(sorted(set(registered) - set(own)), [])

    def test_this_process(self) -> None:
        import torch.nested  # registers its NJT globals at import (torch 2.6 on)

        own = torch_own_registrations()
        from torch.nested._internal import nested_tensor

        if any(e is nested_tensor.NestedTensor for e in getattr(torch.serialization, "get_safe_globals", list)()):
            self.assertIn("torch.nested._internal.nested_tensor.NestedTensor", own)
        self.assertNotIn(f"{__name__}.Mine", own)

    @unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
    def test_what_this_process_registers_is_not_torchs(self) -> None:
        snap = snapshot_registry()
        self.addCleanup(restore_registry, snap)
        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        own = torch_own_registrations()
        self.assertNotIn(f"{__name__}.Mine", own)
        self.assertNotIn("torch.nn.modules.linear.Linear", own)

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
class TestTheNote(unittest.TestCase):
    def setUp(self) -> None:
        snap = snapshot_registry()
        self.addCleanup(restore_registry, snap)

    def test_lists_only_what_was_added_beyond_torchs_own(self) -> None:
        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        note = note_of(sorted(registered_globals()))
        # a torch class registered by user code decides what loads too: it is listed
        listed = sorted([f"{torch.nn.Linear.__module__}.Linear", f"{__name__}.Mine"])
        self.assertEqual(note, NOTE + ", ".join(listed))

    def test_nothing_added_no_note(self) -> None:
        own = torch_own_registrations()
        registered = sorted(n for n in registered_globals() if n in own)
        self.assertEqual(note_of(registered), "")

    def test_torch_214s_builtin_exceptions_are_torchs(self) -> None:
        # torch 2.14's distributed_c10d registers every builtin exception at import.  Where this
        # torch does so itself, the fresh interpreter reports them; elsewhere a stand-in torch does
        # it (the fresh interpreter's torch registering them at import, as 2.14's does, and so
        # this process's): a registry holding them and the user's class names only the latter.
        own = torch_own_registrations()
        if not any(n.startswith("builtins.") and n.endswith("Error") for n in own):
            forget_own()
            self.addCleanup(forget_own)
            child = registry._CHILD.replace(
                "import torch\n",
                "import torch, builtins\ntorch.serialization.add_safe_globals("
                "[t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, BaseException)])\n",
                1,
            )
            self.assertNotEqual(child, registry._CHILD)
            patch = mock.patch.object(registry, "_CHILD", child)
            patch.start()
            self.addCleanup(patch.stop)
            torch.serialization.add_safe_globals(BUILTIN_EXCEPTIONS)
            own = torch_own_registrations()
        self.assertIn("builtins.ZeroDivisionError", own)
        torch.serialization.add_safe_globals([Mine])
        registered = sorted(registered_globals())
        self.assertIn("builtins.ZeroDivisionError", registered)
        self.assertEqual(note_of(registered), f"{NOTE}{__name__}.Mine")

    def test_when_the_probe_fails_the_note_says_so(self) -> None:
        forget_own()
        self.addCleanup(forget_own)
        names = ["torch.nn.modules.linear.Linear", f"{__name__}.Mine"]
        # the fresh interpreter reports nothing
        with mock.patch.object(registry, "_CHILD", "raise SystemExit(3)"):
            with self.assertRaisesRegex(ProbeFailed, "a fresh interpreter could not report torch's own registrations"):
                torch_own_registrations()
            note = note_of(names)
        self.assertTrue(
            note.startswith(
                f"{NOTE}torch.nn.modules.linear.Linear, {__name__}.Mine (which of them are "
                "torch's own is unknown: a fresh interpreter could not report"
            ),
            note,
        )
        # a torch module it cannot import (here: one that exists only in this process)
        forget_own()
        fake = types.ModuleType("torch._tst_only_here")
        with mock.patch.dict(sys.modules, {"torch._tst_only_here": fake}):
            with self.assertRaisesRegex(ProbeFailed, "could not import torch._tst_only_here"):
                torch_own_registrations()
            note = note_of(names)
        self.assertIn(
            "which of them are torch's own is unknown: a fresh interpreter could not import torch._tst_only_here", note
        )
        self.assertTrue(note.startswith(f"{NOTE}torch.nn.modules.linear.Linear, {__name__}.Mine"), note)
        # and once it can run again, torch's own names are known and kept out
        forget_own()
        own = torch_own_registrations()
        self.assertEqual(note_of(sorted(own) + names), NOTE + ", ".join(names))

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
