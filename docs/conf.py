"""Sphinx configuration of hetsync's documentation site (``make docs`` builds ``docs/`` into ``site/``).

Sphinx with MyST-Parser (the pages are Markdown) and the furo theme; ``_ext/hetsync_docs.py`` adds the
directives that generate tables from the code and from measured results (see the architecture page).
"""
import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))  # the checkout's hetsync, also without an install
sys.path.insert(0, os.path.join(HERE, "_ext"))

project = "hetsync"
author = "the hetsync developers"
copyright = "2026, the hetsync developers"
release = version = "0.1.0"

extensions = ["myst_parser", "sphinx.ext.autodoc", "sphinx.ext.napoleon", "hetsync_docs"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build", "_ext", "Thumbs.db", ".DS_Store"]

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 4  # links to headings: [text](page.md#heading-slug)

autodoc_member_order = "bysource"
autodoc_typehints = "none"  # the docstrings give shapes, dtypes and units
autodoc_mock_imports = []
napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_use_rtype = False

html_theme = "furo"
html_title = "hetsync"
html_static_path = []
html_show_sourcelink = False
