"""Run by ``site`` at start-up in a process the audit observes (this folder is first on PYTHONPATH).

When the report variable is set: wait, with a meta-path finder of the standard library only, for the
process's own first import of ``torch`` (or of ``unittest``, unless pytest is importing it), and only
then make ``torch_serial_testing`` importable (its folder appended to the *end* of ``sys.path``, so
nothing the process imports is shadowed) and start :mod:`..hooks` (``torch`` and ``unittest`` are
patched right after they are imported, never imported here).  Nothing of the package is imported
earlier: pytest imports ``unittest`` before it marks its plugins for assertion rewriting, and an
installed ``torch_serial_testing`` imported by then would make it warn (``PytestAssertRewriteWarning``:
"Module already imported so cannot be rewritten"); under pytest the running test comes from
``PYTEST_CURRENT_TEST``, so the audit starts at the import of ``torch``.  Then the ``sitecustomize``
this one shadows runs, if any.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


class _StartOnImport:
    """Starts the audit at the first import of ``torch`` (or ``unittest`` outside pytest), then leaves."""

    def find_spec(self, fullname, path=None, target=None):
        if fullname != "torch" and (fullname != "unittest" or "_pytest" in sys.modules):
            return None
        if self in sys.meta_path:
            sys.meta_path.remove(self)
        root = os.environ.get("TORCH_SERIAL_TESTING_AUDIT_ROOT")
        if root and root not in sys.path:
            sys.path.append(root)
        try:
            from torch_serial_testing.tools.audit import hooks

            hooks.start(os.environ["TORCH_SERIAL_TESTING_AUDIT_REPORT"])
        except Exception as e:  # the process runs on, unobserved, and says so
            sys.stderr.write(f"torch_serial_testing audit: NOT observing process {os.getpid()}: {e!r}\n")
            return None
        return hooks.finder().find_spec(fullname, path, target)  # torch's own spec, its loader wrapped


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


if os.environ.get("TORCH_SERIAL_TESTING_AUDIT_REPORT"):
    sys.meta_path.insert(0, _StartOnImport())
_chain()
