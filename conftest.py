"""Lets a checkout run uninstalled: loads the plugin unless the installed entry point already did."""
import importlib.metadata


def _entry_point_installed() -> bool:
    return any(ep.value == "pytest_zero3.plugin" for ep in importlib.metadata.entry_points(group="pytest11"))


if not _entry_point_installed():
    pytest_plugins = ["pytest_zero3.plugin"]
