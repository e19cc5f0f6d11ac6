"""The probe kit: few-byte pickles fed to torch's real weights-only unpickler, and what it did.

Nothing is assumed beyond the unpickler's constructor and ``load`` (:class:`ProbeFailed` when they
fail).  Probes allowlist :func:`made`, which builds the objects they need, instead of their types.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
from typing import Any, Callable, Optional

STOP = pickle.STOP


class ProbeFailed(Exception):
    """A probe of torch could not run or be read: what needs the fact becomes unknown, never a guess."""


def innermost_frame(error: BaseException) -> Any:  # None without a traceback
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return None if tb is None else tb.tb_frame


class Outcome:
    """What torch's weights-only unpickler did with one probe: loaded ``value`` or raised ``error``.

    ``refused``: one of the unpickler's own checks said no (``UnpicklingError``, or a ``RuntimeError``
    raised by its own code: torch 2.4's checks).  The error keeps no traceback or context, so a probe
    run while a load's rejection is handled leaves no reference cycle through that load's frames."""

    __slots__ = ("value", "error", "loaded", "refused")

    def __init__(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value, self.error, self.loaded = value, error, error is None
        frame = innermost_frame(error) if type(error) is RuntimeError else None
        self.refused = isinstance(error, pickle.UnpicklingError) or (
            frame is not None and frame.f_globals.get("__name__") == "torch._weights_only_unpickler"
        )
        if error is not None:
            error.__traceback__ = error.__context__ = None

    @property
    def message(self) -> str:
        return "" if self.error is None else str(self.error)

    def __repr__(self) -> str:
        return f"Outcome(value={self.value!r})" if self.error is None else f"Outcome(error={self.error!r})"


def global_op(obj_or_name: Any) -> bytes:
    """``GLOBAL module\\nname\\n`` for an object (its ``__module__``, ``__qualname__``) or ``"mod.Name"``."""
    if isinstance(obj_or_name, str):
        module, _, name = obj_or_name.partition(".")
    else:
        module, name = obj_or_name.__module__, obj_or_name.__qualname__
    return pickle.GLOBAL + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    data = s.encode("utf-8")
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def small_int(n: int) -> bytes:
    return pickle.BININT1 + bytes([n])


def unpickle(body: bytes, *, persistent_load: Optional[Callable[[Any], Any]] = None, proto: bool = True) -> Outcome:
    """Run ``PROTO 2`` + *body* (just *body* with ``proto=False``) through torch's weights-only
    unpickler; a persistent id is handed to *persistent_load*, as ``torch.load`` does."""
    try:
        from torch import _weights_only_unpickler as wou

        unpickler = wou.Unpickler(io.BytesIO((pickle.PROTO + b"\x02" if proto else b"") + body), encoding="utf-8")
        if persistent_load is not None:
            # pickle's documented hook is an instance attribute; torch's Unpickler declares a method
            unpickler.persistent_load = persistent_load  # type: ignore[method-assign]
        load = unpickler.load
    except Exception as e:  # noqa: BLE001 - any failure to call torch is the probe's failure
        raise ProbeFailed(
            f"cannot run torch's weights-only unpickler ({type(e).__name__}: {e}); this torch's "
            "torch._weights_only_unpickler.Unpickler(file, encoding=...).load() is not what the library asks"
        ) from None
    try:
        return Outcome(load())
    except Exception as e:  # noqa: BLE001 - the exception is the answer
        return Outcome(error=e)


def with_type(message: str, cls: type) -> str:
    """*message* up to the ``type()`` torch appends (``<class 'list'>``); ProbeFailed when it does not end so."""
    shown = repr(cls)
    if not message.endswith(shown):
        raise ProbeFailed(f"torch's message {message!r} does not end with the type it refused ({shown})")
    return message[: -len(shown)]


# The probes' classes: a list and a dict subclass; a plain class (a __dict__, no __setstate__); instances
# with a slot and no __dict__, with both; a __setstate__ that records its call.
class ProbeList(list): ...  # type: ignore[type-arg]


class ProbeDict(dict): ...  # type: ignore[type-arg]


class ProbeOther: ...


class ProbeSlotted:
    __slots__ = ("a",)


class ProbeSlotsAndDict:
    __slots__ = ("a", "__dict__")


class ProbeWithSetstate:
    def __setstate__(self, state: Any) -> None:
        self.set_with = state


def unlisted_function() -> None: ...  # never allowlisted: REDUCE of it is refused


_MADE: dict[str, Callable[[], Any]] = {"list_subclass": ProbeList, "dict_subclass": ProbeDict, "other": ProbeOther}
_MADE.update(ordered_dict=collections.OrderedDict, counter=collections.Counter, other_class=lambda: ProbeOther)
_MADE["unlisted_function"] = lambda: unlisted_function


def made(kind: str) -> Any:
    return _MADE[kind]()


def made_op(kind: str) -> bytes:
    """The ops that push ``made(kind)``: REDUCE of the factory with ``(kind,)``."""
    return global_op(made) + text(kind) + pickle.TUPLE1 + pickle.REDUCE
