"""What differs between the Python versions the plugin supports, in one place."""

import sys

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on older Pythons only (tomli is a dependency there)
    import tomli as tomllib

__all__ = ["tomllib"]
