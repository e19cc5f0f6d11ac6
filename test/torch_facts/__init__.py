"""Tests of ``torch_serial_testing.torch_facts``."""
