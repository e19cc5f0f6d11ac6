"""The saved objects of the differential corpus, by kind.

Every class a checkpoint names lives in :mod:`.corpus_classes`, an importable module, so a fresh
process can unpickle it with ``weights_only=False`` and name it in ``safe_globals``.
:func:`kinds` returns ``{kind name: factory}``; a factory that cannot run on this torch raises,
and the generator reports that kind as a visible skip, never a missing case.
"""

from __future__ import annotations

import collections
import functools
from typing import Any, Callable

import torch

from .corpus_classes import (
    Color,
    Config,
    CopyregThing,
    FrozenConfig,
    Level,
    MyDict,
    MyList,
    MyOrderedDict,
    MySet,
    MyTensor,
    MyTuple,
    Perm,
    PlainObject,
    PlainPoint,
    Point,
    Reducer,
    ScriptableModule,
    Slotted,
    TinyModule,
    WithState,
    plain_function,
)

# -- factories --------------------------------------------------------------------------------


def _dtype_tensor(dtype: torch.dtype) -> Callable[[], Any]:
    def make() -> Any:
        if dtype in (torch.qint8, torch.quint8, torch.qint32):
            return torch.quantize_per_tensor(
                torch.tensor([0.0, 1.0, 2.0]), 0.5, 1 if dtype is torch.quint8 else 0, dtype
            )
        if dtype in (torch.quint4x2, torch.quint2x4):
            return torch.quantize_per_tensor(torch.tensor([0.0, 1.0, 2.0, 3.0]), 1.0, 0, dtype)
        if dtype.is_floating_point or dtype.is_complex:
            return torch.arange(4, dtype=torch.float32).to(dtype)
        return torch.zeros(4, dtype=dtype)

    return make


def _all_dtypes() -> list[torch.dtype]:
    found = {getattr(torch, n) for n in dir(torch) if isinstance(getattr(torch, n, None), torch.dtype)}
    return sorted(found, key=str)


def _nested_jagged() -> Any:
    return torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)], layout=torch.jagged)


def _nested_strided() -> Any:
    return torch.nested.nested_tensor([torch.ones(2, 3), torch.ones(4, 3)])


def _per_channel() -> Any:
    return torch.quantize_per_channel(
        torch.arange(6.0).reshape(2, 3), torch.tensor([0.5, 1.0]), torch.tensor([0, 1]), 0, torch.qint8
    )


def _shared_storage() -> Any:
    base = torch.arange(6.0)
    return {"base": base, "view": base[2:], "t": base.view(2, 3).t()}


def _tensor_with_attr() -> Any:
    t = torch.ones(2)
    t.note = "extra"  # type: ignore[attr-defined]
    return t


def _named_tensor() -> Any:
    return torch.zeros(2, 3, names=("N", "C"))


def _sparse(layout: str) -> Callable[[], Any]:
    def make() -> Any:
        dense = torch.tensor([[0.0, 1.0, 0.0, 2.0], [3.0, 0.0, 0.0, 0.0]])
        if layout == "coo":
            return dense.to_sparse()
        if layout == "csr":
            return dense.to_sparse_csr()
        if layout == "csc":
            return dense.to_sparse_csc()
        if layout == "bsr":
            return dense.to_sparse_bsr((1, 2))
        return dense.to_sparse_bsc((1, 2))

    return make


def _linear_module() -> Any:
    torch.manual_seed(0)
    return torch.nn.Linear(3, 2)


def _quantized_linear() -> Any:
    from torch.ao.nn.quantized import Linear

    return Linear(3, 2)


def _quantized_conv() -> Any:
    from torch.ao.nn.quantized import Conv2d

    return Conv2d(1, 1, 1)


def _dynamic_quantized_linear() -> Any:
    from torch.ao.nn.quantized.dynamic import Linear

    return Linear(3, 2)


def _sparse_quantized_linear(engine: str = "qnnpack") -> Any:
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

    from torch_serial_testing import override_qengine

    with override_qengine(engine):
        w = torch.quantize_per_tensor(torch.tensor([[0.0, 0, 0, 0, 2, 2, 2, 2]] * 3), 2.0, 0, torch.qint8)
        lin = Linear(3, 8, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.full((3,), 1.0), 1, 4)
    return lin


def _optimizer(name: str) -> Callable[[], Any]:
    def make() -> Any:
        model = torch.nn.Linear(2, 1)
        opt = {
            "sgd": lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9),
            "adam": lambda p: torch.optim.Adam(p, lr=0.01),
            "adamw": lambda p: torch.optim.AdamW(p, lr=0.01),
        }[name](model.parameters())
        model(torch.ones(1, 2)).sum().backward()
        opt.step()
        return opt.state_dict()

    return make


def _scheduler(name: str) -> Callable[[], Any]:
    def make() -> Any:
        opt = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=0.1)
        sched = {
            "steplr": lambda o: torch.optim.lr_scheduler.StepLR(o, 2),
            "onecycle": lambda o: torch.optim.lr_scheduler.OneCycleLR(o, 1.0, total_steps=10),
            "cosine": lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(o, 5),
        }[name](opt)
        opt.step()
        sched.step()
        return sched.state_dict()

    return make


def _script_module() -> Any:
    return torch.jit.script(ScriptableModule())


def _traced_module() -> Any:
    return torch.jit.trace(ScriptableModule(), torch.ones(1, 2))


def _numpy(expr: str) -> Callable[[], Any]:
    def make() -> Any:
        import numpy as np

        return eval(expr, {"np": np})  # noqa: S307 - fixed expressions written in this file

    return make


def kinds() -> dict[str, Callable[[], Any]]:
    """Every kind of saved object, by a stable name."""
    out: dict[str, Callable[[], Any]] = {}
    for dtype in _all_dtypes():
        out[f"tensor_{str(dtype).replace('torch.', '')}"] = _dtype_tensor(dtype)
    out.update(
        {
            "tensor_scalar_0d": lambda: torch.tensor(3.5),
            "tensor_empty": lambda: torch.empty(0, 3),
            "tensor_noncontiguous": lambda: torch.arange(12.0).reshape(3, 4).t(),
            "tensor_requires_grad": lambda: torch.ones(2, requires_grad=True),
            "tensor_shared_storage": _shared_storage,
            "tensor_with_attribute": _tensor_with_attr,
            "tensor_named": _named_tensor,
            "tensor_meta": lambda: torch.empty(3, device="meta"),
            "tensor_conj": lambda: torch.tensor([1 + 2j]).conj(),
            "tensor_channels_last": lambda: torch.ones(1, 2, 2, 2).to(memory_format=torch.channels_last),
            "tensor_quantized_per_channel": _per_channel,
            "tensor_subclass": lambda: torch.ones(2).as_subclass(MyTensor),
            "sparse_coo": _sparse("coo"),
            "sparse_csr": _sparse("csr"),
            "sparse_csc": _sparse("csc"),
            "sparse_bsr": _sparse("bsr"),
            "sparse_bsc": _sparse("bsc"),
            "nested_strided": _nested_strided,
            "nested_jagged": _nested_jagged,
            "parameter": lambda: torch.nn.Parameter(torch.ones(2)),
            "parameter_no_grad": lambda: torch.nn.Parameter(torch.ones(2), requires_grad=False),
            "parameter_in_dict": lambda: {"w": torch.nn.Parameter(torch.ones(2))},
            "torch_size": lambda: torch.Size([2, 3]),
            "torch_dtype": lambda: torch.float16,
            "torch_dtypes_all": lambda: [d for d in _all_dtypes()],
            "torch_device": lambda: torch.device("cpu"),
            "torch_device_indexed": lambda: torch.device("cuda", 1),
            "torch_layout": lambda: torch.sparse_coo,
            "torch_memory_format": lambda: torch.channels_last,
            "torch_qscheme": lambda: torch.per_tensor_affine,
            "generator_state": lambda: torch.Generator().manual_seed(1).get_state(),
            "generator": lambda: torch.Generator().manual_seed(1),
            "rng_state": lambda: torch.get_rng_state(),
            # builtins and containers
            "none": lambda: None,
            "bool": lambda: True,
            "int": lambda: 3,
            "int_big": lambda: 2**100,
            "int_negative": lambda: -(2**40),
            "float": lambda: 1.5,
            "float_nan": lambda: float("nan"),
            "complex": lambda: 1 + 2j,
            "str": lambda: "text",
            "str_unicode": lambda: "\u00e9\u4e2d\U0001f600",
            "bytes": lambda: b"\x00\x01raw",
            "bytearray": lambda: bytearray(b"abc"),
            "slice": lambda: slice(1, 5, 2),
            "range": lambda: range(3),
            "ellipsis": lambda: Ellipsis,
            "list": lambda: [1, 2.0, "x", torch.ones(1)],
            "list_empty": lambda: [],
            "tuple": lambda: (1, torch.ones(1)),
            "tuple_empty": lambda: (),
            "tuple_nested": lambda: ((1, (2, (3,))),),
            "dict": lambda: {"a": 1, "t": torch.ones(1)},
            "dict_int_keys": lambda: {1: "a", 2: "b"},
            "dict_tensor_values_many": lambda: {f"k{i}": torch.full((2,), float(i)) for i in range(20)},
            "set": lambda: {1, 2, 3},
            "frozenset": lambda: frozenset({1, 2}),
            "ordered_dict": lambda: collections.OrderedDict(a=1, b=torch.ones(1)),
            "ordered_dict_empty": lambda: collections.OrderedDict(),
            "defaultdict": lambda: collections.defaultdict(list, {"a": [1]}),
            "defaultdict_empty": lambda: collections.defaultdict(int),
            "deque": lambda: collections.deque([1, 2, 3]),
            "deque_empty": lambda: collections.deque(),
            "counter": lambda: collections.Counter("aab"),
            "chain_map": lambda: collections.ChainMap({"a": 1}),
            "dict_subclass": lambda: MyDict(a=1),
            "dict_subclass_empty": lambda: MyDict(),
            "list_subclass": lambda: MyList([1, 2]),
            "list_subclass_empty": lambda: MyList(),
            "ordered_dict_subclass": lambda: MyOrderedDict(a=1),
            "tuple_subclass": lambda: MyTuple((1, 2)),
            "set_subclass": lambda: MySet({1}),
            "namedtuple_typing": lambda: Point(1, 2.0),
            "namedtuple_collections": lambda: PlainPoint(1, torch.ones(1)),
            "dataclass": lambda: Config(),
            "dataclass_frozen": lambda: FrozenConfig(),
            "enum": lambda: Color.GREEN,
            "int_enum": lambda: Level.HIGH,
            "flag_enum": lambda: Perm.READ | Perm.WRITE,
            "enum_in_dict": lambda: {"color": Color.RED, "t": torch.ones(1)},
            "recursive_list": _recursive_list,
            "shared_reference": lambda: (lambda x: [x, x])({"k": torch.ones(1)}),
            # objects with their own pickling
            "object_plain": PlainObject,
            "object_slots": Slotted,
            "object_getstate": WithState,
            "object_reduce_ex": lambda: Reducer(),
            "object_copyreg": lambda: CopyregThing(),
            "function": lambda: plain_function,
            "class_reference": lambda: Config,
            "builtin_function": lambda: len,
            "functools_partial": lambda: functools.partial(plain_function, 1),
            # numpy
            "numpy_array_float64": _numpy("np.arange(3.0)"),
            "numpy_array_float32": _numpy("np.arange(3, dtype=np.float32)"),
            "numpy_array_float16": _numpy("np.arange(3, dtype=np.float16)"),
            "numpy_array_int64": _numpy("np.arange(3, dtype=np.int64)"),
            "numpy_array_int32": _numpy("np.arange(3, dtype=np.int32)"),
            "numpy_array_uint8": _numpy("np.arange(3, dtype=np.uint8)"),
            "numpy_array_bool": _numpy("np.array([True, False])"),
            "numpy_array_complex": _numpy("np.array([1 + 2j])"),
            "numpy_array_2d": _numpy("np.ones((2, 3))"),
            "numpy_array_empty": _numpy("np.empty((0,))"),
            "numpy_array_structured": _numpy("np.zeros(2, dtype=[('a', 'i4'), ('b', 'f8')])"),
            "numpy_array_object": _numpy("np.array([1, 'a'], dtype=object)"),
            "numpy_scalar_float64": _numpy("np.float64(1.5)"),
            "numpy_scalar_float32": _numpy("np.float32(1.5)"),
            "numpy_scalar_int64": _numpy("np.int64(3)"),
            "numpy_scalar_int32": _numpy("np.int32(3)"),
            "numpy_scalar_bool": _numpy("np.bool_(True)"),
            "numpy_dtype_float64": _numpy("np.dtype('float64')"),
            "numpy_dtype_int32": _numpy("np.dtype('int32')"),
            "numpy_dtype_structured": _numpy("np.dtype([('a', 'i4')])"),
            "numpy_in_dict": _numpy("{'arr': np.arange(2.0), 'step': np.int64(1)}"),
            # modules
            "module_linear": _linear_module,
            "module_linear_state_dict": lambda: _linear_module().state_dict(),
            "module_conv2d": lambda: torch.nn.Conv2d(1, 2, 3),
            "module_batchnorm": lambda: torch.nn.BatchNorm1d(3),
            "module_batchnorm_state_dict": lambda: torch.nn.BatchNorm1d(3).state_dict(),
            "module_embedding": lambda: torch.nn.Embedding(4, 2),
            "module_lstm": lambda: torch.nn.LSTM(2, 3),
            "module_lstm_state_dict": lambda: torch.nn.LSTM(2, 3).state_dict(),
            "module_sequential": lambda: torch.nn.Sequential(torch.nn.Linear(2, 2), torch.nn.ReLU()),
            "module_custom": TinyModule,
            "module_custom_state_dict": lambda: TinyModule().state_dict(),
            "module_quantized_linear": _quantized_linear,
            "module_quantized_linear_state_dict": lambda: _quantized_linear().state_dict(),
            "module_quantized_conv2d": _quantized_conv,
            "module_dynamic_quantized_linear": _dynamic_quantized_linear,
            "module_sparse_quantized_linear": _sparse_quantized_linear,
            "module_sparse_quantized_linear_state_dict": lambda: _sparse_quantized_linear().state_dict(),
            "module_sparse_quantized_linear_fbgemm": lambda: _sparse_quantized_linear("fbgemm"),
            "optimizer_sgd_state_dict": _optimizer("sgd"),
            "optimizer_adam_state_dict": _optimizer("adam"),
            "optimizer_adamw_state_dict": _optimizer("adamw"),
            "scheduler_steplr_state_dict": _scheduler("steplr"),
            "scheduler_onecycle_state_dict": _scheduler("onecycle"),
            "scheduler_cosine_state_dict": _scheduler("cosine"),
            "training_checkpoint": _training_checkpoint,
            "script_module": _script_module,
            "traced_module": _traced_module,
        }
    )
    return out


#: Kinds that are TorchScript modules (also saved with torch.jit.save).
SCRIPT_KINDS = frozenset({"script_module", "traced_module"})

#: The quantized engine a kind's packed parameters need at load time (torch cannot unpack sparse
#: packed params under another engine: "Unknown qengine"); the workers load these under it, as the
#: flagship test does with override_qengine.
LOAD_QENGINE = {
    "module_sparse_quantized_linear": "qnnpack",
    "module_sparse_quantized_linear_state_dict": "qnnpack",
    "module_sparse_quantized_linear_fbgemm": "fbgemm",
}


def _recursive_list() -> Any:
    x: list = [1]
    x.append(x)
    return x


def _training_checkpoint() -> Any:
    model = TinyModule()
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    model(torch.ones(1, 3)).sum().backward()
    opt.step()
    return {"epoch": 3, "model": model.state_dict(), "optim": opt.state_dict(), "rng": torch.get_rng_state()}
