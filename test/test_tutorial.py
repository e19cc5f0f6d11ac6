"""docs/tutorial.rst and the README's first test show real runs: each command the page shows is run on
the file the page shows at that point, and its output must be the page's, up to what truly varies
(timings, the folder it ran in, the library's own traceback frames)."""

from __future__ import annotations

import difflib
import os
import re
import shlex
import subprocess
import sys
import tempfile
import textwrap
import unittest

import torch

from test.helpers.roundtrip_fixtures import DEFAULT_WEIGHTS_ONLY, MODE_SKIPS
from test.helpers.subprocess_env import child_env

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCS = os.path.join(ROOT, "docs")
TUTORIAL_FILE = "test_mynet.py"  # the name the tutorial saves each step under
#: The folder the pages show the runs in; the test runs them in a temporary one.
SHOWN_FOLDER = "/home/me/myproject"

# What the transcripts depend on: their wording of the 2.6 default, Python 3.11's test ids, every mode.
WHY_NOT = (
    f"the transcripts are of torch >= 2.6 (a bare torch.load weights-only), Python >= 3.11 (its test ids) and "
    f"every load mode; here torch {torch.__version__}, Python {sys.version.split()[0]}"
)
COMPARABLE = DEFAULT_WEIGHTS_ONLY and sys.version_info >= (3, 11) and not MODE_SKIPS


def read(*parts: str) -> str:
    with open(os.path.join(ROOT, *parts), encoding="utf-8") as fh:
        return fh.read()


def normalise(text: str, folder: str = SHOWN_FOLDER) -> str:
    """What varies from run to run made constant: timings, the folder, a traceback's frames."""
    text = text.replace(os.path.realpath(folder) + os.sep, SHOWN_FOLDER + "/").replace(
        folder + os.sep, SHOWN_FOLDER + "/"
    )
    text = re.sub(r"^(Ran \d+ tests?) in \d+\.\d+s$", r"\1 in <time>s", text, flags=re.M)
    text = re.sub(r"^(=* ?\d+ passed.*) in \d+\.\d+s( \([\d:]+\))?( =*)?$", r"\1 in <time>s\3", text, flags=re.M)
    # The frames between "Traceback (most recent call last):" and the exception line: one "  ...".
    text = re.sub(r"^(Traceback \(most recent call last\):\n)(?:[ \t].*\n)+", r"\1  ...\n", text, flags=re.M)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip() + "\n"


def run_shown(command: str, folder: str) -> str:
    """Run one ``$ command`` of a page in *folder* as a user's terminal would (its words, output and
    errors interleaved, 80 columns), and return what it printed."""
    words = shlex.split(command)
    overrides = {"PYTHONUNBUFFERED": "1", "COLUMNS": "80"}
    while "=" in words[0]:
        name, _, value = words.pop(0).partition("=")
        overrides[name] = value
    assert words[0] == "python", command
    env = child_env(overrides, drop=("TORCH_FORCE_", "EXPECTTEST_", "PYTEST_ADDOPTS"))
    proc = subprocess.run(
        [sys.executable, *words[1:]], cwd=folder, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    return proc.stdout


def _expand(part: str) -> range:
    """``"6-10"`` -> 6..10, ``"16"`` -> 16 (Sphinx's emphasize-lines syntax)."""
    first, _, last = part.partition("-")
    return range(int(first), int(last or first) + 1)


class Step:
    """One point of a page: the file as the page shows it (``literalinclude``), or a command and its output."""

    def __init__(self, include: str | None = None, command: str | None = None, output: str = "") -> None:
        self.include, self.command, self.output = include, command, output


def steps(page: str) -> list[Step]:
    """The tutorial files the page includes and the ``$`` commands of its console blocks, in page order."""
    found: list[Step] = []
    pattern = re.compile(
        r"^\.\. literalinclude:: (examples/tutorial/\S+\.py)$|^\.\. code-block:: console\n\n((?:(?:   .*)?\n)+)", re.M
    )
    for m in pattern.finditer(page):
        if m.group(1):
            found.append(Step(include=m.group(1)))
            continue
        block = textwrap.dedent(m.group(2))
        if not block.startswith("$ "):
            continue  # commands to type, no output shown
        for part in re.split(r"^\$ ", block, flags=re.M)[1:]:
            command, _, output = part.partition("\n")
            found.append(Step(command=command, output=output))
    return found


def walk(test: unittest.TestCase, page: str, start: str | None = None) -> int:
    """Run a page's steps in one folder, from the file *start* if given: each included file becomes
    test_mynet.py, except that a file named ``*_accepted.py`` must be what the command before it wrote;
    each command's output is compared with the page's.  Returns how many commands ran."""
    ran = 0
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, TUTORIAL_FILE)
        if start is not None:
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(start)
        for step in steps(page):
            if step.include:
                shown = read("docs", step.include)
                if step.include.endswith("_accepted.py"):
                    with open(path, encoding="utf-8") as fh:
                        test.assertEqual(fh.read(), shown, f"{step.include}: not what the command before it wrote")
                else:
                    with open(path, "w", encoding="utf-8") as fh:
                        fh.write(shown)
                continue
            assert step.command is not None
            with test.subTest(command=step.command, after=ran):
                test.assertEqual(normalise(run_shown(step.command, folder), folder), normalise(step.output))
            ran += 1
    return ran


@unittest.skipUnless(COMPARABLE, WHY_NOT)
class TestTutorialTranscripts(unittest.TestCase):
    def test_every_run_the_tutorial_shows(self) -> None:
        page = read("docs", "tutorial.rst")
        self.assertEqual(walk(self, page), 5)

    def test_the_record_expecttest_writes_is_the_file_shown_next(self) -> None:
        # The page tells the reader to write the empty record as """""" and run with
        # EXPECTTEST_ACCEPT=1; the file the page then shows is exactly what that run wrote.
        before = read("docs", "examples", "tutorial", "step3.py")
        self.assertEqual(before.count('self.make_module(), """""")'), 1)
        with tempfile.TemporaryDirectory() as folder:
            path = os.path.join(folder, TUTORIAL_FILE)
            with open(path, "w", encoding="utf-8") as fh:
                fh.write(before)
            out = run_shown("EXPECTTEST_ACCEPT=1 python -m unittest test_mynet", folder)
            self.assertIn("Accepting new output", out)
            with open(path, encoding="utf-8") as fh:
                self.assertEqual(fh.read(), read("docs", "examples", "tutorial", "step4_accepted.py"))
            # and the rewritten file passes without the variable
            self.assertRegex(run_shown("python -m unittest test_mynet", folder), r"\nOK\n")

    def test_readme_first_test_is_the_tutorials_last_file_and_its_output_is_real(self) -> None:
        readme = read("README.rst")
        code = re.search(r"^\.\. code-block:: python\n\n((?:(?:   .*)?\n)+)", readme, re.M)
        assert code is not None
        shown = textwrap.dedent(code.group(1)).rstrip() + "\n"
        self.assertEqual(shown, read("docs", "examples", "tutorial", "step4_accepted.py"))
        self.assertEqual(walk(self, readme, start=shown), 1)


class TestTutorialPage(unittest.TestCase):
    """The page as read (no run): what it highlights is what each step changes."""

    def test_highlighted_lines_are_the_lines_each_step_changes(self) -> None:
        page = read("docs", "tutorial.rst")
        shown = re.findall(
            r"^\.\. literalinclude:: examples/tutorial/(\S+)\n   :language: python\n(?:   :emphasize-lines: (\S+)\n)?",
            page,
            re.M,
        )
        self.assertEqual([name for name, _ in shown], ["step1.py", "step2.py", "step3.py", "step4_accepted.py"])
        for (before, _), (after, spec) in zip(shown, shown[1:]):
            with self.subTest(after):
                old = read("docs", "examples", "tutorial", before).splitlines()
                new = read("docs", "examples", "tutorial", after).splitlines()
                changed = [
                    n + 1
                    for tag, _, _, j1, j2 in difflib.SequenceMatcher(a=old, b=new, autojunk=False).get_opcodes()
                    if tag in ("replace", "insert")
                    for n in range(j1, j2)
                ]
                lines = [int(n) for part in spec.split(",") for n in _expand(part)]
                self.assertEqual(lines, changed)


class TestNormalise(unittest.TestCase):
    """What the comparison forgives, and only that."""

    def test_timings_folders_and_frames(self) -> None:
        out = (
            "Traceback (most recent call last):\n"
            '  File "/tmp/x/test_mynet.py", line 23, in test_round_trip\n'
            "    loaded = self.round_trip(original)\n"
            "             ^^^^^^^^^^^^^^^^^^^^^^^^^\n"
            "ValueError: boom\n"
            "Accepting new output at /tmp/x/test_mynet.py:33\n"
            "Ran 4 tests in 0.035s\n"
            "4 passed in 2.87s\n"
        )
        self.assertEqual(
            normalise(out, "/tmp/x"),
            "Traceback (most recent call last):\n  ...\nValueError: boom\n"
            f"Accepting new output at {SHOWN_FOLDER}/test_mynet.py:33\nRan 4 tests in <time>s\n4 passed in <time>s\n",
        )

    def test_words_and_counts_still_differ(self) -> None:
        self.assertNotEqual(normalise("Ran 4 tests in 0.1s\nOK\n"), normalise("Ran 3 tests in 0.1s\nOK\n"))
        self.assertNotEqual(normalise("ValueError: boom\n"), normalise("ValueError: bang\n"))
        self.assertNotEqual(normalise("test_x ... ok\n"), normalise("test_x ... FAIL\n"))


if __name__ == "__main__":
    unittest.main()
