"""Crafted pickles for the differential: every opcode that takes values from the stack, issued right
after a MARK (``python -m tools.differential --marks``).

pickle's and torch's unpicklers start a new stack at MARK, so such an opcode cannot reach the values
below it: torch raises (``IndexError`` from its weights-only unpickler).  Each case puts on the stack,
below the MARK, exactly what the opcode would take without a MARK, so a model that ignores the MARK
says "loads".  The comparison is weights-only only (the bytes are crafted, never loaded in full):
predict() rejects (or the scan calls the stream damaged) exactly when torch.load raises.
"""

from __future__ import annotations

import io
import pickle
import pickletools
from typing import Any, Iterator, Optional

__all__ = ["popping_opcodes", "cases", "compare", "compare_all"]

_MARK = b"("
# What each opcode takes, pushed below the MARK; the default is a list and three small ints.
_BELOW: dict[str, bytes] = {
    "REDUCE": b"ccollections\nOrderedDict\n)",
    "NEWOBJ": b"ccollections\nOrderedDict\n)",
    "NEWOBJ_EX": b"ccollections\nOrderedDict\n)}",
    "BUILD": b"ccollections\nOrderedDict\n)\x81}",
    "SETITEM": b"}K\x01K\x02",
    "SETITEMS": b"}",
    "APPEND": b"]K\x01",
    "APPENDS": b"]",
    "ADDITEMS": b"\x8f",
    "STACK_GLOBAL": b"\x8c\x0bcollections\x8c\x0bOrderedDict",
    "BINPERSID": b"\x8c\x07storage",
}
_DEFAULT_BELOW = b"]K\x01K\x02K\x03"
# Arguments of the opcodes that have one (the rest take none).
_ARGS = {"BINPUT": b"\x00", "LONG_BINPUT": b"\x00\x00\x00\x00", "PUT": b"0\n", "INST": b"collections\nOrderedDict\n"}
#: Opcodes that read the top of the stack without taking it (pickletools lists no stack_before for them).
_READS_TOP = ("PUT", "BINPUT", "LONG_BINPUT")


def popping_opcodes() -> list[Any]:
    """The stdlib's opcodes that take or read at least one value (not only a MARK) of the stack."""
    return [
        op
        for op in pickletools.opcodes
        if op.name in _READS_TOP or any(s is not pickletools.markobject for s in op.stack_before)
    ]


def _stream(op: Any) -> bytes:
    """PROTO 2 (torch warns of any newer one; no unpickler ties opcodes to it), what *op* takes, MARK (twice
    when *op* itself takes a MARK: the inner one is its own), *op*, STOP."""
    marks = _MARK * (2 if pickletools.markobject in op.stack_before else 1)
    stop = b"" if op.name == "STOP" else b"."
    return (
        b"\x80\x02"
        + _BELOW.get(op.name, _DEFAULT_BELOW)
        + marks
        + op.code.encode("latin-1")
        + _ARGS.get(op.name, b"")
        + stop
    )


def cases() -> Iterator[tuple[str, bytes]]:
    """``(label, checkpoint bytes)``: each popping opcode after a MARK, as a zip and as a legacy stream."""
    import torch

    from torch_serial_testing.tools.formats import LEGACY_MAGIC, LEGACY_PROTOCOL_VERSION

    for op in popping_opcodes():
        body = _stream(op)
        out = io.BytesIO()
        writer = torch._C.PyTorchFileWriter(out)  # names its records archive/<name>, as torch.save does
        for name, record in (("data.pkl", body), ("byteorder", b"little"), ("version", b"3\n")):
            writer.write_record(name, record, len(record))
        writer.write_end_of_file()
        del writer
        yield f"zip/{op.name}", out.getvalue()
        sys_info = {"protocol_version": LEGACY_PROTOCOL_VERSION, "little_endian": True, "type_sizes": {"int": 4}}
        head = b"".join(pickle.dumps(v, protocol=2) for v in (LEGACY_MAGIC, LEGACY_PROTOCOL_VERSION, sys_info))
        yield f"legacy/{op.name}", head + body + pickle.dumps([], protocol=2)


def compare(data: bytes) -> tuple[bool, bool, str]:
    """``(torch raises, the library says it does not load, what each said)`` for a weights-only load."""
    import torch

    from torch_serial_testing import CheckpointFormatError, predict
    from torch_serial_testing.tools import FileCheckpoint  # a zip as the core reads it, and legacy streams

    try:
        torch.load(io.BytesIO(data), weights_only=True)
        actual: Optional[str] = None
    except Exception as e:  # noqa: BLE001 - the outcome is the data
        actual = f"{type(e).__name__}: {(str(e).strip().splitlines() or [''])[0][:80]}"
    try:
        exp = predict("safe_globals", FileCheckpoint.from_bytes(data), [])
        said = "loads" if exp.loads else f"rejects: {(exp.reason or '')[:80]}"
        rejects = not exp.loads
    except CheckpointFormatError as e:
        said, rejects = f"damaged: {str(e)[:80]}", True
    return actual is not None, rejects, f"torch: {actual or 'loads'}; library: {said}"


def compare_all() -> list[str]:
    """One line per disagreement (none when the library agrees with torch on every case)."""
    out = []
    for label, data in cases():
        raises, rejects, what = compare(data)
        if raises != rejects:
            out.append(f"{label}: {what}")
    return out
