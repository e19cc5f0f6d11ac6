"""Full-load gadgets (issue #11.7): names a full unpickle resolves differently, and names the
policy cannot verify, are dangerous wherever a verdict or a suggestion is printed; judging never
imports what a checkpoint names.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import textwrap
import types
import unittest
from typing import Any
from unittest import mock

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

import torch  # noqa: E402,F401

from torch_serial_testing import Checkpoint
from torch_serial_testing.tools.cli.contract import EXIT_ATTENTION, EXIT_DANGEROUS
from torch_serial_testing.tools.cli.inspection import inspect_report
from torch_serial_testing.tools.names import pickle_forms
from torch_serial_testing.tools.policy.trust import judge_name

from test.policy.test_trust_policy import _call_checkpoint  # noqa: E402

#: Names pickle rewrites for protocol < 3 (_compat_pickle) into a dangerous callable.
COMPAT_GADGETS = {
    "cPickle.loads": "pickle.loads",
    "urllib.urlretrieve": "urllib.request.urlretrieve",
    "commands.getoutput": "subprocess.getoutput",
    "__builtin__.eval": "builtins.eval",
    "itertools.imap": "builtins.map",
    # harmless-looking raw names that only their _compat_pickle form gives away
    "__builtin__.reduce": "functools.reduce",
    "__builtin__.intern": "sys.intern",
}


class TestCompatSpellings(unittest.TestCase):
    def test_compat_pickle_spellings_are_judged_as_a_full_unpickle_resolves_them(self) -> None:
        for name, resolved in COMPAT_GADGETS.items():
            with self.subTest(name):
                verdict = judge_name(name)
                self.assertEqual(verdict.kind, "dangerous", verdict)
                self.assertIn(resolved, pickle_forms(name))
                if name.startswith("__builtin__.") and name != "__builtin__.eval":
                    self.assertIn(f"a full unpickle resolves it as {resolved}", verdict.reason)

    def test_inspect_flags_compat_spellings(self) -> None:
        for name in COMPAT_GADGETS:
            with self.subTest(name):
                r = inspect_report("f.pt", [], data=_call_checkpoint(*name.rsplit(".", 1)))
                self.assertEqual((r["status"], r["exit_code"], r["snippet"]), ("dangerous", EXIT_DANGEROUS, None))


class TestFullLoadNames(unittest.TestCase):
    """The scanner's ``full_load_globals`` / ``weights_only_blocker`` facts feed the verdicts."""

    def info(self, **extra: Any) -> Any:
        real = Checkpoint.from_bytes(_call_checkpoint("torch.nn.modules.linear", "Linear")).info
        return dataclasses.replace(real, **extra)  # the real scan, with one fact changed

    def report(self, info: Any) -> dict:
        with mock.patch.object(Checkpoint, "info", new_callable=mock.PropertyMock, return_value=info):
            return inspect_report("f.pt", [], data=_call_checkpoint("torch.nn.modules.linear", "Linear"))

    def test_without_the_facts_a_class_is_suggested(self) -> None:
        r = self.report(self.info())
        self.assertEqual((r["status"], r["dangerous"]), ("needs_allowlist", []))
        self.assertIn("from torch.nn.modules.linear import Linear", r["snippet"])

    def test_a_dangerous_full_load_name_is_flagged(self) -> None:
        for full in (
            ("urllib.request.urlretrieve",),
            {"urllib.urlretrieve": "urllib.request.urlretrieve"},
            ("pickle.loads", "torch.nn.modules.linear.Linear"),
        ):
            with self.subTest(full=full):
                r = self.report(self.info(full_load_globals=full))
                self.assertEqual((r["status"], r["exit_code"]), ("dangerous", EXIT_DANGEROUS))
                self.assertIn("a full unpickle of this file resolves a global as", r["dangerous"][0]["reason"])
                self.assertIsNone(r["snippet"])

    def test_a_weights_only_blocker_means_no_snippet(self) -> None:
        r = self.report(self.info(weights_only_blocker="Unsupported operand 147"))
        self.assertEqual((r["status"], r["exit_code"], r["snippet"]), ("unloadable", EXIT_DANGEROUS, None))
        self.assertIn("Unsupported operand 147", r["error"])


class TestCannotTellIsDangerous(unittest.TestCase):
    """A name the policy cannot verify without importing is dangerous, and nothing is imported."""

    @classmethod
    def setUpClass(cls) -> None:
        cls.tmp = tempfile.mkdtemp(prefix="tst-trust-")
        cls.sentinel = os.path.join(cls.tmp, "imported")
        pkg = os.path.join(cls.tmp, "tst_lazy_pkg")
        os.makedirs(pkg)
        with open(os.path.join(pkg, "__init__.py"), "w") as fh:
            fh.write("")
        with open(os.path.join(pkg, "sub.py"), "w") as fh:
            fh.write(f"open({cls.sentinel!r}, 'a').write('sub')\nimport subprocess\nrun = subprocess.getoutput\n")
        with open(os.path.join(cls.tmp, "tst_never_imported.py"), "w") as fh:
            fh.write(f"open({cls.sentinel!r}, 'a').write('top')\nclass Safe: pass\n")
        sys.path.insert(0, cls.tmp)
        import tst_lazy_pkg  # noqa: F401 - the package is imported, its submodule is not

    @classmethod
    def tearDownClass(cls) -> None:
        sys.path.remove(cls.tmp)
        for mod in ("tst_lazy_pkg", "tst_lazy_pkg.sub", "tst_never_imported", "tst_getattr_mod"):
            sys.modules.pop(mod, None)
        shutil.rmtree(cls.tmp, ignore_errors=True)

    def assertNothingImported(self) -> None:  # noqa: N802
        self.assertFalse(os.path.exists(self.sentinel), "judging imported a module the checkpoint names")
        self.assertNotIn("tst_lazy_pkg.sub", sys.modules)
        self.assertNotIn("tst_never_imported", sys.modules)

    def test_unimported_submodule(self) -> None:
        verdict = judge_name("tst_lazy_pkg.sub.run")  # really subprocess.getoutput
        self.assertEqual(verdict.kind, "dangerous")
        self.assertIn("cannot tell", verdict.reason)
        self.assertNothingImported()

    def test_unimported_module(self) -> None:
        verdict = judge_name("tst_never_imported.Safe")
        self.assertEqual(verdict.kind, "dangerous")
        self.assertIn("not imported", verdict.reason)
        self.assertNothingImported()

    def test_module_level_getattr(self) -> None:
        mod = types.ModuleType("tst_getattr_mod")
        mod.__getattr__ = lambda name: subprocess.getoutput  # type: ignore[attr-defined]
        sys.modules["tst_getattr_mod"] = mod
        verdict = judge_name("tst_getattr_mod.Anything")
        self.assertEqual(verdict.kind, "dangerous")
        self.assertIn("__getattr__", verdict.reason)

    def test_inspect_treats_cannot_tell_as_dangerous(self) -> None:
        # The library's verdict stays "dangerous" (judge_name above); inspect says *unverified* when only
        # a module not imported stands in the way (exit 1, the fix --import), never suggesting it.
        for module, name, status in (
            ("tst_lazy_pkg.sub", "run", "unverified"),
            ("tst_never_imported", "Safe", "unverified"),
            ("numpy.distutils.cpuinfo", "getstatusoutput", "dangerous"),
            ("torch", "not_an_attribute", "dangerous"),
        ):
            with self.subTest(module=module):
                r = inspect_report("f.pt", [], data=_call_checkpoint(module, name))
                code = EXIT_ATTENTION if status == "unverified" else EXIT_DANGEROUS
                self.assertEqual((r["status"], r["exit_code"]), (status, code))
                if status == "unverified":
                    self.assertEqual(
                        r["unverified"], [dict(r["unverified"][0], name=f"{module}.{name}", module=module)]
                    )
                    self.assertEqual(r["dangerous"], [])
                self.assertIsNone(r["snippet"])
                self.assertNothingImported()

    def test_cli_process_imports_nothing_it_judges(self) -> None:
        path = os.path.join(self.tmp, "c.pt")
        with open(path, "wb") as fh:
            fh.write(_call_checkpoint("tst_never_imported", "Safe"))
        code = textwrap.dedent(f"""
            import sys
            sys.path.insert(0, {self.tmp!r})
            from torch_serial_testing.tools import cli
            rc = cli.main(["inspect", {path!r}, "--json"])
            assert "tst_never_imported" not in sys.modules
            sys.exit(rc)
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.assertEqual(proc.returncode, EXIT_ATTENTION, proc.stderr[-2000:])
        self.assertIn("cannot tell", proc.stdout)
        self.assertIn('"status": "unverified"', proc.stdout)
        self.assertNothingImported()

    def test_import_reveals_what_an_unverified_name_is(self) -> None:
        # tst_lazy_pkg.sub.run is subprocess.getoutput: unverified until the user imports the module,
        # then DANGEROUS by identity (a child process: the import writes the sentinel).
        path = os.path.join(self.tmp, "run.pt")
        with open(path, "wb") as fh:
            fh.write(_call_checkpoint("tst_lazy_pkg.sub", "run"))
        self.addCleanup(os.remove, path)
        code = textwrap.dedent(f"""
            import json, sys
            sys.path.insert(0, {self.tmp!r})
            from torch_serial_testing.tools.cli.inspection import inspect_report
            r = inspect_report({path!r}, [], imports=["tst_lazy_pkg.sub"])
            print(json.dumps([r["status"], r["exit_code"], [d["reason"] for d in r["dangerous"]], r["unverified"]]))
        """)
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
        self.addCleanup(lambda: os.path.exists(self.sentinel) and os.remove(self.sentinel))
        self.assertEqual(proc.returncode, 0, proc.stderr[-2000:])
        import json

        status, code_, reasons, unverified = json.loads(proc.stdout)
        self.assertEqual((status, code_, unverified), ("dangerous", EXIT_DANGEROUS, []))
        self.assertIn("subprocess", reasons[0])


if __name__ == "__main__":
    unittest.main()
