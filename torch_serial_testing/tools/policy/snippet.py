"""Ready-to-paste ``safe_globals`` snippets built only from names the trust policy vouches for.

A snippet holds only ``import`` statements of verified classes and one ``safe_globals([...])`` (before
torch 2.5 ``add_safe_globals([...])``) call; :func:`refusal_notes` says, outside the code, why other
names are left out.  Pure string work on :func:`~.trust.judge_name`: nothing named is imported.
"""

from __future__ import annotations

from typing import Optional, Sequence

from ...errors import imported_prefix, show_name
from .trust import Verdict, judge_name

__all__ = ["safe_globals_snippet", "snippet_parts", "refusal_notes", "suggestible", "numpy_recipe"]

#: numpy's array reconstructor: a function (so never suggested on its own), which every checkpoint holding a
#: numpy array calls, and which torch names no remedy for.  The numpy recipe opts in to it, saying so.
NUMPY_RECONSTRUCT = ("numpy._core.multiarray._reconstruct", "numpy.core.multiarray._reconstruct")


def suggestible(names: Sequence[str], allowed: Optional[frozenset[str]] = None) -> list[str]:
    """The names among *names* a snippet may contain: verified classes only, sorted."""
    return sorted({n for n in names if judge_name(n, allowed).suggestible})


def numpy_recipe(names: Sequence[str]) -> list[str]:
    """The opt-ins of the numpy recipe among *names*: numpy's array reconstructor, where the policy finds it a
    plain function (``callable``), for a caller to pass as *opt_in* -- a numpy checkpoint then gets a snippet
    without ``--safe-global``, the reconstructor marked in it."""
    return sorted(n for n in set(names) if n in NUMPY_RECONSTRUCT and judge_name(n).kind == "callable")


def snippet_parts(names: Sequence[str], opt_in: Sequence[str] = ()) -> tuple[list[str], list[str]]:
    """(import lines, allowlist references) for the suggestible *names*: builtins by their bare name,
    ``torch.X`` through ``torch``, others imported (aliased when two share a name).  *opt_in*: verified
    functions the user named explicitly (never suggested otherwise), imported with a comment saying so."""
    imports: list[str] = []
    refs: list[str] = []
    bound: dict[str, str] = {"torch": "torch"}  # local name -> the dotted thing it is bound to
    # builtins first, so that no import can shadow the bare names they are referred to by
    chosen = {n for n in opt_in if judge_name(n).kind == "callable"}
    ordered = sorted(set(suggestible(names)) | chosen, key=lambda n: (not n.startswith("builtins."), n))
    for written in ordered:
        name = judge_name(written).moved or written  # a numpy 1 name: imported as numpy 2 has it
        if name.startswith("torch.") and name.count(".") == 1:
            refs.append(name)  # torch.ScriptObject, torch.Size: reachable as torch.<attr>
            continue
        if name.startswith("builtins.") and name.count(".") == 1:
            bound[name[len("builtins.") :]] = name
            refs.append(name[len("builtins.") :])  # set, complex: no import needed
            continue
        module, attr_path = _split_module(name)
        head, _, rest = attr_path.partition(".")
        target, local, n = f"{module}.{head}", head, 1
        while bound.get(local, target) != target:
            n += 1
            local = f"{head}_{n}"
        if local not in bound:
            bound[local] = target
            imports.append(
                f"from {module} import {head}"
                + (f" as {local}" if local != head else "")
                + (f"  # not a class: the pickle calls it ({_why_opted(written)})" if written in chosen else "")
            )
        ref = local + (f".{rest}" if rest else "")
        refs.append(ref if name == written else f"({ref}, {written!r})")
    return sorted(imports), refs


def safe_globals_snippet(names: Sequence[str], *, context: Optional[bool] = None, opt_in: Sequence[str] = ()) -> str:
    """A ``with torch.serialization.safe_globals([...]):`` block of the verified classes among *names*
    (and the verified functions in *opt_in*), with its imports; ``add_safe_globals`` where torch has no
    such context (< 2.5; *context* None: detect)."""
    if context is None:
        import torch

        context = hasattr(torch.serialization, "safe_globals")
    imports, refs = snippet_parts(names, opt_in)
    listed = ", ".join(refs)
    if context:
        code = [f"with torch.serialization.safe_globals([{listed}]):", "    obj = torch.load(f, weights_only=True)"]
    else:
        code = [f"torch.serialization.add_safe_globals([{listed}])", "obj = torch.load(f, weights_only=True)"]
    return "\n".join(["import torch", *imports, "", *code])


def refusal_notes(names: Sequence[str], allowed: Optional[frozenset[str]] = None) -> list[str]:
    """One line per name a snippet leaves out, saying why (names escaped; never code)."""
    notes = []
    for name in sorted(set(names), key=str):
        verdict: Verdict = judge_name(name, allowed)
        if verdict.suggestible or verdict.kind == "allowlisted":
            continue
        line = f"{show_name(name)}: NOT suggested ({verdict.kind}): {verdict.reason}"
        if verdict.kind == "callable" and "UnsafeCallable(" not in verdict.reason:  # said once
            line += f"; only if you trust it, declare UnsafeCallable('{name}', reason='...')"
        elif verdict.kind in ("dangerous", "malformed"):
            line += "; never allowlist it"
        notes.append(line)
    return notes


def _why_opted(name: str) -> str:
    return "numpy arrays need it: the numpy recipe" if name in NUMPY_RECONSTRUCT else "you named it"


def _split_module(name: str) -> tuple[str, str]:
    """Split 'pkg.mod.Outer.Inner' at the longest already-imported module (never imports)."""
    parts = name.split(".")
    cut = imported_prefix(name) or len(parts) - 1
    return ".".join(parts[:cut]), ".".join(parts[cut:])
