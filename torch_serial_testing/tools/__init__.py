"""The tools: judging checkpoints from strangers, and the command line around the core.

Nothing of the core (the package's top-level modules, which ``vendor`` copies into pytorch's
``test/``) imports anything here.  The tools hold the trust policy (:mod:`.policy`: which globals may
ever be allowlisted, judged without running them), the readers of files and older formats
(:mod:`.formats`), the command line (:mod:`.cli`: ``doctor``, ``inspect``, ``audit``, ``vendor``),
the audit (:mod:`.audit`) and what they ask torch in a fresh interpreter (:mod:`.facts`).
"""

from __future__ import annotations

import importlib
from typing import Any

# Imported on first use: the audit's pytest plugin, loaded by every pytest run where the package is
# installed, imports this package and must stay cheap.  Name -> its module.
_ON_FIRST_USE = {
    **dict.fromkeys(("FileCheckpoint", "open_regular_file", "required_globals", "scan_checkpoint"), "formats"),
    **dict.fromkeys(("refusal_notes", "safe_globals_snippet"), "policy.snippet"),
    **dict.fromkeys(("Verdict", "dangerous_reason", "judge_global", "judge_name"), "policy.trust"),
}
__all__ = sorted(_ON_FIRST_USE)


def __getattr__(name: str) -> Any:
    module = _ON_FIRST_USE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_ON_FIRST_USE})
