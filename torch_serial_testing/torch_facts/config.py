"""``torch.utils.serialization.config``, read and put back for per-test isolation (None before torch 2.5)."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ["serialization_config", "restore_serialization_config"]


def serialization_config() -> Optional[dict[str, Any]]:
    try:
        from torch.utils.serialization import config
    except ImportError:
        return None
    # a torch config module: install_config_module adds its functions at import time
    return dict(config.get_config_copy())  # type: ignore[attr-defined]


def restore_serialization_config(saved: dict[str, Any]) -> None:
    from torch.utils.serialization import config

    config.load_config(saved)  # type: ignore[attr-defined]
