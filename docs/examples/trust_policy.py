"""What the trust policy says about a few names: a compiled class with side effects, a Python class
whose constructor opens a file, a function that reaches pickle, and numpy's scalar reconstructor,
which torch itself names as the remedy for numpy-scalar checkpoints."""

import pickle

import numpy as np
import torch

from torch_serial_testing import RoundTripConfigError, UnsafeCallable, dangerous_reason, judge_global
from torch_serial_testing.declarations import normalize_safe_globals


class Log:
    def __init__(self, path):
        self.fh = open(path, "a")


def decode(data):
    return pickle.loads(data)


def main() -> None:
    # a compiled class that truncates files: refused as a declaration, whatever it is declared as
    assert judge_global(torch.PyTorchFileWriter) is not None
    # a Python class is judged by what constructing it reaches
    print(judge_global(Log))
    # a function that reaches pickle: UnsafeCallable does not admit it either
    try:
        normalize_safe_globals([UnsafeCallable(decode, reason="I trust it")])
    except RoundTripConfigError as e:
        print(e)
    else:
        raise AssertionError("decode was admitted")
    assert dangerous_reason("_imp.create_dynamic") is not None
    # what torch's own weights-only error names for numpy scalars is accepted as it is
    scalar = np.float64(1.0).__reduce__()[0]
    print(normalize_safe_globals([scalar, np.dtype, type(np.dtype("float64"))]))


if __name__ == "__main__":
    main()
