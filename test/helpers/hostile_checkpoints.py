"""Hostile checkpoints, built in memory, for the safety tests (a support module, not a test file).

Every checkpoint here is a torch-style archive (the zip layout ``torch.save``
writes: ``archive/data.pkl``, ``archive/.format_version``,
``archive/.storage_alignment``, ``archive/byteorder``, ``archive/data/<key>``,
``archive/version``, ``archive/.data/serialization_id``) or a legacy
pre-1.6 checkpoint, whose pickle tries to run code.  Pickles are written
opcode by opcode, or with ``__reduce__`` classes pickled with
:mod:`pickle` (pickling never calls what ``__reduce__`` names).

Every side effect appends a line naming the payload to the *sentinel* file,
so any execution -- in this process or a child -- is detectable afterwards::

    from test.helpers.hostile_checkpoints import build_all
    for name, data in build_all(sentinel_path).items():
        ...
    assert not os.path.exists(sentinel_path)

``DANGEROUS_GLOBALS[name]`` is the dangerous global a static scan must report
for each payload (``"<unresolved STACK_GLOBAL>"`` for one built at unpickling time).
"""

from __future__ import annotations

import io
import itertools
import os
import pickle
import shlex
import struct
import sys
import tarfile
import zipfile
from typing import Any, Callable

__all__ = ["build_all", "DANGEROUS_GLOBALS", "FLOODS", "LEGACY_MAGIC", "torch_zip", "legacy_stream", "legacy_tar"]

#: torch.serialization.MAGIC_NUMBER: the first pickle of a legacy (non-zip) checkpoint.
LEGACY_MAGIC = 0x1950A86A20F9469CFC6C
_LEGACY_PROTOCOL_VERSION = 1001

# -- opcode helpers ------------------------------------------------------------------------

MARK, STOP, REDUCE, TUPLE1, TUPLE2, EMPTY_DICT, EMPTY_LIST = b"(", b".", b"R", b"\x85", b"\x86", b"}", b"]"
SETITEM, APPEND, OBJ, STACK_GLOBAL, MEMOIZE, EMPTY_TUPLE = b"s", b"a", b"o", b"\x93", b"\x94", b")"


def proto(n: int) -> bytes:
    return b"\x80" + bytes([n])


def glob(module: str, name: str) -> bytes:
    """GLOBAL: push ``module.name`` (resolved with getattr, or dotted lookup at protocol >= 4)."""
    return b"c" + module.encode() + b"\n" + name.encode() + b"\n"


def ustr(s: str) -> bytes:
    """BINUNICODE: push a str."""
    raw = s.encode("utf-8")
    return b"X" + struct.pack("<I", len(raw)) + raw


def short_ustr(s: str) -> bytes:
    """SHORT_BINUNICODE (protocol 4): push a short str."""
    raw = s.encode("utf-8")
    return b"\x8c" + bytes([len(raw)]) + raw


def call1(callable_ops: bytes, arg_ops: bytes) -> bytes:
    """``callable(arg)`` with REDUCE."""
    return callable_ops + arg_ops + TUPLE1 + REDUCE


class _Reduce:
    """Pickles as ``fn(*args)`` (what an attacker's class would do); never called here."""

    def __init__(self, fn: Callable[..., Any], *args: Any) -> None:
        self.fn, self.args = fn, args

    def __reduce__(self) -> tuple[Any, tuple[Any, ...]]:
        return self.fn, self.args


# -- containers ----------------------------------------------------------------------------


def torch_zip(data_pkl: bytes, storages: dict[str, bytes] | None = None, prefix: str = "archive") -> bytes:
    """A zip archive with exactly torch.save's records (stored, uncompressed)."""
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_STORED) as z:
        z.writestr(f"{prefix}/data.pkl", data_pkl)
        z.writestr(f"{prefix}/.format_version", b"1")
        z.writestr(f"{prefix}/.storage_alignment", b"64")
        z.writestr(f"{prefix}/byteorder", b"little")
        for key, raw in (storages or {}).items():
            z.writestr(f"{prefix}/data/{key}", raw)
        z.writestr(f"{prefix}/version", b"3\n")
        z.writestr(f"{prefix}/.data/serialization_id", b"0" * 40)
    return out.getvalue()


def legacy_stream(obj_pickle: bytes, sys_info_pickle: bytes | None = None) -> bytes:
    """A legacy (pre-1.6, non-zip) checkpoint: magic, protocol version, sys_info, object, storage keys."""
    if sys_info_pickle is None:
        sys_info_pickle = pickle.dumps(
            {
                "protocol_version": _LEGACY_PROTOCOL_VERSION,
                "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4},
            },
            protocol=2,
        )
    return (
        pickle.dumps(LEGACY_MAGIC, protocol=2)
        + pickle.dumps(_LEGACY_PROTOCOL_VERSION, protocol=2)
        + sys_info_pickle
        + obj_pickle
        + pickle.dumps([], protocol=2)
    )


def legacy_tar(pickle_member: bytes, sys_info_member: bytes | None = None) -> bytes:
    """A legacy tar checkpoint (torch < 0.4): members sys_info, pickle, storages, tensors."""
    if sys_info_member is None:
        sys_info_member = pickle.dumps(
            {
                "protocol_version": _LEGACY_PROTOCOL_VERSION,
                "little_endian": True,
                "type_sizes": {"short": 2, "int": 4, "long": 4},
            },
            protocol=2,
        )
    members = {
        "sys_info": sys_info_member,
        "pickle": pickle_member,
        "storages": pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2),  # no storages, no views
        "tensors": pickle.dumps(0, protocol=2),  # tensor count, then none
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:", format=tarfile.PAX_FORMAT) as tar:
        for name, raw in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(raw)
            tar.addfile(info, io.BytesIO(raw))
    return out.getvalue()


# -- payloads ------------------------------------------------------------------------------

#: The dangerous global each payload names, as a static scan spells it.
DANGEROUS_GLOBALS: dict[str, str] = {
    "os_system": "os.system",
    "posix_system": "posix.system",
    "builtins_eval": "builtins.eval",
    "builtins_exec": "builtins.exec",
    "subprocess_popen": "subprocess.Popen",
    "getattr_chain": "builtins.getattr",
    "forged_torch_utils_name": "torch._utils._rebuild_tensor_v2_and_run",
    "forged_torch_serialization_os": "torch.serialization.os.system",
    "nested_container": "posix.system",
    "state_dict_with_payload": "posix.system",
    "stack_global_protocol4": "posix.system",
    "stack_global_unresolved": "<unresolved STACK_GLOBAL>",
    "inst_protocol0": "os.system",
    "obj_protocol1": "os.system",
    "functools_partial": "functools.partial",
    "operator_attrgetter": "operator.attrgetter",
    "legacy_cve_2025_32434": "posix.system",
    "legacy_sys_info_payload": "builtins.exec",
    "legacy_tar_payload": "posix.system",
}


def build_all(sentinel: str) -> dict[str, bytes]:
    """Every hostile checkpoint by name; any code they manage to run appends to *sentinel*."""
    sentinel = os.fspath(sentinel)

    def sh(name: str) -> str:
        return f"echo {name} >> {shlex.quote(sentinel)}"

    def py(name: str) -> str:
        # An expression, so it serves eval() and exec() alike.
        return f"open({sentinel!r}, 'a').write({name + chr(10)!r})"

    def tz(body: bytes, protocol: int = 2) -> bytes:
        return torch_zip(proto(protocol) + body + STOP)

    out: dict[str, bytes] = {}

    # os.system("echo ... >> sentinel"), GLOBAL written by hand as 'os system'.
    out["os_system"] = tz(call1(glob("os", "system"), ustr(sh("os_system"))))

    # What pickle writes for os.system on Linux: GLOBAL 'posix system' (via __reduce__, protocol 2).
    out["posix_system"] = torch_zip(pickle.dumps(_Reduce(os.system, sh("posix_system")), protocol=2))

    # builtins.eval(expression).
    out["builtins_eval"] = tz(call1(glob("builtins", "eval"), ustr(py("builtins_eval"))))

    # builtins.exec(statement).
    out["builtins_exec"] = tz(call1(glob("builtins", "exec"), ustr(py("builtins_exec"))))

    # subprocess.Popen(["/bin/sh", "-c", "echo ... >> sentinel"]): a child process writes the sentinel.
    argv = EMPTY_LIST + MARK + ustr("/bin/sh") + ustr("-c") + ustr(sh("subprocess_popen")) + b"e"  # APPENDS
    out["subprocess_popen"] = tz(call1(glob("subprocess", "Popen"), argv))

    # getattr(__import__("os"), "system")("...") -- only builtins named, os reached by a chain.
    os_mod = call1(glob("builtins", "__import__"), ustr("os"))
    system = glob("builtins", "getattr") + os_mod + ustr("system") + TUPLE2 + REDUCE
    out["getattr_chain"] = tz(system + ustr(sh("getattr_chain")) + TUPLE1 + REDUCE)

    # A global under torch._utils (allowlisted module) whose name torch does not have.
    out["forged_torch_utils_name"] = tz(
        call1(glob("torch._utils", "_rebuild_tensor_v2_and_run"), ustr(sh("forged_torch_utils_name")))
    )

    # 'torch.serialization os.system': at protocol 4 GLOBAL resolves dotted names, and
    # torch.serialization imports os, so a full unpickle reaches os.system through an
    # allowlisted-looking module.
    out["forged_torch_serialization_os"] = tz(
        call1(glob("torch.serialization", "os.system"), ustr(sh("forged_torch_serialization_os"))), protocol=4
    )

    # The payload deep inside dicts, lists and tuples.
    nested = {"config": [{"layers": ({"hooks": [[_Reduce(os.system, sh("nested_container"))]]},)}], "epoch": 3}
    out["nested_container"] = torch_zip(pickle.dumps(nested, protocol=2))

    # A real state_dict (tensors with storages, written by torch.save) plus one malicious entry.
    out["state_dict_with_payload"] = _state_dict_with_payload(_Reduce(os.system, sh("state_dict_with_payload")))

    # Protocol 4 pickling of the payload: STACK_GLOBAL fed by SHORT_BINUNICODE + MEMOIZE.
    out["stack_global_protocol4"] = torch_zip(
        pickle.dumps(_Reduce(os.system, sh("stack_global_protocol4")), protocol=4)
    )

    # STACK_GLOBAL whose module string is computed at unpickling time (str("os") by REDUCE):
    # statically unnameable.  (DUP/POP/memo games are followed by the scan and name os.system.)
    body = (
        short_ustr("pad")
        + b"0"
        + call1(glob("builtins", "str"), short_ustr("os"))
        + short_ustr("system")
        + STACK_GLOBAL
    )
    out["stack_global_unresolved"] = tz(call1(body, short_ustr(sh("stack_global_unresolved"))), protocol=4)

    # Protocol 0 INST: MARK, args, INST module name -- calls os.system(args).
    out["inst_protocol0"] = torch_zip(
        MARK + b"V" + sh("inst_protocol0").encode("raw_unicode_escape") + b"\n" + b"ios\nsystem\n" + STOP
    )

    # Protocol 1 OBJ: MARK, callable, args, OBJ -- calls os.system(args).
    out["obj_protocol1"] = torch_zip(MARK + glob("os", "system") + ustr(sh("obj_protocol1")) + OBJ + STOP)

    # functools.partial(os.system, "...")() -- the call happens in a second REDUCE.
    partial = glob("functools", "partial") + glob("os", "system") + ustr(sh("functools_partial")) + TUPLE2 + REDUCE
    out["functools_partial"] = tz(partial + EMPTY_TUPLE + REDUCE)

    # operator.attrgetter("system")(torch.serialization.os)("...").
    getter = call1(glob("operator", "attrgetter"), ustr("system"))
    system = call1(getter, glob("torch.serialization", "os"))
    out["operator_attrgetter"] = tz(call1(system, ustr(sh("operator_attrgetter"))))

    # CVE-2025-32434 style: a legacy (non-zip) checkpoint whose object pickle runs code
    # (weights_only=True was bypassable through the legacy path before torch 2.6).
    out["legacy_cve_2025_32434"] = legacy_stream(
        pickle.dumps(_Reduce(os.system, sh("legacy_cve_2025_32434")), protocol=2)
    )

    # Legacy checkpoint whose sys_info record (read before the object) runs code.
    out["legacy_sys_info_payload"] = legacy_stream(
        pickle.dumps({"ok": True}, protocol=2),
        sys_info_pickle=proto(2) + call1(glob("builtins", "exec"), ustr(py("legacy_sys_info_payload"))) + STOP,
    )

    # Legacy tar checkpoint whose 'pickle' member runs code.
    out["legacy_tar_payload"] = legacy_tar(pickle.dumps(_Reduce(os.system, sh("legacy_tar_payload")), protocol=2))

    assert set(out) == set(DANGEROUS_GLOBALS), sorted(set(out) ^ set(DANGEROUS_GLOBALS))
    return out


# -- floods: pickles that make a scan work hard (bench/scan_bounds.py, test/scan/test_bounded_work.py) ------
#
# Each takes *n*, the opcodes to write (about), and returns a data.pkl body; none runs code if unpickled.
# A value made once and fetched from the memo again and again (BINGET) costs the pickle 2 bytes per use:
# whatever the scan does per use beyond one opcode's work must be counted, or the bound does not hold.


def _obj(memo: int) -> bytes:
    """An instance of the unimportable ``mymod.Y`` (NEWOBJ), left on the stack and in memo *memo*."""
    return glob("mymod", "Y") + EMPTY_TUPLE + b"\x81" + b"q" + bytes([memo])


def _long_get(i: int) -> bytes:
    return b"j" + i.to_bytes(4, "little")


def _nested_state() -> bytes:
    """Memo 1: a 4-tuple of 4-tuples of one 1,000-character string (a BUILD state of 21 values)."""
    inner = MARK + ustr("a" * 1000) + b"q\x02" + b"h\x02" * 3 + b"t" + b"q\x03"
    return inner + MARK + b"h\x03" * 4 + b"t" + b"q\x01"


def _distinct_states(n: int) -> bytes:
    """*n* BUILDs onto one object, each with another state: 3-tuples of (int, int) pairs from the memo."""
    head = b"".join(b"K" + bytes([i]) + b"r" + i.to_bytes(4, "little") for i in range(64))
    pairs = [64 + a * 16 + b for a in range(64) for b in range(16)]
    head += b"".join(
        _long_get(a) + _long_get(b) + TUPLE2 + b"r" + (64 + a * 16 + b).to_bytes(4, "little")
        for a in range(64)
        for b in range(16)
    )
    body = bytearray()
    for k, p in enumerate(itertools.combinations(pairs, 3)):
        if k >= n:
            break
        body += MARK + b"".join(_long_get(q) for q in p) + b"tb"
    return head + _obj(0) + bytes(body)


#: name -> n -> data.pkl body (protocol 2 or 4), about *n* opcodes.
FLOODS: dict[str, Callable[[int], bytes]] = {
    # BUILD after BUILD onto one object, its state fetched from the memo each time.
    "BINGET+BUILD, dict state": lambda n: proto(2) + EMPTY_DICT + b"q\x01" + _obj(0) + b"h\x01b" * (n // 2) + STOP,
    "BINGET+BUILD, nested tuple state": lambda n: proto(2) + _nested_state() + _obj(0) + b"h\x01b" * (n // 2) + STOP,
    "BUILD, a new state each": lambda n: proto(2) + _distinct_states(n // 6) + STOP,
    # MARK, items fetched from the memo, SETITEMS/APPENDS onto one shared container.
    "BINGET+SETITEMS, shared dict": lambda n: (
        proto(2) + ustr("k" * 1000) + b"q\x01" + EMPTY_DICT + (MARK + b"h\x01h\x01" * 500 + b"u") * (n // 1002) + STOP
    ),
    "BINGET+APPENDS, shared list": lambda n: (
        proto(2) + ustr("k" * 1000) + b"q\x01" + EMPTY_LIST + (MARK + b"h\x01" * 1000 + b"e") * (n // 1002) + STOP
    ),
    # Text integers of 4,300 digits (int() takes quadratic time in the digits): protocol 0's INT.
    "INT of 4,300 digits": lambda n: proto(2) + MARK + (b"I" + b"9" * 4300 + b"\n") * n + b"t" + STOP,
    # Every EXT4 code is another name: a report listing each.
    "EXT4, distinct codes": lambda n: (
        proto(2) + b"".join(b"\x84" + i.to_bytes(4, "little") + b"0" for i in range(n // 2)) + b"N" + STOP
    ),
    # STACK_GLOBAL of two 500-character strings from the memo, popped.
    "STACK_GLOBAL of long names": lambda n: (
        proto(4) + ustr("m" * 500) + b"q\x01" + ustr("n" * 500) + b"q\x02" + b"h\x01h\x02\x930" * (n // 4) + b"N" + STOP
    ),
}


def _state_dict_with_payload(payload: _Reduce) -> bytes:
    """torch.save of a linear layer's state_dict plus *payload*, re-zipped with :func:`torch_zip`."""
    import torch

    state = {"weight": torch.arange(6.0).reshape(2, 3), "bias": torch.ones(2), "_metadata_hook": payload}
    buf = io.BytesIO()
    torch.save(state, buf)  # pickling only records the payload's global; nothing is called
    with zipfile.ZipFile(io.BytesIO(buf.getvalue())) as z:
        prefix = z.namelist()[0].split("/")[0]
        storages = {n.split("/data/", 1)[1]: z.read(n) for n in z.namelist() if n.startswith(f"{prefix}/data/")}
        data_pkl = z.read(f"{prefix}/data.pkl")
    return torch_zip(data_pkl, storages)


if __name__ == "__main__":  # pragma: no cover - a quick listing
    import tempfile

    for name, data in build_all(os.path.join(tempfile.gettempdir(), "hostile-sentinel")).items():
        print(f"{name:32} {len(data):6d} bytes  {DANGEROUS_GLOBALS[name]}")
    sys.exit(0)
