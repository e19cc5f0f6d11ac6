"""``python -m torch_serial_testing vendor PYTORCH_CHECKOUT``: put the library into pytorch's ``test/``.

pytorch does not install test helpers; it imports them from ``test/``, which
every runner puts on ``sys.path`` (the script's folder, the ``cd test`` working
directory, pytest's conftest folder, or a subfolder file's one-line idiom).
So the package is *copied*, byte for byte, to ``test/torch_serial_testing/``.
With ``--with-flagship`` the rewritten ``test_qlinear_packed_params.py`` goes
to ``test/ao/sparsity/`` and ``test/test_ao_sparsity.py`` gets the aggregator
lines (replacing any ``from ao.sparsity.test_qlinear_packed_params import ...``
line, which a device filter would turn into an ImportError).

Idempotent: files already identical are not rewritten; files the package no
longer has are removed from the copy.  ``--check`` writes nothing and exits 1
when the checkout's copy is not current (listing why), 0 when it is.  Only the
standard library is used: torch is not imported.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from .contract import EXIT_ATTENTION, EXIT_DANGEROUS, EXIT_OK, exit_codes_help

__all__ = ["FLAGSHIP", "AGGREGATOR", "AGGREGATOR_LINES", "VendorError", "VendorReport", "vendor", "add_parser", "run"]

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
_SKIP_SUFFIXES = (".pyc", ".pyo")

EXIT_STALE = EXIT_ATTENTION
EXIT_ERROR = EXIT_DANGEROUS


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
            out.append("status: CURRENT" if not self.stale else
                       f"status: STALE (run: python -m {PACKAGE} vendor {self.checkout}"
                       f"{' --with-flagship' if any(FLAGSHIP in s or AGGREGATOR in s for s in self.stale) else ''})")
        else:
            out += [f"  wrote {p}" for p in self.written] + [f"  removed {p}" for p in self.removed]
            out.append(f"status: {len(self.written)} written, {len(self.removed)} removed, {self.unchanged} unchanged")
        return out


def package_dir() -> Path:
    """The package being vendored: the one running this code."""
    return Path(__file__).resolve().parent.parent


def _package_files(src: Path) -> dict[str, bytes]:
    files = {}
    for root, dirs, names in os.walk(src):
        dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
        for name in sorted(names):
            if name.endswith(_SKIP_SUFFIXES):
                continue
            path = Path(root, name)
            files[path.relative_to(src).as_posix()] = path.read_bytes()
    return files


def flagship_source() -> Optional[Path]:
    """The flagship next to the package: a checkout of this project (``test/``) or a vendored tree."""
    parent = package_dir().parent
    for candidate in (parent / "test" / FLAGSHIP, parent / FLAGSHIP):
        if candidate.is_file():
            return candidate
    return None


def _test_dir(checkout: Path) -> Path:
    if not checkout.is_dir():
        raise VendorError(f"{checkout}: no such directory; pass the root of a pytorch checkout")
    test = checkout / "test"
    if not test.is_dir():
        raise VendorError(
            f"{checkout} has no test/ folder, so it is not the root of a pytorch checkout; "
            "pass the folder that holds test/ (and torch/, setup.py)"
        )
    return test


def _by_name_spans(lines: list[str]) -> set[int]:
    """Indexes of by-name imports of the flagship (parenthesised ones span lines) and of our block."""
    drop: set[int] = set()
    i = 0
    while i < len(lines):
        if lines[i] in AGGREGATOR_LINES:
            drop.add(i)
        elif _BY_NAME.match(lines[i]):
            drop.add(i)
            if "(" in lines[i] and ")" not in lines[i]:
                while i + 1 < len(lines) and ")" not in lines[i]:
                    i += 1
                    drop.add(i)
        i += 1
    return drop


def _aggregator_text(text: str) -> str:
    """*text* with the flagship's by-name imports replaced by ``AGGREGATOR_LINES``, once."""
    lines = text.splitlines()
    drop = _by_name_spans(lines)
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


def vendor(checkout: "os.PathLike[str] | str", *, with_flagship: bool = False, check: bool = False) -> VendorReport:
    """Copy the package (and with *with_flagship* the flagship and its aggregator lines) into *checkout*.

    With *check*, nothing is written and the report lists what is not current.
    Raises :class:`VendorError` for a path that is not a pytorch checkout or a
    missing flagship or aggregator.  Vendoring a copy onto itself changes nothing.
    """
    checkout = Path(checkout).resolve()
    test = _test_dir(checkout)
    report = VendorReport(checkout)
    src = package_dir()
    dest = test / PACKAGE
    plan: dict[Path, bytes] = {dest / rel: data for rel, data in _package_files(src).items()}
    if with_flagship:
        flagship = flagship_source()
        if flagship is None:
            raise VendorError(
                f"--with-flagship: {FLAGSHIP} is not next to {src} (an installed wheel does not ship it); "
                "run the command from a checkout of torch_serial_testing"
            )
        plan[test / FLAGSHIP] = flagship.read_bytes()
        aggregator = test / AGGREGATOR
        if not aggregator.is_file():
            raise VendorError(
                f"--with-flagship: {aggregator} does not exist; pytorch's checkout has it (the ao.sparsity "
                "aggregator). Create it or vendor without --with-flagship"
            )
        plan[aggregator] = _aggregator_text(aggregator.read_text(encoding="utf-8")).encode("utf-8")
    stale_files = []
    if dest.is_dir():
        wanted = set(plan)
        for path in sorted(p for p in dest.rglob("*") if p.is_file()):
            if _SKIP_DIRS.intersection(path.relative_to(dest).parts) or path.name.endswith(_SKIP_SUFFIXES):
                continue
            if path not in wanted:
                stale_files.append(path)
    elif dest.exists():
        raise VendorError(f"{dest} exists and is not a folder; move it away first")

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
            path.write_bytes(data)
            report.written.append(rel(path))
    for path in stale_files:
        report.stale.append(f"{rel(path)} (not in the package)")
        if not check:
            path.unlink()
            report.removed.append(rel(path))
    return report


def add_parser(sub: "argparse._SubParsersAction[argparse.ArgumentParser]", formatter: type) -> None:
    """Register ``vendor`` on the CLI's subparsers."""
    ven = sub.add_parser(
        "vendor",
        help="copy this package into a pytorch checkout's test/ (optionally with the flagship test)",
        description=textwrap.fill(
            "Copy torch_serial_testing into PYTORCH_CHECKOUT/test/torch_serial_testing/ (not installed: every "
            "pytorch test runner imports it from test/). Idempotent. Does not import torch.", 88
        ),
        epilog=exit_codes_help(["vendor"]),
        formatter_class=formatter,
    )
    ven.add_argument("checkout", metavar="PYTORCH_CHECKOUT", help="root of a pytorch checkout (the folder holding test/)")
    ven.add_argument(
        "--with-flagship",
        action="store_true",
        help=f"also copy test/{FLAGSHIP} and add the import lines to test/{AGGREGATOR}",
    )
    ven.add_argument("--check", action="store_true", help="write nothing; exit 1 if the checkout's copy is not current")


def run(args: argparse.Namespace) -> int:
    """Run ``vendor`` for parsed *args*; returns the exit code."""
    try:
        report = vendor(args.checkout, with_flagship=args.with_flagship, check=args.check)
    except (VendorError, OSError) as e:
        sys.stderr.write(f"error: {e}\n")
        return EXIT_ERROR
    sys.stdout.write("\n".join(report.lines(args.check)) + "\n")
    return EXIT_STALE if args.check and report.stale else EXIT_OK
