"""Text for a terminal: wrapped to its width (``shutil.get_terminal_size``, 80 columns when it cannot
be asked, e.g. in a pipe; ``COLUMNS`` overrides), names never broken, code never wrapped."""

from __future__ import annotations

import re
import shutil
import textwrap
from typing import Optional, Sequence, Union

__all__ = ["terminal_width", "wrap_lines", "plain"]

#: Narrower than this, wrapping helps nobody: lines are wrapped at this width at least.
MIN_WIDTH = 40
_RST_LITERAL = re.compile(r"``([^`]+)``")
_OPTION = re.compile(r"(--[a-z][\w-]*) (?=[\w.])")

#: A line to print: text (wrapped, continuation lines indented like its own indent plus 2), or
#: (text, hang) with the continuation indent, or (text, None) for a line never wrapped (code).
Line = Union[str, tuple[str, Optional[int]]]


def terminal_width(width: Optional[int] = None) -> int:
    """*width*, or the terminal's (80 when it cannot be told), at least :data:`MIN_WIDTH`."""
    return max(MIN_WIDTH, width if width is not None else shutil.get_terminal_size((80, 24)).columns)


def plain(text: str) -> str:
    """*text* without RST literal markup (torch's own messages carry ````weights_only=True````)."""
    return _RST_LITERAL.sub(r"\1", text)


def wrap_lines(lines: Sequence[Line], width: int) -> list[str]:
    """Every line wrapped at *width* (see :data:`Line`)."""
    out: list[str] = []
    for line in lines:
        text, hang = (line, -1) if isinstance(line, str) else line
        if hang is None or len(text) <= width:
            out.append(text)
            continue
        indent = len(text) - len(text.lstrip(" "))
        if hang < 0:
            hang = indent + 2
        glued = _OPTION.sub("\\1\0", text[indent:])  # "--import mymodels" stays on one line
        out.extend(
            part.replace("\0", " ")
            for part in textwrap.wrap(
                glued,
                width,
                initial_indent=" " * indent,  # kept even before a word longer than the width
                subsequent_indent=" " * hang,
                break_long_words=False,
                break_on_hyphens=False,
            )
            or [text]
        )
    return out
