"""The one adapter to DeepSpeed's accelerator: device, device count, backend, events, device sleep.

Forks exist for hardware (Gaudi, XPU, Ascend NPU, ROCm), and DeepSpeed abstracts it already
(``deepspeed.accelerator.get_accelerator()``).  Everything the harness needs of a device goes through
here, so the same command gates a fork on whatever accelerator DeepSpeed runs on; no other module
names a device type or a vendor's communication backend (``tests/test_accel.py`` checks).

Two halves:

* in pytest's process, cheap and without importing torch or deepspeed (the plugin is a guest):
  the form of ``--zero3-backend``, the ``DS_ACCELERATOR`` the session runs under, whether a world of
  N ranks fits the visible devices, and the header line;
* in a rank (the forkserver imported deepspeed already, so it costs nothing there): DeepSpeed's
  accelerator itself, which resolves ``--zero3-backend=auto`` to its communication backend.

``auto`` is resolved in the ranks, not in pytest's process: only DeepSpeed's own detection knows the
accelerator of a fork (an HPU, an NPU), and asking it in pytest's process would import torch and
deepspeed there (seconds, and a guest must not).  What ran is reported by rank 0
(:func:`describe`, in the report's ``implementation``).
"""

from __future__ import annotations

import glob
import os
import re

#: The variable DeepSpeed reads to choose its accelerator; a value the user set is never changed.
ENV = "DS_ACCELERATOR"
AUTO = "auto"
#: A torch.distributed backend: a name (``gloo``, ``nccl``, ``ccl``, ``hccl``, ``xccl``, ``mpi``, a
#: fork's own), or per-device names (``cpu:gloo,cuda:nccl``), as ``init_process_group`` takes them.
_NAME = r"[a-z][a-z0-9_]*"
_FORM = re.compile(rf"{_NAME}(?::{_NAME})?(?:,{_NAME}(?::{_NAME})?)*")
#: Where DS_ACCELERATOR is unset, the accelerator a backend implies (any other: DeepSpeed detects it).
_IMPLIED = {"gloo": "cpu", "nccl": "cuda"}


def check_backend(value: str) -> str:
    """``--zero3-backend``: ``auto`` or a torch.distributed backend's name; ValueError naming the form."""
    text = value.strip()
    if text != AUTO and not _FORM.fullmatch(text):
        raise ValueError(
            f"give 'auto' (the backend of DeepSpeed's accelerator) or a torch.distributed backend's name "
            f"such as gloo, nccl, ccl, xccl, hccl or mpi (lowercase; per device: 'cpu:gloo,cuda:nccl'), not {value!r}"
        )
    return text


def cuda_devices() -> int:
    """CUDA devices visible to this process, counted without initialising CUDA (or importing torch)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return len([d for d in visible.split(",") if d.strip() and d.strip() != "-1"])
    return len(glob.glob("/dev/nvidia[0-9]*"))


def chosen(backend: str, size: int) -> str | None:
    """The ``DS_ACCELERATOR`` the session sets for its ranks, or None where it sets none: the user set
    one (respected), or DeepSpeed's own detection decides (any accelerator, in the ranks).

    ``gloo`` runs on the CPU and ``nccl`` on CUDA, as before; ``auto`` takes CUDA where at least
    ``size`` CUDA devices are visible and the CPU where there are some but fewer (a small GPU machine
    still runs the suite), and else leaves the choice to DeepSpeed (an HPU, XPU or NPU machine, or
    the CPU)."""
    if ENV in os.environ:
        return None
    if backend != AUTO:
        return _IMPLIED.get(backend)
    gpus = cuda_devices()
    if not gpus:
        return None
    return "cuda" if gpus >= size else "cpu"


def predicted(backend: str, size: int) -> str | None:
    """The accelerator the ranks will run on, where it is known before they start (else None)."""
    return os.environ.get(ENV) or chosen(backend, size)


def fits(backend: str, size: int) -> bool:
    """Whether ``size`` ranks of this machine each get a device of their own (known here for CUDA
    only; on another accelerator the rank checks, :func:`place`)."""
    if backend == "nccl" or predicted(backend, size) == "cuda":
        return cuda_devices() >= size
    return True


def check(backend: str, size: int) -> None:
    """The session's backend and accelerator, checked before any world starts; ValueError naming the fix."""
    value = os.environ.get(ENV)
    if value is not None and not value.strip():
        raise ValueError(f"{ENV} is set but empty: unset it (DeepSpeed detects the accelerator) or name one, e.g. cpu")
    if backend == "nccl":
        gpus = cuda_devices()
        if gpus < size:
            raise ValueError(
                f"--zero3-backend=nccl needs {size} GPUs for --zero3-world-size={size}, "
                f"found {gpus}. Use --zero3-backend=gloo (CPU) or a smaller world size."
            )
        if value not in (None, "cuda"):
            raise ValueError(
                f"--zero3-backend=nccl runs on CUDA devices, but {ENV}={value}: use --zero3-backend=auto "
                f"(the backend of the {value} accelerator) or unset {ENV}"
            )


def header(backend: str, size: int) -> str:
    """The header line: the accelerator the ranks run on, and where the backend comes from."""
    value, set_here = os.environ.get(ENV), chosen(backend, size)
    if value:
        where = f"{value} ({ENV})"
    elif set_here:
        where = f"{set_here} ({ENV} set for the ranks)"
    else:
        where = "DeepSpeed's detection, in the ranks"
    how = "the accelerator's communication backend, chosen in the ranks" if backend == AUTO else "as given"
    return f"zero3: accelerator={where}; backend={backend}: {how}"


# -- in a rank: DeepSpeed's accelerator ---------------------------------------------------------------


def get():
    """DeepSpeed's accelerator (``DS_ACCELERATOR``, else its detection), in a rank."""
    from deepspeed.accelerator import get_accelerator

    return get_accelerator()


def name() -> str:
    """The accelerator's device type: ``cpu``, ``cuda``, ``hpu``, ``xpu``, ``npu``..."""
    return str(get().device_name())


def backend(configured: str) -> str:
    """The torch.distributed backend a rank joins with: ``configured``, or for ``auto`` the
    accelerator's communication backend."""
    return str(get().communication_backend_name()) if configured == AUTO else configured


def device(index: int | None = None):
    """The torch device of a rank with local rank ``index`` (``LOCAL_RANK`` by default): the
    accelerator's device, ``cpu`` on the CPU accelerator."""
    import torch

    if name() == "cpu":
        return torch.device("cpu")
    if index is None:
        index = int(os.environ.get("LOCAL_RANK", "0"))
    return torch.device(get().device_name(index))


def place(local_rank: int, local_size: int) -> str:
    """Give this rank its device (none on the CPU); or, where the node has fewer devices than ranks,
    say why it cannot run the world (unsupported here, not a failure of the implementation)."""
    if name() == "cpu":
        return ""
    count = int(get().device_count())
    if count < local_size:
        return (
            f"{local_size} ranks on this node need {local_size} {name()} devices; {count} visible: "
            "use a smaller --zero3-world-size"
        )
    set_device(local_rank)
    return ""


def set_device(local_rank: int) -> None:
    """Make the accelerator's device ``local_rank`` this process's current one (nothing on the CPU)."""
    if name() != "cpu":
        get().set_device(local_rank)


def timing_event():
    """A device event that records elapsed time (``elapsed_time``), or None on the CPU accelerator."""
    event = get().Event
    return None if event is None else event(enable_timing=True)


def device_sleep():
    """A function that queues a spin of N clock cycles on the current stream (the host returns at
    once), or None where the accelerator has none: only CUDA's torch has one (``_sleep``)."""
    if name() != "cuda":
        return None
    import torch

    return torch.cuda._sleep


def describe() -> dict:
    """What rank 0 reports about the accelerator it ran on (the report's ``implementation``)."""
    try:
        accelerator = get()
        return {"accelerator": str(accelerator.device_name()), "device_count": int(accelerator.device_count())}
    except Exception as exc:  # reported, not fatal
        return {"accelerator": f"unknown ({type(exc).__name__}: {exc})"}
