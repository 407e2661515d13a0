"""Lets a checkout run uninstalled: loads the plugin unless the installed entry point already did."""
import importlib.metadata


def _entry_point_installed() -> bool:
    return any(ep.value == "pytest_zero3.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


# pytester serves the plugin's own tests (tests/); pytest only accepts pytest_plugins at the root.
pytest_plugins = ["pytester"] + ([] if _entry_point_installed() else ["pytest_zero3.plugin"])
