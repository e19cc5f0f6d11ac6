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
# Types in the description, and only where they say something: no "Return type: None".
autodoc_typehints = "description"
autodoc_typehints_description_target = "documented_params"
# docs/reference.rst lists every public name in the order a user meets it; a base class shown would
# be a private one (the errors' message escaping), so no "Bases:" line.
autodoc_default_options: dict = {}
# A default shows as written (``map_location=MISSING``), not as a sentinel object's address.
autodoc_preserve_defaults = True
# Blocks written as "::" are transcripts and error messages, never Python.
highlight_language = "text"
# The reference documents the public names only; torch is the one heavy import autodoc needs.
autodoc_mock_imports: list = []

try:
    import furo  # noqa: F401

    html_theme = "furo"
except ImportError:  # the docs extra installs furo; any Sphinx still builds with its own theme
    html_theme = "alabaster"
html_title = f"torch_serial_testing {release}"
html_static_path = ["_static"]
html_css_files = ["custom.css"]  # long lines wrap; the sidebar title is not broken inside the name
