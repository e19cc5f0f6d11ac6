"""The package's tensor subclass: a tensor that carries a scale (its state, pickled with it)."""

import torch


class ScaledTensor(torch.Tensor):
    """A tensor subclass with one attribute of its own, as quantized-tensor subclasses carry their metadata."""

    @staticmethod
    def of(data: torch.Tensor, scale: float) -> "ScaledTensor":
        t = data.as_subclass(ScaledTensor)
        t.scale = scale
        return t
