"""Tests of ``torch_serial_testing.policy``."""
