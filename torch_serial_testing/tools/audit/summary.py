"""Read an audit report (JSONL) back: a verdict per load, per test, as text or an issue-ready table."""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any, Iterable, Optional

__all__ = ["VERDICTS", "FAIL_ON", "read_report", "verdict", "by_test", "format_text", "format_markdown", "matches"]

#: Verdict key -> the sentence the summary prints.
VERDICTS = {
    "default": "fails only because of the weights_only default",
    "force_no": "passes only because of TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD",
    "force_wo": "fails only because of TORCH_FORCE_WEIGHTS_ONLY_LOAD",
    "explicit_rejected": "rejected by its explicit weights_only=True (globals missing from its safe_globals)",
    "full_load": "loads in full by its explicit weights_only=False",
    "error": "other error",
    "ok": "needs nothing",
}
#: ``--fail-on`` choice -> the verdicts it fails the run on.
FAIL_ON = {
    "default": {"default"},
    "force-no": {"force_no"},
    "weights-only": {"default", "force_no", "force_wo", "explicit_rejected"},
    "full-load": {"full_load"},
    "error": {"error"},
    "any": set(VERDICTS) - {"ok"},
}
_ORDER = list(VERDICTS)  # most notable first
_FAILING = {"default", "force_wo", "explicit_rejected", "error"}


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
        return "force_no" if arg is None and switches.get("TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD") else "ok"
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


def _fix_line(fix: dict[str, Any]) -> str:
    if fix.get("kind") == "none" and not fix.get("snippet"):
        return "nothing to change (weights-only load verified)" if fix.get("verified") else "no fix known"
    state = "verified" if fix.get("verified") else "NOT verified"
    return f"fix ({fix['kind']}, {state})"


def format_text(records: list[dict[str, Any]], report: Optional[str] = None) -> str:
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
                lines.append(f"    needs: {', '.join(r['needs'])}")
            fix = r.get("fix") or {}
            if v != "ok" and fix.get("kind") not in (None, "none") or fix.get("snippet"):
                lines.append(f"    {_fix_line(fix)}:")
                lines.extend(f"      {s}" for s in (fix.get("snippet") or "").splitlines())
    return "\n".join(lines)


def _cell(text: Any) -> str:
    return str(text).replace("|", "\\|").replace("\n", "<br>")


def format_markdown(records: list[dict[str, Any]]) -> str:
    """One row per load: an issue-ready GitHub Markdown table."""
    rows = [
        "| test | outcome | site | weights_only | verdict | needs | fix |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for test, entry in by_test(records).items():
        for v, r in entry["loads"]:
            fix = r.get("fix") or {}
            snippet = fix.get("snippet")
            code = [f"`{_cell(line)}`" for line in (snippet or "").splitlines() if line.strip()]
            fix_cell = "<br>".join([_fix_line(fix), *code])
            needs = ", ".join(f"`{n}`" for n in r.get("needs") or []) or "—"
            arg = r["weights_only_arg"]
            wo = f"arg {'not passed' if arg is None else arg} → {r['effective_weights_only']}"
            rows.append(
                f"| `{_cell(test)}` | {entry['outcome'] or '—'} | `{_cell(r.get('site'))}` | {wo} | "
                f"{_cell(VERDICTS[v])} | {needs} | {fix_cell} |"
            )
    return "\n".join(rows) + "\n"
