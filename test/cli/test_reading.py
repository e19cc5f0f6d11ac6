"""What a person reads: ``inspect``'s text short by default, every detail with ``-v``, wrapped to the
terminal (80 columns when it cannot be asked), nothing said twice, no RST markup; ``--help``'s
exit codes each once, at any width."""

from __future__ import annotations

import io
import os
import re
import unittest
import warnings
from unittest import mock

import torch

from torch_serial_testing.tools.cli import build_parser
from torch_serial_testing.tools.cli.inspection import format_inspect, inspect_report
from torch_serial_testing.tools.facts import torch_reads_force_no_weights_only

from test.cli.test_cli import EXPECTED_EXIT_CODES, _seed_module, exit_code_blocks

WIDTHS = (40, 60, 80, 100, 132)


def _saved(obj: object) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def _prose(text: str) -> list[str]:
    """The lines that are not the snippet's code (code is never wrapped)."""
    lines = text.splitlines()
    start = next((i for i, line in enumerate(lines) if line.startswith("to load it weights-only")), None)
    if start is not None:
        end = next(i for i in range(start, len(lines)) if lines[i].startswith("status: "))
        lines = lines[:start] + [line for line in lines[start:end] if not line.startswith("    ")] + lines[end:]
    return lines


class TestInspectText(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.seed = _saved(_seed_module())
        scripted = io.BytesIO()
        torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), scripted)
        cls.scripted = scripted.getvalue()

    def test_wrapped_to_the_width_names_and_code_intact(self) -> None:
        r = inspect_report("seed.pt", [], data=self.seed)
        for width in WIDTHS:
            with self.subTest(width=width):
                text = format_inspect(r, width=width)
                for line in _prose(text):
                    # a line is over the width only when it is one word (a name is never broken)
                    self.assertTrue(len(line) <= width or " " not in line.strip(), (width, line))
                self.assertIn(r["snippet"], "\n".join(line[4:] for line in text.splitlines()))
                for name in r["required_globals"]:
                    self.assertIn(f"  {name}\n", text)

    def test_terminal_width_or_80(self) -> None:
        r = inspect_report("seed.pt", [], data=self.seed)
        with mock.patch.dict(os.environ, {"COLUMNS": "64"}):
            self.assertEqual(format_inspect(r), format_inspect(r, width=64))
        env = {k: v for k, v in os.environ.items() if k not in ("COLUMNS", "LINES")}
        with mock.patch.dict(os.environ, env, clear=True), mock.patch("os.get_terminal_size", side_effect=OSError):
            self.assertEqual(format_inspect(r), format_inspect(r, width=80))  # not a terminal: 80

    def test_short_by_default_detail_with_verbose(self) -> None:
        r = inspect_report("seed.pt", [], data=self.seed)
        short, verbose = format_inspect(r, width=10000), format_inspect(r, verbose=True, width=10000)
        self.assertNotIn("Unsupported global", short)
        self.assertIn("Unsupported global", verbose)
        self.assertIn(f"the {len(r['required_globals'])} globals above", short)
        self.assertLess(len(short), len(verbose))
        # every required name is listed once in the short form (the modes refer back to it)
        for name in r["required_globals"]:
            self.assertEqual(short.count(f"  {name}\n"), 1)

    def test_no_rst_markup_in_the_text(self) -> None:
        try:  # torch 2.4 hands a TorchScript archive to torch.jit.load even weights-only (with a warning)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                torch.load(io.BytesIO(self.scripted), weights_only=True)
            self.skipTest(f"torch {torch.__version__} refuses no TorchScript archive: no message of torch's to show")
        except RuntimeError:
            pass
        r = inspect_report("scripted.pt", [], data=self.scripted)
        self.assertIn("``", r["error"])  # torch's own message, kept as torch wrote it in --json
        for verbose in (False, True):
            text = format_inspect(r, verbose=verbose)
            self.assertNotIn("``", text)
            self.assertIn("Cannot use weights_only=True with TorchScript archives", " ".join(text.split()))

    @unittest.skipUnless(torch_reads_force_no_weights_only(), "this torch ignores TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD")
    def test_both_switches_said_once(self) -> None:
        both = {"TORCH_FORCE_WEIGHTS_ONLY_LOAD": "1", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1"}
        r = inspect_report("seed.pt", [], data=self.seed, environ=both)
        self.assertEqual(r["status"], "environment_error")
        for verbose in (False, True):
            text = " ".join(format_inspect(r, verbose=verbose, width=10000).split())
            self.assertEqual(text.count("are both set"), 1, text)


class TestHelpText(unittest.TestCase):
    def test_exit_codes_once_at_every_width(self) -> None:
        for width in WIDTHS:
            for command in ([], ["doctor"], ["inspect"], ["vendor"]):
                with self.subTest(width=width, command=command), mock.patch.dict(os.environ, {"COLUMNS": str(width)}):
                    parser = build_parser()
                    if command:
                        parser = parser._subparsers._group_actions[0].choices[command[0]]  # type: ignore[union-attr]
                    text = parser.format_help()
                    self.assertEqual(
                        exit_code_blocks(text),
                        {
                            code: {c: t for c, t in meanings.items() if not command or c in (command[0], "all")}
                            for code, meanings in EXPECTED_EXIT_CODES.items()
                        },
                    )
                    block = text.partition("\nexit codes:\n")[2].split("\n\n", 1)[0]
                    for line in block.splitlines():
                        if not re.match(r"^  \d  ", line):  # a continuation never starts with a number
                            self.assertNotRegex(line, r"^\s+\d", block)
                    self.assertNotIn("``", text)


if __name__ == "__main__":
    unittest.main()
