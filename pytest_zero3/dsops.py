"""DeepSpeed's ops as the ranks need them: probed once, and its CPU shared-memory comm op kept out.

Used by the forkserver before it forks ranks (:mod:`pytest_zero3.preload`) and by launcher mode
before its first scenario (:mod:`pytest_zero3.launcher`), so neither compiles anything inside a
scenario's timeout.
"""

from pytest_zero3 import accel


def probe() -> None:
    """DeepSpeed probes which ops could build (running a C compiler) on first use: do it once, here."""
    try:
        import deepspeed.ops

        deepspeed.ops.__compatible_ops__  # noqa: B018 - reading it runs the probe
    except Exception:
        pass


def skip_cpu_shm_comm_op() -> None:
    """Keep DeepSpeed's CPU shared-memory all-reduce op out of the ranks.

    On CPU, DeepSpeed's comm backend JIT-builds an op (about 40 s once) that maps two 66 MB files in
    /dev/shm per rank, named by MASTER_ADDR/PORT and never removed: a suite forks hundreds of worlds
    and would fill the machine's memory.  The op only speeds up CPU all-reduce; ZeRO-3's parameter
    coordination does not depend on it, so the ranks use plain gloo collectives instead.
    """
    try:
        import deepspeed.ops

        if accel.name() != "cpu":  # DS_ACCELERATOR, or DeepSpeed's detection where it is unset
            return
        builder = accel.get().create_op_builder("ShareMemCommBuilder")
        if builder is not None:
            deepspeed.ops.__compatible_ops__[builder.NAME] = False
    except Exception:
        pass  # an older deepspeed without this op: nothing to skip
