"""``python -m torch_serial_testing vendor PYTORCH_CHECKOUT``: put the library into pytorch's ``test/``.

pytorch does not install test helpers; every runner imports them from ``test/`` (on ``sys.path``),
so the package is copied byte for byte to ``test/torch_serial_testing/``; ``--with-flagship`` adds
the flagship and the aggregator lines (replacing its by-name import, which a device filter breaks).
Idempotent (identical files untouched, files the package lost removed); ``--check`` writes nothing.
Only the standard library is used: torch is not imported.

Links are never followed: a symlink (or anything but a regular file or folder) at ``test/``, at
``test/torch_serial_testing`` or anywhere inside it, or at a path ``--with-flagship`` writes, is
refused before anything is written or removed, so no write or removal lands outside the checkout;
a file is written beside its place and renamed over it, never written through the old name.
"""

from __future__ import annotations

import argparse
import os
import re
import stat
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK

__all__ = ["FLAGSHIP", "AGGREGATOR", "AGGREGATOR_LINES", "VendorError", "VendorReport", "vendor", "run"]

PACKAGE = "torch_serial_testing"
FLAGSHIP = "ao/sparsity/test_qlinear_packed_params.py"  # relative to test/
AGGREGATOR = "test_ao_sparsity.py"  # relative to test/
_FLAGSHIP_MODULE = "ao.sparsity.test_qlinear_packed_params"
AGGREGATOR_LINES = (
    "# Serialization round trips: every class the file generates here, under any device filter",
    "from torch_serial_testing import import_round_trip_tests",
    f'import_round_trip_tests("{_FLAGSHIP_MODULE}", globals())',
)
# The aggregator's own style of import, which breaks for generated classes.
_BY_NAME = re.compile(rf"^\s*from\s+{re.escape(_FLAGSHIP_MODULE)}\s+import\s+.*$")
_MAIN_GUARD = re.compile(r"""^if\s+__name__\s*==\s*['"]__main__['"]\s*:""")
_SKIP_DIRS = {"__pycache__"}
#: Files of the package that are not the core.
_NOT_CORE = {"__main__.py"}
_SKIP_SUFFIXES = (".pyc", ".pyo")


class VendorError(Exception):
    """The checkout or the source cannot be vendored (the message says which path and why)."""


@dataclass
class VendorReport:
    """What was (or, with ``check``, would be) changed; ``stale`` is empty when the copy is current."""

    checkout: Path
    written: list[str] = field(default_factory=list)
    removed: list[str] = field(default_factory=list)
    unchanged: int = 0
    stale: list[str] = field(default_factory=list)

    def lines(self, check: bool) -> list[str]:
        out = [f"checkout: {self.checkout}"]
        if check:
            out += [f"  not current: {s}" for s in self.stale]
            out.append(
                "status: CURRENT"
                if not self.stale
                else f"status: STALE (run: python -m {PACKAGE} vendor {self.checkout}"
                f"{' --with-flagship' if any(FLAGSHIP in s or AGGREGATOR in s for s in self.stale) else ''})"
            )
        else:
            out += [f"  wrote {p}" for p in self.written] + [f"  removed {p}" for p in self.removed]
            out.append(f"status: {len(self.written)} written, {len(self.removed)} removed, {self.unchanged} unchanged")
        return out


def package_dir() -> Path:
    """The package being vendored: the one running this code."""
    return Path(__file__).resolve().parents[2]


def core_files(src: Path) -> list[Path]:
    """The core: the package's top-level modules and its marker file, never the tools (this code,
    ``__main__``) nor bytecode caches."""
    return sorted(
        p for p in src.iterdir() if p.is_file() and p.name not in _NOT_CORE and not p.name.endswith(_SKIP_SUFFIXES)
    )


def flagship_source() -> Optional[Path]:
    """The flagship next to the package: a checkout of this project (``test/``) or a vendored tree."""
    parent = package_dir().parent
    return next((c for c in (parent / "test" / FLAGSHIP, parent / FLAGSHIP) if c.is_file()), None)


def _aggregator_text(text: str) -> str:
    """*text* with the flagship's by-name imports replaced by ``AGGREGATOR_LINES``, once."""
    lines = text.splitlines()
    drop: set[int] = set()  # by-name imports of the flagship (parenthesised ones span lines) and our block
    i = 0
    while i < len(lines):
        if lines[i] in AGGREGATOR_LINES or _BY_NAME.match(lines[i]):
            drop.add(i)
            if "(" in lines[i]:  # a parenthesised import spans lines
                while ")" not in lines[i] and i + 1 < len(lines):
                    i += 1
                    drop.add(i)
        i += 1
    kept = [ln for i, ln in enumerate(lines) if i not in drop]
    if drop:  # where the old import (or our block) was
        at = len([i for i in range(min(drop)) if i not in drop])
        block = list(AGGREGATOR_LINES)
    else:  # before ``if __name__ == "__main__":``, else at the end, set off by blank lines
        at = next((i for i, ln in enumerate(kept) if _MAIN_GUARD.match(ln)), len(kept))
        block = ([""] if at > 0 and kept[at - 1].strip() else []) + list(AGGREGATOR_LINES)
        block += [""] if at < len(kept) else []
    kept[at:at] = block
    return "\n".join(kept) + "\n"


def vendor(checkout: os.PathLike[str] | str, *, with_flagship: bool = False, check: bool = False) -> VendorReport:
    """Copy the package (and with *with_flagship* the flagship and its aggregator lines) into *checkout*;
    with *check*, write nothing and report what is not current."""
    checkout = Path(checkout).resolve()
    test = checkout / "test"
    if not checkout.is_dir():
        raise VendorError(f"{checkout}: no such directory; pass the root of a pytorch checkout")
    if not test.is_dir():
        raise VendorError(
            f"{checkout} has no test/ folder, so it is not the root of a pytorch checkout; "
            "pass the folder that holds test/ (and torch/, setup.py)"
        )
    report = VendorReport(checkout)
    src = package_dir()
    dest = test / PACKAGE
    sources = {dest / path.name: path for path in core_files(src)}
    aggregator = test / AGGREGATOR
    if with_flagship:
        flagship = flagship_source()
        if flagship is None:
            raise VendorError(
                f"--with-flagship: {FLAGSHIP} is not next to {src} (an installed wheel does not ship it); "
                "run the command from a checkout of torch_serial_testing"
            )
        sources[test / FLAGSHIP] = flagship
    # Before anything is read or written: no link on the way to a path written, at it, or in dest.
    found = _tree_files(dest, checkout)
    for path in [*sources, *([aggregator] if with_flagship else [])]:
        between = list(path.relative_to(test).parents)[:-1]  # the folders from test/ down to it
        for folder in reversed(between):
            _require_real(test / folder, checkout, folder=True)
        _require_real(path, checkout, folder=False)
    plan = {path: source.read_bytes() for path, source in sources.items()}
    if with_flagship:
        if not aggregator.is_file():
            raise VendorError(
                f"--with-flagship: {aggregator} does not exist; pytorch's checkout has it (the ao.sparsity "
                "aggregator). Create it or vendor without --with-flagship"
            )
        plan[aggregator] = _aggregator_text(aggregator.read_text(encoding="utf-8")).encode("utf-8")
    stale_files = [
        p
        for p in found
        if p not in plan
        and not p.name.endswith(_SKIP_SUFFIXES)
        and not _SKIP_DIRS.intersection(p.relative_to(dest).parts)
    ]

    def rel(path: Path) -> str:  # paths as seen from the checkout's root
        return path.relative_to(checkout).as_posix()

    for path, data in plan.items():
        current = path.read_bytes() if path.is_file() else None
        if current == data:
            report.unchanged += 1
            continue
        report.stale.append(f"{rel(path)} ({'missing' if current is None else 'differs'})")
        if not check:
            path.parent.mkdir(parents=True, exist_ok=True)
            _replace(path, data)
            report.written.append(rel(path))
    for path in stale_files:
        report.stale.append(f"{rel(path)} (not in the package)")
        if not check:
            path.unlink()
            report.removed.append(rel(path))
    return report


_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _replace(path: Path, data: bytes) -> None:
    """*path* replaced by a new file holding *data*: written beside it, then renamed over it, so what
    the old name pointed to (a hard link's other names, a link made since the check) is never written."""
    new = path.with_name(f".{path.name}.vendor-{os.getpid()}")
    fd = os.open(new, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW, 0o644)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(new, path)
    except BaseException:
        new.unlink(missing_ok=True)
        raise


def _require_real(path: Path, checkout: Path, folder: bool) -> None:
    """*path* is absent, or a real folder (*folder*) or regular file: never a link, a device or a FIFO."""
    try:
        mode = os.lstat(path).st_mode
    except FileNotFoundError:
        return
    if stat.S_ISDIR(mode) if folder else stat.S_ISREG(mode):
        return
    what = "a symlink" if stat.S_ISLNK(mode) else "not a regular file" if not folder else "not a folder"
    target = f" (to {os.readlink(path)})" if stat.S_ISLNK(mode) else ""
    raise VendorError(
        f"{path.relative_to(checkout).as_posix()} is {what}{target}: vendor writes only real "
        f"{'folders' if folder else 'files'} inside the checkout and never follows a link; remove it "
        "(nothing was written or removed)"
    )


def _tree_files(dest: Path, checkout: Path) -> list[Path]:
    """The files under *dest* (a real folder, or absent), found without following a link: a link or
    anything but a folder or regular file anywhere in it raises :class:`VendorError`."""
    _require_real(dest.parent, checkout, folder=True)
    _require_real(dest, checkout, folder=True)
    files: list[Path] = []
    folders = [dest] if dest.is_dir() else []
    while folders:
        with os.scandir(folders.pop()) as entries:
            for entry in entries:
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    folders.append(path)
                    continue
                _require_real(path, checkout, folder=False)
                files.append(path)
    return sorted(files)


def run(args: argparse.Namespace) -> int:
    """Run ``vendor`` for parsed *args*; returns the exit code."""
    try:
        report = vendor(args.checkout, with_flagship=args.with_flagship, check=args.check)
    except (VendorError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_DANGEROUS
    sys.stdout.write("\n".join(report.lines(args.check)) + "\n")
    return EXIT_ATTENTION if args.check and report.stale else EXIT_OK
