"""What the running torch does, learnt by asking it: the only layer that touches torch's private API.

Every behaviour the library predicts is read from torch by a small probe of the real
function (a few-byte pickle fed to its weights-only unpickler, a canary checkpoint through
``torch.serialization.load``), never from torch's source text.  A probe that cannot run
raises :class:`~.probes.ProbeFailed` naming why; the prediction that needed it becomes unknown.
"""
