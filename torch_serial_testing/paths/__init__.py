"""Serialization paths beyond an in-process ``torch.save``/``torch.load`` round trip.

Each module is one path a pytorch test breaks on, built on the core (which never imports them):

* :mod:`torch_serial_testing.paths.fresh` -- loads in a fresh interpreter that imports only the
  modules a user's would, so a checkpoint that loads only thanks to the test's own imports fails,
  naming the missing import; :mod:`torch_serial_testing.paths.forkserver` is the fork server that
  makes each such load a fork of a process that imported exactly those modules.
* :mod:`torch_serial_testing.paths.script` -- TorchScript: ``torch.jit.save``/``torch.jit.load``
  and ``torch.load`` of a TorchScript archive.
* :mod:`torch_serial_testing.paths.export` -- ``torch.export.save``/``torch.export.load``.
* :mod:`torch_serial_testing.paths.distributed` -- the test body in each of N ranks of a gloo
  process group: DTensor, sharded state dicts and DCP, each rank's loads predicted and asserted.

They are not part of the vendored core: a test that uses them needs the installed package.
"""
