"""``python -m test.npu_backend``: build (or confirm the cached build of) the npu test backend.

Run once before the tests (``.ci/run`` does) so no test process pays for the compilation.
Exits 0 with a message when no compiler exists: the device tests then skip, saying why.
"""

import sys
import time

from . import build, build_dir, skip_reason


def main() -> int:
    reason = skip_reason()
    if reason:
        print(f"npu test backend not built: {reason}")
        return 0
    start = time.monotonic()
    build(verbose="-v" in sys.argv[1:])
    print(f"npu test backend ready in {build_dir()} ({time.monotonic() - start:.1f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
