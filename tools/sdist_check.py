#!/usr/bin/env python3
"""Build the sdist, install it into a fresh venv, and run the test suite from the unpacked sdist.

Why: a source distribution is only complete when its own tests run from it -- support modules,
``test/ao/``, the README the tests read, LICENSE.  This does what a packager would::

    python tools/sdist_check.py                 # torch==2.13.0 into the fresh venv
    python tools/sdist_check.py --torch 2.8.0 --python python3.9

Exit status: pytest's (0 when the suite passed).
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile


def main(argv: list[str] | None = None) -> int:
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default=root, help="the checkout to package (default: this one)")
    parser.add_argument(
        "--python",
        default=shutil.which("python3") or sys.executable,
        help="interpreter for the fresh venv (default: python3 on PATH)",
    )
    parser.add_argument("--torch", default="2.13.0", help="torch version to install first (default: %(default)s)")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (venv, sdist, unpacked tree)")
    parser.add_argument("--pytest-args", default="-n 2", help="extra pytest arguments (default: %(default)s)")
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="tst-sdist-")
    try:
        venv = os.path.join(work, "venv")
        subprocess.run([args.python, "-m", "venv", venv], check=True)
        py = os.path.join(venv, "bin", "python")
        pip = [py, "-m", "pip", "install", "--quiet"]
        subprocess.run([*pip, "build", f"torch=={args.torch}"], check=True)
        dist = os.path.join(work, "dist")
        subprocess.run(
            [py, "-m", "build", "--sdist", "--outdir", dist, args.source], check=True, stdout=subprocess.DEVNULL
        )
        (sdist,) = glob.glob(os.path.join(dist, "*.tar.gz"))
        print(f"built {os.path.basename(sdist)} ({os.path.getsize(sdist)} bytes)", flush=True)
        subprocess.run([*pip, f"{sdist}[test]"], check=True)
        unpacked = os.path.join(work, "unpacked")
        with tarfile.open(sdist) as tar:
            # the "data" filter (Python >= 3.12, and security backports) refuses unsafe members
            tar.extractall(unpacked, **({"filter": "data"} if hasattr(tarfile, "data_filter") else {}))
        (tree,) = glob.glob(os.path.join(unpacked, "*"))
        env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH" and not k.startswith("TORCH_FORCE_")}
        code = subprocess.run(
            [py, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", *args.pytest_args.split(), "test"],
            cwd=tree,
            env=env,
        ).returncode
        print(f"pytest from the unpacked sdist ({tree}): exit {code}", flush=True)
        return code
    finally:
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
