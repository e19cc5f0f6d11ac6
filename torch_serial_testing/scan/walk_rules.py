"""The rules one walk (:func:`.walker.scan_pickle`) follows: this torch's weights-only unpickler's
(:func:`~..torch_facts.unpickler.unpickler_rules`), or none when they could not be probed -- the
walk then records one ``"unknown"`` check and no weights-only checks at all.
"""

from __future__ import annotations

import pickletools
from typing import Any, Optional

from ..torch_facts.probes import ProbeFailed
from ..torch_facts.records import storage_type_names
from ..torch_facts.unpickler import UnpicklerRules, unpickler_rules

__all__ = ["WalkRules", "walk_rules"]


class WalkRules:
    """*rules* (None: not probed, *failure* says why), with the opcode bytes they support."""

    __slots__ = ("rules", "supported", "failure", "storage_names")

    def __init__(self, rules: Optional[UnpicklerRules], failure: Optional[str]) -> None:
        self.rules = rules
        self.failure = failure
        names = rules.opcodes if rules is not None else frozenset(op.name for op in pickletools.opcodes)
        self.supported = frozenset(ord(op.code) for op in pickletools.opcodes if op.name in names)
        try:
            self.storage_names = storage_type_names()
        except ProbeFailed:
            self.storage_names = frozenset()


_walk_rules: list[tuple[Any, WalkRules]] = []


def walk_rules() -> WalkRules:
    """This torch's rules for a walk, made once per probed :class:`UnpicklerRules`."""
    try:
        rules: Optional[UnpicklerRules] = unpickler_rules()
        failure = None
    except ProbeFailed as e:
        rules, failure = None, str(e)
    if _walk_rules and _walk_rules[0][0] is rules and rules is not None:
        return _walk_rules[0][1]
    made = WalkRules(rules, failure)
    _walk_rules[:] = [(rules, made)]
    return made
