"""Read an audit report (JSONL) back: a verdict per load, per test, as text or an issue-ready table.

Every field is data (test ids, sites, the globals a checkpoint names, torch's error naming them): the
text summary shows names through :func:`~...errors.show_name` and escapes every line with
:func:`~...errors.escape_text`, as ``inspect`` does, so no byte can add a line, move the cursor or
recolour the terminal; the Markdown table puts each field in a code span no backtick inside it can
close, with ``|`` escaped, so no field can add a cell, a row, a link or markup.
"""

from __future__ import annotations

import json
import re
from collections import OrderedDict
from typing import Any, Callable, Iterable, Optional

from ...errors import escape_text, show_name

__all__ = ["VERDICTS", "FAIL_ON", "read_report", "verdict", "by_test", "format_text", "format_markdown", "matches"]

#: Verdict key -> the sentence the summary prints.
VERDICTS = {
    "default": "fails only because of the weights_only default",
    "force_no": "passes only because of TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
    "default_full": "loads in full only because this torch's default is weights_only=False (True since 2.6)",
    "force_wo": "fails only because of TORCH_FORCE_WEIGHTS_ONLY_LOAD",
    "explicit_rejected": "rejected by its explicit weights_only=True (globals missing from its safe_globals)",
    "full_load": "loads in full by its explicit weights_only=False",
    "bypassed": "loads only through a replaced torch.load (torch's own weights-only load refuses it)",
    "error": "other error",
    "ok": "needs nothing",
}
#: ``--fail-on`` choice -> the verdicts it fails the run on.
FAIL_ON = {
    "default": {"default"},
    "force-no": {"force_no"},
    "weights-only": {"default", "force_no", "default_full", "force_wo", "explicit_rejected", "bypassed"},
    "full-load": {"full_load"},
    "error": {"error"},
    "any": set(VERDICTS) - {"ok"},
}
_ORDER = list(VERDICTS)  # most notable first
_FAILING = {"default", "force_wo", "explicit_rejected", "error"}
_OUTCOMES = {"passed", "failed", "error", "skipped", "xfailed", "xpassed"}
#: The fix of a load that loaded weights-only with what the test allows (verified by torch's own loader).
_NOTHING = {"kind": "none", "snippet": None, "verified": True}


def read_report(path: str) -> list[dict[str, Any]]:
    records = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.strip():
                records.append(json.loads(line))
    return records


def verdict(record: dict[str, Any]) -> str:
    """The verdict on one load record (a key of :data:`VERDICTS`)."""
    needs = record.get("needs") or []
    arg, effective, loaded = record["weights_only_arg"], record["effective_weights_only"], record["loaded"]
    switches = record.get("switches") or {}
    weights_only_error = bool(record.get("error")) and "UnpicklingError" in record["error"]
    if not loaded:
        if not (needs or weights_only_error) or effective is not True:
            return "error"
        if arg is False:
            return "force_wo"
        if arg is True:
            return "explicit_rejected"
        return "force_wo" if switches.get("TORCH_FORCE_WEIGHTS_ONLY_LOAD") else "default"
    if effective is False and needs:
        if arg is False:
            return "full_load"
        return "force_no" if switches.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") else "default_full"
    if effective is True and needs and record.get("fix") != _NOTHING:
        return "bypassed"  # it loaded, but torch's own weights-only load of the same bytes does not
    return "ok"


def by_test(records: Iterable[dict[str, Any]]) -> OrderedDict[Optional[str], dict[str, Any]]:
    """test id -> {"outcome", "loads": [(verdict, record)], "saves": n}, in order of first appearance."""
    tests: OrderedDict[Optional[str], dict[str, Any]] = OrderedDict()
    for r in records:
        entry = tests.setdefault(r.get("test"), {"outcome": None, "loads": [], "saves": 0})
        if r.get("event") == "load":
            entry["loads"].append((verdict(r), r))
        elif r.get("event") == "save":
            entry["saves"] += 1
        elif r.get("event") == "test":
            entry["outcome"] = r.get("outcome")
    return tests


def matches(records: Iterable[dict[str, Any]], fail_on: Iterable[str]) -> list[dict[str, Any]]:
    """The load records whose verdict one of the *fail_on* choices names."""
    wanted = set().union(*(FAIL_ON[c] for c in fail_on)) if fail_on else set()
    return [r for r in records if r.get("event") == "load" and verdict(r) in wanted]


def _fix_line(verdict_key: str, fix: dict[str, Any], show: Callable[[Any], str] = str) -> str:
    """What the fix column says: nothing to change for a load that needs nothing, else the fix's kind."""
    if verdict_key == "ok" or fix.get("kind") == "none" and not fix.get("snippet"):
        if not fix.get("verified"):
            return "nothing to change" if verdict_key == "ok" else "no fix known"
        return "nothing to change (weights-only load verified)"
    state = "verified" if fix.get("verified") else "NOT verified"
    return f"fix ({show(fix.get('kind'))}, {state})"


def _needs_label(verdict_key: str) -> str:
    """A load that needs nothing more lists what it needs beyond torch's allowlist as the test's own."""
    return "allowed by the test" if verdict_key == "ok" else "needs"


def format_text(records: list[dict[str, Any]], report: Optional[str] = None) -> str:
    """The summary for a terminal: every line escaped (no control character of any field reaches it)."""
    tests = by_test(records)
    loads = sum(len(t["loads"]) for t in tests.values())
    with_loads = sum(1 for t in tests.values() if t["loads"])
    head = f"torch_serial_testing audit: {loads} torch.load call(s) in {with_loads} test(s)"
    lines = [head + (f" (records: {report})" if report else "")]
    for test, entry in tests.items():
        if not entry["loads"]:
            continue
        worst = min((v for v, _ in entry["loads"]), key=_ORDER.index)
        outcome = f" [{entry['outcome']}]" if entry["outcome"] else ""
        handled = entry["outcome"] == "passed" and worst in _FAILING
        note = " (raised inside the passing test: it expects or handles the failure)" if handled else ""
        lines.append(f"{test or '(outside any test)'}{outcome}: {VERDICTS[worst]}{note}")
        for v, r in entry["loads"]:
            lines.append(f"  {r.get('site') or '?'}: {VERDICTS[v]}" + (f" ({r['error']})" if r.get("error") else ""))
            if r.get("needs"):
                lines.append(f"    {_needs_label(v)}: {', '.join(map(show_name, r['needs']))}")
            fix = r.get("fix") or {}
            if v != "ok" and (fix.get("kind") not in (None, "none") or fix.get("snippet")):
                lines.append(f"    {_fix_line(v, fix)}:")
                lines.extend(f"      {s}" for s in (fix.get("snippet") or "").splitlines())
    return "\n".join(escape_text(line) for line in lines)


def markdown_code(text: Any) -> str:
    """*text* as one GitHub Markdown code span inside a table cell: escaped (no line break or control
    character), ``|`` as ``\\|`` (a cell ends at no ``|`` of it), fenced by more backticks than its
    longest run of them (nothing in it closes the span, so no link, markup or HTML); "—" when empty."""
    s = escape_text(text).replace("|", "\\|")
    if not s:
        return "—"
    fence = "`" * (max(map(len, re.findall("`+", s)), default=0) + 1)
    pad = " " if s[0] == "`" or s[-1] == "`" or (s[0] == s[-1] == " " and s.strip()) else ""
    return f"{fence}{pad}{s}{pad}{fence}"


def _flag(value: Any) -> str:
    return str(value) if value is None or isinstance(value, bool) else markdown_code(value)


def format_markdown(records: list[dict[str, Any]]) -> str:
    """One row per load: an issue-ready GitHub Markdown table (every field from a record in a code span)."""
    rows = [
        "| test | outcome | site | weights_only | verdict | needs | fix |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for test, entry in by_test(records).items():
        for v, r in entry["loads"]:
            fix = r.get("fix") or {}
            shown = fix.get("snippet") if v != "ok" else None
            code = [markdown_code(line) for line in (shown or "").splitlines() if line.strip()]
            fix_cell = "<br>".join([_fix_line(v, fix, markdown_code), *code])
            names = ", ".join(markdown_code(n) for n in r.get("needs") or [])
            needs = "—" if not names else names if v != "ok" else f"{_needs_label(v)}: {names}"
            arg = r["weights_only_arg"]
            wo = f"arg {'not passed' if arg is None else _flag(arg)} → {_flag(r['effective_weights_only'])}"
            outcome = entry["outcome"] if entry["outcome"] in _OUTCOMES else markdown_code(entry["outcome"] or "")
            where = markdown_code(r.get("site") or "?")
            rows.append(
                f"| {markdown_code(test or '(outside any test)')} | {outcome} | {where} | {wo} | "
                f"{VERDICTS[v]} | {needs} | {fix_cell} |"
            )
    return "\n".join(rows) + "\n"
