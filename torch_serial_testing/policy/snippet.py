"""Ready-to-paste ``safe_globals`` snippets built only from names the trust policy vouches for.

A snippet holds nothing but ``import`` statements of validated names and one
``safe_globals([...])`` (or, before torch 2.5, ``add_safe_globals([...])``)
call.  Names that are not verified classes never enter it; :func:`refusal_notes`
says why, outside the code.  Pure string work on top of :func:`trust.judge_name`:
nothing a name refers to is imported.
"""

from __future__ import annotations

import sys
from typing import Optional, Sequence

from ..core.names import show_name
from .trust import Verdict, judge_name

__all__ = ["safe_globals_snippet", "snippet_parts", "refusal_notes", "suggestible"]


def suggestible(names: Sequence[str], allowed: Optional[frozenset[str]] = None) -> list[str]:
    """The names among *names* a snippet may contain: verified classes only, sorted."""
    return sorted({n for n in names if judge_name(n, allowed).suggestible})


def snippet_parts(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(the import lines, the references to put in the allowlist) for the suggestible *names*:
    builtins by their bare name, ``torch.X`` through ``torch``, others imported (aliased when
    two share a name).  Only names the trust policy verifies as classes are included."""
    imports: list[str] = []
    refs: list[str] = []
    bound: dict[str, str] = {"torch": "torch"}  # local name -> the dotted thing it is bound to
    # builtins first, so that no import can shadow the bare names they are referred to by
    ordered = sorted(suggestible(names), key=lambda n: (not n.startswith("builtins."), n))
    for name in ordered:
        if name.startswith("torch.") and name.count(".") == 1:
            refs.append(name)  # torch.ScriptObject, torch.Size: reachable as torch.<attr>
            continue
        if name.startswith("builtins.") and name.count(".") == 1:
            bound[name[len("builtins."):]] = name
            refs.append(name[len("builtins."):])  # set, complex: no import needed
            continue
        module, attr_path = _split_module(name)
        head, _, rest = attr_path.partition(".")
        target = f"{module}.{head}"
        local = head
        n = 1
        while bound.get(local, target) != target:
            n += 1
            local = f"{head}_{n}"
        if local not in bound:
            bound[local] = target
            imports.append(f"from {module} import {head}" + (f" as {local}" if local != head else ""))
        refs.append(local + (f".{rest}" if rest else ""))
    return sorted(imports), refs


def safe_globals_snippet(names: Sequence[str], *, context: Optional[bool] = None) -> str:
    """A ``with torch.serialization.safe_globals([...]):`` block with its imports.

    Only the names the trust policy verifies as classes are included (see
    :func:`refusal_notes` for the others).  Where torch has no ``safe_globals``
    context (torch < 2.5; *context* None detects it) ``add_safe_globals`` is used.
    """
    if context is None:
        import torch

        context = hasattr(torch.serialization, "safe_globals")
    imports, refs = snippet_parts(names)
    lines = ["import torch", *imports, ""]
    if context:
        lines.append(f"with torch.serialization.safe_globals([{', '.join(refs)}]):")
        lines.append("    obj = torch.load(f, weights_only=True)")
    else:
        lines.append(f"torch.serialization.add_safe_globals([{', '.join(refs)}])")
        lines.append("obj = torch.load(f, weights_only=True)")
    return "\n".join(lines)


def refusal_notes(names: Sequence[str], allowed: Optional[frozenset[str]] = None) -> list[str]:
    """One line per name a snippet leaves out, saying why (names escaped; never code)."""
    notes = []
    for name in sorted(set(names), key=str):
        verdict: Verdict = judge_name(name, allowed)
        if verdict.suggestible or verdict.kind == "allowlisted":
            continue
        line = f"{show_name(name)}: NOT suggested ({verdict.kind}): {verdict.reason}"
        if verdict.kind == "callable":
            line += (f"; only if you trust it, declare UnsafeCallable('{name}', reason='...')")
        elif verdict.kind in ("dangerous", "malformed"):
            line += "; never allowlist it"
        notes.append(line)
    return notes


def _split_module(name: str) -> tuple[str, str]:
    """Split 'pkg.mod.Outer.Inner' at the longest already-imported module (never imports)."""
    parts = name.split(".")
    for cut in range(len(parts) - 1, 0, -1):
        if ".".join(parts[:cut]) in sys.modules:
            return ".".join(parts[:cut]), ".".join(parts[cut:])
    return ".".join(parts[:-1]), parts[-1]
