"""Run by ``site`` at start-up in a process the audit observes (this folder is first on PYTHONPATH).

When the report variable is set: make ``torch_serial_testing`` importable (its folder appended to the
*end* of ``sys.path``, so nothing the process imports is shadowed), install the import hook of
:mod:`..hooks` (``torch`` and ``unittest`` are patched right after they are imported, never imported
here), then run the ``sitecustomize`` this one shadows, if any.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _start() -> None:
    report = os.environ.get("TORCH_SERIAL_TESTING_AUDIT_REPORT")
    root = os.environ.get("TORCH_SERIAL_TESTING_AUDIT_ROOT")
    if not report:
        return
    if root and root not in sys.path:
        sys.path.append(root)
    from torch_serial_testing.tools.audit.hooks import start

    start(report)


def _chain() -> None:
    """Import the next ``sitecustomize`` on sys.path (the one this folder shadows)."""
    import importlib.machinery
    import importlib.util

    rest = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    sys.modules["sitecustomize"] = module
    spec.loader.exec_module(module)


_start()
_chain()
