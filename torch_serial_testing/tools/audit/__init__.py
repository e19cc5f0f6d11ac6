"""Audit any test suite's ``torch.load`` calls: what each one needs, and a fix verified on the same bytes.

:mod:`.observe` wraps ``torch.load``/``torch.save`` in a process (a property on the ``torch`` module,
so a loader installed later, such as torch_npu's, is wrapped too) and writes one JSONL record per
call; :mod:`.analysis` builds a load's record (static scan, provenance, the trial load that verifies
the fix); :mod:`.summary` reads the records back into per-test verdicts and a Markdown table;
:mod:`.bootstrap` is the ``sitecustomize`` a child process gets to be observed; the pytest option
lives in :mod:`.pytest_plugin`.  Nothing here changes what a load returns or raises.
"""

from __future__ import annotations

__all__ = ["REPORT_ENV", "ROOT_ENV"]

#: The environment variable naming the JSONL report file an observed process appends to.
REPORT_ENV = "TORCH_SERIAL_TESTING_AUDIT_REPORT"
#: The folder holding the ``torch_serial_testing`` package, for a child process that cannot import it.
ROOT_ENV = "TORCH_SERIAL_TESTING_AUDIT_ROOT"
