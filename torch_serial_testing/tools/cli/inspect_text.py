"""``inspect``'s text report: short by default, every explanation with ``-v``, wrapped to the terminal.

Names go through :func:`show_name`, other fields through :func:`escape_text`, and every line is
escaped once more, so no byte of the input can add a line, move the cursor or recolour the terminal.
"""

from __future__ import annotations

from typing import Any, Optional

from ...errors import escape_text, show_name
from .terminal import Line, plain, terminal_width, wrap_lines

__all__ = ["format_inspect", "summary_line", "totals_line"]

MODES = ("weights_only_false", "safe_globals", "default")
_MODE_HANG = 22  # where a mode's summary starts: continuation lines line up with it


def format_inspect(r: dict[str, Any], verbose: bool = False, width: Optional[int] = None) -> str:
    """The text report of the ``inspect`` JSON object *r* (*verbose*: every reason and note)."""
    lines: list[Line] = []
    for line in _inspect_lines(r, verbose):
        text, hang = (line, -1) if isinstance(line, str) else line
        lines.append((escape_text(text), hang))
    return "\n".join(wrap_lines(lines, terminal_width(width)))


_STATUS_WIDTH = len("NEEDS_TRUSTED_LOADER")
#: At most this many names on a summary line; the rest are counted.
_NAMES_SHOWN = 3


def summary_line(r: dict[str, Any], width: Optional[int] = None) -> str:
    """One line for the report *r* when many checkpoints are inspected: status, file, and why."""
    where = escape_text(r["checkpoint"])

    def names(key: str, what: str) -> str:
        found = [d["name"] if isinstance(d, dict) else d for d in r[key]]
        shown = ", ".join(show_name(n) for n in found[:_NAMES_SHOWN])
        more = f" and {len(found) - _NAMES_SHOWN} more" if len(found) > _NAMES_SHOWN else ""
        return f"{len(found)} {what}: {shown}{more}"

    why = {
        "needs_allowlist": lambda: names("required_globals", "global(s) beyond torch's allowlist"),
        "needs_opt_in": lambda: names("needs_opt_in", "global(s) not a class, the pickle calls"),
        "unverified": lambda: names("unverified", "class(es) whose module is not imported here"),
        "dangerous": lambda: names("dangerous", "DANGEROUS") if r["dangerous"] else names("malformed", "MALFORMED"),
        "needs_trusted_loader": lambda: f"format {r['format']}: a loader for trusted files only",
        "unloadable": lambda: names("unknown", "global(s) absent here") if r["unknown"] else plain(r["error"] or ""),
    }.get(r["status"], lambda: plain(r["error"] or ""))()
    text = f"{r['status'].upper():<{_STATUS_WIDTH}} {where}" + (f": {why}" if why else "")
    return "\n".join(wrap_lines([(escape_text(text), _STATUS_WIDTH + 3)], terminal_width(width)))


def totals_line(statuses: list[str], worst: int) -> str:
    """The last line of a many-checkpoint report: the count per status and the exit code (the worst)."""
    counts = {s: statuses.count(s) for s in dict.fromkeys(statuses)}
    listed = ", ".join(f"{n} {s.upper()}" for s, n in counts.items()) or "none"
    return f"{len(statuses)} file(s): {listed}; exit {worst} (the worst of them)"


def _short_summary(summary: str, missing: list[str], required: list[str]) -> str:
    """A mode's summary without torch's exception text, the needed names said once (above)."""
    summary = summary.split(" (torch raises ", 1)[0]
    if missing and len(missing) > 1 and set(missing) == set(required):
        listed = ", ".join(show_name(g) for g in missing)
        summary = summary.replace(f"not allowlisted: {listed}", f"not allowlisted: the {len(missing)} globals above")
    return summary


def _inspect_lines(r: dict[str, Any], verbose: bool) -> list[Line]:
    where = escape_text(r["checkpoint"])
    status = f"status: {r['status'].upper()} (exit {r['exit_code']})"
    if r["format"] is None:
        head = "IMPORT FAILED" if r["status"] == "import_failed" else "UNREADABLE"
        return [
            f"checkpoint: {where}" + (f" ({r['nbytes']} bytes)" if r["nbytes"] is not None else ""),
            f"{head}: {escape_text(r['error'])}",
            status,
        ]
    replaced = r["torch_load_replaced_by"]
    lines: list[Line] = [
        f"checkpoint: {where} ({r['nbytes']} bytes, format {r['format']})",
        f"torch {r['torch']['version']}; torch.load is "
        + (
            f"REPLACED by {escape_text(replaced)} (predictions follow torch's own rules)" if replaced else "torch's own"
        ),
    ]
    req = r["required_globals"]
    labels = (
        ("dangerous", "DANGEROUS"),
        ("malformed", "MALFORMED"),
        ("unknown", "UNKNOWN"),
        ("unverified", "UNVERIFIED"),
        ("needs_opt_in", "NOT A CLASS"),
    )
    flagged = {}
    for key, label in labels:
        for d in r.get(key, []):
            reason = d["reason"]
            if key == "unverified" and not verbose:
                reason = "its module is not imported here, so it cannot be judged (not a verdict of danger)"
            elif key == "needs_opt_in" and not verbose:
                reason = "the pickle calls it with arguments of its choosing"
            flagged[d["name"]] = f"{label}: {reason}"
    if r["format"] == "torchscript":
        lines.append("a TorchScript archive: its code is not a pickle of globals; weights_only does not apply")
    else:
        lines.append(
            f"globals beyond torch's allowlist ({len(req)}), found without unpickling:" + ("" if req else " none")
        )
        for g in req:
            lines.append((f"  {show_name(g)}" + (f"    <-- {escape_text(flagged[g])}" if g in flagged else ""), 6))
    sg = r["safe_globals"]
    if sg["given"]:
        lines.append(
            (
                f"--safe-global: {', '.join(map(show_name, sg['given']))}"
                + (f" (not needed: {', '.join(map(show_name, sg['unused']))})" if sg["unused"] else ""),
                4,
            )
        )
    if r.get("imported"):
        lines.append((f"--import: {', '.join(map(escape_text, r['imported']))} (imported before judging)", 4))
    modes = r["modes"]
    summaries = [
        modes[m]["summary"] if verbose else _short_summary(modes[m]["summary"], modes[m]["missing"], req) for m in MODES
    ]
    lines.append("load modes here:")
    if len(set(summaries)) == 1:  # e.g. every torch.load raising: said once
        lines.append((f"  {'every mode':<19} {escape_text(summaries[0])}", _MODE_HANG))
    else:
        lines += [(f"  {name:<19} {escape_text(s)}", _MODE_HANG) for name, s in zip(MODES, summaries)]
    if r["snippet"]:
        lines.append("to load it weights-only, only if you trust these classes:")
        lines.extend((f"    {line}" if line else "", None) for line in r["snippet"].splitlines())
    elif r["status"] == "needs_opt_in":
        names = [d["name"] for d in r["needs_opt_in"] if d["name"] not in sg["given"]]
        lines.append(
            (
                "no snippet: loading it also needs "
                + ", ".join(map(show_name, names))
                + " (not a class: the pickle calls it); only if you trust this file, name each with "
                "--safe-global to get a snippet that opts in to it",
                2,
            )
        )
    lines.append(status)
    default = modes["default"]
    if r["status"] == "needs_allowlist" and default["outcome"] == "rejected":
        lines.append(
            (
                f"  - answer: a bare torch.load here is {default['summary'].split('; ')[0][len('rejected: ') :]}, "
                f"and this checkpoint needs {len(req)} global(s) beyond torch's allowlist: "
                "allowlist them as above if you trust them"
                + (
                    ", or pass weights_only=False for a trusted file only"
                    if modes["weights_only_false"]["outcome"] == "unsafe"
                    else ""
                ),
                4,
            )
        )
    if r.get("unverified"):  # no command is built from a name the file chose (idlelib.idle runs IDLE)
        lines.append(
            (
                "  - UNVERIFIED (not a verdict of danger): judging never imports what a checkpoint names. "
                "If you know and trust the code that defines these classes, run again with --import MODULE, "
                "naming its module yourself (this report never names one for you: the file chose its names); "
                "until then, do not load this file with weights_only=False",
                4,
            )
        )
    if r["status"] == "needs_opt_in" and verbose:
        lines.append(
            (
                "  - it needs globals that are not classes (NOT A CLASS above): the pickle calls them with "
                "arguments of its choosing; they are never suggested, and a test may allow one only "
                "explicitly, with UnsafeCallable('module.name', reason=...), if you trust it",
                4,
            )
        )
    error = r["error"]
    if error and not (len(set(summaries)) == 1 and error in summaries[0]):  # not said twice
        lines.append((f"  - {escape_text(plain(error))}", 4))
    refused = [show_name(d["name"]) for d in r["dangerous"] + r.get("malformed", [])]
    if refused:
        lines.append(
            (
                "  - DANGEROUS: do not load this file with weights_only=False, and never allowlist "
                + ", ".join(refused),
                4,
            )
        )
    if verbose:
        said = tuple(f"{name}:" for name in refused)  # made once: per note it made the report quadratic
        lines.extend((f"  - {escape_text(note)}", 4) for note in r.get("notes", []) if not note.startswith(said))
    return lines
