"""Run by tests/test_lifecycle.py: a scenario that blocks until pytest is terminated."""

import os
import threading


def announce_and_block(marker_dir):
    with open(os.path.join(marker_dir, f"rank-{os.getpid()}"), "w") as fh:
        fh.write(str(os.getppid()))  # the forkserver is the rank's parent
    threading.Event().wait()


def test_blocks(zero3_world):
    # the variable, or ./markers (a session that must keep the environment its zygote was shared under)
    zero3_world.run(announce_and_block, os.environ.get("ZERO3_MARKER_DIR") or os.path.abspath("markers"))
