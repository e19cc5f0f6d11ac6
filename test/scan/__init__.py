"""Tests of the checkpoint scan: the core's (``torch_serial_testing.checkpoint``) and the tools' readers
of files and older formats (``torch_serial_testing.tools.formats``)."""
