"""What ``torch.load`` decides for one call here and now: the effective ``weights_only``.

The argument, the ``TORCH_FORCE_*`` switches (spelt as torch reads them: 2.13 lower-cases the value,
2.8 did not, torch < 2.6 ignores FORCE_NO) and torch's default decide it, so torch is asked: a canary
weights-only refuses (loaded in full only as bytes saved here) goes through ``torch.serialization.load``
with the call's argument under its switch values (set for that load, locked, interrupts held back).
"""

from __future__ import annotations

import io
import os
import pickle
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional

from ..core.environ import stored_environ
from ..core.errors import ConflictingEnvironmentError
from ..core.interrupts import deferred_interrupts
from ..core.modes import LoadMode
from .loader import observe_serialization_warnings, torch_load_replacement
from .probes import ProbeFailed
from .registry import registry_lock
from .serialization_state import genuine

__all__ = [
    "FORCE_WO",
    "FORCE_NO_WO",
    "Decision",
    "decide",
    "WeightsOnlySwitches",
    "switch_values",
    "is_truthy",
    "truthy_spellings",
    "torch_default_weights_only",
    "torch_reads_force_no_weights_only",
]

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
#: Spellings :func:`truthy_spellings` asks torch about (what people write for "on").
CANDIDATE_SPELLINGS = ("1", "y", "yes", "true", "t", "on")


class Canary:
    """Saved once per process: weights-only loads refuse it, a full load builds it."""


_canary: list[bytes] = []
#: A probe's answer: the effective weights_only (None: RuntimeError, both switches set), torch warned.
_Answer = tuple[Optional[bool], bool]
_answers: dict[tuple[Any, ...], _Answer] = {}
_lock = threading.RLock()


def _torch_key() -> tuple[Any, ...]:
    import torch

    ser = torch.serialization
    return (genuine("load"), getattr(ser, "_default_to_weights_only", None), torch.__version__)


def _text(value: Any) -> Optional[str]:
    return value if value is None or isinstance(value, str) else os.fsdecode(value)


def _set_switches(values: tuple[Optional[str], ...]) -> None:
    with deferred_interrupts():
        for name, value in zip((FORCE_WO, FORCE_NO_WO), values):
            if value is None:
                os.environ.pop(name, None)
        for name, value in zip((FORCE_WO, FORCE_NO_WO), values):
            if value is not None:
                os.environ[name] = value


@contextmanager
def _environment(values: tuple[Optional[str], Optional[str]]) -> Iterator[None]:
    """The two switches set to *values* (None: unset) for the block, as they were after it."""
    before = (os.environ.get(FORCE_WO), os.environ.get(FORCE_NO_WO))
    if before != values:
        _set_switches(values)
    try:
        yield
    finally:
        if before != values:
            _set_switches(before)


def _ask(explicit: Optional[bool], wo: Optional[str], no: Optional[str]) -> _Answer:
    """What ``torch.serialization.load(canary[, weights_only=explicit])`` does under (wo, no)."""
    key = (explicit, wo, no, *_torch_key())
    known = _answers.get(key)
    if known is not None:
        return known

    if not _canary:
        buf = io.BytesIO()
        genuine("save")(Canary(), buf)
        _canary.append(buf.getvalue())
    kwargs: dict[str, Any] = {} if explicit is None else {"weights_only": explicit}
    with registry_lock, _lock, _environment((wo, no)), observe_serialization_warnings(consume_all=True) as seen:
        try:
            value = genuine("load")(io.BytesIO(_canary[0]), **kwargs)
        except pickle.UnpicklingError:
            answer: _Answer = (True, seen.seen)
        except RuntimeError as e:
            if wo is None or no is None:
                raise ProbeFailed(f"torch.load of the library's canary raised RuntimeError: {e}") from None
            answer = (None, False)
        except Exception as e:  # noqa: BLE001 - anything else is a probe that cannot be read
            raise ProbeFailed(f"torch.load of the library's canary raised {type(e).__name__}: {e}") from None
        else:
            if type(value) is not Canary:
                raise ProbeFailed(f"torch.load of the library's canary returned {type(value).__name__}")
            answer = (False, seen.seen)
    if len(_answers) > 256:
        _answers.clear()
    _answers[key] = answer
    return answer


def is_truthy(value: Optional[str], name: str = FORCE_WO) -> bool:
    """Whether this torch acts on the switch *name* set to *value* alone (FORCE_WO refuses an explicit
    ``weights_only=False`` load; FORCE_NO_WO makes a bare load warn that it was forced to a full one)."""
    value = _text(value)
    if value is None:
        return False
    if name == FORCE_WO:
        return _ask(False, value, None)[0] is True
    if name == FORCE_NO_WO:
        return _ask(None, None, value)[1]
    raise ValueError(f"{name} is not one of torch's weights_only switches")


def truthy_spellings(name: str) -> tuple[tuple[str, ...], bool, bool]:
    """(the :data:`CANDIDATE_SPELLINGS` this torch reads as set for *name*, whether it ignores
    their case, whether it ignores surrounding spaces): what ``doctor`` says about a spelling."""
    found = tuple(s for s in CANDIDATE_SPELLINGS if is_truthy(s, name))
    any_case = bool(found) and all(is_truthy(s.upper(), name) for s in found)
    strips = bool(found) and is_truthy(f" {found[0]} ", name)
    return found, any_case, strips


def describe_spellings(name: str) -> str:
    """``1, y, yes, true (any case)``: the spellings torch counts as set, for messages."""
    found, any_case, strips = truthy_spellings(name)
    if not found:
        return "none of " + ", ".join(CANDIDATE_SPELLINGS)
    how = "any case" if any_case else "exactly as written, case-sensitive"
    return f"{', '.join(found)} ({how}{', surrounding spaces ignored' if strips else ''})"


def torch_reads_force_no_weights_only() -> bool:
    """Whether this torch's ``torch.load`` acts on TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD at all (torch >= 2.6)."""
    return any(is_truthy(s, FORCE_NO_WO) for s in CANDIDATE_SPELLINGS)


def torch_default_weights_only() -> tuple[bool, str]:
    """torch's default for a bare ``torch.load`` (asked with neither switch set), and why (the version
    only words the reason)."""
    import torch

    if _ask(None, None, None)[0] is True:
        return True, "since torch 2.6"
    parts = torch.__version__.split("+")[0].split(".")
    try:
        release = int(parts[0]), int("".join(c for c in parts[1] if c.isdigit()) or 0)
    except (IndexError, ValueError):
        release = (0, 0)
    if release >= (2, 6):
        return False, "this torch build (fbcode) keeps the old default"
    return False, f"the default before torch 2.6 (torch {torch.__version__})"


def switch_values(environ: Optional[Mapping[str, str]] = None) -> tuple[Any, Any]:
    """The two switches' raw values (None when unset), read on every load: from ``os.environ``'s
    stored mapping (:mod:`..core.environ`), values the platform's (bytes on POSIX)."""
    env = os.environ if environ is None else environ
    stored = stored_environ(env)
    if stored is None:
        return env.get(FORCE_WO), env.get(FORCE_NO_WO)
    data, encode, _decode = stored
    return data.get(encode(FORCE_WO)), data.get(encode(FORCE_NO_WO))


def conflict_message(wo: Optional[str], no: Optional[str]) -> str:
    return (
        f"{FORCE_WO}={wo!s} and {FORCE_NO_WO}={no!s} "
        "are both set: torch.load raises RuntimeError on every load. Unset one of them."
    )


@dataclass(eq=False)
class WeightsOnlySwitches:
    """The two TORCH_FORCE_* switches as this torch reads them."""

    force_weights_only: bool
    force_no_weights_only: bool
    raw: Mapping[str, Optional[str]]
    #: torch raises RuntimeError on every load (both set, as torch reads them).
    conflict: bool

    @classmethod
    def from_environ(cls, environ: Optional[Mapping[str, str]] = None) -> WeightsOnlySwitches:
        wo, no = (_text(v) for v in switch_values(environ))
        conflict = wo is not None and no is not None and _ask(None, wo, no)[0] is None
        return cls(is_truthy(wo, FORCE_WO), is_truthy(no, FORCE_NO_WO), {FORCE_WO: wo, FORCE_NO_WO: no}, conflict)

    def conflict_message(self) -> str:
        return conflict_message(self.raw.get(FORCE_WO), self.raw.get(FORCE_NO_WO))


class Decision:
    """The effective ``weights_only`` of one load mode here and now, and what it was read from."""

    __slots__ = ("weights_only", "warns", "reason", "replaced_by", "force_no_set", "cause")

    def __init__(
        self,
        weights_only: bool,
        warns: bool,
        reason: str,
        replaced_by: Optional[str],
        force_no_set: bool,
        cause: str = "default",
    ) -> None:
        self.weights_only = weights_only
        #: What decided: "explicit" (the argument), "force_wo" / "force_no" (a switch) or "default".
        self.cause = cause
        #: torch warns that TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD made the load a full one.
        self.warns = warns
        self.reason = reason
        #: Who replaced ``torch.load`` (see :func:`.loader.torch_load_replacement`), or None.
        self.replaced_by = replaced_by
        #: TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is in the environment (any value: torch may warn).
        self.force_no_set = force_no_set

    def __repr__(self) -> str:
        return f"<Decision weights_only={self.weights_only} ({self.reason})>"


def decide(mode: LoadMode, environ: Optional[Mapping[str, str]] = None) -> Decision:
    """torch.load's decision for *mode* in *environ* (default ``os.environ``), read on every load (the
    canary's answers are remembered); both switches set raises ConflictingEnvironmentError."""
    values = switch_values(environ)
    wo, no = (_text(v) for v in values)
    explicit = mode.explicit_weights_only
    weights_only, warns = _ask(explicit, wo, no)
    if weights_only is None:
        raise ConflictingEnvironmentError(conflict_message(wo, no))
    if explicit is False and weights_only:
        cause, reason = "force_wo", f"weights_only=True forced by {FORCE_WO}={wo} over explicit weights_only=False"
    elif weights_only and wo is not None and is_truthy(wo, FORCE_WO):
        cause, reason = "force_wo", f"weights_only=True forced by {FORCE_WO}={wo}"
    elif explicit is not None:
        cause = "explicit"
        reason = (
            f"weights_only={explicit} explicit"
            if weights_only == explicit
            else f"weights_only={weights_only} although weights_only={explicit} was passed"
        )
    elif warns:
        cause, reason = "force_no", f"weights_only=False forced by {FORCE_NO_WO}={no}"
    else:
        default, why = torch_default_weights_only()
        cause = "default"
        reason = (
            f"weights_only={weights_only} {why}"
            if default == weights_only
            else f"weights_only={weights_only} (the environment overrides the default)"
        )
    return Decision(weights_only, warns, reason, torch_load_replacement(), values[1] is not None, cause)
