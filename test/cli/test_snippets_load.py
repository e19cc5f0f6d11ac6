"""Every snippet ``inspect`` prints loads the file it was printed for, per format the scan reads.

The checkpoints are the user's own (a module of their own, imported with ``--import``; a plain
class in the legacy format; numpy scalars and arrays, whose dtype classes torch checks at BUILD and
which are never a GLOBAL).  Each snippet is exec'd in a fresh interpreter with ``f`` the file, and
the object it loads is checked; where the CLI prints no snippet it must say why.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import unittest

from torch_serial_testing.tools.cli.contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK

from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY
from test.helpers.subprocess_env import child_env

USER_MODULE = """
import torch


class MyNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = torch.nn.Linear(3, 2)


class Config:
    def __init__(self):
        self.lr = 0.5
        self.weight = torch.ones(2)
"""

MAKE = """
import numpy as np
import torch
import usermodels

torch.save(usermodels.MyNet(), "module.pt")
torch.save(usermodels.Config(), "legacy.pt", _use_new_zipfile_serialization=False)
torch.save({"lr": np.float64(0.1), "step": np.int64(3)}, "np_scalars.pt")
torch.save({"w": torch.ones(2), "lr": np.float64(0.1), "mask": np.arange(3)}, "np_mixed.pt")
torch.save({"w": torch.ones(2)}, "state_dict.pt")
torch.jit.script(torch.nn.Linear(2, 2)).save("scripted.pt")
"""

# For each file: the inspect arguments, the exit code, and the check the loaded object must pass.
CASES = {
    "module.pt": (["--import", "usermodels"], EXIT_ATTENTION, "type(obj).__name__ == 'MyNet'"),
    "legacy.pt": (["--import", "usermodels"], EXIT_ATTENTION, "obj.lr == 0.5 and obj.weight.sum() == 2"),
    "np_scalars.pt": (
        ["--safe-global", "numpy._core.multiarray.scalar"],
        EXIT_ATTENTION,
        "obj['lr'] == 0.1 and obj['step'] == 3",
    ),
    "np_mixed.pt": (
        ["--safe-global", "numpy._core.multiarray.scalar", "--safe-global", "numpy._core.multiarray._reconstruct"],
        EXIT_ATTENTION,
        "obj['lr'] == 0.1 and list(obj['mask']) == [0, 1, 2]",
    ),
}


class TestEverySnippetLoads(unittest.TestCase):
    numpy_module: str  # "numpy._core" or "numpy.core", as the installed numpy names it

    @classmethod
    def setUpClass(cls) -> None:
        cls._tmp = tempfile.TemporaryDirectory(prefix="tst-snippets-")
        cls.tmp = cls._tmp.name
        with open(os.path.join(cls.tmp, "usermodels.py"), "w") as f:
            f.write(USER_MODULE)
        cls.env = child_env(path_first=(cls.tmp,), drop=("TORCH_FORCE_", "COLUMNS"))
        subprocess.run([sys.executable, "-c", MAKE], cwd=cls.tmp, env=cls.env, check=True, timeout=300)
        import numpy  # noqa: F401 - what the scan needs to know numpy's dtype classes

        cls.numpy_module = "numpy._core" if hasattr(numpy, "_core") else "numpy.core"

    @classmethod
    def tearDownClass(cls) -> None:
        cls._tmp.cleanup()

    def inspect(self, name: str, *args: str) -> tuple[int, dict]:
        proc = subprocess.run(
            [sys.executable, "-m", "torch_serial_testing", "inspect", name, "--json", *args],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            timeout=300,
        )
        return proc.returncode, json.loads(proc.stdout)

    def args_for(self, args: list[str]) -> list[str]:
        return [a.replace("numpy._core", self.numpy_module) for a in args]

    def test_printed_snippets_load_their_files(self) -> None:
        snippets = {}
        for name, (args, code, _check) in CASES.items():
            with self.subTest(name):
                exit_code, r = self.inspect(name, *self.args_for(args))
                self.assertEqual(exit_code, code, r)
                self.assertIsNotNone(r["snippet"], r)
                # the snippet, the header and every mode speak of the same globals
                self.assertEqual(r["safe_globals"]["unused"], [])
                # (a bare load before torch 2.6 is a full load: nothing is missing in it)
                default_missing = r["required_globals"] if DEFAULT_WEIGHTS_ONLY else []
                self.assertEqual(r["modes"]["default"]["missing"], default_missing)
                snippets[name] = r["snippet"]
        for name in ("np_scalars.pt", "np_mixed.pt"):
            self.assertIn("numpy.dtypes.Float64DType", self.inspect(name)[1]["required_globals"])
            self.assertIn("Float64DType", snippets[name])
        # Each snippet in a fresh interpreter (the user's), f the file; nothing else is allowlisted.
        program = "import json, torch\nresults = {}\n"
        for name, snippet in snippets.items():
            program += f"f = {name!r}\n{snippet}\nresults[{name!r}] = bool({CASES[name][2]})\n"
        program += "print(json.dumps(results))\n"
        proc = subprocess.run(
            [sys.executable, "-c", program], cwd=self.tmp, env=self.env, capture_output=True, timeout=300
        )
        self.assertEqual(proc.returncode, 0, proc.stderr.decode() + "\n" + program)
        self.assertEqual(json.loads(proc.stdout), {name: True for name in CASES})

    def test_no_snippet_where_it_would_not_load(self) -> None:
        # A user module not imported: UNVERIFIED (exit 1, not DANGEROUS), the fix is --import.
        code, r = self.inspect("module.pt")
        self.assertEqual((code, r["status"]), (EXIT_ATTENTION, "unverified"))
        self.assertEqual([(d["name"], d["module"]) for d in r["unverified"]], [("usermodels.MyNet", "usermodels")])
        self.assertEqual(r["dangerous"], [])
        self.assertIsNone(r["snippet"])
        # a numpy array needs the function that rebuilds it (_reconstruct, which torch names as no remedy):
        # still an opt-in, but the numpy recipe (issue 41): the same snippet as with it named, marked
        code, r = self.inspect("np_mixed.pt")
        self.assertEqual((code, r["status"]), (EXIT_ATTENTION, "needs_opt_in"))
        reconstruct = f"{self.numpy_module}.multiarray._reconstruct"
        self.assertIn(reconstruct, [d["name"] for d in r["needs_opt_in"]])
        self.assertIn("the numpy recipe", r["snippet"])
        self.assertEqual(r["snippet"], self.inspect("np_mixed.pt", "--safe-global", reconstruct)[1]["snippet"])
        # numpy scalars need no opt-in: their reconstructor is the remedy torch documents, so the same
        # snippet is printed as when it is named with --safe-global (which test_printed_snippets_load_their_files runs)
        code, r = self.inspect("np_scalars.pt")
        self.assertEqual((code, r["status"], r["needs_opt_in"]), (EXIT_ATTENTION, "needs_allowlist", []))
        named = self.inspect("np_scalars.pt", *self.args_for(CASES["np_scalars.pt"][0]))[1]
        self.assertIsNotNone(r["snippet"])
        self.assertEqual(r["snippet"], named["snippet"])
        # a state_dict needs none; a TorchScript archive never loads weights-only
        code, r = self.inspect("state_dict.pt")
        self.assertEqual((code, r["status"], r["snippet"]), (EXIT_OK, "loads", None))
        code, r = self.inspect("scripted.pt")
        self.assertEqual((code, r["status"], r["snippet"]), (EXIT_ATTENTION, "needs_trusted_loader", None))

    def test_a_failed_import_is_one_line_and_exit_2(self) -> None:
        proc = subprocess.run(
            [sys.executable, "-m", "torch_serial_testing", "inspect", "module.pt", "--import", "no_such_module_x"],
            cwd=self.tmp,
            env=self.env,
            capture_output=True,
            timeout=300,
        )
        self.assertEqual(proc.returncode, EXIT_DANGEROUS)
        self.assertEqual(proc.stdout, b"")
        err = proc.stderr.decode().splitlines()
        self.assertEqual(len(err), 1, err)
        self.assertIn("--import no_such_module_x failed: ModuleNotFoundError", err[0])

    def test_the_checkpoint_never_chooses_what_is_imported(self) -> None:
        # The module the checkpoint names is on the path, but only --import imports it: without the
        # flag the inspecting process never runs it (it would write a file when imported).
        with open(os.path.join(self.tmp, "tripwire.py"), "w") as f:
            f.write("open(__file__ + '.RAN', 'w').close()\nclass Thing:\n    pass\n")
        self.addCleanup(os.remove, os.path.join(self.tmp, "tripwire.py"))
        program = textwrap.dedent(
            """
            import sys, torch
            sys.path.insert(0, '.')
            import tripwire
            torch.save(tripwire.Thing(), 'tripwire.pt')
            """
        )
        subprocess.run([sys.executable, "-c", program], cwd=self.tmp, env=self.env, check=True, timeout=300)
        ran = os.path.join(self.tmp, "tripwire.py.RAN")
        os.remove(ran)
        self.addCleanup(os.remove, os.path.join(self.tmp, "tripwire.pt"))
        code, r = self.inspect("tripwire.pt")
        self.assertFalse(os.path.exists(ran), "inspect imported a module the checkpoint names")
        self.assertEqual(r["status"], "unverified")
        code, r = self.inspect("tripwire.pt", "--import", "tripwire")
        self.assertTrue(os.path.exists(ran))
        os.remove(ran)
        self.assertEqual((code, r["status"]), (EXIT_ATTENTION, "needs_allowlist"))
        self.assertIn("from tripwire import Thing", r["snippet"])


if __name__ == "__main__":
    unittest.main()
