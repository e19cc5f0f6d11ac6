"""Run a Python module (``-m unittest ...``, ``-m torch_serial_testing doctor``) in a process
prepared like an Ascend machine: ``--backend`` registers the npu test backend, ``--fake-torch-npu``
installs the torch_npu serialization fake -- both before the module runs, as torch_npu's
autoload does at ``import torch``.

    python -m npu_backend.run [--backend] [--fake-torch-npu] -m MODULE [ARGS...]

(with ``test/`` on ``sys.path``, and the project root where MODULE imports ``test.helpers``).
"""

from __future__ import annotations

import runpy
import sys


def main(argv: list[str]) -> None:
    flags = set()
    while argv and argv[0].startswith("--"):
        flags.add(argv.pop(0))
    unknown = flags - {"--backend", "--fake-torch-npu"}
    if unknown or len(argv) < 2 or argv[0] != "-m":
        raise SystemExit(
            f"usage: python -m npu_backend.run [--backend] [--fake-torch-npu] -m MODULE [ARGS...] (got {sys.argv[1:]})"
        )
    if "--backend" in flags:
        from npu_backend import register

        register()
    if "--fake-torch-npu" in flags:
        from npu_backend import fake_torch_npu

        fake_torch_npu.install()
    module = argv[1]
    sys.argv = [module] + argv[2:]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
