"""Installs pytest-zero3's reference coordinator in every Python process started with this folder on
PYTHONPATH (scripts/ds-unit-tests.sh) when ``$ZERO3_DS_UNIT_MODE`` is ``reference``: pytest, the
forkservers and the ranks DeepSpeed's test harness starts (tests/unit/common.py launches its ranks with
multiprocessing, out of reach of any pytest hook; every new interpreter runs ``sitecustomize`` at
start-up, and a forked process inherits the install).  In a ``stock`` run it only imports deepspeed, so
that both runs have the same processes with the same modules loaded (a rank forked from a forkserver
that already imported deepspeed starts in milliseconds, on both sides).

The install is the one a pytest-zero3 rank makes (:func:`pytest_zero3.impl.apply` of the ``reference``
spec).  pytest_zero3 is imported from the checkout this folder belongs to, which then leaves the import
path (its top-level folders would otherwise shadow names of the code under test).  Each process that
installed it (in a stock run: imported deepspeed) appends ``pid coordinator`` to ``$ZERO3_DS_UNIT_LOG`` when set.  A failure is printed and
makes the process exit: running DeepSpeed's tests on stock while calling it the reference would lie.
"""

import importlib.util
import os
import sys


def _install() -> None:
    mode = os.environ.get("ZERO3_DS_UNIT_MODE")
    if mode not in ("stock", "reference") or importlib.util.find_spec("deepspeed") is None:
        return  # not a run of the script, or an interpreter without deepspeed: nothing to install
    if mode == "stock":
        import deepspeed.runtime.zero.stage3  # noqa: F401 - what the reference's install imports

        _log()
        return
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    sys.path.insert(0, root)
    try:
        from pytest_zero3 import impl
    finally:
        sys.path.remove(root)
    impl.apply(impl.parse("reference"))
    _log()


def _log() -> None:
    log = os.environ.get("ZERO3_DS_UNIT_LOG")
    if log:
        from deepspeed.runtime.zero import parameter_offload

        cls = parameter_offload.PartitionedParameterCoordinator
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {cls.__module__}.{cls.__qualname__}\n")


try:
    _install()
except BaseException as exc:  # Python would print one line and carry on without the reference
    import traceback

    traceback.print_exc()
    sys.stderr.write(f"sitecustomize: installing the reference coordinator failed ({exc!r}); exiting\n")
    os._exit(3)
