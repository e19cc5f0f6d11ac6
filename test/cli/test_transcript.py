"""``docs/cli_transcript.txt`` is what ``tools/cli_transcript.py`` writes: the same commands, in order,
each with its exit code (its output is this machine's torch's; regenerate it with the script)."""

from __future__ import annotations

import os
import re
import unittest

from tools.cli_transcript import OUT, commands, shown


class TestTranscript(unittest.TestCase):
    def test_the_file_shows_the_scripts_commands(self) -> None:
        self.assertTrue(os.path.isfile(OUT), f"{OUT} is missing: run python tools/cli_transcript.py")
        with open(OUT, encoding="utf-8") as fh:
            text = fh.read()
        self.assertEqual(
            [line for line in text.splitlines() if line.startswith("$ ")],
            [shown(command, env) for command, env, _note in commands()],
        )
        # every command's output ends with its exit code; the text carries no RST markup
        self.assertEqual(text.count("\n[exit "), len(commands()))
        self.assertRegex(text, r"COLUMNS=100")
        self.assertNotIn("``", text)
        blocks = re.split(r"\n(?:# [^\n]*\n)*\$ ", text)  # a command, with the notes above it
        self.assertEqual(len(blocks), len(commands()) + 1)
        for block in blocks[1:]:
            self.assertRegex(block.rstrip(), r"\[exit \d\]$")


if __name__ == "__main__":
    unittest.main()
