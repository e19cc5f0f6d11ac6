"""Environments for the suite's child processes: the parent's import path is passed on.

Why: the suite must pass wherever this process can import ``torch_serial_testing`` -- pip-installed,
or a checkout (or vendored tree) on ``PYTHONPATH`` only.  A child started with a hand-built
environment would otherwise import the library from nowhere (``No module named
'torch_serial_testing'``) or from a different copy than the one under test.
"""

from __future__ import annotations

import os
from typing import Mapping, Optional

import torch_serial_testing

# The folder this process imported the library from (the checkout root, or site-packages).
PACKAGE_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(torch_serial_testing.__file__)))


def _on_default_path(folder: str) -> bool:
    # An installed copy is found by the child through site anyway; putting site-packages on
    # PYTHONPATH would move it in front of the standard library, so it is never added.
    return os.path.basename(folder) in ("site-packages", "dist-packages")


def import_path(*first: str, base: Optional[str] = None) -> str:
    """A PYTHONPATH value: *first*, then the library's folder, then *base* (default: ours)."""
    rest = os.environ.get("PYTHONPATH", "") if base is None else base
    parts = [*first, *([] if _on_default_path(PACKAGE_ROOT) else [PACKAGE_ROOT]), *rest.split(os.pathsep)]
    seen: list[str] = []
    for part in parts:
        if part and part not in seen:
            seen.append(part)
    return os.pathsep.join(seen)


def child_env(
    overrides: Optional[Mapping[str, str]] = None,
    *,
    path_first: tuple[str, ...] = (),
    drop: tuple[str, ...] = ("TORCH_FORCE_",),
) -> dict[str, str]:
    """``os.environ`` without variables starting with *drop*, plus *overrides*, with ``PYTHONPATH``
    led by *path_first* and carrying the library's folder and the parent's ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(drop)}
    env.update(overrides or {})
    env["PYTHONPATH"] = import_path(*path_first, base=env.get("PYTHONPATH", ""))
    return env
