#!/usr/bin/env python3
# Owner(s): ["oncall: mobile"]
"""Serialization of the sparse dynamic quantized ``Linear``'s packed params.

A port of pytorch's ``test/ao/sparsity/test_qlinear_packed_params.py`` to
``torch_serial_testing``.  The module is
``torch.ao.nn.sparse.quantized.dynamic.linear.Linear`` (row block 1, column
block 4, qint8) whose weights live in the TorchScript object held by
``torch.ao.nn.sparse.quantized.linear.LinearPackedParams``.

Upstream saved the whole module and reloaded it with a bare ``torch.load``,
which has been weights-only since torch 2.6 and rejects this checkpoint (its
module classes and ``torch.ScriptObject`` are not allowlisted).  Here every
save/load goes through the mixin, once per load mode (``weights_only_false``,
``safe_globals``, ``default``) and quantized engine, and each generated test
asserts what torch should do in the current environment: where the load
should be rejected the test checks that it was, for that reason, and passes
saying so; where it should load, every upstream check runs on the copy.

Which generated tests cover which upstream test (``<mode>`` is one of
``weights_only_false``, ``safe_globals``, ``default``)::

    generated test id (in TestQlinearPackedParamsCPU)                upstream test
    ---------------------------------------------------------------  -----------------------------------------------------------
    test_qlinear_packed_params_fbgemm_<mode>_cpu                     test_qlinear_packed_params_fbgemm
    test_qlinear_packed_params_qnnpack_<mode>_cpu                    test_qlinear_packed_params_qnnpack
    test_qlinear_packed_params_cross_compatibility_fbgemm_to_qnnpack_<mode>_cpu
                                                                     test_qlinear_packed_params_fbgemm_qnnpack_cross_compatibility
                                                                     (fbgemm -> qnnpack half)
    test_qlinear_packed_params_cross_compatibility_qnnpack_to_fbgemm_<mode>_cpu
                                                                     test_qlinear_packed_params_fbgemm_qnnpack_cross_compatibility
                                                                     (qnnpack -> fbgemm half)
    test_qlinear_packed_params_state_dict_{fbgemm,qnnpack}_<mode>_cpu  new: the state_dict() form (see below)
    TestQlinearPackedParamsCheckpointFacts.test_required_globals    new: golden list of the globals the checkpoint needs
    TestQlinearPackedParamsCheckpointFacts.test_full_module_state_dict_load_is_broken_in_torch
                                                                     new: pins a torch bug (see below)

The last two never load, so they live in a plain class with no load-mode, engine or device
dimension: one test each, run under every device filter (as the original file's tests were).

Which globals: on torch >= 2.6 the full-module checkpoint needs exactly
``Linear``, ``LinearPackedParams`` and ``torch.ScriptObject`` beyond torch's
allowlist, and that is what ``safe_globals`` declares.  Before torch 2.6 the
allowlist lacks ``builtins.set`` too (every module's
``_non_persistent_buffers_set``), so there -- and only there, decided from
torch's allowlist, not its version -- ``set`` is declared as well.
``test_required_globals`` pins the three as a golden record on every torch and
checks the ``set`` part against the running torch's allowlist.

The three weight cases of upstream's loop (``per_tensor_small``,
``per_channel_small``, ``per_tensor_large``) are subtests, ``case=<name>``.

The ``state_dict()`` form is round-tripped on the ``LinearPackedParams``
submodule: loading ``Linear.state_dict()`` into a ``Linear`` fails in torch
itself, without any serialization (its ``_load_from_state_dict`` does
``int(op_type)`` on the string ``'sparse_dynamic'``).
``test_full_module_state_dict_load_is_broken_in_torch`` asserts that failure,
so it fails as soon as torch fixes it.

Run: ``python -m unittest test_qlinear_packed_params -v`` from this directory
(as the seed report did), ``python -m unittest test.ao.sparsity.test_qlinear_packed_params -v``
or ``pytest test/ao/sparsity/test_qlinear_packed_params.py`` (``-n 2`` works) from the project
root, or ``python test_qlinear_packed_params.py``.
"""

import functools
import os
import sys
import unittest

import torch

# Make the helper files in test/ importable (pytorch's idiom for test subfolders, one dirname per
# folder level; inserted first so the torch_serial_testing vendored there wins under every runner)
pytorch_test_dir = os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__))))
if pytorch_test_dir not in sys.path:
    sys.path.insert(0, pytorch_test_dir)

try:
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear
    from torch.ao.nn.sparse.quantized.linear import LinearPackedParams
except ImportError as e:  # a torch without sparse quantization: every test skips, saying why
    Linear = LinearPackedParams = None
    SPARSE_MISSING = f"this torch has no torch.ao.nn.sparse quantized Linear ({e})"
else:
    SPARSE_MISSING = None

from torch_serial_testing import (
    SerializationRoundTripTestCase,
    cross_engine,
    instantiate_round_trip_tests,
    override_qengine,
    qualified_name,
    supported_qengines,
)
from torch_serial_testing.registry import torch_allowlist

try:  # what upstream test files use; plain unittest when it cannot be imported
    from torch.testing._internal.common_utils import TestCase, run_tests
except ImportError:  # pragma: no cover - torch without its internal testing helpers
    from unittest import TestCase

    run_tests = unittest.main


ROW_BLOCK_SIZE = 1
COL_BLOCK_SIZE = 4
DTYPE = torch.qint8
ENGINES = ("fbgemm", "qnnpack")
CASE_NAMES = ("per_tensor_small", "per_channel_small", "per_tensor_large")

# The index and weight layout below is the CSR example from
# https://pytorch.org/docs/stable/sparse.html#csr-tensor-operations, with
# 1x4 blocks and scaled rows (as upstream).
SMALL_WEIGHT_ROWS = (
    [0] * 8 + [2] * 4 + [0] * 4,
    [6] * 4 + [12] * 4 + [0] * 8,
    [0] * 16,
)
SCALES = (2.0, 6.0, 12.0)
CROSS_SCALES = (2.0, 3.0, 7.0)
WIDE_IN_FEATURES = 4008  # wider than fbgemm's 4000-column tile
# In the packed state, int8 weights are stored shifted by +128 (as uint8).
PACKED_WEIGHT_OFFSET = 128

# Globals every nn.Module checkpoint uses that torch's allowlist covers only on some versions:
# builtins.set (nn.Module._non_persistent_buffers_set) joined it in torch 2.6.  The ones the
# running torch's allowlist lacks are needed beyond the golden record below (empty on >= 2.6).
VERSION_DEPENDENT_GLOBALS = frozenset({"builtins.set"}) - torch_allowlist()

# torch 2.13 deprecates creating quantized tensors (pytorch issue 184982); these tests do it on
# purpose, so that warning is ignored during them.  Every other warning shows exactly as without
# the library: torch's own from saving and loading (TypedStorage, once per process) included.
QUANTIZED_CREATION_DEPRECATION = r".*quantized tensor creation functions.*"

# The sparse dynamic quantized Linear runs only on the CPU: fbgemm/qnnpack kernels and packed
# params held in a TorchScript object; a device class (npu, cuda) skips every test with this reason.
CPU_ONLY = (
    "the sparse quantized Linear is a CPU-only module (fbgemm/qnnpack kernels, packed params in a "
    "TorchScript object); its round trips run in TestQlinearPackedParamsCPU"
)

# Positions in the first element of LinearPackedParamsBase.__getstate__().
ROW_BLOCK_INDICES_POS = 7
COL_BLOCK_INDICES_POS = 8


def small_weight_fp32():
    return torch.tensor(SMALL_WEIGHT_ROWS, dtype=torch.float32)


def wide_weight_fp32():
    weight = torch.zeros(3, WIDE_IN_FEATURES)
    weight[0, 0] = 4
    weight[0, 4004] = 6
    weight[1, 0] = 8
    return weight


def zero_points_for(engine):
    """Non-zero zero points only where the engine supports them (qnnpack)."""
    nonzero = engine == "qnnpack"
    return [i + 1 if nonzero else 0 for i in range(len(SCALES))]


def weight_cases(zero_points):
    """Upstream's three cases: name -> (weight, per_tensor, row idx, col idx, packed int8 weights).

    Built once per set of zero points and shared read-only by every generated test: creating a
    quantized tensor costs torch ~10 ms, and the cases do not depend on the mode or engine.
    """
    return _weight_cases(tuple(zero_points))


@functools.cache
def _weight_cases(zero_points):
    nz = any(zero_points)
    small = small_weight_fp32()
    return {
        "per_tensor_small": (
            torch.quantize_per_tensor(small, SCALES[0], zero_points[0], DTYPE),
            True,
            [0, 1, 3, 3],
            [2, 0, 1],
            [v + (1 if nz else 0) for v in [1, 1, 1, 1, 3, 3, 3, 3, 6, 6, 6, 6]],
        ),
        "per_channel_small": (
            torch.quantize_per_channel(
                small, torch.tensor(SCALES), torch.tensor(zero_points, dtype=torch.int), 0, DTYPE
            ),
            False,
            [0, 1, 3, 3],
            [2, 0, 1],
            [v + ((1, 2, 2)[i // 4] if nz else 0) for i, v in enumerate([1] * 8 + [2] * 4)],
        ),
        "per_tensor_large": (
            torch.quantize_per_tensor(wide_weight_fp32(), SCALES[0], zero_points[0], DTYPE),
            True,
            [0, 2, 3, 3],
            [0, 1001, 0],
            [v + (1 if nz else 0) for v in [2, 0, 0, 0, 3, 0, 0, 0, 4, 0, 0, 0]],
        ),
    }


def make_linear(weight):
    """A sparse dynamic quantized Linear holding *weight* and a bias of ones."""
    out_features, in_features = weight.shape
    lin = Linear(
        out_features=out_features,
        in_features=in_features,
        row_block_size=ROW_BLOCK_SIZE,
        col_block_size=COL_BLOCK_SIZE,
        bias=True,
        dtype=DTYPE,
    )
    bias = torch.ones(out_features)
    lin.set_weight_bias(weight, bias, ROW_BLOCK_SIZE, COL_BLOCK_SIZE)
    return lin, bias


def packed_state(lin):
    """The TorchScript packed-params object's ``__getstate__()`` (upstream's ``serialized``)."""
    return lin._packed_params._packed_params.__getstate__()


def make_packed_params():
    return LinearPackedParams(row_block_size=ROW_BLOCK_SIZE, col_block_size=COL_BLOCK_SIZE, dtype=DTYPE)


def with_int32_block_indices(state):
    """fbgemm packs block indices as int32, qnnpack as int8: compare them as int32."""
    fields, class_name = state
    fields = tuple(
        v.to(torch.int32) if i in (ROW_BLOCK_INDICES_POS, COL_BLOCK_INDICES_POS) else v for i, v in enumerate(fields)
    )
    return fields, class_name


@unittest.skipIf(SPARSE_MISSING, SPARSE_MISSING)
class TestQlinearPackedParams(SerializationRoundTripTestCase, TestCase):
    qengines = ENGINES
    # Every available device type, as pytorch's device tests; the module is CPU-only, so the
    # classes of other devices (TestQlinearPackedParamsNPU with torch_npu) skip saying so.
    devices = None
    ignore_warnings = (QUANTIZED_CREATION_DEPRECATION,)
    # Exactly these three on torch >= 2.6.  Where torch's allowlist lacks builtins.set (< 2.6),
    # set is declared too: the checkpoint needs it there (see VERSION_DEPENDENT_GLOBALS).
    safe_globals = (
        ()
        if SPARSE_MISSING
        else ((Linear, LinearPackedParams, torch.ScriptObject) + ((set,) if VERSION_DEPENDENT_GLOBALS else ()))
    )

    # -- upstream's checks, on the module as built -----------------------------------

    # Upstream compared these with pytorch's assertEqual; here every value is compared exactly with
    # assertRoundTripEqual (type included: the packed ints, the flag, the lists from .tolist()).
    # Exact is at least as strict as assertEqual's float tolerance, and pytorch's assertEqual
    # costs about 0.1 ms per call even on two ints -- more than a round trip of this module.

    def check_packed_state(self, state, bias, weight, zero_points, per_tensor, rows, cols, weights):
        """*state* is ``packed_state(lin)`` of the module as built."""
        (
            _version,
            bias_,
            out_block,
            in_block,
            weight_scales_,
            weight_zero_points_,
            quantization_scheme_,
            row_block_indices_,
            col_block_indices_,
            weights_,
            output_channels_,
            input_channels_,
        ) = state[0]
        self.assertRoundTripEqual(bias, bias_)
        self.assertRoundTripEqual(out_block, ROW_BLOCK_SIZE)
        self.assertRoundTripEqual(in_block, COL_BLOCK_SIZE)
        self.assertRoundTripEqual(weight_scales_.tolist(), [SCALES[0]] if per_tensor else list(SCALES))
        self.assertRoundTripEqual(weight_zero_points_.tolist(), [zero_points[0]] if per_tensor else zero_points)
        self.assertRoundTripEqual(quantization_scheme_, per_tensor)
        self.assertRoundTripEqual(row_block_indices_.tolist(), rows)
        self.assertRoundTripEqual(col_block_indices_.tolist(), cols)
        self.assertRoundTripEqual(weights_.tolist(), [v + PACKED_WEIGHT_OFFSET for v in weights])
        self.assertRoundTripEqual(output_channels_, weight.shape[0])
        self.assertRoundTripEqual(input_channels_, weight.shape[1])

    def check_unpacked(self, lin, bias, weight):
        weight_, bias_, out_block, in_block = lin._weight_bias()
        self.assertRoundTripEqual(torch.dequantize(weight), torch.dequantize(weight_))
        self.assertRoundTripEqual(bias, bias_)
        self.assertRoundTripEqual(out_block, ROW_BLOCK_SIZE)
        self.assertRoundTripEqual(in_block, COL_BLOCK_SIZE)

    def check_same_output(self, lin, lin2, in_features):
        """Upstream compares outputs under qnnpack only: fbgemm has no sparse dynamic kernel."""
        if self.qengine != "qnnpack":
            return
        x = torch.rand(1, in_features)
        self.assertRoundTripEqual(lin(x), lin2(x))

    # -- tests --------------------------------------------------------------------------

    # Random inputs come from the generator pytorch's TestCase.setUp seeds before every test (upstream
    # seeded once more with torch.manual_seed(0), which also seeds every lazily initialized
    # accelerator generator: about a millisecond per call on a machine without them).

    def test_qlinear_packed_params(self, device):
        """Packed state, unpacking and a full-module round trip, for each weight case."""
        if device != "cpu":
            self.skipTest(CPU_ONLY)
        zero_points = zero_points_for(self.qengine)
        for name, (weight, per_tensor, rows, cols, weights) in weight_cases(zero_points).items():
            with self.subTest(case=name):
                lin, bias = make_linear(weight)
                serialized = packed_state(lin)
                self.check_packed_state(serialized, bias, weight, zero_points, per_tensor, rows, cols, weights)
                self.check_unpacked(lin, bias, weight)

                lin2 = self.round_trip(lin)  # an expected rejection ends this subtest here, as a pass
                self.assertIsInstance(lin2, Linear)
                self.assertRoundTripEqual(lin._weight_bias(), lin2._weight_bias())
                # serialize -> deserialize -> serialize gives back the first serialization
                self.assertRoundTripEqual(serialized, packed_state(lin2))
                self.check_same_output(lin, lin2, weight.shape[1])

    @cross_engine
    def test_qlinear_packed_params_cross_compatibility(self, device):
        """Build and save under one engine, load and read under the other."""
        if device != "cpu":
            self.skipTest(CPU_ONLY)
        weight = torch.quantize_per_tensor(small_weight_fp32(), CROSS_SCALES[0], 0, DTYPE)
        lin, _ = make_linear(weight)
        before = (with_int32_block_indices(packed_state(lin)), lin._weight_bias())

        lin2 = self.round_trip(lin)  # loaded under self.load_qengine
        with self.loading_engine():
            self.assertIsInstance(lin2, Linear)
            after = (with_int32_block_indices(packed_state(lin2)), lin2._weight_bias())
        self.assertRoundTripEqual(before, after)

    def test_qlinear_packed_params_state_dict(self, device):
        """``state_dict()`` of the packed params, loaded into fresh ``LinearPackedParams``."""
        if device != "cpu":
            self.skipTest(CPU_ONLY)
        zero_points = zero_points_for(self.qengine)
        for name, (weight, _per_tensor, _rows, _cols, _weights) in weight_cases(zero_points).items():
            with self.subTest(case=name):
                lin, _ = make_linear(weight)
                serialized = packed_state(lin)
                params2 = self.round_trip_state_dict(lin._packed_params, factory=make_packed_params)
                self.assertRoundTripEqual(lin._packed_params._weight_bias(), params2._weight_bias())
                self.assertRoundTripEqual(serialized, params2._packed_params.__getstate__())
                if self.qengine == "qnnpack":  # outputs are compared under qnnpack only (check_same_output)
                    lin2, _ = make_linear(weight)
                    lin2._packed_params = params2
                    self.check_same_output(lin, lin2, weight.shape[1])

    def modules_per_engine(self):
        """One ``Linear`` per supported engine, with that engine's zero points (per_tensor_small)."""
        modules = {}
        for engine in ENGINES:
            if engine not in supported_qengines():
                continue
            with override_qengine(engine):
                weight = weight_cases(zero_points_for(engine))["per_tensor_small"][0]
                modules[engine] = make_linear(weight)[0]
        if not modules:
            self.skipTest(f"none of the quantized engines {ENGINES} is supported by this torch build")
        return modules


# Kept for the facts below: under a device filter no generated class (TestQlinearPackedParamsCPU) exists.
ROUND_TRIP_SAFE_GLOBALS = TestQlinearPackedParams.safe_globals
MODULES_PER_ENGINE = TestQlinearPackedParams.modules_per_engine
instantiate_round_trip_tests(TestQlinearPackedParams, globals())


@unittest.skipIf(SPARSE_MISSING, SPARSE_MISSING)
class TestQlinearPackedParamsCheckpointFacts(SerializationRoundTripTestCase, TestCase):
    """Facts about the CPU module's checkpoint that involve no load: no mode, engine or device
    dimension, so a plain class -- it runs under every device filter, as the original file did."""

    ignore_warnings = (QUANTIZED_CREATION_DEPRECATION,)
    modules_per_engine = MODULES_PER_ENGINE

    def test_required_globals(self):
        modules = self.modules_per_engine()
        found = {engine: self.required_globals(lin) for engine, lin in modules.items()}
        first_engine, first = next(iter(found.items()))
        for engine, names in found.items():
            self.assertEqual(names, first, f"{engine} needs other globals than {first_engine}")
        # The version-dependent part: exactly the globals torch's allowlist lacks here among
        # those it added later (builtins.set before torch 2.6; nothing on >= 2.6).
        self.assertEqual(
            sorted(set(first) & {"builtins.set"}),
            sorted(VERSION_DEPENDENT_GLOBALS),
            "globals needed beyond torch's allowlist that a later torch allowlists",
        )
        # The version-independent part is a golden record (expecttest: EXPECTTEST_ACCEPT=1 rewrites
        # the literal).  On torch >= 2.6 nothing is left out, so it is the complete required list,
        # exactly what assertRequiredGlobalsExpectedInline(modules[first_engine], ...) pins.
        from expecttest import assert_expected_inline

        actual = "".join(f"{name}\n" for name in first if name not in VERSION_DEPENDENT_GLOBALS)
        assert_expected_inline(
            actual,
            """\
torch.ScriptObject
torch.ao.nn.sparse.quantized.dynamic.linear.Linear
torch.ao.nn.sparse.quantized.linear.LinearPackedParams
""",
            assert_eq=self.assertMultiLineEqual,
            debug_id=self.id(),
        )
        # The round-trip tests declare exactly what the checkpoint needs here, no more, no less.
        self.assertEqual(sorted(qualified_name(g) for g in ROUND_TRIP_SAFE_GLOBALS), first)

    def test_full_module_state_dict_load_is_broken_in_torch(self):
        # torch bug, no serialization involved: Linear._load_from_state_dict does
        # int(state_dict[prefix + "op_type"]) on the string 'sparse_dynamic'.
        # If this starts failing, torch fixed it: switch test_qlinear_packed_params_state_dict
        # to round-trip the full Linear (factory building a Linear) and delete this test.
        for engine, lin in self.modules_per_engine().items():
            with self.subTest(engine=engine), override_qengine(engine):
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


if __name__ == "__main__":
    run_tests()
