"""The trust policy (issue #11.2): classes only, callables by explicit opt-in, a denylist as
second line covering whole families of dangerous callables, never suggested.

The full policy is the tools' (``inspect``, ``audit``, snippets: bytes from strangers).  A test
author's declaration gets only the small check (issue 37): modules, known code-running callables and
names that import nothing are refused; any other class or function is trusted as torch trusts it.
"""

from __future__ import annotations

import io
import os
import subprocess
import sys
import types
import unittest

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import numpy as np  # noqa: E402  (torch imports numpy already)
import torch  # noqa: E402

from test.helpers import hostile_checkpoints as H  # noqa: E402
from torch_serial_testing import (
    AllowlistError,
    Checkpoint,
    RoundTripConfigError,
    SerializationRoundTripTestCase,
    UnsafeCallable,
    required_globals,
)
from torch_serial_testing.declarations import Declaration, SafeGlobal, normalize_safe_globals
from torch_serial_testing.registry import torch_allowlist_table
from torch_serial_testing.tools.cli.contract import EXIT_ATTENTION, EXIT_DANGEROUS
from torch_serial_testing.tools.cli.inspection import format_inspect, inspect_report
from torch_serial_testing.tools.policy.trust import dangerous_reason, judge_global, judge_name

from test.helpers.roundtrip_fixtures import SAFE_GLOBALS_SKIP  # noqa: E402

#: Callables from every family of issue #11.2: each must be judged dangerous by name.
DANGEROUS_FAMILIES = {
    "torch full-unpickle helper": "torch.storage._load_from_bytes",
    "torch import helper": "torch._utils._import_dotted_name",
    "fx reduce helper (exec)": "torch.fx.graph_module.reduce_graph_module",
    "fx package reduce helper": "torch.fx.graph_module.reduce_package_graph_module",
    "fx GraphModule class": "torch.fx.graph_module.GraphModule",
    "numpy runstring": "numpy.testing._private.utils.runstring",
    "cpp_extension load_inline": "torch.utils.cpp_extension.load_inline",
    "cpp_extension load": "torch.utils.cpp_extension.load",
    "timeit": "timeit.timeit",
    "timeit Timer class": "timeit.Timer",
    "pdb.run": "pdb.run",
    "cProfile.run": "cProfile.run",
    "profile.run": "profile.run",
    "pydoc pager": "pydoc.pager",
    "pydoc pipepager": "pydoc.pipepager",
    "logging fileConfig": "logging.config.fileConfig",
    "logging listen": "logging.config.listen",
    "urlretrieve": "urllib.request.urlretrieve",
    "urlopen": "urllib.request.urlopen",
    "http connection": "http.client.HTTPConnection",
    "numpy.load": "numpy.load",
    "numpy memmap": "numpy.memmap",
    "torch.ops.load_library": "torch.ops.load_library",
    "types.FunctionType at runtime": "builtins.function",
    "types.CodeType at runtime": "builtins.code",
    "types.FunctionType": "types.FunctionType",
    "builtins.type": "builtins.type",
    "builtins.getattr": "builtins.getattr",
    "copyreg reconstructor": "copyreg._reconstructor",
    "functools.partial": "functools.partial",
    "operator.methodcaller": "operator.methodcaller",
    "torch.load": "torch.load",
    "torch.jit.load": "torch.jit.load",
    "ctypes": "ctypes.CDLL",
    "io.FileIO": "io.FileIO",
    "shutil.rmtree": "shutil.rmtree",
    "dunder walk": "torch.nn.Module.__init__.__globals__",
    "walk into os": "torch.serialization.os.system",
}

# What torch.save writes for a numpy array: numpy 2 moved numpy.core to numpy._core.
_NP_CORE = np._core if hasattr(np, "_core") else np.core
RECONSTRUCT = _NP_CORE.multiarray._reconstruct
RECONSTRUCT_NAME = f"{_NP_CORE.multiarray.__name__}.{RECONSTRUCT.__name__}"
# torch's BUILD check of a dtype wants its class (numpy >= 1.25 has numpy.dtypes).
DTYPE_CLASSES = (type(np.dtype("float64")),) if hasattr(np, "dtypes") else ()


class Meta(type):
    pass


class Spawner(subprocess.Popen):  # type: ignore[type-arg]
    pass


class Opener(io.FileIO):
    pass


class Pickler(__import__("pickle").Unpickler):
    pass


def _call_checkpoint(module: str, name: str) -> bytes:
    return H.torch_zip(H.proto(2) + H.call1(H.glob(module, name), H.ustr("x")) + H.STOP)


class TestDenylistFamilies(unittest.TestCase):
    def test_every_family_is_dangerous_by_name(self) -> None:
        for family, name in DANGEROUS_FAMILIES.items():
            with self.subTest(family, name=name):
                verdict = judge_name(name)
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertEqual(dangerous_reason(name), verdict.reason)

    def test_inspect_flags_every_family_and_suggests_nothing(self) -> None:
        for family, name in DANGEROUS_FAMILIES.items():
            module, _, attr = name.rpartition(".")
            with self.subTest(family):
                r = inspect_report("f.pt", [], data=_call_checkpoint(module, attr))
                self.assertEqual((r["status"], r["exit_code"]), ("dangerous", EXIT_DANGEROUS))
                self.assertEqual([d["name"] for d in r["dangerous"]], [name])
                self.assertIsNone(r["snippet"])
                # and allowlisting it by hand is reported as unsafe, never as loading
                r = inspect_report("f.pt", [name], data=_call_checkpoint(module, attr))
                self.assertEqual(r["exit_code"], EXIT_DANGEROUS)
                if not SAFE_GLOBALS_SKIP:
                    self.assertEqual(r["modes"]["safe_globals"]["outcome"], "unsafe")

    def test_family_members_refused_by_the_tools_declarations_by_the_small_check(self) -> None:
        import pdb
        import timeit

        runs_code = "^refusing to allowlist {0}: {1} runs code or reaches the system when a pickle calls it$"
        load_from_bytes = torch.storage._load_from_bytes
        # (declared, the object and name the tools judge, what a declaration of it gives)
        cases = (
            (load_from_bytes, runs_code.format(*["torch.storage._load_from_bytes"] * 2)),  # a full torch.load
            (
                torch._utils._import_dotted_name,
                (SafeGlobal(torch._utils._import_dotted_name, "torch._utils._import_dotted_name"),),
            ),
            (timeit.Timer, (SafeGlobal(timeit.Timer, "timeit.Timer"),)),
            (pdb.run, runs_code.format("pdb.run", "pdb.run")),
            (
                UnsafeCallable(load_from_bytes, reason="it is a torch function"),
                runs_code.format(*["torch.storage._load_from_bytes"] * 2),
            ),
            (
                UnsafeCallable("timeit.timeit", reason="benchmark"),
                (SafeGlobal(timeit.timeit, "timeit.timeit", False, "benchmark"),),
            ),
            # the constructors of functions and code objects build code from the pickle's data
            (types.FunctionType, runs_code.format("builtins.function", "builtins.function")),
            (types.CodeType, runs_code.format("builtins.code", "builtins.code")),
            ((types.FunctionType, "harmless.Name"), runs_code.format("harmless.Name", "builtins.function")),
        )
        for declared, expected in cases:
            with self.subTest(declared=declared):
                if isinstance(declared, UnsafeCallable):
                    target = declared.target
                    obj = timeit.timeit if isinstance(target, str) else target
                    self.assertIsNotNone(judge_global(obj, opt_in=True))
                else:
                    self.assertIsNotNone(judge_global(declared))
                if isinstance(expected, str):
                    with self.assertRaisesRegex(RoundTripConfigError, expected):
                        normalize_safe_globals([declared])
                else:
                    self.assertEqual(normalize_safe_globals([declared]), expected)

    def test_genuine_graph_module_checkpoint_gets_no_snippet(self) -> None:
        class AddOne(torch.nn.Module):
            def forward(self, x):  # type: ignore[no-untyped-def]
                return x + 1

        buf = io.BytesIO()
        torch.save(torch.fx.symbolic_trace(AddOne()), buf)
        r = inspect_report("gm.pt", [], data=buf.getvalue())
        self.assertEqual(r["status"], "dangerous")
        self.assertIn("torch.fx.graph_module.reduce_graph_module", [d["name"] for d in r["dangerous"]])
        self.assertIsNone(r["snippet"])

    def test_torch_own_allowlist_passes_the_policy(self) -> None:
        for name, obj in dict(torch_allowlist_table()).items():
            with self.subTest(name):
                self.assertIsNone(judge_global(obj, name))
                self.assertEqual(judge_name(name).kind, "allowlisted")


class TestClassesOnly(unittest.TestCase):
    def test_flagship_classes_are_suggested(self) -> None:
        from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
        from torch.ao.nn.sparse.quantized.linear import LinearPackedParams

        for obj in (Linear, LinearPackedParams, torch.ScriptObject, torch.nn.Linear, set, np.ndarray, np.dtype):
            with self.subTest(obj=obj):
                self.assertIsNone(judge_global(obj))
                name = f"{obj.__module__}.{obj.__qualname__}"
                self.assertIn(judge_name(name).kind, ("class", "allowlisted"))

    def test_aliases_are_not_suggested(self) -> None:
        # torch matches a class by its own module.qualname: allowlisting Linear never matches
        # a checkpoint naming it torch.nn.Linear, so that name is not suggested as if it would.
        for name in ("torch.nn.Linear", "torch.nn.modules.linear.torch.nn.Linear"):
            with self.subTest(name):
                verdict = judge_name(name)
                self.assertEqual((verdict.kind, verdict.suggestible), ("alias", False))
                self.assertIn("torch.nn.modules.linear.Linear", verdict.reason)
                r = inspect_report("f.pt", [], data=_call_checkpoint(*name.rsplit(".", 1)))
                self.assertEqual((r["status"], r["snippet"]), ("unloadable", None))
        self.assertEqual(judge_name("torch.nn.modules.linear.Linear").kind, "class")

    def test_functions_are_refused_and_never_suggested(self) -> None:
        for obj in (RECONSTRUCT, torch.nn.functional.relu, len, print, torch.add):
            with self.subTest(obj=obj):
                self.assertIsNotNone(judge_global(obj))
                if obj is torch.add:  # pickled as torch._VariableFunctionsClass.add, which imports nothing
                    with self.assertRaisesRegex(RoundTripConfigError, "^refusing to allowlist .* is not importable"):
                        normalize_safe_globals([obj])
                    continue
                # a test author may declare a function plainly, as torch lets them
                name = f"{obj.__module__}.{obj.__qualname__}"
                self.assertEqual(normalize_safe_globals([obj]), (SafeGlobal(obj, name),))
        verdict = judge_name(RECONSTRUCT_NAME)
        self.assertEqual((verdict.kind, verdict.suggestible), ("callable", False))
        self.assertIn("not a class", verdict.reason)

    def test_metaclasses_and_dangerous_subclasses_are_refused(self) -> None:
        for cls, why in (
            (Meta, "metaclass"),
            (Spawner, "subclasses subprocess.Popen"),
            (Opener, "subclasses _io.FileIO"),
            (Pickler, "subclasses _pickle.Unpickler"),
        ):
            with self.subTest(cls=cls):
                self.assertIn(why, judge_global(cls))
                name = f"{__name__}.{cls.__qualname__}"
                self.assertIn(why, judge_name(name).reason)
                # the test author's own class: declarable (only the tools analyse what it can reach)
                self.assertEqual(normalize_safe_globals([cls]), (SafeGlobal(cls, name),))

    def test_numpy_checkpoint_needs_the_explicit_opt_in(self) -> None:
        state = {"weight": torch.ones(2), "stats": np.arange(3.0)}
        needed = required_globals(state)
        self.assertIn(RECONSTRUCT_NAME, needed)
        data = Checkpoint.save(state).rewound().getvalue()
        r = inspect_report("np.pt", [], data=data)
        self.assertEqual((r["status"], r["exit_code"]), ("needs_opt_in", EXIT_ATTENTION))
        # numpy pickles an array's bytes through _codecs.encode: a function, on torch's own allowlist
        # since torch 2.5; where it is not (asked of torch), torch's refusal names it as the remedy
        # (as for numpy scalars), so it needs no opt-in -- only the reconstructor does.
        codecs_needed = "_codecs.encode" not in torch_allowlist_table()
        self.assertEqual("_codecs.encode" in needed, codecs_needed)
        self.assertEqual([d["name"] for d in r["needs_opt_in"]], [RECONSTRUCT_NAME])
        # the numpy recipe: a snippet without --safe-global, numpy's reconstructor marked in it (issue 41),
        # and pasted, it makes torch load the file
        self.assertIn(f"import {RECONSTRUCT_NAME.rpartition('.')[2]}  # not a class", r["snippet"])
        self.assertIn("the numpy recipe", r["snippet"])
        pasted: dict = {"f": io.BytesIO(data)}
        exec(r["snippet"], pasted)
        self.assertEqual(pasted["obj"]["stats"].tolist(), [0.0, 1.0, 2.0])
        self.assertIn(f"UnsafeCallable('{RECONSTRUCT_NAME}'", "\n".join(r["notes"]))
        text = format_inspect(r)
        self.assertIn("NOT A CLASS", text)
        self.assertIn("status: NEEDS_OPT_IN (exit 1)", text)
        self.assertNotIn("no snippet: loading it also needs", text)
        # named with --safe-global, the functions join the snippet, marked; classes still verified ones
        opted = [d["name"] for d in r["needs_opt_in"]]
        r = inspect_report("np.pt", opted, data=data)
        self.assertIn("from numpy import ndarray", r["snippet"])
        for name in opted:
            module, _, attr = name.rpartition(".")
            self.assertIn(f"from {module} import {attr}  # not a class", r["snippet"])

    def test_a_numpy_checkpoint_loads_with_the_reconstructor_declared(self) -> None:
        # inspect asks for UnsafeCallable before it suggests a function (above); a test author may
        # declare numpy's reconstructor either way, as torch lets them allowlist it.
        if SAFE_GLOBALS_SKIP:
            self.skipTest(SAFE_GLOBALS_SKIP)
        state = {"stats": np.arange(3.0)}
        dtype_names = {f"{c.__module__}.{c.__qualname__}" for c in DTYPE_CLASSES}
        extra = [
            g
            for g in required_globals(state)
            if g not in (RECONSTRUCT_NAME, "numpy.ndarray", "numpy.dtype") and g not in dtype_names
        ]
        # torch's BUILD check also wants the dtype's class, which the pickle does not name as a
        # global (required_globals lists it from the scan's BUILD types)
        classes = (np.ndarray, np.dtype, *DTYPE_CLASSES, *extra)
        for reconstruct in (UnsafeCallable(RECONSTRUCT, reason="numpy arrays in the state"), RECONSTRUCT):
            with self.subTest(reconstruct=reconstruct):

                class NumpyState(SerializationRoundTripTestCase, unittest.TestCase):
                    safe_globals = (reconstruct, *classes)  # exactly what it needs: nothing over-trusted

                    def runTest(self) -> None:  # noqa: N802
                        pass

                probe = NumpyState()
                probe.setUp()
                try:
                    loaded = probe.round_trip(state, mode="safe_globals")
                finally:
                    probe.doCleanups()
                np.testing.assert_array_equal(loaded["stats"], state["stats"])

        class Undeclared(SerializationRoundTripTestCase, unittest.TestCase):
            safe_globals = classes

            def runTest(self) -> None:  # noqa: N802
                pass

        probe = Undeclared()
        probe.setUp()
        try:
            with self.assertRaises(AllowlistError) as cm:
                probe.round_trip(state, mode="safe_globals")
        finally:
            probe.doCleanups()
        # the one declaration that fixes it names the reconstructor plainly
        fixed = [RECONSTRUCT_NAME, "numpy.ndarray", "numpy.dtype", *sorted(dtype_names), *extra]
        self.assertEqual(
            str(cm.exception),
            f"Undeclared.safe_globals misses 1 global(s) the checkpoint needs: {RECONSTRUCT_NAME}\n"
            "The exact declaration (declare only what you trust):\n\n"
            + Declaration("Undeclared", "safe_globals").fix(fixed),
        )
        self.assertIn(f"from {_NP_CORE.multiarray.__name__} import _reconstruct\n", str(cm.exception))

    def test_opt_in_needs_a_reason_and_a_plain_function(self) -> None:
        import functools

        with self.assertRaisesRegex(RoundTripConfigError, "needs reason="):
            UnsafeCallable(len, reason="  ")
        # what a pickle cannot name (no module and qualified name of its own), or names as another object
        unnamed = "^refusing to allowlist .*: it has no __module__/__qualname__ of its own; declare a class or function"
        for target, refusal in (
            (functools.partial(len), unnamed),
            (
                torch.nn.Linear(1, 1).forward,
                "^refusing to allowlist torch.nn.modules.linear.Linear.forward: torch.nn.modules.linear.Linear.forward "
                "resolves to another object",
            ),
            (os.system.__call__, unnamed),
            (os, "^refusing to allowlist 'os': it is the module 'os': a pickle names globals in modules"),
        ):
            with self.subTest(target=target):
                self.assertIsNotNone(judge_global(target, opt_in=True))
                with self.assertRaisesRegex(RoundTripConfigError, refusal):
                    normalize_safe_globals([UnsafeCallable(target, reason="because")])
        (sg,) = normalize_safe_globals([UnsafeCallable("torch.nn.functional.relu", reason="a test")])
        self.assertEqual((sg.name, sg.unsafe_reason), ("torch.nn.functional.relu", "a test"))


if __name__ == "__main__":
    unittest.main()
