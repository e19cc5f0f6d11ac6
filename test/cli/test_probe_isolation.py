"""A fresh-interpreter probe of the tools never has the caller's folder first on ``sys.path`` (issue 40.8).

``doctor``, ``inspect`` and the trust policy ask a fresh interpreter which safe globals torch
registers itself.  Run from a folder holding a ``json.py`` or ``torch.py`` (a checkout, a download
folder), a probe started with that folder first on ``sys.path`` would import those in place of the
real ones: run their code and report whatever they print.  The planted modules here append to a
sentinel file when imported; the probe must not import them and must still answer.
"""

from __future__ import annotations

import os
import tempfile
import unittest
import unittest.mock

from torch_serial_testing.tools import facts

SHADOW = """\
with open({sentinel!r}, "a") as fh:
    fh.write(__name__ + " imported from the caller's folder\\n")
raise SystemExit("shadowed: " + __name__)
"""


class ProbeIsolation(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="tst_probe_cwd_")
        self.addCleanup(tmp.cleanup)
        self.folder = tmp.name
        self.sentinel = os.path.join(self.folder, "sentinel.txt")
        here = os.getcwd()
        self.addCleanup(os.chdir, here)
        self.addCleanup(facts._own.clear)  # forget what this test's probes reported
        facts._own.clear()

    def plant(self, *modules: str) -> None:
        for name in modules:
            with open(os.path.join(self.folder, f"{name}.py"), "w") as fh:
                fh.write(SHADOW.format(sentinel=self.sentinel))

    def test_shadowing_modules_in_the_callers_folder_are_not_imported(self):
        from_the_checkout = facts.torch_own_registrations()  # asked from the suite's folder, before any plant
        facts._own.clear()
        self.plant("json", "torch")
        os.chdir(self.folder)
        names = facts.torch_own_registrations()
        self.assertFalse(os.path.exists(self.sentinel), "the probe imported a module from the caller's folder")
        self.assertEqual(names, from_the_checkout)  # torch's own registrations, whichever torch this is
        self.assertEqual({n for n in names if n.startswith("torch.")}, names)  # and only torch's

    def test_an_empty_pythonpath_entry_does_not_bring_the_folder_back(self):
        """An empty ``PYTHONPATH`` entry means the current folder: the probe drops it."""
        self.plant("json", "torch")
        os.chdir(self.folder)
        with unittest.mock.patch.dict(os.environ, PYTHONPATH=os.pathsep + os.environ.get("PYTHONPATH", "")):
            facts.torch_own_registrations()
        self.assertFalse(os.path.exists(self.sentinel), "the probe imported a module from the caller's folder")

    def test_benign_twin_a_plain_folder(self):
        """The same probe from a folder holding nothing to shadow: the same answer."""
        os.chdir(self.folder)
        plain = facts.torch_own_registrations()
        facts._own.clear()
        self.plant("json", "torch")
        self.assertEqual(facts.torch_own_registrations(), plain)
        self.assertFalse(os.path.exists(self.sentinel))

    def test_the_command_isolates_the_path(self):
        command = facts.fresh_interpreter()
        self.assertEqual(command[0], __import__("sys").executable)
        if __import__("sys").version_info >= (3, 11):
            self.assertEqual(command[1:], ["-P"])


if __name__ == "__main__":
    unittest.main()
