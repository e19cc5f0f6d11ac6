"""``inspect`` of many files and folders in one call (issue 40.9), and suggestions never built from
names in the file (issue 40.7).

Many checkpoints: one process (one ``import torch``), a summary line per file, the exit code the
worst, ``--jsonl`` a full report a line.  Folders are walked without following a link out of them;
every file keeps the checks of a single one (regular files only: FIFOs, devices, folders refused).
The in-process tests call :func:`inspect_many`; two subprocess runs check the command itself.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import unittest

import torch

from test.helpers.roundtrip_fixtures import MODULE_GLOBALS
from test.helpers.hostile_checkpoints import build_all, glob, proto, torch_zip
from test.helpers.subprocess_env import child_env
from torch_serial_testing.tools.cli.contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, EXIT_USAGE
from torch_serial_testing.tools.cli.inspect_text import summary_line, totals_line
from torch_serial_testing.tools.cli.inspection import format_inspect, inspect_many, inspect_report

# A class of a module not imported here, named by the file: importing idlelib.idle starts IDLE.
IDLE = torch_zip(proto(2) + glob("idlelib.idle", "Window") + b")\x81}b.")


def write(path: str, data: bytes) -> str:
    with open(path, "wb") as fh:
        fh.write(data)
    return path


class SuggestionsNeverFromTheFile(unittest.TestCase):
    """Class 7: an UNVERIFIED class's module is data; no ``--import <its module>`` is printed."""

    @unittest.skipIf("idlelib.idle" in sys.modules, "idlelib.idle is imported in this process")
    def test_unverified_class_gets_no_import_command_of_its_module(self):
        r = inspect_report("idle.pt", data=IDLE)
        self.assertEqual((r["status"], r["exit_code"]), ("unverified", EXIT_ATTENTION))
        self.assertEqual([d["name"] for d in r["unverified"]], ["idlelib.idle.Window"])
        for verbose in (False, True):
            text = format_inspect(r, verbose=verbose, width=1000)
            self.assertNotRegex(text, r"--import\s+idlelib", text)
            self.assertIn("run again with --import MODULE, naming its module yourself", text)
            self.assertIn("this report never names one for you", text)
            self.assertIn("idlelib.idle.Window    <-- UNVERIFIED", text)  # the name is shown, as data
        self.assertNotIn("idlelib.idle", sys.modules, "judging imported what the checkpoint names")

    def test_benign_twin_a_module_the_user_imports_is_verified(self):
        """The same flow with --import of a module the user names: verified, no UNVERIFIED advice."""
        data = torch_zip(proto(2) + glob("json.decoder", "JSONDecoder") + b")\x81}b.")
        r = inspect_report("json.pt", data=data, imports=["json.decoder"])
        self.assertEqual(r["unverified"], [])
        self.assertNotIn("UNVERIFIED", format_inspect(r, width=200))


class InspectMany(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="tst_inspect_many_")
        self.addCleanup(tmp.cleanup)
        self.tmp = os.path.realpath(tmp.name)
        self.models = os.path.join(self.tmp, "models")
        os.makedirs(os.path.join(self.models, "sub"))
        torch.save({"w": torch.ones(2)}, os.path.join(self.models, "a.pt"))
        torch.save(torch.nn.Linear(2, 2), os.path.join(self.models, "sub", "linear.pt"))
        self.sentinel = os.path.join(self.tmp, "sentinel")
        write(os.path.join(self.models, "sub", "evil.bin"), build_all(self.sentinel)["os_system"])
        self.outside = os.path.join(self.tmp, "outside")
        os.makedirs(self.outside)
        torch.save({"w": torch.zeros(1)}, os.path.join(self.outside, "far.pt"))

    def reports(self, *targets: str) -> dict[str, dict]:
        return {os.path.relpath(r["checkpoint"], self.tmp): r for r in inspect_many(list(targets))}

    def test_a_folder_is_walked_each_file_judged_alone(self):
        found = self.reports(self.models)
        self.assertEqual(list(found), ["models/a.pt", "models/sub/evil.bin", "models/sub/linear.pt"])
        statuses = {k: (r["status"], r["exit_code"]) for k, r in found.items()}
        self.assertEqual(statuses["models/a.pt"], ("loads", EXIT_OK))
        self.assertEqual(statuses["models/sub/linear.pt"], ("needs_allowlist", EXIT_ATTENTION))
        self.assertEqual(statuses["models/sub/evil.bin"], ("dangerous", EXIT_DANGEROUS))
        self.assertEqual([d["name"] for d in found["models/sub/evil.bin"]["dangerous"]], ["os.system"])
        # each report is the single-file report of that file (only the path differs)
        alone = inspect_report(os.path.join(self.models, "sub", "linear.pt"))
        self.assertEqual(found["models/sub/linear.pt"], alone)
        self.assertFalse(os.path.exists(self.sentinel))

    def test_links_out_of_a_folder_are_not_followed(self):
        os.symlink(os.path.join(self.outside, "far.pt"), os.path.join(self.models, "far_link.pt"))
        os.symlink(self.outside, os.path.join(self.models, "outside_dir"))
        os.symlink(os.path.join(self.models, "sub"), os.path.join(self.models, "sub_again"))
        os.symlink(os.path.join(self.models, "a.pt"), os.path.join(self.models, "sub", "a_link.pt"))
        found = self.reports(self.models)
        self.assertNotIn("outside/far.pt", found)
        far, out_dir = found["models/far_link.pt"], found["models/outside_dir"]
        for r in (far, out_dir):
            self.assertEqual((r["status"], r["exit_code"], r["format"]), ("skipped", EXIT_ATTENTION, None))
            self.assertIn("a link leading out of the folder walked", r["error"])
        self.assertIn(repr(os.path.join(self.outside, "far.pt")), far["error"])
        # a link to a folder inside is never walked (its files are, where they are); to a file inside: read
        self.assertEqual((found["models/sub_again"]["status"], found["models/sub_again"]["exit_code"]), ("skipped", 0))
        self.assertNotIn("models/sub_again/linear.pt", found)
        self.assertEqual(found["models/sub/a_link.pt"]["status"], "loads")
        # named directly, a link is read as before (its target judged)
        self.assertEqual(
            self.reports(os.path.join(self.models, "far_link.pt"))["models/far_link.pt"]["status"], "loads"
        )

    def test_per_file_regular_file_checks_hold(self):
        os.mkfifo(os.path.join(self.models, "pipe.pt"))  # opening it for reading must not hang
        found = self.reports(self.models, "/dev/zero", os.path.join(self.tmp, "missing.pt"))
        for key in ("models/pipe.pt", os.path.relpath("/dev/zero", self.tmp)):
            self.assertEqual((found[key]["status"], found[key]["exit_code"]), ("unreadable", EXIT_DANGEROUS), key)
        self.assertIn("a FIFO (named pipe), not a regular file", found["models/pipe.pt"]["error"])
        self.assertIn("a character device", found[os.path.relpath("/dev/zero", self.tmp)]["error"])
        self.assertIn("cannot read", found["missing.pt"]["error"])
        self.assertEqual(found["models/a.pt"]["status"], "loads")  # the others still judged

    def test_an_empty_folder_is_said(self):
        empty = os.path.join(self.tmp, "empty")
        os.mkdir(empty)
        (r,) = inspect_many([empty])
        self.assertEqual((r["status"], r["exit_code"]), ("unreadable", EXIT_DANGEROUS))
        self.assertIn("a folder holding no file", r["error"])

    def test_a_failed_import_is_the_one_report(self):
        reports = list(inspect_many([self.models], imports=["no_such_module_x"]))
        self.assertEqual([r["status"] for r in reports], ["import_failed"])

    def test_summary_lines_escape_and_count(self):
        r = inspect_report("x\x1b[31m.pt", data=torch_zip(proto(2) + glob("os", "sys\x1b]0;t\x07tem") + b"."))
        line = summary_line(r, width=200)
        self.assertNotIn("\x1b", line)
        self.assertTrue(line.startswith("DANGEROUS "), line)
        self.assertEqual(
            totals_line(["loads", "dangerous", "loads"], EXIT_DANGEROUS),
            "3 file(s): 2 LOADS, 1 DANGEROUS; exit 2 (the worst of them)",
        )


class InspectManyCommand(unittest.TestCase):
    """The command: a line per file and the totals, or --jsonl; the worst exit code; usage errors."""

    @classmethod
    def setUpClass(cls):
        cls._tmp = tempfile.TemporaryDirectory(prefix="tst_inspect_many_cli_")
        cls.tmp = cls._tmp.name
        torch.save({"w": torch.ones(2)}, os.path.join(cls.tmp, "a.pt"))
        torch.save(torch.nn.Linear(2, 2), os.path.join(cls.tmp, "b.pt"))
        write(os.path.join(cls.tmp, "idle.pt"), IDLE)

    @classmethod
    def tearDownClass(cls):
        cls._tmp.cleanup()

    def run_cli(self, *args: str) -> subprocess.CompletedProcess:
        return subprocess.run(
            [sys.executable, "-m", "torch_serial_testing", "inspect", *args],
            cwd=self.tmp,
            env=child_env(),
            capture_output=True,
            text=True,
            timeout=300,
        )

    def test_text_jsonl_and_exit_code(self):
        text = self.run_cli("b.pt", "a.pt")  # the worst first: the exit code is the worst, not the last
        self.assertEqual(text.returncode, EXIT_ATTENTION, text.stderr)
        lines = text.stdout.splitlines()
        beyond = 1 + len(MODULE_GLOBALS)  # the module's class, and builtins.set where torch's allowlist lacks it (2.4)
        self.assertTrue(lines[0].startswith(f"{'NEEDS_ALLOWLIST':<20} b.pt: {beyond} global(s) beyond"), lines)
        self.assertEqual(lines[-2], f"{'LOADS':<20} a.pt")
        self.assertEqual(lines[-1], "2 file(s): 1 NEEDS_ALLOWLIST, 1 LOADS; exit 1 (the worst of them)")
        self.assertNotIn("--import idlelib", self.run_cli("-v", "idle.pt", "a.pt").stdout)

        jsonl = self.run_cli(".", "--jsonl")
        self.assertEqual(jsonl.returncode, EXIT_ATTENTION, jsonl.stderr)
        records = [json.loads(line) for line in jsonl.stdout.splitlines()]
        self.assertEqual(
            [(r["checkpoint"], r["status"]) for r in records],
            [("./a.pt", "loads"), ("./b.pt", "needs_allowlist"), ("./idle.pt", "unverified")],
        )
        self.assertEqual({r["command"] for r in records}, {"inspect"})

    def test_usage_errors(self):
        both = self.run_cli("a.pt", "b.pt", "--json")
        self.assertEqual(both.returncode, EXIT_USAGE)
        self.assertIn("--json prints one object for one checkpoint; for several, use --jsonl", both.stderr)
        self.assertEqual(self.run_cli("-", "-").returncode, EXIT_USAGE)


if __name__ == "__main__":
    unittest.main()
