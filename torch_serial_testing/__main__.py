"""``python -m torch_serial_testing {doctor,inspect,vendor}``: see :mod:`torch_serial_testing.cli`."""

import sys

from .tools.cli import main

if __name__ == "__main__":
    sys.exit(main())
