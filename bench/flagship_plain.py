"""The flagship's tests written with plain torch: the benchmark's measure of the library's share.

``bench/run.py`` compares the flagship file (``test/ao/sparsity/test_qlinear_packed_params.py``)
with an empty pytorch test file, as issue 16 asks.  That difference also holds the tests' own
torch work (44 saves, 42 loads, building and running the modules) and pytorch's per-test cost
(20 tests against 1).  This file does that same work without the library, so the flagship's
time over *this* file is what the library adds:

* the same 20 tests (engine x mode, cross-engine, state_dict, and the two facts), on
  pytorch's ``TestCase``;
* the same module builders, weight cases and checks: taken from the flagship file's own text
  (its constants and functions, and the three ``check_*`` methods), not written a second time;
* the same save / load calls per mode, with the outcome a hand-written test would hard-code
  for its torch (the default mode rejects the full module from torch 2.6);
* exact comparisons (``torch.equal`` and ``==``), as cheap as a test can make them.

It is a benchmark fixture, not part of the suite: ``python -m unittest flagship_plain`` from
``bench/``.  After its tests it checks that the library was never imported.
"""

from __future__ import annotations

import ast
import io
import os
import pickle
import sys
import unittest
import warnings
from typing import Any

import functools

import torch
from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
from torch.ao.nn.sparse.quantized.linear import LinearPackedParams
from torch.testing._internal.common_utils import TestCase

FLAGSHIP = os.path.join(
    os.path.dirname(os.path.abspath(__file__)), os.pardir, "test", "ao", "sparsity", "test_qlinear_packed_params.py"
)
# What is taken from the flagship file: its module-level data and builders, and the checks its
# test class runs on the modules as built.
FLAGSHIP_NAMES = {
    "ROW_BLOCK_SIZE",
    "COL_BLOCK_SIZE",
    "DTYPE",
    "ENGINES",
    "SMALL_WEIGHT_ROWS",
    "SCALES",
    "CROSS_SCALES",
    "WIDE_IN_FEATURES",
    "PACKED_WEIGHT_OFFSET",
    "ROW_BLOCK_INDICES_POS",
    "COL_BLOCK_INDICES_POS",
    "small_weight_fp32",
    "wide_weight_fp32",
    "zero_points_for",
    "weight_cases",
    "_weight_cases",
    "make_linear",
    "packed_state",
    "make_packed_params",
    "with_int32_block_indices",
    "QUANTIZED_CREATION_DEPRECATION",
}
FLAGSHIP_CHECKS = {"check_packed_state", "check_unpacked", "check_same_output"}


def _from_flagship() -> tuple[dict[str, Any], dict[str, Any]]:
    """(module-level names, check methods) defined by the flagship file's own statements."""
    with open(FLAGSHIP, encoding="utf-8") as fh:
        tree = ast.parse(fh.read(), FLAGSHIP)

    def defines(node: ast.stmt) -> set[str]:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            return {node.name}
        if isinstance(node, ast.Assign):
            return {t.id for t in node.targets if isinstance(t, ast.Name)}
        return set()

    namespace: dict[str, Any] = {
        "torch": torch,
        "functools": functools,
        "Linear": Linear,
        "LinearPackedParams": LinearPackedParams,
    }
    body = [node for node in tree.body if defines(node) & FLAGSHIP_NAMES]
    test_class = next(
        node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "TestQlinearPackedParams"
    )
    checks = [node for node in test_class.body if isinstance(node, ast.FunctionDef) and node.name in FLAGSHIP_CHECKS]
    exec(compile(ast.Module(body=body + checks, type_ignores=[]), FLAGSHIP, "exec"), namespace)  # noqa: S102
    missing = (FLAGSHIP_NAMES | FLAGSHIP_CHECKS) - set(namespace)
    if missing:
        raise RuntimeError(f"{FLAGSHIP} no longer defines {sorted(missing)}: update bench/flagship_plain.py")
    return {k: namespace[k] for k in FLAGSHIP_NAMES}, {k: namespace[k] for k in FLAGSHIP_CHECKS}


F, CHECKS = _from_flagship()
ROW_BLOCK_SIZE, COL_BLOCK_SIZE, DTYPE = F["ROW_BLOCK_SIZE"], F["COL_BLOCK_SIZE"], F["DTYPE"]
ENGINES, CROSS_SCALES = F["ENGINES"], F["CROSS_SCALES"]
QUANTIZED_CREATION_DEPRECATION = F["QUANTIZED_CREATION_DEPRECATION"]

MODES = ("weights_only_false", "safe_globals", "default")
# A hand-written test knows its torch: from 2.6 the bare torch.load is weights-only and rejects
# the full module (its classes are not allowlisted); before 2.6 the allowlist lacks builtins.set.
DEFAULT_REJECTS_MODULE = tuple(int(x) for x in torch.__version__.split(".")[:2]) >= (2, 6)
SAFE_GLOBALS = [Linear, LinearPackedParams, torch.ScriptObject] + ([] if DEFAULT_REJECTS_MODULE else [set])


def save(obj: Any) -> io.BytesIO:
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return buf


class engine:  # noqa: N801 - a context manager used like a function
    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        self.previous = torch.backends.quantized.engine
        torch.backends.quantized.engine = self.name

    def __exit__(self, *exc: Any) -> None:
        torch.backends.quantized.engine = self.previous


class TestQlinearPackedParamsPlain(TestCase):
    qengine = None

    check_packed_state = CHECKS["check_packed_state"]
    check_unpacked = CHECKS["check_unpacked"]
    check_same_output = CHECKS["check_same_output"]

    def run(self, result: Any = None) -> Any:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", QUANTIZED_CREATION_DEPRECATION)
            return super().run(result)

    def assertRoundTripEqual(self, expected: Any, actual: Any) -> None:  # noqa: N802
        """Exact: types, then tensors with torch.equal, sequences item by item, the rest with ==."""
        self.assertIs(type(actual), type(expected))
        if isinstance(expected, torch.Tensor):
            self.assertTrue(
                expected.dtype == actual.dtype and expected.shape == actual.shape and torch.equal(expected, actual)
            )
        elif isinstance(expected, (tuple, list)):
            self.assertEqual(len(actual), len(expected))
            for e, a in zip(expected, actual):
                self.assertRoundTripEqual(e, a)
        else:
            self.assertTrue(expected == actual)

    def load(self, buf: io.BytesIO, mode: str, safe_globals: list[Any]) -> Any:
        if mode == "weights_only_false":
            return torch.load(buf, weights_only=False)
        if mode == "safe_globals":
            with torch.serialization.safe_globals(safe_globals):
                return torch.load(buf, weights_only=True)
        return torch.load(buf)

    def load_module(self, buf: io.BytesIO, mode: str) -> Any:
        """The full module back, or None where torch rejects it (checked): the case ends there."""
        if mode == "default" and DEFAULT_REJECTS_MODULE:
            with self.assertRaisesRegex(pickle.UnpicklingError, "Unsupported global"):
                torch.load(buf)
            return None
        return self.load(buf, mode, SAFE_GLOBALS)

    def packed_params(self, mode: str) -> None:
        zero_points = F["zero_points_for"](self.qengine)
        with engine(self.qengine):
            for name, (weight, per_tensor, rows, cols, weights) in F["weight_cases"](zero_points).items():
                with self.subTest(case=name):
                    lin, bias = F["make_linear"](weight)
                    serialized = F["packed_state"](lin)
                    self.check_packed_state(serialized, bias, weight, zero_points, per_tensor, rows, cols, weights)
                    self.check_unpacked(lin, bias, weight)
                    lin2 = self.load_module(save(lin), mode)
                    if lin2 is None:
                        continue
                    self.assertIsInstance(lin2, Linear)
                    self.assertRoundTripEqual(lin._weight_bias(), lin2._weight_bias())
                    self.assertRoundTripEqual(serialized, F["packed_state"](lin2))
                    self.check_same_output(lin, lin2, weight.shape[1])

    def cross_compatibility(self, save_engine: str, load_engine: str, mode: str) -> None:
        with engine(save_engine):
            weight = torch.quantize_per_tensor(F["small_weight_fp32"](), CROSS_SCALES[0], 0, DTYPE)
            lin, _ = F["make_linear"](weight)
            before = (F["with_int32_block_indices"](F["packed_state"](lin)), lin._weight_bias())
            buf = save(lin)
        with engine(load_engine):
            lin2 = self.load_module(buf, mode)
            if lin2 is None:
                return
            self.assertIsInstance(lin2, Linear)
            after = (F["with_int32_block_indices"](F["packed_state"](lin2)), lin2._weight_bias())
        self.assertRoundTripEqual(before, after)

    def state_dict(self, mode: str) -> None:
        zero_points = F["zero_points_for"](self.qengine)
        with engine(self.qengine):
            for name, (weight, *_rest) in F["weight_cases"](zero_points).items():
                with self.subTest(case=name):
                    lin, _ = F["make_linear"](weight)
                    serialized = F["packed_state"](lin)
                    state = self.load(save(lin._packed_params.state_dict()), mode, [])
                    params2 = F["make_packed_params"]()
                    params2.load_state_dict(state)
                    self.assertRoundTripEqual(lin._packed_params._weight_bias(), params2._weight_bias())
                    self.assertRoundTripEqual(serialized, params2._packed_params.__getstate__())
                    if self.qengine == "qnnpack":
                        lin2, _ = F["make_linear"](weight)
                        lin2._packed_params = params2
                        self.check_same_output(lin, lin2, weight.shape[1])

    def test_required_globals(self) -> None:
        # By hand: the three globals suffice for a weights-only load under each engine.
        for name in ENGINES:
            with engine(name):
                weight = F["weight_cases"](F["zero_points_for"](name))["per_tensor_small"][0]
                self.assertIsInstance(
                    self.load(save(F["make_linear"](weight)[0]), "safe_globals", SAFE_GLOBALS), Linear
                )

    def test_full_module_state_dict_load_is_broken_in_torch(self) -> None:
        for name in ENGINES:
            with self.subTest(engine=name), engine(name):
                weight = F["weight_cases"](F["zero_points_for"](name))["per_tensor_small"][0]
                lin = F["make_linear"](weight)[0]
                fresh = Linear(
                    out_features=lin.out_features,
                    in_features=lin.in_features,
                    row_block_size=ROW_BLOCK_SIZE,
                    col_block_size=COL_BLOCK_SIZE,
                    bias=True,
                    dtype=DTYPE,
                )
                with self.assertRaisesRegex(
                    ValueError, r"^invalid literal for int\(\) with base 10: 'sparse_dynamic'$"
                ):
                    fresh.load_state_dict(lin.state_dict())


def tearDownModule() -> None:  # noqa: N802 - unittest's name
    if "torch_serial_testing" in sys.modules:
        raise AssertionError("the plain twin imported torch_serial_testing: it would not measure plain torch")


def _generate() -> None:
    """The flagship's generated tests, by the same names: engine x mode, and cross-engine x mode."""

    def make(method: str, *args: Any, qengine: Any = None) -> Any:
        def test(self: TestQlinearPackedParamsPlain) -> None:
            self.qengine = qengine
            getattr(self, method)(*args)

        return test

    for mode in MODES:
        for name in ENGINES:
            setattr(
                TestQlinearPackedParamsPlain,
                f"test_qlinear_packed_params_{name}_{mode}_cpu",
                make("packed_params", mode, qengine=name),
            )
            setattr(
                TestQlinearPackedParamsPlain,
                f"test_qlinear_packed_params_state_dict_{name}_{mode}_cpu",
                make("state_dict", mode, qengine=name),
            )
        for a, b in ((ENGINES[0], ENGINES[1]), (ENGINES[1], ENGINES[0])):
            setattr(
                TestQlinearPackedParamsPlain,
                f"test_qlinear_packed_params_cross_compatibility_{a}_to_{b}_{mode}_cpu",
                make("cross_compatibility", a, b, mode, qengine=b),
            )


_generate()

if __name__ == "__main__":
    unittest.main()
