"""Round trips on a real second device: the npu test backend (run by ``test/torch_facts/test_npu_device.py``).

This module registers the backend at import, which renames privateuse1 for the rest of the
process, so it runs only in a child process of its own::

    cd test && PYTHONPATH=.. python -m npu_backend.run --backend -m unittest -v npu_backend.device_cases

Generated here: ``TestNpuRoundTripCPU`` / ``TestNpuRoundTripNPU`` from ``devices = ("cpu",
"npu")``; ``TestPrivateuse1DeclarationNPU`` from ``devices = ("privateuse1",)``;
``TestNpuEnginesCPU`` / ``TestNpuEnginesNPU`` (the engine dimension on a non-CPU device); the
devices page's example (``docs/examples/test_linear_devices.py``, which ``test/torch_facts/test_npu_device.py`` runs on the backend).  Run as a
script (``-m npu_backend.device_cases``) it prints the generated class names as JSON (the
environment-filter tests use that).
"""

from __future__ import annotations

import io
import json
import pickletools
import unittest
import zipfile

import torch

from npu_backend import register

register()

from torch_serial_testing import (  # noqa: E402 - the backend must exist before instantiation
    SerializationRoundTripTestCase,
    UnexpectedLoadOutcome,
    instantiate_round_trip_tests,
)
from test.helpers.device_filters import assert_filters_match_pytorch  # noqa: E402

from test.helpers.roundtrip_fixtures import MODULE_SAFE_GLOBALS  # noqa: E402 - builtins.set where torch < 2.6 needs it

DEVICE_INDEX_ERROR = "Attempting to deserialize object on NPU device 1 but torch.npu.device_count() is 1"


class Net(torch.nn.Module):
    """Parameters, a buffer and a forward: enough to see a module survive on the device."""

    def __init__(self) -> None:
        super().__init__()
        self.linear = torch.nn.Linear(3, 2)
        self.register_buffer("steps", torch.arange(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.linear(x) + self.steps.sum()


def storage_locations(checkpoint: io.BytesIO) -> set[str]:
    """The storage location tags a zip checkpoint records (persistent ids), read without unpickling."""
    with zipfile.ZipFile(io.BytesIO(checkpoint.getvalue())) as z:
        (pkl,) = [n for n in z.namelist() if n.endswith("/data.pkl")]
        data = z.read(pkl)
    strings = [arg for op, arg, _ in pickletools.genops(data) if isinstance(arg, str)]
    # each persistent id is ('storage', <storage type>, key, location, numel)
    return {strings[i + 3] for i, s in enumerate(strings) if s == "storage" and i + 3 < len(strings)}


class DeviceTestCase(SerializationRoundTripTestCase, unittest.TestCase):
    """What every device test here needs to know: where the loaded copy must be."""

    def target(self) -> torch.device:
        """The device loaded tensors land on (``self.load_device``: cpu in the ``_to_cpu`` twins), indexed."""
        return torch.device("cpu") if self.load_device == "cpu" else torch.device(self.load_device, 0)


class TestNpuRoundTrip(DeviceTestCase):
    devices = ("cpu", "npu")
    safe_globals = (Net, torch.nn.Linear) + MODULE_SAFE_GLOBALS

    def make_module(self) -> Net:
        torch.manual_seed(0)
        return Net()

    def test_module(self, device):
        original = self.make_module().to(device)
        x = torch.ones(1, 3, device=device)
        loaded = self.round_trip(original)  # the default mode ends here: rejected as expected
        target = self.target()
        self.assertEqual({p.device for p in loaded.parameters()} | {loaded.steps.device}, {target})
        self.assertRoundTripEqual(original.to(target), loaded)
        self.assertRoundTripEqual(original.to(target)(x.to(target)), loaded(x.to(target)))

    def test_state_dict(self, device):
        original = self.make_module().to(device)
        checkpoint = self.save_checkpoint(original.state_dict())
        self.assertEqual(storage_locations(checkpoint.rewound()), {f"{device}:0" if device != "cpu" else "cpu"})
        loaded = self.load_checkpoint(checkpoint, safe_globals=())
        target = self.target()
        self.assertEqual({t.device for t in loaded.values()}, {target})
        expected = original.state_dict()
        self.assertRoundTripEqual(type(expected)((k, v.to(target)) for k, v in expected.items()), loaded)

    def test_shared_storage_stays_shared(self, device):
        base = torch.arange(12.0, device=device)
        loaded = self.round_trip({"base": base, "view": base[4:8], "again": base}, safe_globals=())
        self.assertIs(loaded["again"], loaded["base"])
        self.assertEqual(loaded["view"].untyped_storage().data_ptr(), loaded["base"].untyped_storage().data_ptr())
        self.assertEqual(loaded["view"].storage_offset(), 4)
        loaded["base"].fill_(-1.0)
        self.assertEqual(loaded["view"].cpu().tolist(), [-1.0] * 4)
        self.assertEqual(loaded["base"].device, self.target())

    def test_map_location(self, device):
        checkpoint = self.save_checkpoint({"t": torch.arange(3.0, device=device)})
        npu = torch.device("npu:0")
        cpu = torch.device("cpu")
        # a dict maps the saved location tag; a tag it does not name stays where it was saved
        onto = [
            ("npu", npu),
            ("npu:0", npu),
            (npu, npu),
            ("cpu", cpu),
            ({"npu:0": "cpu"}, cpu),
            ({"cpu": "npu:0"}, npu),
        ]
        for location, expected in onto:
            with self.subTest(map_location=location):
                loaded = self.load_checkpoint(checkpoint, safe_globals=(), map_location=location)
                self.assertEqual(loaded["t"].device, expected)
                self.assertEqual(loaded["t"].cpu().tolist(), [0.0, 1.0, 2.0])

    def test_device_index_error_is_torchs_own(self, device):
        checkpoint = self.save_checkpoint({"t": torch.ones(2, device=device)})
        with self.assertRaises(UnexpectedLoadOutcome) as cm:
            self.load_checkpoint(checkpoint, safe_globals=(), map_location="npu:1")
        self.assertIn(f"torch.load raised RuntimeError: {DEVICE_INDEX_ERROR}", str(cm.exception))


class TestPrivateuse1Declaration(DeviceTestCase):
    devices = ("privateuse1",)

    def test_round_trip(self, device):
        self.assertEqual(device, "npu")
        self.assertEqual(self.device_type, "privateuse1")
        original = {"w": torch.randn(2, 2).to(device)}
        loaded = self.round_trip(original, safe_globals=())
        self.assertEqual(loaded["w"].device, self.target())
        self.assertRoundTripEqual(original["w"].to(loaded["w"].device), loaded["w"])


class TestNpuEngines(DeviceTestCase):
    """Engines are a CPU concept; the dimension is generated on every device all the same."""

    devices = ("cpu", "npu")
    qengines = ("fbgemm", "qnnpack")
    load_modes = ("default",)

    def test_engine_is_set_on_every_device(self, device):
        self.assertEqual(torch.backends.quantized.engine, self.qengine)
        # quantized tensors are CPU tensors: quantize there, keep the integer representation on the device
        q = torch.quantize_per_tensor(torch.tensor([0.5, 1.0, 2.0]), 0.5, 0, torch.quint8)
        loaded = self.round_trip({"int_repr": q.int_repr().to(device), "scale": q.q_scale()}, safe_globals=())
        self.assertEqual(loaded["int_repr"].device, self.target())
        self.assertEqual(loaded["int_repr"].cpu().tolist(), [1, 2, 4])

    def test_quantized_tensors_cannot_live_on_the_device(self, device):
        q = torch.quantize_per_tensor(torch.tensor([1.0]), 1.0, 0, torch.quint8)
        if device == "cpu":
            self.assertRoundTripEqual(q, self.round_trip(q, safe_globals=()))
            return
        with self.assertRaises((RuntimeError, NotImplementedError)):
            q.to(device)


instantiate_round_trip_tests(TestNpuRoundTrip, globals())
instantiate_round_trip_tests(TestPrivateuse1Declaration, globals())
instantiate_round_trip_tests(TestNpuEngines, globals())


class TestDeviceFiltersMatchPytorch(unittest.TestCase):
    """With the backend registered and available: our filters select what pytorch's select."""

    def test_grid(self):
        from torch.testing._internal import common_device_type as cdt

        values = ["", "cpu", "npu", "privateuse1", "cpu,npu", "cuda", "npu,cuda", " npu", "NPU", "cpu,privateuse1"]
        assert_filters_match_pytorch(self, [cdt.CPUTestBase, cdt.PrivateUse1TestBase], ("cpu", "privateuse1"), values)


if __name__ == "__main__":
    print(
        json.dumps(
            sorted(
                n
                for n, v in list(globals().items())
                if isinstance(v, type) and n.startswith("Test") and n[-3:] in ("CPU", "NPU")
            )
        )
    )
