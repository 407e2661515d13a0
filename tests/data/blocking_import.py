"""Imported by the forkserver in tests/test_lifecycle.py: an import that never finishes, as a stuck preload."""

import threading


def _block_forever_at_import():
    threading.Event().wait()


_block_forever_at_import()
