"""Other torch releases' weights-only behaviours, simulated on the torch that runs.

The library learns torch's rules by asking it (``torch_serial_testing.unpickler``), so a
behaviour of another release is tested in two ways, neither reading any source text:

* **rules objects** (:func:`simulated_rules`): this torch's probed ``UnpicklerRules`` with some
  of its rules replaced (another release's ``BuildRules``, container checks, renames...), given
  to the model -- the scan and the prediction -- instead of this torch's;
* **stand-ins** of torch's behaviour (:func:`unpickler_standin`, :func:`load_standin`): a
  small subclass of ``torch._weights_only_unpickler.Unpickler`` that behaves like another
  release in one respect (or a ``torch.serialization.load`` reading the switches like another
  release), installed where torch looks it up, so that the library's probes *and* a real
  ``torch.load`` meet the same behaviour; the tests check the probes read it right.

A stand-in that lets through what this torch refuses loads the rest of the pickle with
:class:`_RestLoader` (the pickle module's own unpickler, with torch's allowlists as its only
globals and this torch's container checks).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import os
import pickle
import re
from contextlib import contextmanager
from typing import Any, Callable, Iterator, Optional
from unittest import mock

import torch
from torch import _weights_only_unpickler as wou

from torch_serial_testing import checkpoint, prediction, unpickler
from torch_serial_testing.unpickler import innermost_frame
from torch_serial_testing.tools import facts
from torch_serial_testing.unpickler import UnpicklerRules, unpickler_rules

FORCE_WO = "TORCH_FORCE_WEIGHTS_ONLY_LOAD"
FORCE_NO_WO = "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD"
REAL_UNPICKLER = wou.Unpickler
#: APPEND(S) targets as torch's checks tell them apart (ContainerRule.refused); "allowlisted_": user-allowlisted.
APPEND_TARGETS = ("list", "list_subclass", "allowlisted_list_subclass", "other", "allowlisted_other")


# -- rules objects ----------------------------------------------------------------------------------


@contextmanager
def simulated_rules(**changes: Any) -> Iterator[UnpicklerRules]:
    """The model (scan and prediction) follows this torch's rules with *changes* applied
    (``dataclasses.replace``).  Checkpoints scanned inside keep that scan: use fresh ones."""
    rules = dataclasses.replace(unpickler_rules(), **changes)
    with (
        mock.patch.object(unpickler, "unpickler_rules", return_value=rules),
        mock.patch.object(prediction, "unpickler_rules", return_value=rules),
    ):
        yield rules


# -- stand-in unpicklers ----------------------------------------------------------------------------------


def forget_probes() -> None:
    """Clear the library's memos of what torch's unpickler does (they are keyed by the unpickler
    anyway; cleared so that nothing learnt before a stand-in survives it), and the tools' memo of
    what it does with a TorchScript archive."""
    unpickler._known.clear()
    unpickler._walk_rules.clear()
    facts._torchscript_refusal.clear()


@contextmanager
def unpickler_standin(cls: type) -> Iterator[None]:
    """``torch._weights_only_unpickler.Unpickler`` is *cls* inside the block (``torch.load`` and
    the library's probes both construct it from there), the probes forgotten on both sides."""
    forget_probes()
    try:
        with mock.patch.object(wou, "Unpickler", cls):
            yield
    finally:
        forget_probes()


def _user_allowed() -> dict[str, Any]:
    return dict(wou._get_user_allowed_globals())


class _RestLoader(pickle._Unpickler):  # type: ignore[name-defined]
    """The pickle module's pure-Python unpickler with torch's allowlists as its only globals
    and this torch's container checks (APPEND(S) onto exactly a list, SETITEM(S) onto a dict,
    OrderedDict or Counter), which the stand-ins override."""

    dispatch = dict(pickle._Unpickler.dispatch)  # type: ignore[attr-defined]

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in torch._utils.NAME_MAPPING:
            module, name = torch._utils.NAME_MAPPING[(module, name)]
        elif module in torch._utils.IMPORT_MAPPING:
            module = torch._utils.IMPORT_MAPPING[module]
        key = f"{module}.{name}"
        for table in (wou._get_allowed_globals(), _user_allowed()):
            if key in table:
                return table[key]
        raise pickle.UnpicklingError(f"Unsupported global: GLOBAL {key} was not an allowed global by default.")

    def check_append(self, target: Any) -> None:
        if type(target) is not list:
            raise pickle.UnpicklingError(f"Can only append to lists, but got {type(target)}")

    def check_setitem(self, opcode: str, target: Any) -> None:
        if type(target) not in (dict, collections.OrderedDict, collections.Counter):
            raise pickle.UnpicklingError(
                f"Can only {opcode} for dict, collections.OrderedDict, collections.Counter, but got {type(target)}"
            )

    def _append(self) -> None:
        self.check_append(self.stack[-2])
        pickle._Unpickler.load_append(self)  # type: ignore[attr-defined]

    def _appends(self) -> None:
        self.check_append(self.metastack[-1][-1])
        pickle._Unpickler.load_appends(self)  # type: ignore[attr-defined]

    def _setitem(self) -> None:
        self.check_setitem("SETITEM", self.stack[-3])
        pickle._Unpickler.load_setitem(self)  # type: ignore[attr-defined]

    def _setitems(self) -> None:
        self.check_setitem("SETITEMS", self.metastack[-1][-1])
        pickle._Unpickler.load_setitems(self)  # type: ignore[attr-defined]

    dispatch[pickle.APPEND[0]] = _append
    dispatch[pickle.APPENDS[0]] = _appends
    dispatch[pickle.SETITEM[0]] = _setitem
    dispatch[pickle.SETITEMS[0]] = _setitems


def _load_refusing(load: Callable[[], Any]) -> Any:
    """*load* (the next ``load`` up the stand-in's classes, this torch's own at the end), its refusals
    raised as ``UnpicklingError`` whatever this torch raises them as (torch 2.4's checks raise
    ``RuntimeError``, which ``torch.load`` turns into that), so a stand-in built on any torch tells
    its refusals apart from other failures the same way."""
    try:
        return load()
    except RuntimeError as e:
        frame = innermost_frame(e)
        if frame is not None and frame.f_globals.get("__name__") == wou.__name__:
            raise pickle.UnpicklingError(str(e)) from None
        raise


class _Rerunnable(REAL_UNPICKLER):  # type: ignore[misc, valid-type]
    """Remembers where its pickle starts, to load it again with :class:`_RestLoader`."""

    rest_loader: type = _RestLoader

    def __init__(self, file: Any, *, encoding: str = "bytes") -> None:
        super().__init__(file, encoding=encoding)
        self._tst_file, self._tst_start, self._tst_encoding = file, file.tell(), encoding

    def rerun(self, persistent_load: Optional[Callable[[Any], Any]] = None) -> Any:
        self._tst_file.seek(self._tst_start)
        rest = self.rest_loader(self._tst_file, encoding=self._tst_encoding)
        rest.persistent_load = persistent_load or self.persistent_load
        return rest.load()


class _Append2141Rest(_RestLoader):
    def check_append(self, target: Any) -> None:
        if type(target) is not list and not (isinstance(target, list) and type(target) in _user_allowed().values()):
            raise pickle.UnpicklingError(f"Can only append to lists, but got {type(target)}")


class Torch2141Append(_Rerunnable):
    """torch 2.14.1's APPEND/APPENDS check: onto exactly a ``list``, or an instance of a ``list``
    subclass that is itself user-allowlisted; both refusals say "Can only append to lists"."""

    rest_loader = _Append2141Rest

    def load(self) -> Any:
        try:
            return _load_refusing(super().load)
        except pickle.UnpicklingError as e:
            if not str(e).startswith(("Can only append to lists", "Can only extend lists")):
                raise
            target = self.stack[-1]
            if not (isinstance(target, list) and type(target) in _user_allowed().values()):
                raise pickle.UnpicklingError(f"Can only append to lists, but got {type(target)}") from None
        return self.rerun()


class _NoSetitemCheckRest(_RestLoader):
    def check_setitem(self, opcode: str, target: Any) -> None:
        pass


class Torch28Setitem(_Rerunnable):
    """torch 2.8's SETITEM/SETITEMS: no check of the target at all."""

    rest_loader = _NoSetitemCheckRest

    def load(self) -> Any:
        try:
            return _load_refusing(super().load)
        except pickle.UnpicklingError as e:
            if not str(e).startswith(("Can only SETITEM", "Can only SETITEMS")):
                raise
        return self.rerun()


def _persid_28(pid: Any) -> None:
    """torch 2.8's persistent-id checks: its type check inverted (``not type(pid) is not int``:
    an int id is refused, any other type let through) and a non-storage tuple named by its item."""
    if type(pid) is not tuple and type(pid) is int:
        raise pickle.UnpicklingError(f"persistent_load id must be tuple or int, but got {type(pid)}")
    if type(pid) is tuple and len(pid) > 0 and torch.serialization._maybe_decode_ascii(pid[0]) != "storage":
        raise pickle.UnpicklingError(f"Only persistent_load of storage is allowed, but got {pid[0]}")


class Torch28Persid(_Rerunnable):
    """torch 2.8's persistent-id checks (:func:`_persid_28`); ``persistent_load`` set by the caller
    (as ``torch.load`` sets it) is called behind them."""

    def __init__(self, file: Any, *, encoding: str = "bytes") -> None:
        self._tst_loader = REAL_UNPICKLER.persistent_load.__get__(self)
        super().__init__(file, encoding=encoding)

    @property  # type: ignore[override]
    def persistent_load(self) -> Callable[[Any], Any]:
        return self._tst_checked

    @persistent_load.setter
    def persistent_load(self, loader: Callable[[Any], Any]) -> None:
        self._tst_loader = loader

    def _tst_checked(self, pid: Any) -> Any:
        _persid_28(pid)
        return self._tst_loader(pid)

    def load(self) -> Any:
        try:
            return _load_refusing(super().load)
        except pickle.UnpicklingError as e:
            if not str(e).startswith(("persistent_load id must be", "Only persistent_load of storage")):
                raise
        return self.rerun(self._tst_checked)


class _OldBuildRest(_RestLoader):
    dispatch = dict(_RestLoader.dispatch)

    def _build(self) -> None:
        state = self.stack.pop()
        inst = self.stack[-1]
        if type(inst) is torch.Tensor:
            inst.set_(*state)
        elif type(inst) is torch.nn.Parameter:
            inst.__setstate__(state)
        elif type(inst) is collections.OrderedDict:
            inst.__dict__.update(state)
        elif type(inst) in _user_allowed().values():
            if hasattr(inst, "__setstate__"):
                inst.__setstate__(state)
            else:
                inst.__dict__.update(state)
        else:
            raise pickle.UnpicklingError(
                f"Can only build Tensor, parameter or OrderedDict objects, but got {type(inst)}"
            )

    dispatch[pickle.BUILD[0]] = _build


class Torch24Build(_Rerunnable):
    """torch 2.4 and 2.5's BUILD: ``inst.__dict__.update(state)`` whatever the state, and only on
    instances of user-allowlisted types (besides Tensor, Parameter, OrderedDict), refusing others
    in 2.4's words.

    Every other check is this torch's: the pickle is loaded by this torch first; what it accepts
    is then loaded again with that BUILD, which raises what Python raises (AttributeError for a
    slotted instance, TypeError or ValueError for a slot-state pair) through torch.load as it is.
    """

    rest_loader = _OldBuildRest

    def load(self) -> Any:
        try:
            _load_refusing(super().load)
        except pickle.UnpicklingError as e:  # one of this torch's checks said no
            if str(e).startswith("Can only build"):  # in torch 2.4's words
                raise pickle.UnpicklingError(
                    "Can only build Tensor, parameter or OrderedDict objects, but got "
                    + str(e).rpartition("but got ")[2]
                ) from None
            raise
        except Exception:  # noqa: BLE001 - this torch's own BUILD failed: the old BUILD decides
            pass
        return self.rerun()


class Torch26Spelling(REAL_UNPICKLER):  # type: ignore[misc, valid-type]
    """torch 2.4 to 2.6's refusal of a ``builtins`` global: the name in full (``GLOBAL
    builtins.frozenset was not an allowed global``), where torch 2.7 on drops the prefix."""

    def load(self) -> Any:
        try:
            return _load_refusing(super().load)
        except pickle.UnpicklingError as e:
            message = str(e)
            m = re.match(r"Unsupported global: GLOBAL ([^ .]+) was not", message)
            if m is None:
                raise
            raise pickle.UnpicklingError(
                message.replace(f"GLOBAL {m.group(1)} ", f"GLOBAL builtins.{m.group(1)} ", 1)
            ) from None


class RaisingUnpickler(REAL_UNPICKLER):  # type: ignore[misc, valid-type]
    """An unpickler that cannot even be constructed: no probe of it can run."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        raise RuntimeError("this stand-in unpickler cannot be constructed")


# -- stand-in torch.serialization.load ---------------------------------------------------------------------


@contextmanager
def _switches_unset() -> Iterator[None]:
    before = {name: os.environ.pop(name, None) for name in (FORCE_WO, FORCE_NO_WO)}
    try:
        yield
    finally:
        for name, value in before.items():
            if value is not None:
                os.environ[name] = value


def switch_reader(
    *,
    true_values: tuple[str, ...] = ("1", "y", "yes", "true"),
    lower: bool = True,
    reads_no: bool = True,
    default: bool = True,
    jit_dispatch: bool = False,
) -> Callable[..., Any]:
    """A ``torch.serialization.load`` reading the two switches like another release: torch 2.8
    compared the raw value (``lower=False``), torch before 2.6 read only
    TORCH_FORCE_WEIGHTS_ONLY_LOAD (``reads_no=False``) and defaulted to a full load
    (``default=False``), torch 2.4 handed a TorchScript archive to ``torch.jit.load`` whatever
    ``weights_only`` said (``jit_dispatch``).  The load itself is this torch's, with the
    effective ``weights_only`` passed explicitly and the switches unset."""
    real = torch.serialization.load

    def is_set(name: str) -> bool:
        value = os.getenv(name, "0")
        return (value.lower() if lower else value) in true_values

    def load(
        f: Any,
        map_location: Any = None,
        pickle_module: Any = None,
        *,
        weights_only: Optional[bool] = None,
        **kwargs: Any,
    ) -> Any:
        not_set = weights_only is None
        if not_set:
            weights_only = default
        force_wo, force_no = is_set(FORCE_WO), reads_no and is_set(FORCE_NO_WO)
        if force_wo and force_no:
            raise RuntimeError(
                "Only one of `TORCH_FORCE_WEIGHTS_ONLY_LOAD` or `TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD` "
                "should be set, but both were set."
            )
        if force_wo:
            weights_only = True
        elif force_no and not_set:
            torch.serialization.warnings.warn(
                "Environment variable TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD detected, since the`weights_only` argument "
                "was not explicitly passed to `torch.load`, forcing weights_only=False.",
                UserWarning,
                stacklevel=2,
            )
            weights_only = False
        if jit_dispatch:
            start = f.tell()
            head = f.read(4)
            f.seek(start)
            if head == b"PK\x03\x04" and unpickler.is_torchscript(torch._C.PyTorchFileReader(f)):
                f.seek(start)
                return torch.jit.load(f, map_location=map_location)
            f.seek(start)
        with _switches_unset():
            return real(f, map_location, pickle_module, weights_only=weights_only, **kwargs)

    return load


@contextmanager
def load_standin(load: Callable[..., Any]) -> Iterator[None]:
    """``torch.serialization.load`` is *load* inside the block (the library's canary probes call
    it there); ``torch.load`` stays torch's.  The library calls only torch's own function, verified
    by identity, so the stand-in also plays that part (:func:`as_genuine_load`).  What a TorchScript
    archive meets is read into its scan (by the tools, :func:`~torch_serial_testing.tools.facts.torchscript_refusal`):
    that memo is forgotten on both sides, and the scans of small checkpoints remembered outside the block
    are set aside inside it (those made inside are dropped after it)."""
    facts._torchscript_refusal.clear()
    try:
        with (
            mock.patch.object(torch.serialization, "load", load),
            as_genuine_load(load),
            mock.patch.dict(checkpoint._small_infos, clear=True),
        ):
            yield
    finally:
        facts._torchscript_refusal.clear()


def as_genuine_load(load: Callable[..., Any]) -> Any:
    """Inside the block the library takes *load* (a function playing another torch's
    ``torch.serialization.load``) for torch's own (``serialization.genuine``)."""
    from torch_serial_testing import serialization

    kw = load.__kwdefaults__
    return mock.patch.dict(serialization._genuine, {"load": (load, load.__code__, None if kw is None else dict(kw))})


def torch_zip_of(data_pkl: bytes) -> bytes:
    """A zip checkpoint of exactly torch.save's records holding *data_pkl*."""
    from test.helpers import hostile_checkpoints

    return hostile_checkpoints.torch_zip(data_pkl)


def saved(obj: Any, **kwargs: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf, **kwargs)
    return buf.getvalue()
