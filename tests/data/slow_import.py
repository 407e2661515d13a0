"""Imported by the forkserver in tests/test_lifecycle.py: a preload slower than the scenario timeout
(a cold forkserver under ``pytest -n`` on a loaded machine), which must not fail a healthy test."""

import os
import threading

threading.Event().wait(float(os.environ.get("PYTEST_ZERO3_SLOW_IMPORT_SECONDS", "0")))
