"""Being a class is not being safe (issue 27.1): the tools' trust policy judges what constructing or
BUILD-ing a class can reach.  Compiled classes (``torch._C``'s, pybind11, C types) are refused unless
torch vouches for them, and so are Python classes whose constructor, ``__setstate__`` or finalizer
reaches files, sockets, processes, compilers or other pickles: never suggested, never accepted by
``--safe-global``.  A test author's own declaration of such a class is theirs to trust, as torch lets
it be (issue 37: only the small check applies to declarations); the tools still refuse it in bytes from
strangers.  The crafted checkpoints are only ever scanned; a ``torch.load`` during any of these checks
fails the test.
"""

from __future__ import annotations

import array
import collections
import functools
import io
import json
import os
import pickle
import subprocess
import sys
import tempfile
import unittest
from contextlib import contextmanager, redirect_stdout
from typing import Any, Iterator
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import torch  # noqa: E402
import torch.distributed  # noqa: E402,F401

try:
    import torch.cuda.gds  # noqa: F401
except ImportError:  # torch < 2.5 has no GPUDirect Storage bindings
    pass

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import SerializationRoundTripTestCase
from torch_serial_testing.declarations import SafeGlobal, normalize_safe_globals
from torch_serial_testing.tools.cli import main as cli_main
from torch_serial_testing.tools.cli.contract import EXIT_DANGEROUS, EXIT_OK
from torch_serial_testing.tools.cli.inspection import format_inspect, inspect_report
from torch_serial_testing.tools.policy.reach import TRUSTED_NATIVE
from torch_serial_testing.tools.policy.snippet import refusal_notes, safe_globals_snippet
from torch_serial_testing.tools.policy.trust import judge_global, judge_name

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP  # noqa: E402

#: The review's native classes with side effects, by the name a pickle would carry (their own).
#: (Those this torch has: older releases lack the AOTI loader, GdsFile and _WorkerServer.)
ATTACK_CLASSES = {
    case: cls
    for case, path in {
        "AOTI loader (runs the compiler)": "_C._aoti.AOTIModelPackageLoader",
        "PyTorchFileWriter (truncates a file)": "PyTorchFileWriter",
        "GdsFile (opens with the pickle's flags)": "cuda.gds.GdsFile",
        "FileStore (creates a file)": "distributed.FileStore",
        "TCPStore (outbound connection)": "distributed.TCPStore",
        "_WorkerServer (HTTP server)": "_C._distributed_c10d._WorkerServer",
    }.items()
    if (cls := functools.reduce(lambda o, a: getattr(o, a, None), path.split("."), torch)) is not None
}


def _name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


# -- classes no family names: the construction check alone refuses them ------------------------------


class CompiledSubclass(array.array):
    """A Python class over a compiled type nothing vouches for: array.array's constructor is C."""


class OpensInInit:
    def __init__(self, path: str) -> None:
        self.f = open(path, "w")  # noqa: SIM115 - the point of the case


class SpawnsInSetstate:
    def __setstate__(self, state: Any) -> None:
        subprocess.run(state["cmd"], check=False)


class RemovesInDel:
    def __del__(self) -> None:
        os.remove(self.path)  # type: ignore[attr-defined]


def _unpickle_helper(data: bytes) -> Any:
    return pickle.loads(data)


class UnpicklesThroughAHelper:
    def __init__(self, data: bytes) -> None:
        self.value = self._decode(data)

    def _decode(self, data: bytes) -> Any:
        return _unpickle_helper(data)


class FlagsMixin:
    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_RDONLY)


class InheritsAReachingInit(FlagsMixin):
    pass


REACHING = {
    # array.array is a heap type from Python 3.10 (its compiled __new__ is named), a static one before
    "compiled base": (CompiledSubclass, r"array\.array(\.__new__ is compiled code| is a compiled type)"),
    "open() in __init__": (OpensInInit, r"builtins\.open"),
    "subprocess in __setstate__": (SpawnsInSetstate, "subprocess"),
    "os in __del__": (RemovesInDel, r"\bos\b"),
    "pickle through a method and a helper": (UnpicklesThroughAHelper, "pickle"),
    "inherited __init__ using os": (InheritsAReachingInit, r"\bos\b"),
}


# -- classes that stay classes -----------------------------------------------------------------------


class Plain:
    def __init__(self, a: int = 1) -> None:
        self.a = a


class UsesSysAndInspect:
    """Reaching sys or inspect in a constructor is not reaching the outside world."""

    def __init__(self) -> None:
        import inspect

        self.frames = len(inspect.stack(0)) + len(sys.argv)


class MyTensor(torch.Tensor):
    """A Python tensor subclass: torch.Tensor, which torch allowlists, vouches for its compiled base."""


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = torch.nn.Linear(2, 2)


BENIGN = (Plain, UsesSysAndInspect, MyTensor, Net, torch.nn.Linear, torch.nn.Conv2d, torch.nn.LSTM, collections.deque)


@contextmanager
def no_torch_load() -> Iterator[None]:
    """Fail on any torch.load while the block runs (declarations are judged before anything loads)."""

    def refuse(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("torch.load was called on crafted bytes")

    with mock.patch.object(torch, "load", refuse), mock.patch.object(torch.serialization, "load", refuse):
        yield


def _reduce_checkpoint(name: str, *args: str) -> bytes:
    """A torch zip whose data.pkl calls *name* with string arguments (REDUCE)."""
    module, _, attr = name.rpartition(".")
    ops = H.glob(module, attr) + pickle.MARK + b"".join(H.ustr(a) for a in args) + pickle.TUPLE + pickle.REDUCE
    return H.torch_zip(H.proto(2) + ops + H.STOP)


def _build_checkpoint(name: str) -> bytes:
    """A torch zip whose data.pkl makes an instance with NEWOBJ and BUILDs it from a dict."""
    module, _, attr = name.rpartition(".")
    ops = H.glob(module, attr) + pickle.EMPTY_TUPLE + pickle.NEWOBJ + pickle.EMPTY_DICT + pickle.BUILD
    return H.torch_zip(H.proto(2) + ops + H.STOP)


class TestNativeAttackClasses(unittest.TestCase):
    def test_judged_dangerous_never_suggested(self) -> None:
        names = [_name(c) for c in ATTACK_CLASSES.values()]
        for label, cls in ATTACK_CLASSES.items():
            with self.subTest(label):
                verdict = judge_name(_name(cls))
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertFalse(verdict.suggestible)
                self.assertIsNotNone(judge_global(cls))
        snippet = safe_globals_snippet(names, context=True)
        for cls in ATTACK_CLASSES.values():
            self.assertNotIn(cls.__name__, snippet)
        notes = refusal_notes(names)
        self.assertEqual(len(notes), len(names))
        self.assertTrue(all("NOT suggested (dangerous)" in n and "never allowlist it" in n for n in notes), notes)

    def test_declarable_by_a_test_author_refused_by_the_tools(self) -> None:
        # torch's own classes pass the small check on declarations (torch lets them be allowlisted);
        # the tools' policy, which judges bytes from strangers, refuses each under the same name.
        for label, cls in ATTACK_CLASSES.items():
            for entry in (cls, _name(cls), (cls, _name(cls))):
                with self.subTest(label, entry=repr(entry)[:60]), no_torch_load():
                    explicit = isinstance(entry, tuple)
                    self.assertEqual(normalize_safe_globals([entry]), (SafeGlobal(cls, _name(cls), explicit),))
                    reason = judge_name(_name(cls)).reason
                    self.assertEqual((judge_global(cls), judge_global(cls, _name(cls))), (reason, reason))
        with no_torch_load():

            class Declares(SerializationRoundTripTestCase, unittest.TestCase):
                safe_globals = (torch.PyTorchFileWriter,)

        loader = torch.PyTorchFileWriter
        self.assertEqual(Declares._tst_safe_globals, (SafeGlobal(loader, _name(loader)),))

    def test_crafted_checkpoints_are_dangerous_even_with_safe_global(self) -> None:
        with tempfile.TemporaryDirectory() as tmp:
            target = os.path.join(tmp, "never-written")
            for label, cls in ATTACK_CLASSES.items():
                name = _name(cls)  # the REDUCE form would create *target* if anything loaded it
                for shape, data in (
                    ("REDUCE", _reduce_checkpoint(name, target, "model")),
                    ("NEWOBJ+BUILD", _build_checkpoint(name)),
                ):
                    for given in ([], [name]):
                        with self.subTest(label, shape=shape, given=given):
                            r = inspect_report("crafted.pt", given, data=data)
                            self.assertEqual((r["status"], r["exit_code"]), ("dangerous", EXIT_DANGEROUS))
                            self.assertEqual([d["name"] for d in r["dangerous"]], [name])
                            self.assertIsNone(r["snippet"])
                            if given and not SAFE_GLOBALS_SKIP:
                                self.assertEqual(r["modes"]["safe_globals"]["outcome"], "unsafe")
                            self.assertIn("DANGEROUS", format_inspect(r))
            self.assertEqual(os.listdir(tmp), [])

    def test_cli_exit_code_with_safe_global(self) -> None:
        name = _name(torch.PyTorchFileWriter)
        with tempfile.TemporaryDirectory() as tmp:
            path = os.path.join(tmp, "crafted.pt")
            with open(path, "wb") as fh:
                fh.write(_reduce_checkpoint(name, os.path.join(tmp, "victim")))
            out = io.StringIO()
            with redirect_stdout(out):
                code = cli_main(["inspect", path, "--safe-global", name, "--json"])
            self.assertEqual(code, EXIT_DANGEROUS)
            report = json.loads(out.getvalue())
            self.assertEqual(report["status"], "dangerous")
            self.assertEqual(sorted(os.listdir(tmp)), ["crafted.pt"])


class TestWhatConstructionReaches(unittest.TestCase):
    def test_reaching_classes_are_refused(self) -> None:
        for label, (cls, why) in REACHING.items():
            with self.subTest(label):
                verdict = judge_name(_name(cls))
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertIn("constructing or BUILD-ing it", verdict.reason)
                self.assertRegex(verdict.reason, why)
                self.assertEqual(judge_global(cls), verdict.reason)
                # the test author's own class: declarable, only the tools analyse what it reaches
                self.assertEqual(normalize_safe_globals([cls]), (SafeGlobal(cls, _name(cls)),))
                r = inspect_report("f.pt", [_name(cls)], data=_build_checkpoint(_name(cls)))
                self.assertEqual(r["exit_code"], EXIT_DANGEROUS)

    def test_compiled_classes_nothing_vouches_for(self) -> None:
        # in no denylist family: refused because their construction is compiled code
        for cls in (torch._C.Generator, array.array):
            with self.subTest(cls=cls):
                verdict = judge_name(_name(cls))
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertIn("compiled", verdict.reason)

    def test_benign_classes_stay_classes(self) -> None:
        for cls in BENIGN:
            with self.subTest(cls=cls):
                self.assertIsNone(judge_global(cls))
                self.assertEqual(judge_name(_name(cls)).kind, "class", judge_name(_name(cls)))
                self.assertEqual(normalize_safe_globals([cls])[0].obj, cls)

    def test_trusted_native_classes_are_the_listed_ones(self) -> None:
        import numpy as np

        for name in ("torch.ScriptObject", "numpy.ndarray", "collections.defaultdict", "datetime.datetime"):
            with self.subTest(name):
                self.assertIn(name, TRUSTED_NATIVE)
                verdict = judge_name(name)
                self.assertEqual(verdict.kind, "class")
                self.assertIn(TRUSTED_NATIVE[name], verdict.reason)
        self.assertIsNone(judge_global(np.ndarray))
        self.assertIsNone(judge_global(torch.ScriptObject))

    def test_crafted_benign_class_checkpoint_still_loads(self) -> None:
        # the construction check does not turn an ordinary class checkpoint into a false alarm
        r = inspect_report("f.pt", [_name(Plain)], data=_build_checkpoint(_name(Plain)))
        self.assertEqual(r["dangerous"], [])
        if not SAFE_GLOBALS_SKIP:
            self.assertEqual((r["status"], r["exit_code"]), ("loads", EXIT_OK))


if __name__ == "__main__":
    unittest.main()
