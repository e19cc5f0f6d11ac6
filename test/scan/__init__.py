"""Tests of ``torch_serial_testing.scan``."""
