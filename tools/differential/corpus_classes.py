"""The classes the differential corpus's checkpoints name (its saved objects are in :mod:`.corpus`).

They live in an importable module (``tools.differential.corpus_classes``), so a fresh process can
unpickle them with ``weights_only=False`` and name them in ``safe_globals``.
"""

from __future__ import annotations

import collections
import copyreg
import dataclasses
import enum
from typing import Any, NamedTuple

import torch


class Point(NamedTuple):
    x: int
    y: float


PlainPoint = collections.namedtuple("PlainPoint", "a b")


@dataclasses.dataclass
class Config:
    lr: float = 0.1
    steps: int = 3
    tags: list = dataclasses.field(default_factory=lambda: ["a"])


@dataclasses.dataclass(frozen=True)
class FrozenConfig:
    name: str = "frozen"
    scale: float = 2.0


class Color(enum.Enum):
    RED = 1
    GREEN = 2


class Level(enum.IntEnum):
    LOW = 1
    HIGH = 2


class Perm(enum.Flag):
    READ = 1
    WRITE = 2


class MyDict(dict):
    pass


class MyList(list):
    pass


class MyOrderedDict(collections.OrderedDict):
    pass


class MyTuple(tuple):
    pass


class MySet(set):
    pass


class MyTensor(torch.Tensor):
    """A plain tensor subclass (saved through _rebuild_from_type_v2)."""


class Slotted:
    __slots__ = ("a", "b")

    def __init__(self) -> None:
        self.a = 1
        self.b = torch.ones(2)

    def __eq__(self, other: Any) -> bool:
        return type(other) is Slotted and other.a == self.a


class WithState:
    def __init__(self) -> None:
        self.w = torch.arange(3.0)
        self.note = "state"

    def __getstate__(self) -> dict:
        return {"w": self.w, "note": self.note}

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)


class Reducer:
    """``__reduce_ex__`` returning a module-level callable and its arguments."""

    def __init__(self, value: int = 7) -> None:
        self.value = value

    def __reduce_ex__(self, protocol: int) -> Any:
        return (make_reducer, (self.value,))


def make_reducer(value: int) -> Reducer:
    return Reducer(value)


class CopyregThing:
    """Pickled through a ``copyreg.pickle`` registration."""

    def __init__(self, n: int = 3) -> None:
        self.n = n


def _reduce_copyreg_thing(obj: CopyregThing) -> Any:
    return (CopyregThing, (obj.n,))


copyreg.pickle(CopyregThing, _reduce_copyreg_thing)


class PlainObject:
    def __init__(self) -> None:
        self.t = torch.zeros(2)
        self.n = 1


class TinyModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 2)
        self.register_buffer("count", torch.tensor(1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x)


class ScriptableModule(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(2, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.lin(x))


def plain_function(x: int) -> int:
    return x + 1
