"""The scan reads exactly what torch reads: a differential of our archive view against torch's reader.

Every crafted archive below is judged twice: by the library (``scan_checkpoint`` +
``predict``) and by torch itself (``torch.load(..., weights_only=True)``, which never
executes anything).  They must agree on loads/rejects and on the reason.  The globals
used are harmless (``collections.deque``) and are never allowlisted here.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
import sys
import tarfile
import unittest
import warnings
import zipfile

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))  # the project root

from test.helpers import hostile_checkpoints as H  # noqa: E402

from torch_serial_testing import Checkpoint, CheckpointFormatError, predict, scan_checkpoint
from torch_serial_testing.model import scan_limits
from torch_serial_testing.tools import FileCheckpoint
from torch_serial_testing.tools import scan_checkpoint as tools_scan_checkpoint

GOOD = pickle.dumps({"a": 1}, protocol=2)
EVIL = pickle.dumps(__import__("collections").deque([1]), protocol=2)  # names collections.deque
EVIL_NAME = "collections.deque"


def torch_weights_only(data: bytes) -> tuple[bool, str]:
    """What torch does with *data* weights-only: (loaded, message)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.load(io.BytesIO(data), weights_only=True)
        return True, ""
    except Exception as e:  # noqa: BLE001 - any failure is torch's answer
        return False, f"{type(e).__name__}: {e}"


def _torch_refuses_torchscript() -> bool:
    """Asked of torch itself, not its version: does a weights-only torch.load refuse a TorchScript archive?"""
    buf = io.BytesIO()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.jit.save(torch.jit.script(torch.nn.Identity()), buf)
    return not torch_weights_only(buf.getvalue())[0]


TORCH_REFUSES_TORCHSCRIPT = _torch_refuses_torchscript()


def zip_of(entries: list[tuple[str, bytes]], method: int = zipfile.ZIP_STORED) -> bytes:
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", method) as z:
        for name, raw in entries:
            z.writestr(name, raw)
    return out.getvalue()


def records(data_pkl_entries: list[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
    return [*data_pkl_entries, ("archive/version", b"3\n"), ("archive/byteorder", b"little")]


class AgreesWithTorch:
    """Mixin: the library's view of crafted bytes against torch's own load."""

    #: How the bytes are wrapped: the core reads zip archives from memory; older formats are the tools'.
    wrap = staticmethod(Checkpoint.from_bytes)

    def assertAgreesWithTorch(self, data: bytes) -> None:  # noqa: N802
        """predict() (or a CheckpointFormatError) matches what torch's weights-only load does."""
        loaded, message = torch_weights_only(data)
        try:
            exp = predict("safe_globals", self.wrap(data))
        except CheckpointFormatError as e:
            self.assertFalse(loaded, f"the scan refused bytes torch loads: {e}")
            return
        self.assertEqual(exp.loads, loaded, f"predicted {exp.summary()}; torch: {message or 'loaded'}")
        if not loaded:
            self.assertTrue(exp.rejection and exp.rejection in message, (exp.rejection, message))


class ArchiveDifferential(AgreesWithTorch, unittest.TestCase):
    def test_duplicate_records_differing_in_case(self) -> None:
        # torch's reader finds records case-insensitively; which one it returns depends on the order.
        for entries in (
            [("archive/DATA.pkl", EVIL), ("archive/data.pkl", GOOD)],
            [("archive/data.pkl", GOOD), ("archive/DATA.pkl", EVIL)],
            [("archive/data.pkl", EVIL), ("archive/Data.pkl", GOOD)],
        ):
            with self.subTest([n for n, _ in entries]):
                data = zip_of(records(entries))
                self.assertAgreesWithTorch(data)
                torch_pkl = torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl")
                info = scan_checkpoint(data)
                self.assertEqual(EVIL_NAME in info.globals, torch_pkl == EVIL)

    def test_case_duplicate_python_zipfile_would_misread(self) -> None:
        data = zip_of(records([("archive/DATA.pkl", EVIL), ("archive/data.pkl", GOOD)]))
        with zipfile.ZipFile(io.BytesIO(data)) as z:
            self.assertEqual(z.read("archive/data.pkl"), GOOD)  # Python's view: harmless
        self.assertEqual(torch._C.PyTorchFileReader(io.BytesIO(data)).get_record("data.pkl"), EVIL)
        self.assertIn(EVIL_NAME, scan_checkpoint(data).globals)  # the scan follows torch

    def test_two_central_directories(self) -> None:
        first = zip_of(records([("archive/data.pkl", GOOD)]))
        second = zip_of(records([("archive/data.pkl", EVIL)]))
        for data in (first + second, second + first):
            with self.subTest(first_is_good=data.startswith(first)):
                self.assertAgreesWithTorch(data)

    def test_zip64_locator_pointing_at_another_end_record(self) -> None:
        good = zip_of(records([("archive/data.pkl", GOOD)]))
        evil = zip_of(records([("archive/data.pkl", EVIL)]))
        data = bytearray(evil + good)
        # A zip64 end record describing the *first* archive's central directory, plus a locator,
        # inserted before the final end-of-central-directory record.
        eocd = data.rfind(b"PK\x05\x06")
        cd_entries, cd_size, cd_offset = struct.unpack("<HII", evil[evil.rfind(b"PK\x05\x06") + 10 :][:10])
        z64 = struct.pack("<IQHHIIQQQQ", 0x06064B50, 44, 45, 45, 0, 0, cd_entries, cd_entries, cd_size, cd_offset)
        locator = struct.pack("<IIQI", 0x07064B50, 0, eocd, 1)
        data[eocd:eocd] = z64 + locator
        self.assertAgreesWithTorch(bytes(data))

    def test_constants_pkl_in_a_subfolder_is_not_torchscript(self) -> None:
        data = zip_of(records([("archive/data.pkl", EVIL), ("archive/sub/constants.pkl", GOOD)]))
        info = scan_checkpoint(data)
        self.assertEqual(info.format, "zip")  # torch: "constants.pkl" not among its records
        self.assertIn(EVIL_NAME, info.globals)
        self.assertAgreesWithTorch(data)

    def test_torchscript_archive_is_refused_weights_only(self) -> None:
        buf = io.BytesIO()
        with warnings.catch_warnings():  # a TorchScript archive on purpose: torch 2.13 deprecates making one
            # DeprecationWarning on torch 2.13, FutureWarning on 2.15: matched by message only
            warnings.filterwarnings("ignore", r".*torch\.jit\.\w+` is deprecated")
            torch.jit.save(torch.jit.script(torch.nn.ReLU()), buf)
        data = buf.getvalue()
        # The core reads what torch.save writes; it names the reader of a TorchScript archive.
        refusal = (
            "this is a TorchScript archive (torch.jit.save wrote it): torch.load hands it to torch.jit.load; "
            "read it with torch_serial_testing.tools.scan_checkpoint"
        )
        for label, call in (
            ("scan_checkpoint", lambda: scan_checkpoint(data)),
            ("predict", lambda: predict("safe_globals", Checkpoint.from_bytes(data))),
        ):
            with self.subTest(core=label):
                with self.assertRaises(CheckpointFormatError) as cm:
                    call()
                self.assertEqual(str(cm.exception), refusal)
        # The tools read it as torch.load does.
        info = tools_scan_checkpoint(data)
        self.assertEqual(info.format, "torchscript")
        exp = predict("safe_globals", FileCheckpoint.from_bytes(data))
        loaded, message = torch_weights_only(data)
        if TORCH_REFUSES_TORCHSCRIPT:
            self.assertIn("Cannot use ``weights_only=True`` with TorchScript archives", info.weights_only_blocker)
            self.assertFalse(exp.loads)
            self.assertEqual(exp.error_type, "RuntimeError")
            self.assertFalse(loaded)
            self.assertIn(exp.rejection, message)
        else:  # torch 2.4: weights_only=True is not obeyed, torch.jit.load takes the archive
            self.assertIsNone(info.weights_only_blocker)
            self.assertTrue(loaded, message)
            self.assertFalse(exp.weights_only)
            self.assertTrue(exp.loads)
            self.assertIn("torch.jit.load whatever weights_only says", exp.reason)

    def test_damaged_archives_are_format_errors_torch_also_refuses(self) -> None:
        base = zip_of(records([("archive/data.pkl", GOOD)]))
        encrypted = bytearray(base)
        for sig, flag_at in ((b"PK\x03\x04", 6), (b"PK\x01\x02", 8)):
            i = encrypted.find(sig)
            while i != -1:
                encrypted[i + flag_at] |= 1
                i = encrypted.find(sig, i + 1)
        method = bytearray(base)
        method[method.find(b"PK\x01\x02") + 10] = 12  # bzip2: not supported by torch's reader
        method[method.find(b"PK\x03\x04") + 8] = 12
        no_subfolder = zip_of([("data.pkl", GOOD)])
        no_data = zip_of(records([("archive/other.pkl", GOOD)]))
        for label, data in (
            ("encrypted", encrypted),
            ("method", method),
            ("no subfolder", no_subfolder),
            ("no data.pkl", no_data),
        ):
            with self.subTest(label):
                with self.assertRaises(CheckpointFormatError) as cm:
                    scan_checkpoint(bytes(data))
                self.assertEqual(len(str(cm.exception).splitlines()), 1, str(cm.exception))
                self.assertFalse(torch_weights_only(bytes(data))[0])

    def test_deflate_bomb_is_refused_before_decompressing(self) -> None:
        bomb = b"\x80\x02" + b"N0" * 5_000_000 + b"N."  # 10 MB of NONE/POP, a few kB deflated
        data = zip_of(records([("archive/data.pkl", bomb)]), zipfile.ZIP_DEFLATED)
        self.assertLess(len(data), 100_000)
        with scan_limits(max_pickle_bytes=1_000_000):
            with self.assertRaisesRegex(CheckpointFormatError, r"max_pickle_bytes=1000000"):
                scan_checkpoint(data)


class LegacyAndTar(AgreesWithTorch, unittest.TestCase):
    """Formats before torch 1.6: read by the tools (``FileCheckpoint``, ``tools.scan_checkpoint``)."""

    wrap = staticmethod(FileCheckpoint.from_bytes)

    def test_the_core_refuses_them_naming_the_tools(self) -> None:
        buf = io.BytesIO()
        torch.save({"a": 1}, buf, _use_new_zipfile_serialization=False)
        tar = self.tar_of({"storages": b"", "tensors": b"", "pickle": b""})
        for label, data in (("legacy", buf.getvalue()), ("tar", tar)):
            for how, call in (
                ("scan_checkpoint", scan_checkpoint),
                ("predict", lambda d: predict("safe_globals", Checkpoint.from_bytes(d))),
            ):
                with self.subTest(label, core=how):
                    with self.assertRaises(CheckpointFormatError) as cm:
                        call(data)
                    self.assertEqual(
                        str(cm.exception),
                        f"not a zip archive (the first bytes are {data[:4]!r}): torch.save has written zip "
                        "archives since torch 1.6; read other formats (legacy streams, tar archives) and files "
                        "with torch_serial_testing.tools.scan_checkpoint",
                    )

    def test_legacy_protocols_0_to_5_are_torch_checkpoints(self) -> None:
        for proto in range(6):
            for obj in ({"t": torch.ones(2)}, {"a": 1, "b": [1, 2]}):
                buf = io.BytesIO()
                torch.save(obj, buf, pickle_protocol=proto, _use_new_zipfile_serialization=False)
                with self.subTest(proto=proto, keys=sorted(obj)):
                    info = tools_scan_checkpoint(buf.getvalue())
                    self.assertEqual(info.format, "legacy")
                    self.assertAgreesWithTorch(buf.getvalue())
                    if proto < 2:  # the magic number itself is a LONG: "Unsupported operand 76"
                        self.assertEqual(info.weights_only_blocker, "Unsupported operand 76")

    def test_every_legacy_pickle_is_scanned(self) -> None:
        sys_info = H.glob("collections", "deque") + b")R."  # collections.deque() as sys_info
        data = H.legacy_stream(pickle.dumps({"a": 1}, protocol=2), b"\x80\x02" + sys_info)
        info = tools_scan_checkpoint(data)
        self.assertIn(EVIL_NAME, info.globals)
        self.assertAgreesWithTorch(data)

    def test_wrong_magic_or_protocol_version(self) -> None:
        with self.assertRaisesRegex(CheckpointFormatError, "no torch magic number"):
            tools_scan_checkpoint(pickle.dumps(12345, protocol=2) + pickle.dumps(1001, protocol=2))
        bad_version = pickle.dumps(H.LEGACY_MAGIC, protocol=2) + pickle.dumps(1000, protocol=2)
        with self.assertRaisesRegex(CheckpointFormatError, "protocol version"):
            tools_scan_checkpoint(bad_version)

    def tar_of(self, members: dict[str, bytes], sparse: frozenset[str] = frozenset()) -> bytes:
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:", format=tarfile.GNU_FORMAT if sparse else tarfile.PAX_FORMAT) as tar:
            for name, raw in members.items():
                info = tarfile.TarInfo(name)
                info.size = len(raw)
                if name in sparse:
                    info.type = tarfile.GNUTYPE_SPARSE
                tar.addfile(info, io.BytesIO(raw))
        return out.getvalue()

    def test_tar_storages_and_tensors_members_are_scanned(self) -> None:
        float_storage = H.glob("torch", "FloatStorage")
        storage_args = b"\x80\x02(X\x01\x00\x00\x00kX\x03\x00\x00\x00cpu" + float_storage + b"t."
        storages = (
            pickle.dumps(1, protocol=2)
            + storage_args
            + struct.pack("<q", 2)
            + b"\x00" * 8  # two float32 elements
            + b"\x80\x02"
            + H.glob("collections", "deque")
            + b")R."  # the storage views pickle
        )
        tensors = pickle.dumps(0, protocol=2)
        data = self.tar_of({"storages": storages, "tensors": tensors, "pickle": pickle.dumps({}, protocol=2)})
        info = tools_scan_checkpoint(data)
        self.assertEqual(info.format, "tar")
        self.assertIn(EVIL_NAME, info.full_load_globals)
        self.assertIn("torch.FloatStorage", info.full_load_globals)
        self.assertIn("legacy .tar format", info.weights_only_blocker)

    def test_gnu_sparse_and_odd_tar_members_are_refused(self) -> None:
        members = {
            "storages": pickle.dumps(0, protocol=2) + pickle.dumps([], protocol=2),
            "tensors": pickle.dumps(0, protocol=2),
            "pickle": pickle.dumps({}, protocol=2),
        }
        with self.assertRaisesRegex(CheckpointFormatError, "GNU sparse"):
            tools_scan_checkpoint(self.tar_of(members, sparse=frozenset({"storages"})))
        out = io.BytesIO()
        with tarfile.open(fileobj=out, mode="w:") as tar:
            link = tarfile.TarInfo("storages")
            link.type = tarfile.SYMTYPE
            link.linkname = "/etc/passwd"
            tar.addfile(link)
        with self.assertRaisesRegex(CheckpointFormatError, "not a regular file"):
            tools_scan_checkpoint(out.getvalue())


class Alpha:
    """Two classes whose names have the same length: their checkpoints have the same size."""


class Omega:
    pass


class TestRememberedScans(unittest.TestCase):
    """Small checkpoints' scans are remembered by content: never the facts of other bytes."""

    @staticmethod
    def saved(obj: object) -> bytes:
        buf = io.BytesIO()
        torch.save(obj, buf)
        return buf.getvalue()

    def test_identical_bytes_share_a_scan(self) -> None:
        data = self.saved({"x": Alpha()})
        self.assertIs(Checkpoint.from_bytes(data).info, Checkpoint.from_bytes(bytes(bytearray(data))).info)

    def test_same_size_other_bytes_get_their_own_scan(self) -> None:
        a, b = self.saved({"x": Alpha()}), self.saved({"x": Omega()})
        self.assertEqual(len(a), len(b))  # the same size (and a central directory differing only by CRCs)
        self.assertNotEqual(a, b)
        info_a, info_b = Checkpoint.from_bytes(a).info, Checkpoint.from_bytes(b).info
        self.assertIsNot(info_a, info_b)
        self.assertIn(f"{__name__}.Alpha", info_a.globals)
        self.assertIn(f"{__name__}.Omega", info_b.globals)
        self.assertNotIn(f"{__name__}.Alpha", info_b.globals)
        self.assertIs(Checkpoint.from_bytes(a).info, info_a)


if __name__ == "__main__":
    unittest.main()
