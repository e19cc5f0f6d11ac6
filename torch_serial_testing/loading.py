"""The load: the mode's one exact ``torch.load`` call, asserted to do what :func:`~.prediction.predict` says.

Loaded, or rejected naming a predicted cause: a test is green for the right reason everywhere.  A replaced
``torch.load`` (torch_npu's) may *report* differently (the TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD notice printed instead
of warned, a reworded rejection, globals it registered): recorded in the outcome text, never a skip or a failure."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import pickle
import shutil
import tempfile
import unittest
from dataclasses import dataclass
from typing import Any, Iterator, Mapping, Optional, Sequence

import torch

from .checkpoint import Checkpoint
from .declarations import as_safe_globals
from .errors import CheckpointFormatError, RoundTripConfigError, UnexpectedLoadOutcome, UnsafeLoadRefused
from .modes import FORCE_NO_WO, LoadMode, decide
from .prediction import Expectation, _as_checkpoint, decided
from .registry import registered_by_torch, registered_entries, registry_lock, restore_registry, snapshot_registry
from .registry import safe_globals_context_missing
from .serialization import FORCE_NO_NOTICE, TORCH_SERIALIZATION, genuine, raiser
from .serialization import observe_serialization_warnings, watch_stdout


def mode_skip_reason(mode: LoadMode) -> Optional[str]:
    """Why *mode* cannot run on this torch (the ``safe_globals`` context is torch >= 2.5), or None."""
    return safe_globals_context_missing() if mode is LoadMode.SAFE_GLOBALS else None


@dataclass
class LoadResult:
    """A performed load: the object (when it loaded) and the expectation it met."""

    expectation: Expectation
    loaded: bool
    value: Any = None
    error: Optional[BaseException] = None
    #: How a replaced ``torch.load`` reported differently from torch's own (empty otherwise).
    notes: tuple[str, ...] = ()
    warned: Optional[bool] = None

    @property
    def summary(self) -> str:
        return self.expectation.summary(self.loaded, self.notes, self.warned)


#: ``torch.load`` keyword arguments a load may pass on (``map_location`` and the mode have their own).
LOAD_KWARGS = ("mmap",)


def load_kwargs(given: Optional[Mapping[str, Any]]) -> dict[str, Any]:
    """*given* checked: only :data:`LOAD_KWARGS`; anything else fails naming the right argument."""
    extra = dict(given or {})
    own = {"weights_only": "the load mode (mode=...)", "map_location": "map_location=...", "f": "the checkpoint"}
    for key in extra:
        if key in own:
            raise RoundTripConfigError(f"torch.load's {key!r} is not a load kwarg here: it is {own[key]}")
        if key in ("encoding", "errors", "fix_imports"):
            raise RoundTripConfigError(
                f"torch.load's {key!r} is a pickle_load_arg: those only apply to weights_only=False loads "
                "(torch warns and ignores them otherwise), so a round trip in every load mode cannot use it"
            )
        if key not in LOAD_KWARGS:
            raise RoundTripConfigError(
                f"torch.load keyword {key!r} is not supported by round trips (supported: {', '.join(LOAD_KWARGS)}); "
                "a custom pickle_module cannot be combined with weights_only loads"
            )
    return extra


@contextlib.contextmanager
def _private_file(checkpoint: Checkpoint) -> Iterator[str]:
    """A private temporary copy's path, removed after the load (mmap-ed tensors keep their mapping)."""
    with tempfile.TemporaryDirectory(prefix="tst-checkpoint-") as folder:  # mode 0700: nobody swaps the bytes
        path = os.path.join(folder, "checkpoint.pt")
        with open(path, "wb") as fh:
            shutil.copyfileobj(checkpoint.rewound(), fh)
        yield path


def load(
    checkpoint: Checkpoint,
    mode: LoadMode | str,
    safe_globals: Sequence[Any] = (),
    map_location: Any = None,
    *,
    from_file: bool = False,
    extra_kwargs: Optional[Mapping[str, Any]] = None,
) -> LoadResult:
    """Load *checkpoint* in *mode* and assert torch did what :func:`predict` says; never retried.  Only
    :meth:`Checkpoint.save` output is ever fully unpickled (else :class:`UnsafeLoadRefused`); foreign bytes are
    loaded with an explicit ``weights_only=True``.  *from_file* (or ``mmap=True``): through a private temporary file."""
    if isinstance(checkpoint, (LoadMode, str)) and isinstance(mode, Checkpoint):
        raise RoundTripConfigError("load() got the load mode first: the order is load(checkpoint, mode, ...)")
    mode = LoadMode.parse(mode)
    checkpoint = _as_checkpoint(checkpoint, "load")
    if mode is LoadMode.SAFE_GLOBALS and (reason := mode_skip_reason(mode)):
        raise unittest.SkipTest(reason)
    # The declaration is read (and judged) only where the mode uses it: inside torch's safe_globals context.
    safe_globals = as_safe_globals(safe_globals) if mode is LoadMode.SAFE_GLOBALS else ()
    extra = load_kwargs(extra_kwargs) if extra_kwargs else {}
    to_file = from_file or bool(extra.get("mmap"))
    with registry_lock, _private_file(checkpoint) if to_file else contextlib.nullcontext() as path:
        # The environment is read once per load; undecided, it is loaded all the same (see _verify).
        decision, expectation = decided(mode, checkpoint, tuple((sg.obj, sg.name) for sg in safe_globals))
        if not checkpoint.owned and (mode is LoadMode.WEIGHTS_ONLY_FALSE or not expectation.weights_only):
            raise UnsafeLoadRefused(
                f"refusing a weights_only=False load ({expectation.reason}) of bytes this process "
                "did not just produce: only Checkpoint.save() output may be fully unpickled"
            )
        fmt = checkpoint.format
        if fmt == "torchscript":
            raise CheckpointFormatError(
                "this is a TorchScript archive: load it with torch.jit.load; torch.load would hand it "
                "to torch.jit.load, and weights_only does not apply"
            )
        if fmt == "tar":
            raise CheckpointFormatError(
                "this is a legacy tar checkpoint (torch < 0.4): torch.load reads that format only from a "
                "real file and never with weights_only=True; re-save it with a current torch"
            )
        if not checkpoint.owned and expectation.replaced_by is not None:
            # Foreign bytes go to torch's own function only (see _torch_load): judged as torch's own.
            why = (
                f"{expectation.reason}; loaded with torch's own torch.serialization.load, not the replaced "
                f"torch.load ({expectation.replaced_by}), which foreign bytes never reach"
            )
            expectation = dataclasses.replace(expectation, replaced_by=None, reason=why)
        kwargs = extra if map_location is None else {"map_location": map_location, **extra}
        replaced = expectation.replaced_by is not None
        registered = registered_entries() if replaced else []
        # torch's safe_globals exit drops entries registered before it (a replaced loader may add its own): restored
        snapshot = snapshot_registry() if mode is LoadMode.SAFE_GLOBALS or replaced else None
        warned = printed = False  # torch warns only with TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD set (a replacement may)
        try:
            if not (replaced or (decision is not None and decision.force_no_set)):  # nothing to observe
                value, error = _torch_load(checkpoint, mode, safe_globals, kwargs, expectation, path)
            else:
                with observe_serialization_warnings() as observed, watch_stdout(replaced and expectation.warns) as out:
                    value, error = _torch_load(checkpoint, mode, safe_globals, kwargs, expectation, path)
                warned, printed = observed.seen, out is not None and bool(FORCE_NO_NOTICE.search(out.copy.getvalue()))
        finally:
            if snapshot is not None:
                restore_registry(snapshot)
    result = _verify(expectation, value, error, warned, printed, registered)
    _drop_tracebacks(error)
    return result


def _drop_tracebacks(error: Optional[BaseException]) -> None:
    """Detach a judged rejection and its chain from their frames, which hold the result holding it (a cycle)."""
    seen: set[int] = set()
    stack: list[Optional[BaseException]] = [error]
    while stack:
        e = stack.pop()
        if e is not None and id(e) not in seen:  # each exception once, even in a cyclic chain
            seen.add(id(e))
            e.__traceback__ = None
            stack += (e.__cause__, e.__context__)


def _torch_load(
    checkpoint: Checkpoint, mode: LoadMode, safe_globals: Sequence, kwargs: dict, exp: Expectation, path: Optional[str]
) -> tuple[Any, Optional[BaseException]]:
    """The one ``torch.load`` call of *mode*: (value, None) or (None, torch's rejection).  Owned bytes go to
    ``torch.load`` as the process has it (a replacement is judged by its outcome); foreign ones to torch's own only."""
    torch_load = torch.load if checkpoint.owned else genuine("load")
    buf: Any = checkpoint.rewound() if path is None else path
    try:
        if mode is LoadMode.WEIGHTS_ONLY_FALSE:
            return torch_load(buf, weights_only=False, **kwargs), None
        if mode is LoadMode.SAFE_GLOBALS:
            with torch.serialization.safe_globals([sg.torch_entry for sg in safe_globals]):
                return torch_load(buf, weights_only=True, **kwargs), None
        if checkpoint.owned:
            return torch_load(buf, **kwargs), None
        return torch_load(buf, weights_only=True, **kwargs), None  # foreign bytes: the predicted call, explicit
    except pickle.UnpicklingError as e:
        return None, e
    except Warning:
        raise  # a warning the caller's filters turned into an error (-W error): theirs, as raised
    except Exception as e:  # noqa: BLE001 - reported as an unexpected outcome
        if exp.unknown or (not exp.loads and _is_error_type(e, exp.error_type)):
            return None, e  # predicted, not as UnpicklingError (torch 2.4/2.5's BUILD of a slotted class)
        raise UnexpectedLoadOutcome(
            f"{mode.value}: expected to be {'loaded' if exp.loads else 'rejected'} "
            f"({exp.reason}); torch.load raised {type(e).__name__}: {e}"
        ) from e


def _is_error_type(error: Optional[BaseException], type_name: str) -> bool:
    return error is not None and any(c.__name__ == type_name for c in type(error).__mro__)


def _names_a_cause(exp: Expectation, message: str) -> bool:
    """Whether the rejection names a predicted cause (torch stops at the first): its text, missing globals, opcodes."""
    if exp.rejection and exp.rejection in message:
        return True
    for name in exp.missing:  # torch's message drops the ``builtins.`` prefix
        if name in message or (name.startswith("builtins.") and f"GLOBAL {name[len('builtins.') :]} " in message):
            return True
    codes = {getattr(pickle, op)[0] for op in exp.unsupported_opcodes if hasattr(pickle, op)}
    return any(f"Unsupported operand {code}" in message for code in codes)


def _verify(
    exp: Expectation, value: Any, error: Optional[BaseException], warned: bool, printed: bool, registered: Sequence
) -> LoadResult:
    """Judge one load: as predicted, for a predicted cause (a replaced torch.load's warning is only recorded)."""
    loaded = error is None
    notes = replacement_notes(exp.warns, error, warned, printed, registered) if exp.replaced_by else ()
    problem: Optional[str] = None
    if exp.unknown:
        outcome = "loaded it" if loaded else f"rejected it:\n{error}"
        problem = f"cannot predict this load here ({exp.unknown}); torch {outcome}"
    elif exp.loads and not loaded:
        problem = f"expected to load ({exp.reason}); torch rejected it:\n{error}"
    elif not exp.loads and loaded:
        why = exp.summary(False).partition("(")[2].rstrip(")")
        problem = f"expected rejection ({why}); torch loaded it: unexpected success"
    elif not loaded and not _is_error_type(error, exp.error_type):
        problem = (
            f"rejected with {type(error).__name__}, but this torch is predicted to raise {exp.error_type} "
            f"({exp.rejection}):\n{error}"
        )
    elif not loaded and not isinstance(error, pickle.UnpicklingError) and str(error) != exp.rejection:
        # Raised through torch.load as it is (not worded by torch): the message is Python's, exactly.
        problem = f"rejected with {type(error).__name__} as predicted, but not saying {exp.rejection!r}:\n{error}"
    elif not loaded and not _names_a_cause(exp, str(error)):
        problem = (
            f"rejected, but the message names none of the predicted causes (globals {list(exp.missing)}, "
            f"opcodes {list(exp.unsupported_opcodes)}):\n{error}"
        )
    elif loaded and exp.warns != warned and not exp.replaced_by:
        did = "did" if warned else "did not"
        problem = f"expected torch {'to' if exp.warns else 'not to'} warn about {FORCE_NO_WO}; it {did}"
    if problem is not None:
        if exp.replaced_by:
            which = f" (which {'; '.join(notes)})" if notes else ""
            problem = (
                f"torch.load is replaced by {exp.replaced_by}{which}, and it did not do what torch's own "
                f"rules require: {problem}"
            )
        raise UnexpectedLoadOutcome(f"{exp.mode.value}: {problem}")
    return LoadResult(exp, loaded, value, error, notes, warned if exp.replaced_by and warned != exp.warns else None)


def round_trip(
    obj: Any, mode: LoadMode | str, safe_globals: Sequence[Any] = (), map_location: Any = None
) -> LoadResult:
    """``torch.save`` *obj* to memory and :func:`load` it back in *mode* (outside any test class)."""
    return load(Checkpoint.save(obj), mode, safe_globals, map_location)


def replacement_notes(
    torch_warns: bool, error: Optional[BaseException], warned: bool, printed: bool, registered: Sequence[tuple]
) -> tuple[str, ...]:
    """How a replaced ``torch.load`` reported differently from torch's own: facts, not verdicts."""
    notes = []
    if torch_warns and not warned and printed:
        notes.append(f"printed the {FORCE_NO_WO} notice instead of warning")
    elif torch_warns and not warned:
        notes.append(f"did not warn about {FORCE_NO_WO} (torch does)")
    elif warned and not torch_warns:
        notes.append(f"warned about {FORCE_NO_WO} where torch would not")
    if error is not None and not raiser(error).startswith(tuple(m + "." for m in TORCH_SERIALIZATION)):
        last = str(error).strip().splitlines()[-1] if str(error).strip() else ""
        ending = f", ending {last[:120]!r}" if last else ""
        notes.append(f"worded the rejection itself ({type(error).__name__} raised in {raiser(error)}{ending})")
    # torch registers some globals itself (2.14: the builtin exceptions); others (backends, user code) decide loads
    if foreign := [name for name, entry in registered if not registered_by_torch(entry)]:
        notes.append(f"runs with process-wide safe globals {', '.join(foreign)}")
    return tuple(notes)


@dataclass(frozen=True)
class PickleResult:
    value: Any
    #: The inner ``torch.load`` calls' effective ``weights_only`` (forced True by TORCH_FORCE_WEIGHTS_ONLY_LOAD).
    weights_only: bool
    summary: str


def pickle_round_trip(obj: Any, protocol: Optional[int] = None) -> PickleResult:
    """``pickle.loads(pickle.dumps(obj, protocol))``; the environment conflict raises
    ConflictingEnvironmentError first, any other difference from torch's decision UnexpectedLoadOutcome."""
    data = pickle.dumps(obj, protocol=protocol)
    if b"_load_from_bytes" not in data:  # no storage (torch.storage._load_from_bytes): torch.load is never called
        return PickleResult(pickle.loads(data), False, "pickle.loads: loaded as expected (no tensor storage in it)")
    decision = decide(LoadMode.WEIGHTS_ONLY_FALSE)  # the call torch.storage._load_from_bytes makes
    where = f"its storages through torch.load: {decision.reason}"
    with observe_serialization_warnings() as observed:
        try:
            value = pickle.loads(data)  # noqa: S301 - the bytes pickled on the line above
        except Warning:
            raise  # a warning the caller's filters turned into an error: theirs
        except Exception as e:  # noqa: BLE001 - reported with what torch was predicted to do
            raise UnexpectedLoadOutcome(
                f"pickle.loads: expected to load ({where}); it raised {type(e).__name__}: {e}"
            ) from e
    if observed.seen != decision.warns and decision.replaced_by is None:
        raise UnexpectedLoadOutcome(
            f"pickle.loads: expected torch {'to' if decision.warns else 'not to'} warn about {FORCE_NO_WO} "
            f"({where}); it {'did' if observed.seen else 'did not'}"
        )
    return PickleResult(value, decision.weights_only, f"pickle.loads: loaded as expected ({where})")
