"""Serves the plugin's own tests (tests/) with pytester.

No ``pytest_plugins`` here: running the conformance suite of this checkout (editable install) from
another directory loads this file as a non-root conftest, where pytest rejects ``pytest_plugins``.
The plugin itself comes from the installed entry point (``pip install -e .``; uninstalled, run with
``-p pytest_zero3.plugin``).
"""

from pathlib import Path


def pytest_configure(config):
    if config.rootpath == Path(__file__).resolve().parent and not config.pluginmanager.has_plugin("pytester"):
        config.pluginmanager.import_plugin("pytester")
