"""Which process-wide safe globals are torch's own, and the replaced-loader note built from that.

torch registers globals itself at import (torch 2.14: every builtin exception class and
``traceback.StackSummary``/``FrameSummary``, from ``torch.distributed.distributed_c10d``); the
outcome note of a replaced ``torch.load`` must list only what was added beyond those, on every
torch.  The call sites are read from torch's source (``torch_registrations``).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest
from unittest import mock

import torch

from torch_serial_testing import torch_registrations

from torch_serial_testing.torch_facts import loader as replaced_loader
from torch_serial_testing.torch_facts.registry import restore_registry, snapshot_registry

from subprocess_env import child_env

NOTE = "runs with process-wide safe globals "


class Mine:
    """A class of user code."""


def note_of(registered: list[str]) -> str:
    notes = replaced_loader.replacement_notes(False, None, False, False, registered)
    return next((n for n in notes if n.startswith(NOTE)), "")


class TestTorchsOwnRegistrations(unittest.TestCase):
    def test_a_fresh_torchs_registry_is_all_its_own(self) -> None:
        # In a fresh process only torch has registered anything (with the modules that register
        # something imported, where this torch has them): all of it is recognized as torch's.
        script = textwrap.dedent('''
            import importlib, json
            import torch
            for name in ("torch._dynamo", "torch.distributed.tensor", "torch.nested"):
                try:
                    importlib.import_module(name)
                except Exception:
                    pass
            from torch_serial_testing.torch_facts.registry import registered_globals
            from torch_serial_testing.UNKNOWN_UNKNOWN_torch_registrations import torch_registered_names
            own, complete = torch_registered_names()
            print(json.dumps([sorted(registered_globals()), sorted(own), complete]))
        ''')
        proc = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, env=child_env(), timeout=600,
        )
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        registered, own, complete = json.loads(proc.stdout.strip().splitlines()[-1])
        if not registered:  # torch 2.4/2.5 register nothing themselves: nothing to recognize (2.6 on: NJT)
            self.skipTest(f"torch {torch.__version__} registers no safe globals itself: nothing to recognize as its own")
        self.assertEqual(sorted(set(registered) - set(own)), [])
        self.assertTrue(complete)

    def test_this_process(self) -> None:
        import torch.nested  # registers its NJT globals at import (torch 2.6 on)

        own, complete = torch_registrations.torch_registered_names()
        self.assertTrue(complete)
        from torch.nested._internal import nested_tensor

        if any(e is nested_tensor.NestedTensor for e in getattr(torch.serialization, "get_safe_globals", list)()):
            self.assertIn("torch.nested._internal.nested_tensor.NestedTensor", own)


@unittest.skipUnless(hasattr(torch.serialization, "add_safe_globals"), "torch without a safe-globals registry")
class TestTheNote(unittest.TestCase):
    def setUp(self) -> None:
        snap = snapshot_registry()
        self.addCleanup(restore_registry, snap)

    def test_lists_only_what_was_added_beyond_torchs_own(self) -> None:
        from torch_serial_testing.torch_facts.registry import registered_globals

        torch.serialization.add_safe_globals([Mine, torch.nn.Linear])
        note = note_of(sorted(registered_globals()))
        # a torch class registered by user code decides what loads too: it is listed
        listed = sorted([f"{torch.nn.Linear.__module__}.Linear", f"{__name__}.Mine"])
        self.assertEqual(note, NOTE + ", ".join(listed))

    def test_nothing_added_no_note(self) -> None:
        from torch_serial_testing.torch_facts.registry import registered_globals

        own, _complete = torch_registrations.torch_registered_names()
        registered = sorted(n for n in registered_globals() if n in own)
        self.assertEqual(note_of(registered), "")

    def test_torch_214s_builtin_exceptions_are_torchs(self) -> None:
        # torch 2.14's distributed_c10d registers every builtin exception; where it has done so in
        # this process, a registry holding them and the user's class names only the latter.
        own, _complete = torch_registrations.torch_registered_names()
        registered = sorted({n for n in own if n.startswith("builtins.")} | {f"{__name__}.Mine"})
        self.assertEqual(note_of(registered), f"{NOTE}{__name__}.Mine")

    def test_unreadable_call_sites_keep_torchs_own_names_out(self) -> None:
        with mock.patch.object(torch_registrations, "torch_registered_names", return_value=(frozenset(), False)):
            self.assertEqual(note_of(["torch.nn.modules.linear.Linear", f"{__name__}.Mine"]), f"{NOTE}{__name__}.Mine")
        with mock.patch.object(torch_registrations, "torch_registered_names", return_value=(frozenset(), True)):
            self.assertEqual(
                note_of(["torch.nn.modules.linear.Linear", f"{__name__}.Mine"]),
                f"{NOTE}torch.nn.modules.linear.Linear, {__name__}.Mine",
            )


class TestCallSitesAreRead(unittest.TestCase):
    """A stand-in torch module: its module-level calls are read, nothing else of it runs."""

    SOURCE = textwrap.dedent('''
        import builtins, traceback
        import torch

        torch.serialization.add_safe_globals([Layout, (Alias, "torch.fake.AliasName")])

        if not available():
            pass
        else:
            torch.serialization.add_safe_globals(
                [t for t in vars(builtins).values() if isinstance(t, type) and issubclass(t, ArithmeticError)]
                + [traceback.StackSummary]
            )

        def later(entries):
            torch.serialization.add_safe_globals(entries)  # runs only when called: not an import-time entry

        class Registrar:
            torch.serialization.add_safe_globals([InClass])
    ''')

    def module(self, source: str, **namespace: object) -> types.ModuleType:
        folder = tempfile.mkdtemp()
        self.addCleanup(lambda: (os.remove(path), os.rmdir(folder)))
        path = os.path.join(folder, "fake_registrar.py")
        with open(path, "w", encoding="utf-8") as fh:
            fh.write(source)
        module = types.ModuleType("torch._t214_fake_registrar")
        module.__file__ = path
        import builtins
        import traceback

        vars(module).update(builtins=builtins, traceback=traceback, torch=torch, **namespace)
        return module

    def test_module_level_calls(self) -> None:
        Layout = type("Layout", (), {"__module__": "torch.fake"})
        Alias = type("Alias", (), {"__module__": "torch.fake"})
        names, complete = torch_registrations._registered_by(self.module(self.SOURCE, Layout=Layout, Alias=Alias))
        self.assertTrue(complete)
        self.assertEqual(
            names,
            {"torch.fake.Layout", "torch.fake.AliasName", "traceback.StackSummary", "builtins.ArithmeticError",
             "builtins.FloatingPointError", "builtins.OverflowError", "builtins.ZeroDivisionError"},
        )

    def test_a_name_bound_in_a_branch_not_taken_is_not_read(self) -> None:
        names, complete = torch_registrations._registered_by(self.module(self.SOURCE, Alias=Mine))
        self.assertFalse(complete)  # Layout is not bound: that site is not read
        self.assertIn("builtins.ZeroDivisionError", names)

    def test_nothing_but_plain_expressions_is_evaluated(self) -> None:
        hostile = "import torch\ntorch.serialization.add_safe_globals([__import__('os').getcwd()])\n"
        calls = []
        names, complete = torch_registrations._registered_by(self.module(hostile, __import__=calls.append))
        self.assertEqual((names, complete), (frozenset(), False))
        self.assertEqual(calls, [])

    def test_cut_statements_or_the_whole_file(self) -> None:
        # a line of the call at column 0 spoils the cut: the whole text is parsed instead
        source = self.SOURCE + "torch.serialization.add_safe_globals([\nLayout,\n])\n"
        Layout = type("Layout", (), {"__module__": "torch.fake"})
        names, complete = torch_registrations._registered_by(self.module(source, Layout=Layout, Alias=Mine))
        self.assertTrue(complete)
        self.assertIn("torch.fake.Layout", names)


if __name__ == "__main__":
    unittest.main()
