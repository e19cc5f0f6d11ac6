"""What the running torch's weights-only unpickler enforces, asked of it by probes.

``torch/_weights_only_unpickler.py`` changes between releases: which opcodes it implements,
whether SETITEM/APPEND check their target (torch 2.8 checks no SETITEM target; 2.14.1 lets
APPEND onto an allowlisted ``list`` subclass), which persistent ids it refuses and how it
words that, how BUILD applies a state (2.4/2.5: ``inst.__dict__.update(state)`` for every
state), whether Python-2 names are renamed outside protocol 2 (2.4: not), what it says about
a global it refuses.  :func:`unpickler_rules` learns each of these by feeding the real
unpickler a pickle of a few opcodes (:mod:`.unpickler_checks`) and reading what it did, so the static
model (:mod:`..scan`) replays the torch that runs.  A probe whose answer cannot be read
raises :class:`~.probes.ProbeFailed`; nothing falls back to another torch's rules.
"""

from __future__ import annotations

import pickle
import threading
from dataclasses import dataclass
from typing import Any, Optional

from . import probes, unpickler_checks as checks
from .probes import ProbeFailed, unpickle
from .registry import registry_lock
from .unpickler_checks import APPEND_TARGETS, SETITEM_TARGETS, BuildRules, ContainerRule, PersidRules

__all__ = [
    "APPEND_TARGETS",
    "SETITEM_TARGETS",
    "ContainerRule",
    "BuildRules",
    "PersidRules",
    "UnpicklerRules",
    "unpickler_rules",
    "global_refusal",
]


@dataclass(frozen=True)
class UnpicklerRules:
    """Everything the static model replays of this torch's weights-only unpickler."""

    opcodes: frozenset[str]
    #: ``str.format`` template of the refusal of an opcode it lacks, e.g. ``"Unsupported operand {code}"``.
    unsupported: str
    #: Target checks by opcode name (SETITEM, SETITEMS, APPEND, APPENDS); None: no check.
    containers: dict[str, Optional[ContainerRule]]
    persid: PersidRules
    build: BuildRules
    #: Refusals up to the object torch names: BUILD on a type, NEWOBJ of a class, REDUCE of a function.
    build_refusal: str
    newobj_refusal: str
    reduce_refusal: str
    #: When torch renames Python-2 globals (``copy_reg``, ``__builtin__``): "always" or "protocol_2".
    renames: str
    import_mapping: dict[str, str]
    name_mapping: dict[tuple[str, str], tuple[str, str]]
    blocked_modules: frozenset[str]

    def container(self, opcode: str) -> Optional[ContainerRule]:
        return self.containers.get(opcode)


_lock = threading.Lock()
_known: dict[Any, Any] = {}


def _torch_key() -> tuple[Any, ...]:
    """What the rules depend on: the unpickler class and its ``load``, torch's allowlist, the version."""
    import torch
    from torch import _weights_only_unpickler as wou

    cls = getattr(wou, "Unpickler", None)
    return (cls, getattr(cls, "load", None), getattr(wou, "_get_allowed_globals", None), torch.__version__)


def unpickler_rules() -> UnpicklerRules:
    """This torch's :class:`UnpicklerRules`, asked once per unpickler; raises :class:`ProbeFailed`
    (the same one every time) when a probe cannot be read."""
    key = _torch_key()
    known = _known.get(key)
    if known is None:
        with registry_lock, _lock:
            known = _known.get(key)
            if known is None:
                try:
                    known = _probe_rules()
                except ProbeFailed as e:
                    known = e
                _known.clear()
                _refusals.clear()
                _known[key] = known
    if isinstance(known, ProbeFailed):
        raise known
    return known  # type: ignore[no-any-return]


def _probe_rules() -> UnpicklerRules:
    import torch

    template = checks.unsupported_template()
    try:
        import_mapping, name_mapping = torch._utils.IMPORT_MAPPING, torch._utils.NAME_MAPPING
    except AttributeError as e:
        raise ProbeFailed(f"torch no longer has the table the library reads: {e}") from None
    build_refusal, newobj_refusal, reduce_refusal = checks.refusal_prefixes()
    return UnpicklerRules(
        opcodes=checks.supported_opcodes(template),
        unsupported=template,
        containers=checks.container_rules(),
        persid=checks.persid_rules(),
        build=checks.build_rules(),
        build_refusal=build_refusal,
        newobj_refusal=newobj_refusal,
        reduce_refusal=reduce_refusal,
        renames=checks.renames(),
        import_mapping=dict(import_mapping),
        name_mapping=dict(name_mapping),
        blocked_modules=checks.blocked_modules(),
    )


# -- names ----------------------------------------------------------------------------------------------------


_refusals: dict[tuple[str, bool], Optional[str]] = {}


def global_refusal(name: str, *, proto: bool = True) -> Optional[str]:
    """torch's own message refusing the global *name* (``module.attr``) here and now, or None when
    it accepts it.  Asked of torch per name: special cases (a nested jagged tensor before
    ``torch.nested`` is imported) and the spelling of ``builtins`` names come with it.

    *name* is spelled as the weights-only unpickler sees it (its Python-2 renames applied);
    ``proto=False`` asks in a pickle without ``PROTO 2``, where a torch that renames only in
    protocol 2 (2.4) renames nothing again -- for the names of a protocol 0/1 pickle there.
    """
    key = (name, proto)
    known = _refusals.get(key)
    if known is None and key not in _refusals:
        module, _, attr = name.partition(".")
        body = pickle.GLOBAL + module.encode("utf-8", "surrogatepass") + b"\n" + attr.encode("utf-8", "surrogatepass")
        with registry_lock:
            outcome = unpickle(body + b"\n" + probes.STOP, proto=proto)
        if outcome.loaded:
            return None  # allowlisted right now: nothing to remember
        if not outcome.refused:
            raise ProbeFailed(f"torch answered GLOBAL {name} with {outcome!r}, not a refusal")
        known = outcome.message
        if len(_refusals) > 4096:
            _refusals.clear()
        _refusals[key] = known
    return known
