"""The three load modes, each one exact ``torch.load`` call, named as in test ids, and what torch decides
for each here and now (:func:`decide`: asked of torch itself, by loading a canary).

* ``weights_only_false``: ``torch.load(buf, weights_only=False)``
* ``safe_globals``: ``with torch.serialization.safe_globals([...]): torch.load(buf, weights_only=True)``
* ``default``: ``torch.load(buf)``, no ``weights_only`` argument at all"""

from __future__ import annotations

import enum
import io
import os
import pickle
import re
from dataclasses import dataclass
from typing import Any, Mapping, Optional

import torch

from .errors import ConflictingEnvironmentError, ProbeFailed, RoundTripConfigError
from .registry import registry_lock
from .serialization import genuine, observe_serialization_warnings, torch_load_replacement


class LoadMode(enum.Enum):
    """How a round trip is loaded; the value is the stable name used in test ids."""

    WEIGHTS_ONLY_FALSE = "weights_only_false"
    SAFE_GLOBALS = "safe_globals"
    DEFAULT = "default"

    @property
    def explicit_weights_only(self) -> Optional[bool]:
        """The ``weights_only`` argument this mode passes (None: not passed at all)."""
        return _EXPLICIT[self._value_]

    @classmethod
    def parse(cls, value: LoadMode | str) -> LoadMode:
        if value.__class__ is LoadMode:  # the common case first: parse runs on every load
            return value  # type: ignore[return-value]
        if isinstance(value, str) and (found := _BY_SPELLING.get(value) or _BY_SPELLING.get(value.upper())):
            return found
        raise RoundTripConfigError(
            f"unknown load mode {value!r}; use one of {', '.join(m.value for m in cls)} "
            "(or LoadMode.WEIGHTS_ONLY_FALSE / SAFE_GLOBALS / DEFAULT)"
        )

    def __str__(self) -> str:
        return self.value


_EXPLICIT = {"weights_only_false": False, "safe_globals": True, "default": None}
_BY_SPELLING = {**{m.value: m for m in LoadMode}, **{m.name: m for m in LoadMode}}
FORCE_WO, FORCE_NO_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD", "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"


class Canary:
    """Saved once per process: weights-only loads refuse it, a full load builds it."""


_canary: list[bytes] = []
#: A probe's answer: the effective weights_only (None: RuntimeError, both switches set), torch warned.
_Answer = tuple[Optional[bool], bool]
#: (explicit, the switches' values, torch's load and default) -> the answer: asked once each.
_answers: dict[tuple[Any, ...], _Answer] = {}


def set_environ(values: Mapping[str, Optional[str]]) -> None:
    """Set each variable to its value or unset it (None), removals first: the switches are never both set."""
    for name, value in sorted(values.items(), key=lambda item: item[1] is not None):
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def _ask(explicit: Optional[bool], wo: Optional[str], no: Optional[str]) -> _Answer:
    """What ``torch.serialization.load(canary[, weights_only=explicit])`` does with the switches (wo, no)."""
    key = (explicit, wo, no, genuine("load"), getattr(torch.serialization, "_default_to_weights_only", None))
    if (known := _answers.get(key)) is not None:
        return known
    if not _canary:
        buf = io.BytesIO()
        genuine("save")(Canary(), buf)
        _canary.append(buf.getvalue())
    kwargs: dict[str, Any] = {} if explicit is None else {"weights_only": explicit}
    with registry_lock, observe_serialization_warnings(consume_all=True) as seen:
        before = {name: os.environ.get(name) for name in (FORCE_WO, FORCE_NO_WO)}
        set_environ({FORCE_WO: wo, FORCE_NO_WO: no})
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
        finally:
            set_environ(before)
    _answers[key] = answer
    return answer


def is_truthy(value: Optional[str], name: str = FORCE_WO) -> bool:
    """Whether this torch acts on the switch *name* set to *value* alone (FORCE_WO refuses an explicit
    ``weights_only=False`` load; FORCE_NO_WO makes a bare load warn that it was forced to a full one)."""
    if value is None:
        return False
    if name == FORCE_WO:
        return _ask(False, value, None)[0] is True
    if name == FORCE_NO_WO:
        return _ask(None, None, value)[1]
    raise ValueError(f"{name} is not one of torch's weights_only switches")


def torch_default_weights_only() -> tuple[bool, str]:
    """torch's default for a bare ``torch.load`` (asked with neither switch set) and why (the version only words it)."""
    if _ask(None, None, None)[0] is True:
        return True, "since torch 2.6"
    release = re.match(r"(\d+)\.(\d+)", torch.__version__)
    if release and (int(release[1]), int(release[2])) >= (2, 6):
        return False, "this torch build (fbcode) keeps the old default"
    return False, f"the default before torch 2.6 (torch {torch.__version__})"


def switch_values(environ: Optional[Mapping[str, str]] = None) -> tuple[Optional[str], Optional[str]]:
    env = os.environ if environ is None else environ
    return env.get(FORCE_WO), env.get(FORCE_NO_WO)


def conflict_message(wo: Optional[str], no: Optional[str]) -> str:
    return (
        f"{FORCE_WO}={wo!s} and {FORCE_NO_WO}={no!s} "
        "are both set: torch.load raises RuntimeError on every load. Unset one of them."
    )


@dataclass(frozen=True, eq=False)
class Decision:
    """The effective ``weights_only`` of one load mode here and now, and what it was read from."""

    weights_only: bool
    warns: bool  # torch warns that TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD made the load a full one
    reason: str
    replaced_by: Optional[str]  # who replaced ``torch.load``, or None
    force_no_set: bool  # TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD is set, to any value: torch may warn
    cause: str  # "explicit": the argument, "force_wo" / "force_no": a switch, "default"


#: (mode, the switches' values, torch.load, torch's own load and default) -> the decision.
_decisions: dict[tuple[Any, ...], Decision] = {}


def decide(mode: LoadMode, environ: Optional[Mapping[str, str]] = None) -> Decision:
    """torch.load's decision for *mode* in *environ* (default ``os.environ``), read on every load (the
    canary's answers are remembered); both switches set raises ConflictingEnvironmentError."""
    wo, no = switch_values(environ)
    ser, load = torch.serialization, getattr(torch, "load", None)
    key = (mode, wo, no, load, genuine("load"), getattr(ser, "_default_to_weights_only", None))
    if (known := _decisions.get(key)) is not None:
        return known
    explicit = mode.explicit_weights_only
    weights_only, warns = _ask(explicit, wo, no)
    if weights_only is None:
        raise ConflictingEnvironmentError(conflict_message(wo, no))
    if explicit is False and weights_only:
        cause, reason = "force_wo", f"weights_only=True forced by {FORCE_WO}={wo} over explicit weights_only=False"
    elif weights_only and wo is not None and is_truthy(wo, FORCE_WO):
        cause, reason = "force_wo", f"weights_only=True forced by {FORCE_WO}={wo}"
    elif explicit is not None:
        cause, reason = "explicit", f"weights_only={explicit} explicit"
        if weights_only != explicit:
            reason = f"weights_only={weights_only} although weights_only={explicit} was passed"
    elif warns:
        cause, reason = "force_no", f"weights_only=False forced by {FORCE_NO_WO}={no}"
    else:
        default, why = torch_default_weights_only()
        cause, reason = "default", f"weights_only={weights_only} {why}"
        if default != weights_only:
            reason = f"weights_only={weights_only} (the environment overrides the default)"
    if len(_decisions) >= 64:
        _decisions.clear()
    decision = _decisions[key] = Decision(weights_only, warns, reason, torch_load_replacement(), no is not None, cause)
    return decision
