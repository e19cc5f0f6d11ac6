"""torch_serial_testing's own tests.

A package so that ``python -m unittest test.ao.sparsity.test_qlinear_packed_params`` works from
the project root (this ``test`` then shadows the standard library's, as pytorch's own ``test/``
does).  The tests of each layer are in the sub-package of its name (``test.scan``...), whole-repo
checks here; the shared support modules are in ``test.helpers`` (``test.helpers.roundtrip_fixtures``).
The npu test backend is imported by its top-level name (``npu_backend``), so this folder is put on
``sys.path`` whichever runner imports it.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
