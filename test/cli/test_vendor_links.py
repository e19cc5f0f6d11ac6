"""``vendor`` never follows a link and never touches a path outside the checkout (issue 40, class 2).

Each attack puts a symlink where ``vendor`` reads, writes or removes -- at ``test/torch_serial_testing``,
at a file or folder inside it, on ``test/`` itself, on a folder or file ``--with-flagship`` writes --
pointing at a folder outside the checkout that holds sentinel files.  ``vendor`` must refuse (exit 2,
naming the link) before writing or removing anything, and every sentinel must be byte-for-byte as it
was.  Each attack has a benign twin: the same layout made of real files and folders, which vendors.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

from test.cli.test_vendoring import AGGREGATOR, FLAGSHIP_REL, build_tree
from torch_serial_testing.tools.cli import vendor as vendor_mod

DEST = "test/torch_serial_testing"


def snapshot(root: Path) -> dict[str, bytes]:
    """Every file under *root* (links not followed) and its bytes: what must not change."""
    found = {}
    for folder, dirs, files in os.walk(root):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(folder, d))]:
            path = Path(folder, name)
            found[path.relative_to(root).as_posix()] = (
                b"link:" + os.readlink(path).encode() if path.is_symlink() else path.read_bytes()
            )
    return found


class VendorLinks(unittest.TestCase):
    def setUp(self):
        tmp = tempfile.TemporaryDirectory(prefix="tst_vendor_links_")
        self.addCleanup(tmp.cleanup)
        base = Path(tmp.name).resolve()
        self.root = build_tree(base / "checkout")
        self.dest = self.root / DEST
        self.outside = base / "outside"
        (self.outside / "sub").mkdir(parents=True)
        # sentinels named like what vendor writes (case.py), removes (stale.py) or rewrites (the aggregator)
        for name in ("case.py", "stale.py", "sub/nested.py", "test_ao_sparsity.py", "test_qlinear_packed_params.py"):
            (self.outside / name).write_text(f"# sentinel {name}: never touched\n")
        self.before = snapshot(self.outside)

    def assertRefused(self, link: str, *, with_flagship: bool = False):
        """vendor and vendor --check both refuse naming *link*; nothing outside changed; nothing written."""
        inside = snapshot(self.root)
        for check in (True, False):
            with self.subTest(check=check), self.assertRaisesRegex(vendor_mod.VendorError, f"^{link} is a symlink"):
                vendor_mod.vendor(self.root, with_flagship=with_flagship, check=check)
        self.assertEqual(snapshot(self.outside), self.before, "a file outside the checkout changed")
        self.assertEqual(snapshot(self.root), inside, "a refused vendor wrote or removed something")

    def test_link_at_the_package_folder(self):
        self.dest.symlink_to(self.outside, target_is_directory=True)
        self.assertRefused(DEST)
        cli = subprocess.run(
            [sys.executable, "-m", "torch_serial_testing", "vendor", str(self.root)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        self.assertEqual(cli.returncode, 2, cli.stdout + cli.stderr)
        self.assertIn(f"error: {DEST} is a symlink (to {self.outside})", cli.stderr)
        self.assertIn("never follows a link; remove it (nothing was written or removed)", cli.stderr)
        self.assertEqual(cli.stdout, "")
        self.assertEqual(snapshot(self.outside), self.before)

    def test_benign_twin_real_package_folder_with_stale_files(self):
        self.dest.mkdir()
        (self.dest / "sub").mkdir()
        (self.dest / "stale.py").write_text("# stale\n")
        (self.dest / "sub" / "nested.py").write_text("# stale\n")
        report = vendor_mod.vendor(self.root)
        self.assertEqual(sorted(report.removed), [f"{DEST}/stale.py", f"{DEST}/sub/nested.py"])
        self.assertIn(f"{DEST}/case.py", report.written)
        self.assertEqual(snapshot(self.outside), self.before)

    def test_link_at_a_file_inside(self):
        self.dest.mkdir()
        (self.dest / "case.py").symlink_to(self.outside / "case.py")  # would be overwritten through
        self.assertRefused(f"{DEST}/case.py")

    def test_link_at_a_stale_file_inside(self):
        self.dest.mkdir()
        (self.dest / "stale.py").symlink_to(self.outside / "stale.py")
        self.assertRefused(f"{DEST}/stale.py")

    def test_link_at_a_folder_inside(self):
        self.dest.mkdir()
        (self.dest / "sub").symlink_to(self.outside / "sub", target_is_directory=True)  # removal would recurse
        self.assertRefused(f"{DEST}/sub")

    def test_link_at_a_deeper_file(self):
        (self.dest / "sub").mkdir(parents=True)
        (self.dest / "sub" / "nested.py").symlink_to(self.outside / "sub" / "nested.py")
        self.assertRefused(f"{DEST}/sub/nested.py")

    def test_link_on_the_test_folder(self):
        real_test = self.root / "test"
        moved = self.outside / "test"
        real_test.rename(moved)
        self.before = snapshot(self.outside)
        real_test.symlink_to(moved, target_is_directory=True)
        self.assertRefused("test")

    def test_benign_twin_checkout_named_through_a_link(self):
        """The checkout the user names may be reached through a link: it is resolved once, and the
        copy lands in the real checkout."""
        alias = self.outside.parent / "alias"
        alias.symlink_to(self.root, target_is_directory=True)
        report = vendor_mod.vendor(alias)
        self.assertEqual(report.checkout, self.root)
        self.assertTrue((self.dest / "case.py").is_file() and not (self.dest / "case.py").is_symlink())
        self.assertEqual(snapshot(self.outside), self.before)

    def test_link_on_a_flagship_folder(self):
        ao = self.root / "test" / "ao"
        for p in sorted(ao.rglob("*"), reverse=True):
            p.unlink() if p.is_file() else p.rmdir()
        ao.rmdir()
        (self.outside / "sparsity").mkdir()
        self.before = snapshot(self.outside)
        ao.symlink_to(self.outside, target_is_directory=True)
        self.assertRefused("test/ao", with_flagship=True)
        # without --with-flagship nothing is written there: the link is none of vendor's business
        self.assertTrue(vendor_mod.vendor(self.root).written)
        self.assertEqual(snapshot(self.outside), self.before)

    def test_link_at_the_flagship_and_the_aggregator(self):
        flagship = self.root / FLAGSHIP_REL
        flagship.symlink_to(self.outside / "test_qlinear_packed_params.py")
        self.assertRefused(FLAGSHIP_REL, with_flagship=True)
        flagship.unlink()
        aggregator = self.root / "test" / "test_ao_sparsity.py"
        aggregator.unlink()
        aggregator.symlink_to(self.outside / "test_ao_sparsity.py")
        self.assertRefused("test/test_ao_sparsity.py", with_flagship=True)

    def test_benign_twin_flagship_and_aggregator_real(self):
        report = vendor_mod.vendor(self.root, with_flagship=True)
        self.assertIn(FLAGSHIP_REL, report.written)
        self.assertIn("test/test_ao_sparsity.py", report.written)
        self.assertNotEqual((self.root / "test" / "test_ao_sparsity.py").read_text(), AGGREGATOR)
        self.assertEqual(snapshot(self.outside), self.before)

    def test_hard_link_inside_is_replaced_never_written_through(self):
        """A hard link is a regular file, so it is not refused; vendor replaces the name, and the file's
        other name outside the checkout keeps its bytes."""
        self.dest.mkdir()
        try:
            os.link(self.outside / "case.py", self.dest / "case.py")
        except OSError as e:
            self.skipTest(f"no hard links here: {e}")
        report = vendor_mod.vendor(self.root)
        self.assertIn(f"{DEST}/case.py", report.written)
        self.assertEqual((self.dest / "case.py").read_bytes(), (vendor_mod.package_dir() / "case.py").read_bytes())
        self.assertEqual(snapshot(self.outside), self.before)
        self.assertEqual(sorted(p.name for p in self.dest.iterdir() if p.name.startswith(".")), [])

    @unittest.skipUnless(hasattr(os, "mkfifo"), "no FIFOs on this platform")
    def test_fifo_inside_is_refused_without_hanging(self):
        self.dest.mkdir()
        os.mkfifo(self.dest / "case.py")  # writing into it would block forever
        with self.assertRaisesRegex(vendor_mod.VendorError, f"^{DEST}/case.py is not a regular file"):
            vendor_mod.vendor(self.root)


if __name__ == "__main__":
    unittest.main()
