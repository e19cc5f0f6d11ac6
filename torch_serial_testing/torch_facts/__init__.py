"""What the running torch does, learnt by asking it: the only layer that touches torch's private API.

Every behaviour the library predicts is read by a small probe of the real function (a few-byte pickle
fed to the weights-only unpickler, a canary through ``torch.serialization.load``), never from torch's
source.  A probe that cannot run raises :class:`~.probes.ProbeFailed`; what needed it becomes unknown.
"""
