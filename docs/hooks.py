"""mkdocs hook: fills the generated parts of the pages (``docs/gen.py``) as the site builds."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("zero3_docs_gen", Path(__file__).with_name("gen.py"))
gen = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(gen)


def on_page_markdown(markdown, page, config, files):
    return gen.fill(markdown)
