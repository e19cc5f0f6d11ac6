"""Pure-Python foundations every layer may use: errors, names, load modes, scan limits, interrupts."""
