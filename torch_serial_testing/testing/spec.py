"""A generated test's coordinates, and the test name pytorch's conventions give them."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..core.modes import LoadMode

__all__ = ["CaseSpec"]


@dataclass(frozen=True)
class CaseSpec:
    """One generated test's coordinates: load mode, engines (save, load), device, and where it loads to."""

    mode: Optional[LoadMode]  # None: the method dropped the load-mode dimension
    device_type: str
    save_qengine: Optional[str] = None
    load_qengine: Optional[str] = None
    to_cpu: bool = False

    def method_name(self, base: str, device_part: str) -> str:
        parts = [base]
        if self.save_qengine:
            same = self.save_qengine == self.load_qengine
            parts.append(self.save_qengine if same else f"{self.save_qengine}_to_{self.load_qengine}")
        if self.mode is not None:
            parts.append(self.mode.value)
        parts += [device_part, "to_cpu"] if self.to_cpu else [device_part]
        return "_".join(parts)

    @property
    def map_location(self) -> Optional[str]:
        if self.to_cpu:
            return "cpu"
        from ..torch_facts.devices import torch_device_type

        return None if self.device_type == "cpu" else torch_device_type(self.device_type)
