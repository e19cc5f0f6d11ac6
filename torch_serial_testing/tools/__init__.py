"""The tools: judging checkpoints from strangers, and the command line around the core.

Nothing of the core (the package's top-level modules, which ``vendor`` copies into pytorch's
``test/``) imports anything here.  The tools hold the trust policy (:mod:`.policy`: which globals may
ever be allowlisted, judged without running them), the readers of files and older formats
(:mod:`.formats`), the command line (:mod:`.cli`: ``doctor``, ``inspect``, ``audit``, ``vendor``),
the audit (:mod:`.audit`) and what they ask torch in a fresh interpreter (:mod:`.facts`).
"""

from __future__ import annotations

from .formats import FileCheckpoint, open_regular_file, required_globals, scan_checkpoint
from .policy.snippet import refusal_notes, safe_globals_snippet
from .policy.trust import Verdict, dangerous_reason, judge_global, judge_name

__all__ = [
    "FileCheckpoint",
    "Verdict",
    "dangerous_reason",
    "judge_global",
    "judge_name",
    "open_regular_file",
    "refusal_notes",
    "required_globals",
    "safe_globals_snippet",
    "scan_checkpoint",
]
