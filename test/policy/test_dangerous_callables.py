"""Callables the denylist used to miss (issue 27.4): judged dangerous by the tools' trust policy, saying
why, and never admitted there by ``UnsafeCallable``.  The class of the problem is covered: whole modules
(the import machinery, ``_imp``, ``_signal``, ``torch.utils.collect_env``, the datapipes decoders) by
name, and any Python function whose code reaches pickle, files, processes, compilers or sockets by what
it uses.

A test author's own declaration gets only the small check (issue 37): the known code-running callables
among them are refused there too, the others are declarable as torch lets them be, and the tools' policy
still refuses them in checkpoints from strangers.
"""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import torch  # noqa: E402
import torch.utils.collect_env  # noqa: E402,F401
import torch.utils.data.datapipes.utils.decoder as decoder  # noqa: E402

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import RoundTripConfigError, UnsafeCallable
from torch_serial_testing.declarations import SafeGlobal, normalize_safe_globals
from torch_serial_testing.tools.cli.contract import EXIT_DANGEROUS
from torch_serial_testing.tools.cli.inspection import inspect_report
from torch_serial_testing.tools.policy.snippet import refusal_notes
from torch_serial_testing.tools.policy.trust import dangerous_reason, judge_global, judge_name

#: The review's samples and our own, by name: (name, what the reason must say).
BY_NAME = {
    "collect_env.run (shell)": ("torch.utils.collect_env.run", "runs commands"),
    "collect_env.run_and_read_all": ("torch.utils.collect_env.run_and_read_all", "runs commands"),
    "datapipes basichandlers (pickle.loads)": ("torch.utils.data.datapipes.utils.decoder.basichandlers", "pickle"),
    "datapipes Decoder class": ("torch.utils.data.datapipes.utils.decoder.Decoder", "pickle"),
    "_write_atomic (file write)": ("_frozen_importlib_external._write_atomic", "runs code"),
    "_gcd_import": ("_frozen_importlib._gcd_import", "runs code"),
    "SourceFileLoader class": ("_frozen_importlib_external.SourceFileLoader", "runs code"),
    "importlib._bootstrap": ("importlib._bootstrap._gcd_import", "runs code"),
    "_imp.create_dynamic": ("_imp.create_dynamic", "runs code"),
    "_imp.exec_dynamic": ("_imp.exec_dynamic", "runs code"),
    "_signal.raise_signal": ("_signal.raise_signal", "signals"),
    "signal.raise_signal": ("signal.raise_signal", "signals"),
    "_thread.start_new_thread": ("_thread.start_new_thread", "threads"),
    "_posixsubprocess.fork_exec": ("_posixsubprocess.fork_exec", "runs commands"),
    "marshal.loads": ("marshal.loads", "pickle"),
    "_pickle.loads": ("_pickle.loads", "pickle"),
    "_io.open": ("_io.open", "files"),
    "torch.compile": ("torch.compile", "runs code"),
    "torch.serialization.load": ("torch.serialization.load", "pickle"),
    "_lzma / _bz2 decompressors' modules": ("_bz2.BZ2Decompressor", "files"),
    "uuid's command runner": ("uuid._get_command_stdout", "runs commands"),
}

#: Those the small check on an author's declaration refuses too (known code-running modules and callables,
#: by the declared name and by the object's own identity); the others only the tools' policy refuses.
CODE_RUNNING_LABELS = frozenset(
    {
        "_write_atomic (file write)",
        "_gcd_import",
        "SourceFileLoader class",
        "importlib._bootstrap",
        "_imp.create_dynamic",
        "_imp.exec_dynamic",
        "_posixsubprocess.fork_exec",
        "marshal.loads",
        "_pickle.loads",
        "_io.open",
        "torch.serialization.load",
    }
)


# -- Python functions no family names: refused for what their code reaches ---------------------------


def shell(cmd: str) -> bytes:
    return subprocess.check_output(cmd, shell=True)  # noqa: S602 - the point of the case; never called


def unpickles(data: bytes) -> object:
    return pickle.loads(data)  # noqa: S301 - never called


def writes(path: str) -> None:
    with open(path, "w") as fh:
        fh.write("x")


def _helper(data: bytes) -> object:
    return unpickles(data)


def via_a_helper(data: bytes) -> object:
    return _helper(data)


def removes(path: str) -> None:
    os.remove(path)


def evaluates(src: str) -> object:
    return eval(src)  # noqa: S307 - never called


REACHING_FUNCTIONS = {
    "subprocess": (shell, "subprocess"),
    "pickle.loads": (unpickles, "pickle"),
    "open()": (writes, "builtins.open"),
    "two helpers deep": (via_a_helper, "pickle"),
    "os.remove": (removes, "os"),
    "eval": (evaluates, "builtins.eval"),
}


def add(a: float, b: float) -> float:
    return a + b


def _name(obj: object) -> str:
    return f"{obj.__module__}.{obj.__qualname__}"  # type: ignore[attr-defined]


class TestByName(unittest.TestCase):
    def test_dangerous_reason_says_why(self) -> None:
        for label, (name, why) in BY_NAME.items():
            with self.subTest(label):
                reason = dangerous_reason(name)
                self.assertIsNotNone(reason, name)
                self.assertIn(why, reason)
                self.assertEqual(judge_name(name).kind, "dangerous")

    def test_inspect_reports_them_dangerous_not_as_needing_an_opt_in(self) -> None:
        for label, (name, _) in BY_NAME.items():
            module, _, attr = name.rpartition(".")
            data = H.torch_zip(H.proto(2) + H.call1(H.glob(module, attr), H.ustr("x")) + H.STOP)
            for given in ([], [name]):
                with self.subTest(label, given=given):
                    r = inspect_report("f.pt", given, data=data)
                    self.assertEqual((r["status"], r["exit_code"]), ("dangerous", EXIT_DANGEROUS))
                    self.assertEqual([d["name"] for d in r["dangerous"]], [name])
                    self.assertEqual(r["needs_opt_in"], [])

    def test_unsafe_callable_never_admits_them_in_the_tools(self) -> None:
        import importlib

        for label, (name, why) in BY_NAME.items():
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
            for given in (None, name):
                with self.subTest(label, name=given):
                    reason = judge_global(obj, given, opt_in=True)
                    self.assertIsNotNone(reason)
                    self.assertIn(why, reason)

    def test_as_declarations_only_the_code_running_ones_are_refused(self) -> None:
        import importlib

        self.assertLess(CODE_RUNNING_LABELS, set(BY_NAME))
        for label, (name, _) in BY_NAME.items():
            module, _, attr = name.rpartition(".")
            obj = getattr(importlib.import_module(module), attr)
            own = f"{obj.__module__}.{obj.__qualname__}"
            for target in (name, obj):
                for entry in (UnsafeCallable(target, reason="I trust it"), target):
                    with self.subTest(label, entry=repr(entry)[:60]):
                        if label in CODE_RUNNING_LABELS:
                            with self.assertRaisesRegex(
                                RoundTripConfigError,
                                "^refusing to allowlist .*: .* runs code or reaches the system when a pickle calls it$",
                            ):
                                normalize_safe_globals([entry])
                            continue
                        # the author's to trust, as torch lets them: declared as they wrote it
                        (sg,) = normalize_safe_globals([entry])
                        self.assertIs(sg.obj, obj)
                        expected = (name, own != name) if target is name else (own, False)
                        self.assertEqual((sg.name, sg.explicit_name), expected)
                        reason = "I trust it" if isinstance(entry, UnsafeCallable) else None
                        self.assertEqual(sg.unsafe_reason, reason)

    def test_review_samples_by_object(self) -> None:
        import _frozen_importlib
        import _frozen_importlib_external
        import _imp
        import _signal

        for obj in (
            torch.utils.collect_env.run,
            decoder.basichandlers,
            _frozen_importlib_external._write_atomic,
            _frozen_importlib._gcd_import,
            _imp.create_dynamic,
            _signal.raise_signal,
        ):
            with self.subTest(obj=obj):
                reason = judge_global(obj, opt_in=True)
                self.assertIsNotNone(reason)
                self.assertIn("UnsafeCallable", reason)


class TestByWhatTheyReach(unittest.TestCase):
    def test_reaching_functions_are_dangerous(self) -> None:
        for label, (func, why) in REACHING_FUNCTIONS.items():
            with self.subTest(label):
                verdict = judge_name(_name(func))
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertIn(why, verdict.reason)
                self.assertIn("UnsafeCallable", verdict.reason)
                self.assertEqual(dangerous_reason(_name(func)), verdict.reason)
                self.assertIn("refuses it too", judge_global(func, opt_in=True) or "")
                # the test author's own function: declarable (only the tools analyse what it reaches)
                self.assertEqual(
                    normalize_safe_globals([UnsafeCallable(func, reason="trusted")]),
                    (SafeGlobal(func, _name(func), False, "trusted"),),
                )

    def test_a_harmless_function_still_takes_the_opt_in(self) -> None:
        verdict = judge_name(_name(add))
        self.assertEqual(verdict.kind, "callable")
        self.assertIsNone(dangerous_reason(_name(add)))
        (sg,) = normalize_safe_globals([UnsafeCallable(add, reason="adds")])
        self.assertIs(sg.obj, add)


class TestEveryCallableRefusalNamesTheEscapeHatch(unittest.TestCase):
    def test_messages(self) -> None:
        for obj in (add, len, torch.add, torch.nn.functional.relu):
            with self.subTest(obj=obj):
                self.assertIn("UnsafeCallable", judge_global(obj) or "")
                if obj is torch.add:  # pickled as torch._VariableFunctionsClass.add, which imports nothing
                    with self.assertRaisesRegex(
                        RoundTripConfigError,
                        "^refusing to allowlist torch._VariableFunctionsClass.add: safe global "
                        "'torch._VariableFunctionsClass.add' is not importable",
                    ):
                        normalize_safe_globals([obj])
                    continue
                # a plain function is declarable without UnsafeCallable (the tools ask for that form)
                self.assertEqual(normalize_safe_globals([obj]), (SafeGlobal(obj, _name(obj)),))
        name = _name(add)
        self.assertIn(f"UnsafeCallable('{name}'", judge_name(name).reason)
        (note,) = refusal_notes([name])
        self.assertIn("UnsafeCallable", note)


if __name__ == "__main__":
    unittest.main()
