"""Installs pytest-zero3's reference coordinator in every Python process started with this folder on
PYTHONPATH (scripts/ds-unit-tests.sh, ``$ZERO3_DS_UNIT_MODE=reference``) as soon as it imports
deepspeed: pytest, and the ranks DeepSpeed's test harness starts (tests/unit/common.py launches them
with multiprocessing, out of reach of any pytest hook; every new interpreter runs ``sitecustomize`` at
start-up, and a forked process inherits the install).  The install waits for deepspeed's own import, so
the processes that never import it (the ``cpuinfo`` probe DeepSpeed runs in each rank, say) pay nothing.

The install is the one a pytest-zero3 rank makes (:func:`pytest_zero3.impl.apply` of the ``reference``
spec).  pytest_zero3 is imported from the checkout this folder belongs to, which then leaves the import
path (its top-level folders would otherwise shadow names of the code under test).  Each process that
installed it appends ``pid coordinator`` to ``$ZERO3_DS_UNIT_LOG`` when set.  A failure is printed and
makes the process exit: running DeepSpeed's tests on stock while calling it the reference would lie.
"""

import importlib.abc
import importlib.util
import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _install() -> None:
    sys.path.insert(0, ROOT)
    try:
        from pytest_zero3 import impl
    finally:
        sys.path.remove(ROOT)
    impl.apply(impl.parse("reference"))
    log = os.environ.get("ZERO3_DS_UNIT_LOG")
    if log:
        from deepspeed.runtime.zero import parameter_offload

        cls = parameter_offload.PartitionedParameterCoordinator
        with open(log, "a") as fh:
            fh.write(f"{os.getpid()} {cls.__module__}.{cls.__qualname__}\n")


def _install_or_exit() -> None:
    try:
        _install()
    except BaseException as exc:  # Python would go on without the reference
        import traceback

        traceback.print_exc()
        sys.stderr.write(f"sitecustomize: installing the reference coordinator failed ({exc!r}); exiting\n")
        os._exit(3)


class _AfterDeepSpeed(importlib.abc.MetaPathFinder):
    """Finds ``deepspeed`` the usual way, and installs the reference once its package has executed."""

    def find_spec(self, name, path=None, target=None):
        if name != "deepspeed":
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(name)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _install_or_exit()

        spec.loader.exec_module = exec_module  # this spec's own loader instance
        return spec


if os.environ.get("ZERO3_DS_UNIT_MODE") == "reference":
    sys.meta_path.insert(0, _AfterDeepSpeed())
