"""The CLI's contract with scripts: exit codes and the ``--json`` schema, written once.

``--help`` prints :func:`exit_codes_help` of :data:`EXIT_CODES`; the subcommands return these codes.
JSON (schema 1; keys stable, values ``null`` when unknown).  Every report: ``schema`` (1), ``command``,
``status``, ``exit_code``, ``torch`` ({``version``, ``cuda``, ``hip``, ``git_version``, ``debug``}),
``torch_load_replaced_by`` (string or null).

doctor: ``status`` "ok" | "attention" | "error"; ``problems`` (why not "ok"); ``default_weights_only``
({``value``: bool, or null when every load fails or torch cannot be asked (``reason`` then starts
"unknown: "), ``reason``, ``warns``, ``torch_default`` (null when unknown), ``torch_default_reason``});
``environment`` (per TORCH_FORCE_WEIGHTS_ONLY_LOAD, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD,
TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT, TORCH_DEVICE_BACKEND_AUTOLOAD: {``raw``, ``value`` torch uses
(bool; the wait limit in seconds, or "inf"/"nan"), ``effect``}); ``backend_entry_points`` ("name =
target" of group ``torch.backends``); ``safe_globals`` (registered process-wide, sorted);
``safe_globals_torch_own`` (those of them torch's own modules register themselves, as a fresh
interpreter importing the same ``torch.*`` modules reports; null when it cannot be asked);
``quantized_engines`` ({``supported``, ``current``}); ``devices`` ({``available``, ``privateuse1_backend``}).

inspect: ``status`` "loads" | "needs_allowlist" | "needs_opt_in" | "needs_trusted_loader" | "unverified"
| "dangerous" | "unloadable" | "unreadable" | "import_failed" | "environment_error" | "skipped" (in a
folder, a link not followed: exit 1 when it leads out of the folder, 0 to a folder inside it);
``checkpoint`` (the argument, or the path found in a folder); ``nbytes``;
``format`` ("zip" | "torchscript" | "legacy" | "tar" | null); ``error`` (why it is unreadable, every
load fails, or torch.load cannot be predicted here: status "environment_error", outcome "error");
``globals`` (all the pickle names); ``required_globals`` (beyond torch's allowlist); ``dangerous``
(denylisted, or the policy cannot tell), ``malformed`` (not a dotted name), ``unknown`` (absent here),
``needs_opt_in`` (verified, not a class): lists of {``name``, ``reason``}; ``unverified`` (its module is
not imported here, so it cannot be judged -- not a verdict of danger: {``name``, ``reason``, ``module``
as the file spells it: data, never a command -- pass ``--import`` only a module you know}); ``imported``
(the ``--import`` modules, imported before judging; a failed one: status "import_failed", exit 2,
``error`` its one line); ``notes`` (a line per global the snippet leaves out); ``safe_globals``
({``given``, ``unused``}); ``modes`` (per weights_only_false,
safe_globals, default: {``weights_only`` (bool or null), ``outcome`` "loads" | "rejected" | "unsafe" |
"error", ``missing``, ``summary`` (the text line)}); ``snippet`` (string or null: printed only when it
holds every global the file needs, so that it loads it -- verified classes and the functions named with
``--safe-global``).  ``--jsonl``: one such object a line per checkpoint (files, and every file of a
folder), the exit code the worst of theirs.

Exit code of "unverified": 1 (needs action first: ``--import``), not 2: a name this process cannot
judge is not known to be dangerous.  It was 2 (DANGEROUS) before ``--import`` existed; a script that
treats every nonzero code as "do not load" is unaffected, and a DANGEROUS verdict is still 2.
"""

from __future__ import annotations

import re
import textwrap
from typing import Any, Sequence

__all__ = [
    "SCHEMA_VERSION",
    "EXIT_OK",
    "EXIT_ATTENTION",
    "EXIT_DANGEROUS",
    "EXIT_USAGE",
    "EXIT_CODES",
    "exit_codes_help",
    "torch_info",
]

SCHEMA_VERSION = 1
EXIT_OK = 0
EXIT_ATTENTION = 1
EXIT_DANGEROUS = 2
EXIT_USAGE = 3

#: What each exit code means, per subcommand (argparse's own 2 for usage errors is remapped to 3).
EXIT_CODES: dict[int, dict[str, str]] = {
    EXIT_OK: {
        "inspect": "loads weights-only here (with the --safe-global names given)",
        "doctor": "environment OK: torch.load does what its call site says",
        "vendor": "done, or (--check) the copy is current",
    },
    EXIT_ATTENTION: {
        "inspect": "needs action first: allowlisting the listed classes, an explicit UnsafeCallable opt-in "
        "for a needed global that is not a class, --import of the module of an UNVERIFIED class, "
        "(TorchScript, legacy .tar) a loader only for trusted files, or a link leading out of a folder (not "
        "followed); for several checkpoints, the worst code of theirs",
        "doctor": "attention: a TORCH_FORCE_* switch is active or set to a spelling torch ignores, a "
        "variable is named almost like a switch, torch.load is replaced, a bare torch.load is "
        "not weights-only, or backend autoload is off for installed backends or set to "
        "neither '0' nor '1'",
        "vendor": "--check: the copy is not current (listed)",
    },
    EXIT_DANGEROUS: {
        "inspect": "dangerous or unloadable input: a DANGEROUS or malformed global, a global this torch "
        "lacks, unreadable / truncated / not a checkpoint, a failed --import, both TORCH_FORCE_* "
        "switches set (every torch.load fails), or this torch cannot be asked what torch.load does",
        "doctor": "error: both TORCH_FORCE_* switches set (every torch.load raises RuntimeError), or this "
        "torch cannot be asked what torch.load does",
        "vendor": "not a pytorch checkout, the flagship or aggregator is missing, or a symlink (or anything but a "
        "regular file or folder) where vendor would write or remove: refused, nothing written",
    },
    EXIT_USAGE: {"all": "usage error (bad arguments, unknown subcommand)"},
}


def exit_codes_help(commands: Sequence[str], width: int = 100) -> str:
    """The ``exit codes:`` block of ``--help`` for *commands*, from :data:`EXIT_CODES`, wrapped at *width*:
    each code once, at the start of its first line; a continuation line never starts with a digit."""
    label = max(len(c) for c in commands) + 2
    lines = ["exit codes:"]
    for code, meanings in EXIT_CODES.items():
        shown = [(c, text) for c, text in meanings.items() if c == "all" or c in commands]
        for i, (command, text) in enumerate(shown):
            prefix = (f"  {code}  " if i == 0 else " " * 5) + ("" if command == "all" else f"{command + ':':<{label}}")
            glued = re.sub(r" (?=\d)", "\0", text)  # a number stays on its word's line: never read as a code
            wrapped = textwrap.wrap(
                glued, width, initial_indent=prefix, subsequent_indent=" " * max(7, len(prefix)), break_on_hyphens=False
            )
            lines.extend(line.replace("\0", " ") for line in wrapped)
    return "\n".join(lines) + "\n"


def torch_info() -> dict[str, Any]:
    """The ``torch`` object of every report: this interpreter's torch build."""
    import torch

    version = getattr(torch, "version", None)
    return {
        "version": torch.__version__,
        **{key: getattr(version, key, None) for key in ("cuda", "hip", "git_version", "debug")},
    }
