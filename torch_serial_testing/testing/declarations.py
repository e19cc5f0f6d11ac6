"""Judging a test class's declared safe globals against a checkpoint, and saying the fix.

Globals are declared in class attributes (``safe_globals``, ``state_dict_safe_globals``) or per
call (``safe_globals=``).  Every error names the wrong declaration and shows the line to paste
*there* (a class attribute, not a ``torch.load`` call), then the plain ``torch.load`` form.  Names
become code only through :mod:`..policy.snippet`, which owns their validation and escaping.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterable, Optional, Sequence

from ..core.errors import AllowlistError, RoundTripConfigError
from ..core.names import show_name, torch_key
from ..policy.declared import SafeGlobal, split_entry
from ..torch_facts.registry import torch_allowlist

if TYPE_CHECKING:  # the round-trip machinery is imported on the first round trip
    from ..scan.checkpoint import Checkpoint

__all__ = [
    "Declaration",
    "check_declared",
    "refuse_over_trust",
    "refuse_local",
    "LATER_ALLOWLISTED",
    "local_class_message",
]

#: Globals a later torch put on its own allowlist (``builtins.set``: torch 2.6).  Declaring one is
#: never over-trust, so one declaration serves every torch and module, whether or not its
#: checkpoint names it (a quantized ``Conv2d`` pickles through ``__getstate__``, never naming ``set``).
LATER_ALLOWLISTED = frozenset({"builtins.set"})


class Declaration:
    """Where the judged globals were declared: class *owner*'s *attribute*, or (None) the
    ``safe_globals=`` argument of *method*.  A plain class: a dataclass would compile its
    generated methods at import."""

    __slots__ = ("owner", "attribute", "method")

    def __init__(self, owner: str, attribute: Optional[str], method: str = "round_trip") -> None:
        self.owner, self.attribute, self.method = owner, attribute, method

    @property
    def label(self) -> str:
        return f"{self.owner}.{self.attribute}" if self.attribute else f"the safe_globals= argument of {self.method}()"

    def fix(self, names: Sequence[str]) -> str:
        """The line(s) to paste where this declaration lives, then the plain torch.load form."""
        from ..policy.snippet import safe_globals_snippet, snippet_parts  # a failing test's message only

        imports, refs = snippet_parts(sorted(names))
        # a declared global torch allowlists (now or later: set) stays where the author put it
        refs = [
            n.split(".", 1)[1] for n in sorted(set(names) & LATER_ALLOWLISTED) if n.split(".", 1)[1] not in refs
        ] + refs
        snippet = safe_globals_snippet(sorted(names), context=True)
        tuple_text = "(" + ", ".join(refs) + ("," if len(refs) == 1 else "") + ")"
        where = (
            [f"class {self.owner}(...):", f"    {self.attribute} = {tuple_text}"]
            if self.attribute
            else [f"self.{self.method}(..., safe_globals={tuple_text})"]
        )
        body = "\n".join(["import torch", *imports, "", *where])
        return f"{body}\n\n(outside a test class, the same globals in a torch.load call:)\n{snippet}"


def check_declared(
    checkpoint: Checkpoint,
    declared: Sequence[SafeGlobal],
    where: Declaration,
    *,
    allow_unneeded: bool = False,
    saved_type: Optional[str] = None,
) -> frozenset[str]:
    """Raise :class:`AllowlistError` when *declared* misses or over-trusts what *checkpoint* needs (not
    over-trust: a global it uses although torch allows it, or one on torch's allowlist now or later,
    :data:`LATER_ALLOWLISTED`).  *saved_type*: the saved object's type when it is not a module.  The
    globals the checkpoint needs or uses (a test's several checkpoints share a class declaration)."""
    from ..loading.required import required_globals

    blocker = checkpoint.info.weights_only_blocker
    if blocker:
        named = required_globals(checkpoint)
        also = f" (it also names {', '.join(map(show_name, named))} beyond torch's allowlist)" if named else ""
        raise AllowlistError(
            f"{where.label}: this checkpoint cannot load weights-only, whatever is allowlisted: {blocker}{also}\n"
            "The safe_globals mode cannot pass for it. Save something weights-only can load (a "
            "state_dict, plain containers), or drop this test's safe_globals mode with "
            "@round_trip_dims(load_modes=('weights_only_false', 'default'))."
        )
    needed = set(required_globals(checkpoint))
    names = {sg.name for sg in declared}
    missing = sorted(needed - names)
    used = set(checkpoint.info.globals)
    harmless = torch_allowlist() | LATER_ALLOWLISTED
    if missing:
        from ..policy.snippet import refusal_notes, suggestible  # a failing test's message only

        keep = sorted(needed | (names & (used | harmless)))  # what the author declared stays, unless over-trust
        notes = "".join(f"\n{note}" for note in refusal_notes(keep))
        example = (
            "Declare them (only if you trust them):\n\n" + where.fix(keep)
            if suggestible(keep)
            else "No global it needs is a class the trust policy can suggest."
        )
        raise AllowlistError(
            f"{where.label} misses {len(missing)} global(s) the checkpoint needs: "
            f"{', '.join(map(show_name, missing))}\n" + example + notes
        )
    if not allow_unneeded:
        refuse_over_trust(names, needed | used, where, [saved_type])
    return frozenset(needed | used)


def refuse_over_trust(
    names: set[str], used: set[str], where: Declaration, saved_types: Sequence[Optional[str]]
) -> None:
    """Raise :class:`AllowlistError` when declared *names* hold globals none of the checkpoints loaded
    under the declaration needed or used (*used*); *saved_types*: theirs, None for a module."""
    harmless = torch_allowlist() | LATER_ALLOWLISTED
    unneeded = sorted(n for n in names - used if n not in harmless)
    if not unneeded:
        return
    keep = sorted(names - set(unneeded))
    saved_type = next((t for t in saved_types if t is not None), None)
    hint = (
        f"\nClass-level safe_globals apply to every round_trip in the class; this one saves a "
        f"{saved_type}, not a module: pass safe_globals=() (or the globals it needs) to this "
        "call, or use round_trip_state_dict (which uses state_dict_safe_globals)."
        if where.attribute == "safe_globals" and saved_type is not None
        else ""
    )
    raise AllowlistError(
        f"{where.label} over-trusts: the checkpoint does not need {', '.join(map(show_name, unneeded))}. Remove "
        f"them, or set allow_unneeded_safe_globals = True on the class.{hint}\nThe exact declaration:\n\n"
        + where.fix(keep)
    )


def local_class_message(name: str) -> str:
    return (
        f"{name} is defined inside a function ('<locals>' in its name): pickle, and so torch.save, "
        "can only store classes importable by module path, so no checkpoint can name it.  Move the "
        "class to module level -- checkpointed classes belong in an importable module."
    )


def refuse_local(declared: Iterable[object], attribute: str) -> None:
    """Refuse a declared function-local class: no checkpoint can name one.  Judged on the raw
    declaration, before the trust policy, so the message says what to do, not why the name is malformed."""
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
