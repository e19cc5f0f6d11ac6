"""Tests of the load modes and the load (``torch_serial_testing.modes``, ``torch_serial_testing.loading``)."""
