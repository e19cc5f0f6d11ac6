"""A test class's declared safe globals against what its ``safe_globals``-mode loads needed, and the fix.

Globals are declared in class attributes (``safe_globals``, ``state_dict_safe_globals``) or per call
(``safe_globals=``), and used only by the ``safe_globals`` mode.  What is *missing* is what torch
refuses there (the prediction's missing globals: torch's allowlist, the process-wide registry and the
declaration all count); what is *unneeded* is a declared global no load under the declaration named,
that torch would not allow anyway.  One :class:`AllowlistError` reports both, with the one
declaration that fixes them, to paste where the declaration lives.
"""

from __future__ import annotations

from typing import Any, Iterable, Optional, Sequence

from ..core.errors import AllowlistError, RoundTripConfigError
from ..core.names import imported_prefix, show_name, torch_key
from ..policy.declared import split_entry
from ..torch_facts.registry import registered_globals, torch_allowlist

__all__ = ["Declaration", "LATER_ALLOWLISTED", "allowed_anyway", "names_used", "refuse_local", "local_class_message"]

#: Globals a later torch put on its own allowlist (``builtins.set``: torch 2.6).  Declaring one is
#: never over-trust, so one declaration serves every torch and module, whether or not its
#: checkpoint names it (a quantized ``Conv2d`` pickles through ``__getstate__``, never naming ``set``).
LATER_ALLOWLISTED = frozenset({"builtins.set"})
_CONTAINER_CHECKS = ("append", "appends", "setitem", "setitems")


def allowed_anyway() -> frozenset[str]:
    """What declaring changes nothing for: torch's allowlist (now or later) and the registry."""
    return torch_allowlist() | registered_globals() | LATER_ALLOWLISTED


def names_used(info: Any) -> set[str]:
    """Every name a scanned checkpoint's weights-only load may need allowed (globals, BUILD types,
    container targets)."""
    return set(info.globals) | {c.name for c in info.checks if c.kind == "type" or c.kind in _CONTAINER_CHECKS}


def paste_parts(names: Sequence[str]) -> tuple[list[str], list[str]]:
    """(import lines, references) that name *names* in code: builtins bare, ``torch.X`` through
    ``torch``, the rest imported from their longest imported module (aliased when two share a name)."""
    imports: list[str] = []
    refs: list[str] = []
    bound: dict[str, str] = {"torch": "torch"}
    for name in sorted(names, key=lambda n: (not n.startswith("builtins."), n)):
        module, _, attr = name.rpartition(".")
        if module in ("builtins", "torch"):
            refs.append(attr if module == "builtins" else name)
            bound.setdefault(attr, name)
            continue
        parts = name.split(".")
        cut = imported_prefix(name) or len(parts) - 1
        module, head, rest = ".".join(parts[:cut]), parts[cut], parts[cut + 1 :]
        local, n = head, 1
        while bound.get(local, f"{module}.{head}") != f"{module}.{head}":
            n += 1
            local = f"{head}_{n}"
        if local not in bound:
            bound[local] = f"{module}.{head}"
            imports.append(f"from {module} import {head}" + (f" as {local}" if local != head else ""))
        refs.append(".".join([local, *rest]))
    return sorted(imports), refs


class Declaration:
    """Where the declared globals live: class *owner*'s *attribute*, or (None) the ``safe_globals=``
    argument of *method*."""

    __slots__ = ("owner", "attribute", "method")

    def __init__(self, owner: str, attribute: Optional[str], method: str = "round_trip") -> None:
        self.owner, self.attribute, self.method = owner, attribute, method

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.attribute}" if self.attribute else f"the safe_globals= argument of {self.method}()"

    def fix(self, names: Sequence[str]) -> str:
        """The declaration of exactly *names*, where it lives, then the plain ``torch.load`` form."""
        import torch

        imports, refs = paste_parts(names)
        tuple_text = "(" + ", ".join(refs) + ("," if len(refs) == 1 else "") + ")"
        where = (
            [f"class {self.owner}(...):", f"    {self.attribute} = {tuple_text}"]
            if self.attribute
            else [f"self.{self.method}(..., safe_globals={tuple_text})"]
        )
        listed = ", ".join(refs)
        call = (
            [f"with torch.serialization.safe_globals([{listed}]):", "    obj = torch.load(f, weights_only=True)"]
            if hasattr(torch.serialization, "safe_globals")
            else [f"torch.serialization.add_safe_globals([{listed}])", "obj = torch.load(f, weights_only=True)"]
        )
        head = "\n".join(["import torch", *imports, ""])
        return (
            f"{head}\n" + "\n".join(where) + "\n\n(outside a test class, the same globals in a torch.load call:)\n"
            f"{head}\n" + "\n".join(call)
        )

    def error(
        self,
        declared: Iterable[str],
        missing: Iterable[str] = (),
        unneeded: Iterable[str] = (),
        saved_types: Sequence[Optional[str]] = (),
    ) -> AllowlistError:
        """One error for what the declaration misses and what it over-trusts, with the declaration that
        fixes both (*saved_types*: the saved objects' types when they are not modules)."""
        missing, unneeded = sorted(set(missing)), sorted(set(unneeded))
        keep = sorted((set(declared) - set(unneeded)) | set(missing))
        shown_missing, shown_unneeded = ", ".join(map(show_name, missing)), ", ".join(map(show_name, unneeded))
        parts = []
        if missing:
            parts.append(f"{self.label} misses {len(missing)} global(s) the checkpoint needs: {shown_missing}")
            if unneeded:
                parts.append(f"and over-trusts {len(unneeded)} it does not need: {shown_unneeded}")
        elif unneeded:
            parts.append(f"{self.label} over-trusts: the checkpoint does not need {shown_unneeded}.")
        saved_type = next((t for t in saved_types if t is not None), None)
        hint = (
            f"\nClass-level safe_globals apply to every round_trip in the class; this one saves a "
            f"{saved_type}, not a module: pass safe_globals=() (or the globals it needs) to this "
            "call, or use round_trip_state_dict (which uses state_dict_safe_globals)."
            if unneeded and self.attribute == "safe_globals" and saved_type is not None
            else ""
        )
        fixing = "" if missing else "Remove them, or set allow_unneeded_safe_globals = True on the class. "
        return AllowlistError(
            " ".join(parts)
            + f"\n{fixing}The exact declaration (declare only what you trust):{hint}\n\n"
            + self.fix(keep)
        )

    def blocked(self, blocker: str, named: Sequence[str]) -> AllowlistError:
        also = f" (it also names {', '.join(map(show_name, named))} beyond torch's allowlist)" if named else ""
        return AllowlistError(
            f"{self.label}: this checkpoint cannot load weights-only, whatever is allowlisted: {blocker}{also}\n"
            "The safe_globals mode cannot pass for it. Save something weights-only can load (a "
            "state_dict, plain containers), or drop this test's safe_globals mode with "
            "@round_trip_dims(load_modes=('weights_only_false', 'default'))."
        )


def local_class_message(name: str) -> str:
    return (
        f"{name} is defined inside a function ('<locals>' in its name): pickle, and so torch.save, "
        "can only store classes importable by module path, so no checkpoint can name it.  Move the "
        "class to module level -- checkpointed classes belong in an importable module."
    )


def refuse_local(declared: Iterable[object], attribute: str) -> None:
    """Refuse a declared function-local class: no checkpoint can name one.  Judged on the raw
    declaration first, so the message says what to do, not why the name does not resolve."""
    if isinstance(declared, (str, bytes)) or not hasattr(declared, "__iter__"):
        return  # normalize_safe_globals names that mistake
    for item in declared:
        try:
            obj, name, _explicit, _unsafe = split_entry(item)
        except RoundTripConfigError:
            continue  # normalize_safe_globals names that mistake
        names = {name, torch_key(obj) if obj is not None else None}
        local = sorted(n for n in names if isinstance(n, str) and "<locals>" in n)
        if local:
            raise RoundTripConfigError(
                f"{attribute} lists {local[0]}, which is not importable: " + local_class_message(local[0])
            )
