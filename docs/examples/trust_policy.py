"""What the trust policy says about a few names: a compiled class with side effects, a Python class
whose constructor opens a file, a function that reaches pickle, and numpy's scalar reconstructor,
which torch itself names as the remedy for numpy-scalar checkpoints.

The full policy belongs to the tools (``inspect``, ``audit``, snippets: bytes from strangers).  A test
author's own declaration gets a small check only: what can never be a safe global (a module, a
code-running callable such as ``os.system``) is refused; their classes and functions are trusted."""

import os
import pickle

import numpy as np
import torch

from torch_serial_testing import RoundTripConfigError, UnsafeCallable
from torch_serial_testing.declarations import normalize_safe_globals
from torch_serial_testing.tools.policy.trust import dangerous_reason, judge_global


class Log:
    def __init__(self, path):
        self.fh = open(path, "a")


def decode(data):
    return pickle.loads(data)


def main() -> None:
    # a compiled class that truncates files: never suggested for a checkpoint from elsewhere
    assert judge_global(torch.PyTorchFileWriter) is not None
    # a Python class is judged by what constructing it reaches
    print(judge_global(Log))
    # a function that reaches pickle: in the tools, UnsafeCallable does not admit it either
    print(judge_global(decode, opt_in=True))
    assert dangerous_reason("_imp.create_dynamic") is not None
    # a test author's own declaration is theirs to trust (the small check accepts it) ...
    print(normalize_safe_globals([Log, UnsafeCallable(decode, reason="I trust it")]))
    # ... except what can never be a safe global, however it is named
    try:
        normalize_safe_globals([(os.system, "mymod.Safe")])
    except RoundTripConfigError as e:
        print(e)
    else:
        raise AssertionError("os.system was admitted")
    # what torch's own weights-only error names for numpy scalars is accepted as it is
    scalar = np.float64(1.0).__reduce__()[0]
    assert judge_global(scalar) is None
    print(normalize_safe_globals([scalar, np.dtype, type(np.dtype("float64"))]))


if __name__ == "__main__":
    main()
