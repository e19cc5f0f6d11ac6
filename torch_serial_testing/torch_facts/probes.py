"""The probe kit: few-byte pickles fed to torch's real weights-only unpickler, and what it did.

A probe is a pickle of a handful of opcodes built here (:func:`global_op`, :func:`text`, ...),
handed to ``torch._weights_only_unpickler.Unpickler`` exactly as ``torch.load`` hands it a
checkpoint's ``data.pkl``; the outcome (:class:`Outcome`: the value, or the exception torch
raised) is the answer.  Nothing torch-specific is assumed beyond the unpickler's constructor
and ``load``; when those cannot be called, :class:`ProbeFailed` says so.

The objects the probes build live here too: a ``list`` and a ``dict`` subclass, a plain
class, a slotted class and one with ``__setstate__``, and the factories that return them
(allowlisted for the probe only, so that torch builds them without allowlisting their type).
"""

from __future__ import annotations

import io
import pickle
import struct
from typing import Any, Callable, Optional

__all__ = [
    "ProbeFailed",
    "Outcome",
    "unpickle",
    "global_op",
    "text",
    "small_int",
    "PROTO_2",
    "STOP",
]


class ProbeFailed(Exception):
    """A probe of torch could not run, or gave an answer the library cannot read.

    The message names the probe and what happened; predictions that need the fact become
    unknown with this message, never a guess.
    """


class Outcome:
    """What torch's weights-only unpickler did with one probe: loaded ``value`` or raised ``error``."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: Optional[BaseException] = None) -> None:
        self.value = value
        self.error = error

    @property
    def loaded(self) -> bool:
        return self.error is None

    @property
    def refused(self) -> bool:
        """One of the unpickler's own checks said no: it raised ``UnpicklingError``, or (torch 2.4,
        whose checks raise ``RuntimeError``, which ``torch.load`` turns into ``UnpicklingError``) a
        ``RuntimeError`` raised by the unpickler's own code."""
        if isinstance(self.error, pickle.UnpicklingError):
            return True
        return type(self.error) is RuntimeError and _raised_in(self.error, "torch._weights_only_unpickler")

    @property
    def message(self) -> str:
        return "" if self.error is None else str(self.error)

    def __repr__(self) -> str:
        return f"Outcome(value={self.value!r})" if self.error is None else f"Outcome(error={self.error!r})"


def _raised_in(error: BaseException, module: str) -> bool:
    """Whether the innermost frame of *error*'s traceback runs code of *module*."""
    tb = error.__traceback__
    if tb is None:
        return False
    while tb.tb_next is not None:
        tb = tb.tb_next
    return bool(tb.tb_frame.f_globals.get("__name__") == module)


PROTO_2 = pickle.PROTO + b"\x02"
STOP = pickle.STOP


def global_op(obj_or_name: Any) -> bytes:
    """``GLOBAL module\\nname\\n`` for an object (its ``__module__``, ``__qualname__``) or ``"mod.Name"``."""
    if isinstance(obj_or_name, str):
        module, _, name = obj_or_name.partition(".")
    else:
        module, name = obj_or_name.__module__, obj_or_name.__qualname__
    return pickle.GLOBAL + module.encode() + b"\n" + name.encode() + b"\n"


def text(s: str) -> bytes:
    """``BINUNICODE`` of *s*."""
    data = s.encode("utf-8")
    return pickle.BINUNICODE + struct.pack("<I", len(data)) + data


def small_int(n: int) -> bytes:
    """``BININT1`` of *n* (0..255)."""
    return pickle.BININT1 + bytes([n])


def unpickle(body: bytes, *, persistent_load: Optional[Callable[[Any], Any]] = None,
             proto: bool = True) -> Outcome:
    """Run ``PROTO 2`` + *body* + ``STOP`` (just *body* with ``proto=False``) through torch's
    weights-only unpickler; a persistent id is handed to *persistent_load*, as ``torch.load`` does."""
    try:
        from torch import _weights_only_unpickler as wou

        unpickler = wou.Unpickler(io.BytesIO((PROTO_2 if proto else b"") + body), encoding="utf-8")
        if persistent_load is not None:
            unpickler.persistent_load = persistent_load
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


# -- what the probes build ------------------------------------------------------------------------


class ProbeList(list):  # type: ignore[type-arg]
    """A ``list`` subclass, for the APPEND target check."""


class ProbeDict(dict):  # type: ignore[type-arg]
    """A ``dict`` subclass, for the SETITEM target check."""


class ProbeOther:
    """Neither a list nor a dict."""


class ProbePlain:
    """A class whose instances have a ``__dict__`` and no ``__setstate__``."""


class ProbeSlotted:
    """A class whose instances have a slot and no ``__dict__``."""

    __slots__ = ("a",)


class ProbeWithSetstate:
    """Records that BUILD called its ``__setstate__``."""

    def __setstate__(self, state: Any) -> None:
        self.set_with = state


def make_probe_list() -> ProbeList:
    return ProbeList()


def make_probe_dict() -> ProbeDict:
    return ProbeDict()


def make_probe_other() -> ProbeOther:
    return ProbeOther()


def make_defaultdict() -> Any:
    import collections

    return collections.defaultdict(int)


def make_counter() -> Any:
    import collections

    return collections.Counter()


def make_ordered_dict() -> Any:
    import collections

    return collections.OrderedDict()
