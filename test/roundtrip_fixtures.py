"""Small modules shared by the library's own tests (importable as a top-level module from test/)."""

from __future__ import annotations

import torch


class TinyNet(torch.nn.Module):
    """A float module whose full checkpoint needs exactly one global beyond torch's allowlist."""

    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.arange(6, dtype=torch.float32).reshape(2, 3))
        self.register_buffer("steps", torch.tensor([3], dtype=torch.int64))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight.t()


class Wrapper(torch.nn.Module):
    """Needs TinyNet, Wrapper and torch.nn.Linear (to exercise multi-global messages)."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = TinyNet()
        self.head = torch.nn.Linear(2, 1)


TINY_GLOBALS = ["roundtrip_fixtures.TinyNet"]


def tiny_qlinear(bias: float = 1.0):
    """The seed module: a sparse dynamic quantized Linear (needs three globals), packed by qnnpack."""
    from torch.ao.nn.sparse.quantized.dynamic.linear import Linear

    from torch_serial_testing import override_qengine

    with override_qengine("qnnpack"):
        w = torch.quantize_per_tensor(torch.tensor([[0.0, 0, 0, 0, 2, 2, 2, 2]] * 3), 2.0, 0, torch.qint8)
        lin = Linear(3, 8, 1, 4, bias=True, dtype=torch.qint8)
        lin.set_weight_bias(w, torch.full((3,), bias), 1, 4)
    return lin


SEED_GLOBALS = [
    "torch.ScriptObject",
    "torch.ao.nn.sparse.quantized.dynamic.linear.Linear",
    "torch.ao.nn.sparse.quantized.linear.LinearPackedParams",
]
