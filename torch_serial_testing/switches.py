"""How the running torch reads its ``TORCH_FORCE_*`` switches and chooses the default.

``torch.load``'s effective ``weights_only`` depends on the version's default and
on two environment variables whose spellings torch itself decides (2.13 lower-cases
the value, 2.6-2.12 compared it as written).  Everything here is read from the
running torch -- its source where it has one -- so predictions follow the torch
that will do the load, not a table of versions.
"""

from __future__ import annotations

import functools
import os
import re
from dataclasses import dataclass, field
from typing import Any, Mapping, Optional

from .environ import stored_environ

__all__ = [
    "TRUE_VALUES",
    "FORCE_WO",
    "FORCE_NO_WO",
    "SwitchReading",
    "switch_readings_from_source",
    "torch_switch_readings",
    "is_truthy",
    "WeightsOnlySwitches",
    "torch_reads_force_no_weights_only",
    "torch_default_weights_only",
]

#: torch's truthy spellings for the TORCH_FORCE_* switches (the fallback when its source is unreadable).
TRUE_VALUES = ("1", "y", "yes", "true")
FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


@dataclass(frozen=True)
class SwitchReading:
    """How one torch build reads one TORCH_FORCE_* variable.

    torch 2.13 compares ``value.lower()`` with its truthy list; torch 2.8 compared the raw
    value (``TRUE`` was not set there).  The rule is read from the running torch's source so
    a prediction never assumes another torch's spelling rules.
    """

    name: str
    true_values: tuple[str, ...] = TRUE_VALUES
    #: str methods torch applies to the value before comparing, in order (e.g. ``("lower",)``).
    transforms: tuple[str, ...] = ("lower",)

    def is_set(self, value: Optional[str]) -> bool:
        if value is None:
            return False
        for method in self.transforms:
            value = getattr(value, method)()
        return value in self.true_values

    def describe(self) -> str:
        """``1, y, yes, true (any case)`` -- the spellings torch counts as set, for messages."""
        spelled = ", ".join(self.true_values)
        if "lower" in self.transforms or "casefold" in self.transforms:
            how = "any case"
        elif "upper" in self.transforms:
            how = "any case"
        else:
            how = "exactly as written, case-sensitive"
        if "strip" in self.transforms:
            how += ", surrounding spaces ignored"
        return f"{spelled} ({how})"


_STR_TRANSFORMS = ("lower", "upper", "casefold", "strip")


def switch_readings_from_source(source: str) -> dict[str, SwitchReading]:
    """The TORCH_FORCE_* readings in *source* (torch.serialization.load's code), by variable.

    Recognises ``os.getenv(NAME, d)[.lower()...] in <list or name of a list>`` (and
    ``os.environ.get``); a variable torch does not read is absent from the result.  Pure
    parsing, so torch-2.8-like source can be fed in without installing that torch.
    """
    import ast
    import textwrap

    tree = ast.parse(textwrap.dedent(source))
    lists: dict[str, tuple[str, ...]] = {}
    compares = []
    for node in ast.walk(tree):  # one walk: the lists a comparison names may be assigned after it
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            values = _str_sequence(node.value)
            if values is not None:
                lists.setdefault(node.targets[0].id, values)
        elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(node.ops[0], ast.In):
            compares.append(node)
    found: dict[str, SwitchReading] = {}
    for node in compares:
        transforms: list[str] = []
        expr = node.left
        while (
            isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute)
            and expr.func.attr in _STR_TRANSFORMS and not expr.args
        ):
            transforms.append(expr.func.attr)
            expr = expr.func.value
        name = _getenv_name(expr)
        if name is None or not name.startswith("TORCH_FORCE_"):
            continue
        comparator = node.comparators[0]
        values = _str_sequence(comparator)
        if values is None and isinstance(comparator, ast.Name):
            values = lists.get(comparator.id)
        if values is None:
            continue
        found.setdefault(name, SwitchReading(name, values, tuple(reversed(transforms))))
    return found


def _str_sequence(node: Any) -> Optional[tuple[str, ...]]:
    import ast

    if isinstance(node, (ast.List, ast.Tuple, ast.Set)) and node.elts and all(
        isinstance(e, ast.Constant) and isinstance(e.value, str) for e in node.elts
    ):
        return tuple(e.value for e in node.elts)
    return None


def _getenv_name(node: Any) -> Optional[str]:
    """NAME from ``os.getenv("NAME", ...)`` / ``os.environ.get("NAME", ...)``, else None."""
    import ast

    if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
        return None
    func = node.func
    is_getenv = func.attr == "getenv"
    is_environ_get = func.attr == "get" and isinstance(func.value, ast.Attribute) and func.value.attr == "environ"
    first = node.args[0]
    if (is_getenv or is_environ_get) and isinstance(first, ast.Constant) and isinstance(first.value, str):
        return first.value
    return None


@functools.lru_cache(maxsize=1)
def torch_switch_readings() -> dict[str, SwitchReading]:
    """How the running torch's ``torch.load`` reads each TORCH_FORCE_* variable.

    Read from torch's own source.  Without the source (a frozen build) the version decides:
    TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD exists from torch 2.6, and both are read lower-cased as in
    current torch.
    """
    import torch

    from .torch_source import source_of

    try:
        readings = switch_readings_from_source(source_of(torch.serialization.load))
    except (OSError, TypeError, SyntaxError):
        readings = {}
    if FORCE_WO not in readings:
        major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
        readings = {FORCE_WO: SwitchReading(FORCE_WO)}
        if (major, minor) >= (2, 6):
            readings[FORCE_NO_WO] = SwitchReading(FORCE_NO_WO)
    return readings


def is_truthy(value: Optional[str], name: str = FORCE_WO) -> bool:
    """Whether the running torch counts *value* of the switch *name* as set.

    A switch this torch does not read at all is never set.
    """
    reading = torch_switch_readings().get(name)
    return reading is not None and reading.is_set(value)


@dataclass(frozen=True)
class WeightsOnlySwitches:
    """The two TORCH_FORCE_* switches as torch reads them."""

    force_weights_only: bool = False
    force_no_weights_only: bool = False
    raw: Mapping[str, Optional[str]] = field(default_factory=dict)

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> "WeightsOnlySwitches":
        return cls.from_values(switch_values(environ), environ)

    @classmethod
    def from_values(cls, values: tuple[Any, Any], environ: Optional[Mapping[str, str]] = None) -> "WeightsOnlySwitches":
        """The switches of *values*, read from *environ* by :func:`switch_values` (one read, one answer)."""
        readings = torch_switch_readings()
        known = _switches_by_values.get(values)
        if known is not None and known[0] is readings:  # read on every load: same values, same reading
            return known[1]
        env = os.environ if environ is None else environ
        decode = env.decodevalue if stored_environ(env) is not None else None  # the values read above, as text
        raw = {name: decode(v) if decode is not None and v is not None else v
               for name, v in zip((FORCE_WO, FORCE_NO_WO), values)}
        # A torch before 2.6 does not read TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (so it neither
        # warns nor refuses both switches): there it is never set, whatever its spelling.
        switches = cls(is_truthy(raw[FORCE_WO], FORCE_WO), is_truthy(raw[FORCE_NO_WO], FORCE_NO_WO), raw)
        if cls is WeightsOnlySwitches:
            if len(_switches_by_values) >= 64:
                _switches_by_values.clear()
            _switches_by_values[values] = (readings, switches)
        return switches

    @property
    def conflict(self) -> bool:
        return self.force_weights_only and self.force_no_weights_only

    def conflict_message(self) -> str:
        return (
            f"{FORCE_WO}={self.raw.get(FORCE_WO)!s} and {FORCE_NO_WO}={self.raw.get(FORCE_NO_WO)!s} "
            "are both set: torch.load raises RuntimeError on every load. Unset one of them."
        )


def switch_values(environ: Optional[Mapping[str, str]] = None) -> tuple[Any, Any]:
    """The two switches' raw values (None when unset), read on every load.

    ``os.environ`` is read through its stored mapping (:mod:`.environ`) with the names encoded
    once; the values are then the platform's (bytes on POSIX), and
    :meth:`WeightsOnlySwitches.from_values` decodes them as ``os.environ`` does.
    """
    env = os.environ if environ is None else environ
    stored = stored_environ(env)
    if stored is None:
        return env.get(FORCE_WO), env.get(FORCE_NO_WO)
    data, encode, _decode = stored
    keys = _encoded_names.get(encode)
    if keys is None:
        keys = _encoded_names[encode] = (encode(FORCE_WO), encode(FORCE_NO_WO))
    return data.get(keys[0]), data.get(keys[1])


#: os.environ's key encoder -> the two switch names encoded by it.
_encoded_names: dict[Any, tuple[Any, Any]] = {}

#: The two switches' values (as :func:`switch_values` reads them) -> their reading.
_switches_by_values: dict[tuple[Any, Any], tuple[Any, WeightsOnlySwitches]] = {}


def torch_reads_force_no_weights_only() -> bool:
    """Whether this torch's ``torch.load`` reads TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD (torch >= 2.6).

    Read from torch's own source; the version decides only when the source is unavailable.
    """
    return FORCE_NO_WO in torch_switch_readings()


def torch_default_weights_only() -> tuple[bool, str]:
    """torch's default for a bare ``torch.load`` and why, derived from torch's own code.

    Asked on every prediction; remembered per deciding function and version (the answer of
    ``_default_to_weights_only(None)`` depends only on the build).
    """
    import torch

    default_fn = getattr(torch.serialization, "_default_to_weights_only", None)
    key = (default_fn, torch.__version__)
    known = _defaults.get(key)
    if known is None:
        known = _defaults[key] = _torch_default(default_fn)
    return known


_defaults: dict[tuple[Any, str], tuple[bool, str]] = {}


def _torch_default(default_fn: Any) -> tuple[bool, str]:
    import torch

    if default_fn is not None:
        if default_fn(None):
            return True, "since torch 2.6"
        return False, "this torch build (fbcode) keeps the old default"
    major, minor = (int(x) for x in re.findall(r"\d+", torch.__version__)[:2])
    if (major, minor) >= (2, 6):
        return True, "since torch 2.6"
    return False, f"the default before torch 2.6 (torch {torch.__version__})"
