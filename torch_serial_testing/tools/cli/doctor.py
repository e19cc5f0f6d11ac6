"""``doctor``: this interpreter's torch and the switches that change what ``torch.load`` does,
as the JSON object documented in :mod:`.contract`."""

from __future__ import annotations

import difflib
import math
import os
import re
from importlib.metadata import entry_points
from typing import Any, Optional

from ...errors import ConflictingEnvironmentError, escape_text, show_name, torch_key
from ...modes import FORCE_NO_WO, FORCE_WO, LoadMode, decide, is_truthy, torch_default_weights_only
from ...errors import ProbeFailed
from ..facts import describe_spellings, torch_reads_force_no_weights_only
from .contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, SCHEMA_VERSION, torch_info
from .terminal import terminal_width, wrap_lines

__all__ = ["doctor_report", "format_doctor"]

WAIT_LIMIT = "TORCH_AUTOGRAD_SHUTDOWN_WAIT_LIMIT"
AUTOLOAD = "TORCH_DEVICE_BACKEND_AUTOLOAD"
#: torch's "Miscellaneous Environment Variables".
ENV_VARS = (FORCE_WO, FORCE_NO_WO, WAIT_LIMIT, AUTOLOAD)
_FALSY = ("", "0", "n", "no", "false", "off")
# C's atof: leading whitespace, then the longest float prefix; anything else reads as 0.
_ATOF = re.compile(r"\s*([+-]?(?:(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|inf(?:inity)?|nan))", re.IGNORECASE)
# Likeness to a switch that counts as a misspelling: 0.8 flags a missing/extra word or letter
# (TORCH_FORCE_WEIGHTS_ONLY, PYTORCH_FORCE_...) and no variable torch reads (the closest,
# TORCH_ELASTIC_SHUTDOWN_TIMEOUT, scores 0.69).
_NEAR_MISS = 0.8


def near_miss_switches(env: Any) -> list[tuple[str, str]]:
    """(set name, switch it resembles) for every variable named almost like one of the four: torch
    reads them by exact, case-sensitive name, so ``TORCH_FORCE_WEIGHTS_ONLY=1`` silently does nothing."""
    close = {
        name: difflib.get_close_matches(name.upper(), ENV_VARS, n=1, cutoff=_NEAR_MISS)
        for name in sorted(env)
        if name not in ENV_VARS
    }
    return [(name, match[0]) for name, match in close.items() if match]


def _force_effect(name: str, raw: Optional[str], both: bool, problems: list[str]) -> tuple[Optional[bool], str]:
    if raw is None:
        return False, "unset: no effect"
    try:
        active = is_truthy(raw, name)
        spellings = describe_spellings(name)
        reads = name != FORCE_NO_WO or torch_reads_force_no_weights_only()
    except ProbeFailed as e:  # reported as an error by doctor_report (the bare load cannot be asked either)
        return None, f"unknown: this torch cannot be asked how it reads {name} ({e})"
    if not reads:
        problems.append(f"{name}={raw!r} is ignored: this torch's torch.load does not read it (torch < 2.6)")
        return False, "ignored: this torch's torch.load does not read it (it was added in torch 2.6)"
    if not active:
        if raw.strip().lower() in _FALSY:
            return False, f"off ({raw!r} is not truthy): no effect"
        problems.append(f"{name}={raw!r} is ignored: this torch only reads {spellings} as set")
        return False, f"ignored: {raw!r} is not one of this torch's truthy spellings: {spellings}"
    if both:
        return True, "active, and so is the other TORCH_FORCE_* switch: every torch.load raises RuntimeError"
    if name == FORCE_WO:
        problems.append(
            f"{name}={raw} forces weights_only=True on every torch.load, even an explicit weights_only="
            "False: files needing globals beyond the allowlist fail with 'Unsupported global'"
        )
        return True, (
            "active: every torch.load runs weights_only=True, even where the call site passes "
            "weights_only=False explicitly"
        )
    problems.append(
        f"{name}={raw} makes a torch.load without weights_only fully unpickle (runs arbitrary code "
        "from the file) and warn"
    )
    return True, (
        "active: a torch.load that does not pass weights_only runs weights_only=False (full unpickling, "
        "executes arbitrary code from the file) with a UserWarning; an explicit weights_only=True/False "
        "is obeyed"
    )


def _wait_limit_effect(raw: Optional[str]) -> tuple[Any, str]:
    if raw is None:
        return 10.0, (
            "unset: at exit, waits up to 10 s (the default) for autograd worker threads to shut down "
            "(only when no backward is running)"
        )
    m = _ATOF.match(raw)
    seconds = float(m.group(1)) if m else 0.0
    value = seconds if math.isfinite(seconds) else ("nan" if math.isnan(seconds) else "inf")  # JSON has neither
    if math.isnan(seconds) or seconds <= 0:
        why = "NaN is not > 0" if math.isnan(seconds) else f"{seconds:g} <= 0" if m else f"{raw!r} reads as 0 (C atof)"
        return value, f"{why}: does not wait for autograd worker threads at exit"
    return value, (
        f"at exit, waits up to {seconds:g} s for autograd worker threads to shut down "
        "(only when no backward is running)"
    )


def _backend_entry_points() -> list[str]:
    try:
        found = entry_points()  # Python >= 3.10 selects by group; 3.9 returns a dict of group -> entry points
        eps = found.select(group="torch.backends") if hasattr(found, "select") else found.get("torch.backends", ())
    except Exception:  # noqa: BLE001 - a broken metadata install is not the user's question
        return []
    return sorted(f"{ep.name} = {ep.value}" for ep in eps)


def _autoload_effect(raw: Optional[str], eps: list[str], problems: list[str]) -> tuple[bool, str]:
    enabled = (raw if raw is not None else "1") == "1"
    installed = ", ".join(eps) if eps else "none installed"
    if enabled:
        origin = "unset, default '1'" if raw is None else "'1'"
        return True, (
            f"enabled ({origin}): `import torch` imported the out-of-tree backends of entry-point group "
            f"'torch.backends': {installed}"
        )
    if raw != "0":
        problems.append(f"{AUTOLOAD}={raw!r} disables backend autoload: torch enables it only for exactly '1'")
    why = "'0'" if raw == "0" else f"{raw!r} is not exactly '1'"
    if eps:
        problems.append(
            f"{AUTOLOAD}={raw!r}: installed backends were not imported ({installed}); their devices "
            "and any torch.load patch are absent unless imported explicitly"
        )
        return False, f"disabled ({why}): `import torch` did NOT import the installed backends: {installed}"
    return False, (
        f"disabled ({why}): `import torch` imports no out-of-tree backend; none is installed "
        "in entry-point group 'torch.backends', so no effect here"
    )


def _replaced_loader_explanation(replaced: str, safe: list[str]) -> str:
    """What a replaced ``torch.load`` means for round-trip tests (torch_npu's is the common case)."""
    from ..facts import torch_own_registrations

    try:  # torch registers some itself (2.14: every builtin exception too); the others came from elsewhere
        foreign = [name for name in safe if name not in torch_own_registrations()] if safe else []
    except ProbeFailed as e:
        registered = f"here, with torch's own: {', '.join(safe)}; which are torch's own is unknown: {e}"
    else:
        registered = f"here: {', '.join(foreign)}" if foreign else "none here"
    return (
        f"torch.load is replaced by {replaced} (an out-of-tree backend such as torch_npu patches it at "
        "import); torch.serialization.load is still torch's own. Round-trip tests are judged by their outcome "
        "as under torch's own loader: loaded, or rejected naming the missing globals. How the replacement "
        "reports may differ -- torch_npu prints the TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD notice instead of "
        "warning, rewords weights-only rejections with an error-code suffix (ERR00010 PTA ...), and "
        f"registers its own safe globals ({registered}); each difference is recorded in the test's "
        "outcome text, never skipped"
    )


def _torch_own(entries: Any) -> tuple[Optional[list[str]], list[str]]:
    """(the names of the registrations torch's own modules make themselves -- a fresh interpreter importing
    the same ``torch.*`` modules makes them too, :func:`..facts.torch_registers_itself` -- or None when
    that cannot be asked; the names registered both so and by another entry), sorted."""
    from ..facts import torch_registers_itself

    name = {id(e): torch_key(e) or f"<unnamed {type(e).__name__}>" for e in entries}
    try:
        own = {id(e) for e in entries if torch_registers_itself(e)}
    except ProbeFailed:
        return None, []
    mine = {name[i] for i in own}
    return sorted(mine), sorted(mine & {name[id(e)] for e in entries if id(e) not in own})


def doctor_report(environ: Optional[dict[str, str]] = None) -> dict[str, Any]:
    """The facts ``doctor`` prints, as the documented JSON object."""
    import torch

    from ...dimensions import available_device_types, privateuse1_backend, supported_qengines
    from ...registry import registered_globals
    from ...serialization import torch_load_replacement
    from ..policy.trust import judge_registry_entry

    env = os.environ if environ is None else environ
    problems: list[str] = []
    errors: list[str] = []
    raw = {name: env.get(name) for name in ENV_VARS}
    try:
        torch_default, torch_why = torch_default_weights_only()
    except ProbeFailed as e:
        torch_default, torch_why = None, f"unknown: {e}"
    full_by_default: list[str] = []  # listed after the environment's problems
    try:  # a bare torch.load(f), as torch decides it here: the default load mode
        decision = decide(LoadMode.DEFAULT, env)
    except ConflictingEnvironmentError as e:
        errors.append(str(e))
        wo: dict[str, Any] = {
            "value": None,
            "reason": "both TORCH_FORCE_* switches are set: every torch.load raises RuntimeError",
            "warns": False,
        }
    except ProbeFailed as e:  # never a guess: what this torch does is unknown, and that is the report
        errors.append(f"cannot tell what torch.load does here: {e}")
        wo = {"value": None, "reason": f"unknown: {e}", "warns": False}
    else:
        cause = {
            "force_wo": f"forced by {FORCE_WO}={raw[FORCE_WO]}",
            "force_no": f"forced by {FORCE_NO_WO}={raw[FORCE_NO_WO]} (torch warns)",
        }
        wo = {
            "value": decision.weights_only,
            "reason": cause.get(decision.cause, f"torch's default {torch_why}"),
            "warns": decision.warns,
        }
        if decision.cause == "default" and not decision.weights_only:
            full_by_default.append(f"a bare torch.load is weights_only=False here ({torch_why}): it fully unpickles")
    wo.update(torch_default=torch_default, torch_default_reason=torch_why)

    effects = {name: _force_effect(name, raw[name], wo["value"] is None, problems) for name in (FORCE_WO, FORCE_NO_WO)}
    effects[WAIT_LIMIT] = _wait_limit_effect(raw[WAIT_LIMIT])
    problems += [
        f"{name}={env[name]!r} is not a switch torch reads: did you mean {switch}? "
        f"(torch reads only the exact name {switch}; {name} has no effect)"
        for name, switch in near_miss_switches(env)
    ]
    eps = _backend_entry_points()
    effects[AUTOLOAD] = _autoload_effect(raw[AUTOLOAD], eps, problems)
    environment = {
        name: {"raw": raw[name], "value": value, "effect": effect} for name, (value, effect) in effects.items()
    }
    problems.extend(full_by_default)

    replaced = torch_load_replacement()
    safe = sorted(registered_globals())
    own, twice = _torch_own(torch.serialization.get_safe_globals())
    problems += [
        f"safe global {show_name(n)} is registered by torch and again by another entry of the same name "
        "(another object under torch's name): torch.load resolves the name to one of them"
        for n in twice
    ]
    if replaced:
        problems.append(_replaced_loader_explanation(replaced, safe))

    # Judged as the mixin judges the registry before each test (functions accepted: torch registers _rebuild_njt).
    problems += [
        f"registered safe global {show_name(torch_key(entry) or f'<unnamed {type(entry).__name__}>')} "
        f"is refused by the trust policy: {reason}"
        for entry in torch.serialization.get_safe_globals()
        if (reason := judge_registry_entry(entry))
    ]

    status = "error" if errors else ("attention" if problems else "ok")
    code = {"ok": EXIT_OK, "attention": EXIT_ATTENTION, "error": EXIT_DANGEROUS}[status]
    return {
        "schema": SCHEMA_VERSION,
        "command": "doctor",
        "status": status,
        "exit_code": code,
        "problems": errors + problems,
        "torch": torch_info(),
        "torch_load_replaced_by": replaced,
        "default_weights_only": wo,
        "environment": environment,
        "backend_entry_points": eps,
        "safe_globals": safe,
        "safe_globals_torch_own": own,
        "quantized_engines": {"supported": list(supported_qengines()), "current": torch.backends.quantized.engine},
        "devices": {"available": list(available_device_types()), "privateuse1_backend": privateuse1_backend()},
    }


def _registrations(safe: list[str], own: Optional[list[str]]) -> list[str]:
    """The registered safe globals, torch's own apart from the others (which this process added)."""
    if not safe:
        return ["safe globals registered process-wide: none"]
    if own is None:
        listed = ", ".join(map(show_name, safe))
        return [f"safe globals registered process-wide (which are torch's own is unknown): {listed}"]
    others = [n for n in safe if n not in own]
    return [
        "safe globals registered process-wide:",
        f"  torch's own: {', '.join(map(show_name, own)) or 'none'}",
        f"  not torch's (added in this process: a backend, sitecustomize, your code): "
        f"{', '.join(map(show_name, others)) or 'none'}",
    ]


def format_doctor(r: dict[str, Any]) -> str:
    t = r["torch"]
    wo = r["default_weights_only"]
    lines = [
        f"torch {t['version']}  (cuda {t['cuda']}, hip {t['hip']}, git {t['git_version']}, debug {t['debug']})",
        "torch.load: "
        + (
            f"REPLACED by {r['torch_load_replaced_by']}"
            if r["torch_load_replaced_by"]
            else "torch's own (torch.serialization.load)"
        ),
    ]
    verdict = (
        f"weights_only={wo['value']}"
        if wo["value"] is not None
        else "UNKNOWN"
        if wo["reason"].startswith("unknown: ")
        else "FAILS"
    )
    lines.append(f"bare torch.load(f): {verdict} -- {wo['reason']}")
    lines.append(f"  torch's own default here: weights_only={wo['torch_default']} ({wo['torch_default_reason']})")
    if wo["value"]:
        lines.append(
            "  so a checkpoint naming a global beyond the allowlist fails with '_pickle.UnpicklingError: "
            "... Unsupported global: GLOBAL <name>'; run `inspect CHECKPOINT` for the names and the fix"
        )
    lines.append("environment:")
    for name, e in r["environment"].items():
        lines += [f"  {name}={'unset' if e['raw'] is None else repr(e['raw'])}", f"      {e['effect']}"]
    q, d = r["quantized_engines"], r["devices"]
    lines += [
        *_registrations(r["safe_globals"], r["safe_globals_torch_own"]),
        f"quantized engines: {', '.join(q['supported']) or 'none'} (current: {q['current']})",
        f"devices: {', '.join(d['available'])}; privateuse1 backend: {d['privateuse1_backend'] or 'none registered'}",
        f"status: {r['status'].upper()} (exit {r['exit_code']})",
        *(f"  - {p}" for p in r["problems"]),
    ]
    # no byte of a name or variable can repaint it; wrapped to the terminal (80 in a pipe)
    return "\n".join(wrap_lines([escape_text(line) for line in lines], terminal_width()))
