"""The audit against attackers (issue 40), each class with its benign twin.

1. a save into a reused buffer: only exactly the bytes a save wrote are "saved in this process", and
   only those are ever loaded in full;
3. names chosen by a checkpoint reach neither the terminal nor the Markdown table unescaped;
5. trial loads go through torch's own loader, never a replaced ``torch.load``;
8. the report and the Markdown table are never written through a symbolic link.

And issue 41's audit that contradicted itself: a load that works weights-only needs nothing and gets
no fix; audited pytest runs print no ``PytestAssertRewriteWarning`` and no frame of the audit.
"""

from __future__ import annotations

import io
import json
import os
import re
import sys
import tempfile
import unittest
import zipfile
from contextlib import suppress
from typing import Any, Optional

import torch

from torch_serial_testing.errors import escape_text
from torch_serial_testing.tools.audit import observe
from torch_serial_testing.tools.audit.analysis import digest, needs_of, trial, verified_fix
from torch_serial_testing.tools.audit.summary import FAIL_ON, format_markdown, format_text, markdown_code, verdict

from .runs import BEFORE_THE_DEFAULT, PLUGIN, observed_here, run

#: What the payloads below ran: an entry means a pickle was unpickled in full in this process.
FIRED: list[str] = []


def fire(tag: str) -> str:
    FIRED.append(tag)
    return tag


class Payload:
    """Unpickled in full, it calls :func:`fire` (a function: no trust policy vouches for it)."""

    def __init__(self, tag: str) -> None:
        self.tag = tag

    def __reduce__(self) -> Any:
        return (fire, (self.tag,))


def saved(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def records_from(archive: bytes, **replace: bytes) -> bytes:
    """*archive*'s records rewritten by :mod:`zipfile` (*replace*: record name suffix -> new bytes), after
    64 KiB of padding: the records a later, shorter save does not overwrite."""
    src = zipfile.ZipFile(io.BytesIO(archive))
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", zipfile.ZIP_STORED) as z:
        prefix = src.namelist()[0].split("/")[0]
        z.writestr(f"{prefix}/.padding", b"\0" * 65536)
        for info in src.infolist():
            data = src.read(info)
            for suffix, new in replace.items():
                if info.filename.endswith(suffix):
                    data = new
            z.writestr(info.filename, data)
    return out.getvalue()


class Observed(unittest.TestCase):
    """This process observed into a temporary report; torch and the observer restored after each test."""

    def setUp(self) -> None:
        self.report = observed_here(self)
        self.addCleanup(FIRED.clear)
        FIRED.clear()
        observe._State.report = self.report
        observe.install_torch(torch)

    def records(self, event: str = "load") -> list[dict[str, Any]]:
        with open(self.report, encoding="utf-8") as f:
            return [r for r in map(json.loads, f) if r["event"] == event]


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestReusedBuffer(Observed):
    """Class 1: ``torch.save`` into ``io.BytesIO(fixture)`` overwrites the fixture's head, not its tail."""

    def fixture(self) -> bytes:
        return records_from(saved({"payload": Payload("fixture")}))

    def test_the_fixtures_tail_is_never_loaded_in_full(self) -> None:
        fixture = self.fixture()
        buf = io.BytesIO(fixture)
        torch.save({"w": torch.ones(2)}, buf)
        written = buf.tell()
        self.assertLess(written, len(fixture))  # the fixture's records after the save's bytes are still there
        buf.seek(0)
        with self.assertRaises(Exception) as rejected:  # the test's own load reads the fixture's data.pkl
            torch.load(buf)
        self.assertIn("fire", str(rejected.exception))
        save = self.records("save")[-1]  # (the fixture was made by a save too)
        self.assertEqual(save["digest"], digest(fixture_head := buf.getvalue()[:written]))
        self.assertEqual(needs_of(fixture_head), [])
        (load,) = self.records()
        self.assertEqual(load["provenance"], {"kind": "unknown"})
        self.assertEqual(load["needs"], [f"{__name__}.fire"])
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("none", False))
        self.assertEqual(FIRED, [])  # the fixture's pickle never ran in this process

    def test_benign_twin_a_truncated_buffer_holds_only_the_tests_own_bytes(self) -> None:
        buf = io.BytesIO(self.fixture())
        torch.save({"payload": Payload("own")}, buf)
        buf.truncate()
        buf.seek(0)
        with self.assertRaises(Exception):
            torch.load(buf)
        (load,) = self.records()
        self.assertEqual(load["provenance"]["kind"], "saved_in_process")
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("weights_only_false", True))
        self.assertEqual(FIRED, ["own"])  # the test's own bytes, and only they, were loaded in full

    def test_the_digest_is_checked_again_right_before_a_full_load(self) -> None:
        data = saved({"payload": Payload("checked")})
        needs = needs_of(data)
        other = verified_fix(data, needs, own_digest=digest(data + b"\0"))
        self.assertEqual((other["kind"], other["verified"]), ("none", False))
        self.assertEqual(FIRED, [])
        own = verified_fix(data, needs, own_digest=digest(data))
        self.assertEqual((own["kind"], own["verified"]), ("weights_only_false", True))
        self.assertEqual(FIRED, ["checked"])

    def test_a_save_at_an_offset_records_only_its_own_range(self) -> None:
        buf = io.BytesIO(b"prefix" + b"\0" * 10_000)
        buf.seek(6)
        torch.save(torch.ones(1), buf)
        end = buf.tell()
        (save,) = self.records("save")
        self.assertEqual(save["digest"], digest(buf.getvalue()[6:end]))
        buf.seek(6)
        with suppress(Exception):
            torch.load(buf)  # reads the save's bytes and the zero tail: not what the save wrote
        (load,) = self.records()
        self.assertEqual(load["provenance"], {"kind": "unknown"})


HOSTILE_MODULE = "evil\x1b]8;;http://x.example\x07mod"
HOSTILE_NAME = "C`|[x](http://e.example) <b>\u202e\x1b[2J\r"


def hostile_checkpoint() -> bytes:
    """A checkpoint whose one GLOBAL names *HOSTILE_MODULE*.*HOSTILE_NAME* (no newline: pickle's own delimiter)."""
    pickle = b"\x80\x02c" + HOSTILE_MODULE.encode() + b"\n" + HOSTILE_NAME.encode() + b"\n)R."
    return records_from(saved({"w": 1}), **{"data.pkl": pickle})


def gfm_cells(row: str) -> list[str]:
    """The cells of a GitHub Markdown table row, split as GFM does (a ``|`` right after ``\\`` is content)."""
    cells, current, escaped = [], "", False
    for c in row.strip()[1:-1] if row.strip().endswith("|") else row.strip()[1:]:
        if c == "|" and not escaped:
            cells.append(current.strip())
            current = ""
        else:
            current += c
        escaped = c == "\\"
    return [*cells, current.strip()]


CODE_SPAN = re.compile(r"(`+)( ?)(.*?)\2\1")


def code_contents(cell: str) -> tuple[list[str], str]:
    """(the contents of the code spans in *cell*, what is left outside them), as CommonMark reads them."""
    found, rest, pos = [], "", 0
    while pos < len(cell):
        m = re.compile(r"`+").search(cell, pos)
        if m is None:
            rest += cell[pos:]
            break
        rest += cell[pos : m.start()]
        fence = m.group()
        close = re.compile(rf"(?<!`){fence}(?!`)").search(cell, m.end())
        if close is None:
            rest += cell[m.start() :]
            break
        inner = cell[m.end() : close.start()]
        if inner.startswith(" ") and inner.endswith(" ") and inner.strip():
            inner = inner[1:-1]
        found.append(inner.replace("\\|", "|"))
        pos = close.end()
    return found, rest


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestNamesAreData(Observed):
    """Class 3: a checkpoint's names escaped in the terminal summary and the Markdown table."""

    def load_and_format(self, data: bytes) -> tuple[list[dict[str, Any]], str, str]:
        with self.assertRaises(Exception):
            torch.load(io.BytesIO(data))
        records = self.records()
        return records, format_text(records, self.report), format_markdown(records)

    def test_a_hostile_name_cannot_reach_the_terminal(self) -> None:
        records, text, _ = self.load_and_format(hostile_checkpoint())
        self.assertEqual(records[0]["needs"], [f"{HOSTILE_MODULE}.{HOSTILE_NAME}"])
        self.assertIn(HOSTILE_NAME.rstrip("\r"), records[0]["error"])  # torch's error as it was (its first line)
        unprintable = sorted({c for c in text if not c.isprintable() and c != "\n"})
        self.assertEqual(unprintable, [])
        self.assertIn("\\x1b]8;;http://x.example\\x07mod", text)  # shown, visibly, not obeyed
        self.assertIn("\\u202e", text)
        self.assertIn("\\x1b[2J\\r", text)

    def test_a_hostile_name_cannot_break_out_of_its_code_span(self) -> None:
        records, _, table = self.load_and_format(hostile_checkpoint())
        header, _, *rows = table.splitlines()
        self.assertEqual(len(rows), 1, table)  # no row added
        cells = gfm_cells(rows[0])
        self.assertEqual(len(cells), len(gfm_cells(header)), cells)  # no cell added
        needs_code, needs_rest = code_contents(cells[5])
        self.assertEqual(needs_code, [escape_text(f"{HOSTILE_MODULE}.{HOSTILE_NAME}")])
        self.assertEqual(needs_rest.strip(), "")  # nothing of the name outside its code span
        for cell in cells:
            _, outside = code_contents(cell)
            self.assertNotRegex(outside, r"\]\(|<(?!br>)|\x1b|\\x1b", cell)  # no link, HTML or escape outside code

    def test_benign_twin_ordinary_names_are_shown_as_they_are(self) -> None:
        records, text, table = self.load_and_format(saved(torch.nn.Linear(1, 1)))
        self.assertIn("needs: torch.nn.modules.linear.Linear", text)
        self.assertIn("`torch.nn.modules.linear.Linear`", table)
        self.assertEqual(markdown_code("test_x[a-b]"), "`test_x[a-b]`")
        self.assertEqual(markdown_code("a`b"), "``a`b``")
        self.assertEqual(markdown_code("`a"), "`` `a ``")
        self.assertEqual(markdown_code("a|b"), "`a\\|b`")
        self.assertEqual(code_contents(markdown_code("x ``y`` |z"))[0], ["x ``y`` |z"])


def shim(seen: list[Any]) -> Any:
    """The common shim: ``torch.load`` forcing ``weights_only=False`` (recording each call)."""
    original = torch.serialization.load

    def load(f: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(kwargs.get("weights_only"))
        kwargs["weights_only"] = False
        return original(f, *args, **kwargs)

    return load


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestGenuineLoader(Observed):
    """Class 5: trial loads through torch's own ``torch.serialization.load``, never a replaced ``torch.load``."""

    def test_an_incomplete_fix_is_not_verified_under_a_shim(self) -> None:
        data = saved(torch.nn.Sequential(torch.nn.Linear(2, 2)))
        needs = needs_of(data) or []
        seen: list[Any] = []
        torch.load = shim(seen)
        self.addCleanup(setattr, torch.serialization, "load", torch.serialization.load)
        torch.serialization.load = shim(seen)  # even torch.serialization.load replaced: torch's own is known
        fix = verified_fix(data, needs[:1])
        self.assertEqual((fix["kind"], fix["verified"]), ("safe_globals", False))
        self.assertFalse(trial(data, True))
        complete = verified_fix(data, needs)  # torch's own loader was found (by identity) and asked
        self.assertEqual((complete["kind"], complete["verified"]), ("safe_globals", True))
        self.assertEqual(seen, [])  # the shims were never asked

    def test_a_load_that_passes_only_through_the_shim_is_said_so(self) -> None:
        seen: list[Any] = []
        torch.load = shim(seen)
        data = saved(torch.nn.Linear(2, 2))
        self.assertIsInstance(torch.load(io.BytesIO(data)), torch.nn.Linear)  # the shim loads it in full
        self.assertEqual(seen, [None])  # the test's own call, once: no trial went through the shim
        (load,) = self.records()
        self.assertEqual(verdict(load), "bypassed")
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("safe_globals", True))
        self.assertIn("bypassed", FAIL_ON["weights-only"])

    def test_benign_twin_torchs_own_loader_loads_weights_only(self) -> None:
        data = saved(torch.nn.Linear(2, 2))
        with self.assertRaises(Exception):
            torch.load(io.BytesIO(data))
        (load,) = self.records()
        self.assertEqual(verdict(load), "default")
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("safe_globals", True))


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestVerdictNeedsAndFixAgree(Observed):
    """Issue 41 item 8: a load that works weights-only needs nothing and is never told to load in full."""

    def test_a_load_the_tests_own_allowlist_makes_work_needs_nothing(self) -> None:
        import numpy as np

        from torch_serial_testing.tools.audit.analysis import resolve_names

        data = saved({"history": np.arange(3.0)})
        names = needs_of(data) or []
        with torch.serialization.safe_globals(resolve_names(names)):  # _reconstruct included: the test trusts it
            torch.load(io.BytesIO(data), weights_only=True)
        (load,) = self.records()
        self.assertEqual(verdict(load), "ok")
        self.assertEqual(load["fix"], {"kind": "none", "snippet": None, "verified": True})
        text, table = format_text([load]), format_markdown([load])
        self.assertIn("needs nothing", text)
        self.assertIn("allowed by the test: ", text)
        for out in (text, table):
            self.assertNotIn("weights_only=False", out)
            self.assertNotIn("fix (", out)
            self.assertNotRegex(out, r"(?m)^\s*needs: ")
        self.assertIn("nothing to change (weights-only load verified)", table)

    def test_a_full_load_by_an_older_torchs_default_is_not_needs_nothing(self) -> None:
        # (torch < 2.6: a bare load is a full load; the record as this torch would write it there)
        record = {
            "event": "load",
            "test": "t",
            "site": "t.py:1",
            "weights_only_arg": None,
            "effective_weights_only": False,
            "switches": {},
            "loaded": True,
            "error": None,
            "needs": ["torch.nn.modules.linear.Linear"],
            "fix": {"kind": "safe_globals", "snippet": "import torch", "verified": True},
        }
        self.assertEqual(verdict(record), "default_full")
        self.assertNotIn("needs nothing", format_text([record]))
        self.assertEqual(verdict({**record, "switches": {"TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}}), "force_no")
        self.assertEqual(verdict({**record, "needs": []}), "ok")

    def test_benign_twin_without_the_allowlist_the_fix_is_given(self) -> None:
        import numpy as np

        data = saved({"history": np.arange(3.0)})
        with self.assertRaises(Exception):
            torch.load(io.BytesIO(data))
        (load,) = self.records()
        self.assertEqual(verdict(load), "default")
        self.assertEqual((load["fix"]["kind"], load["fix"]["verified"]), ("weights_only_false", True))
        self.assertIn("fix (weights_only_false, verified)", format_text([load]))


class TestNoWritingThroughLinks(unittest.TestCase):
    """Class 8's side note: the report and the Markdown table are refused at a symbolic link."""

    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        self.target = os.path.join(tmp.name, "precious.txt")
        with open(self.target, "w", encoding="utf-8") as f:
            f.write("keep me\n")
        self.link = os.path.join(tmp.name, "serial-audit.jsonl")
        os.symlink(self.target, self.link)

    def precious(self) -> str:
        with open(self.target, encoding="utf-8") as f:
            return f.read()

    def test_write_file_refuses_a_link(self) -> None:
        for append in (False, True):
            with self.assertRaises(observe.ReportPathError) as refused:
                observe.write_file(self.link, "x", append=append)
            self.assertIn("is a symbolic link", str(refused.exception))
            self.assertIn("precious.txt", str(refused.exception))
        self.assertEqual(self.precious(), "keep me\n")

    def test_benign_twin_a_regular_file_is_emptied_then_appended_to(self) -> None:
        plain = os.path.join(self.dir, "plain.jsonl")
        for text, append in (("old\n", False), ("", False), ("a\n", True), ("b\n", True)):
            observe.write_file(plain, text, append=append)
        with open(plain, encoding="utf-8") as f:
            self.assertEqual(f.read(), "a\nb\n")

    def test_the_command_and_the_pytest_option_refuse_a_link(self) -> None:
        with open(os.path.join(self.dir, "test_none.py"), "w", encoding="utf-8") as f:
            f.write("def test_none():\n    pass\n")
        cli = [sys.executable, "-m", "torch_serial_testing", "audit"]
        for argv in (
            [*cli, "--report", self.link, "--", sys.executable, "-c", "pass"],
            [*cli, "--markdown", self.link, "--", sys.executable, "-c", "pass"],
        ):
            proc = run(argv, cwd=self.dir)
            self.assertEqual(proc.returncode, 3, proc.stderr)
            self.assertIn("is a symbolic link", proc.stderr)
        pytest = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "-q", "test_none.py"]
        proc = run([*pytest, f"--serial-audit={self.link}"], cwd=self.dir)
        self.assertEqual(proc.returncode, 4, proc.stdout + proc.stderr)  # pytest's usage error
        self.assertIn("is a symbolic link", proc.stderr)
        self.assertEqual(self.precious(), "keep me\n")
        proc = run([*pytest, "--serial-audit=plain.jsonl"], cwd=self.dir)  # the benign twin
        self.assertEqual(proc.returncode, 0, proc.stdout + proc.stderr)


FAILING_LOAD = """\
import io

import torch


def test_bare_load():
    buf = io.BytesIO()
    torch.save(torch.nn.Linear(1, 1), buf)
    buf.seek(0)
    torch.load(buf)
"""


def installed_entry_point() -> Optional[str]:
    from importlib.metadata import entry_points

    found = [e for e in entry_points(group="pytest11") if e.value == PLUGIN]
    return None if found else "the audit's pytest11 entry point is not installed (pip install the package)"


@unittest.skipIf(BEFORE_THE_DEFAULT, BEFORE_THE_DEFAULT)
class TestAuditedPytestOutput(unittest.TestCase):
    """Issue 41 item 8: no PytestAssertRewriteWarning, and no frame of the audit in a test's traceback."""

    def setUp(self) -> None:
        tmp = tempfile.TemporaryDirectory()
        self.addCleanup(tmp.cleanup)
        self.dir = tmp.name
        with open(os.path.join(self.dir, "test_failing_load.py"), "w", encoding="utf-8") as f:
            f.write(FAILING_LOAD)

    def records(self, report: str) -> list[dict[str, Any]]:
        with open(os.path.join(self.dir, report), encoding="utf-8") as f:
            return [r for r in map(json.loads, f) if r["event"] == "load"]

    @unittest.skipIf(installed_entry_point(), installed_entry_point())
    def test_under_the_audit_command_pytest_does_not_warn(self) -> None:
        pytest = [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "test_failing_load.py"]
        proc = run(
            [sys.executable, "-m", "torch_serial_testing", "audit", "--report", "r.jsonl", "--", *pytest], cwd=self.dir
        )
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:])
        self.assertIn("1 failed", proc.stdout)
        self.assertNotIn("PytestAssertRewriteWarning", proc.stdout + proc.stderr)
        (load,) = self.records("r.jsonl")  # and the audit still observed the load
        self.assertEqual(load["test"], "test_failing_load.py::test_bare_load")
        self.assertEqual(verdict(load), "default")

    def test_the_traceback_shows_no_frame_of_the_audit(self) -> None:
        argv = [sys.executable, "-m", "pytest", "-p", PLUGIN, "-p", "no:cacheprovider", "--tb=short"]
        proc = run([*argv, "--serial-audit=r.jsonl", "test_failing_load.py"], cwd=self.dir)
        self.assertEqual(proc.returncode, 1, proc.stdout[-3000:])
        failure = proc.stdout.split("= FAILURES =", 1)[1].split("torch_serial_testing audit", 1)[0]
        self.assertIn("test_failing_load.py:10: in test_bare_load", failure)
        self.assertIn("torch/serialization.py", failure)  # torch's own frames stay
        self.assertNotIn("torch_serial_testing", failure)
        self.assertEqual(len(self.records("r.jsonl")), 1)


if __name__ == "__main__":
    unittest.main()
