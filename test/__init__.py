"""torch_serial_testing's own tests.

A package so that ``python -m unittest test.ao.sparsity.test_qlinear_packed_params`` works from
the project root (this ``test`` then shadows the standard library's, as pytorch's own ``test/``
does).  The shared support modules (``roundtrip_fixtures``, ``hostile_checkpoints``) are imported
by their top-level names, so this folder is put on ``sys.path`` whichever runner imports it.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
