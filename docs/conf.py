"""Sphinx configuration of the torch_serial_testing documentation.

Build: ``python -m sphinx -W -b html docs docs/_build/html`` (``pip install -e ".[docs]"``).
"""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)  # the checkout's package, also when it is not installed

import torch_serial_testing  # noqa: E402

project = "torch_serial_testing"
author = "torch_serial_testing maintainers"
copyright = "torch_serial_testing maintainers"
release = version = torch_serial_testing.__version__

extensions = ["sphinx.ext.autodoc"]
# The build output is not a page.
exclude_patterns = ["_build", "examples/README.rst"]
root_doc = "index"
nitpicky = False

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}
# The reference documents the public names only; torch is the one heavy import autodoc needs.
autodoc_mock_imports: list = []

try:
    import furo  # noqa: F401

    html_theme = "furo"
except ImportError:  # the docs extra installs furo; any Sphinx still builds with its own theme
    html_theme = "alabaster"
html_title = f"torch_serial_testing {release}"
