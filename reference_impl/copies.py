"""``copy.deepcopy`` of what ZeRO-3 manages: refused at the call where the copy could not be plain torch's.

DeepSpeed 0.19.8 deep-copies a wrapped model (``copy.deepcopy(engine.module)``: EMA weights, an RL
reference copy) without a word, and the copy is never plain torch's.  torch's ``Parameter.__deepcopy__``
copies the data, which on a partitioned param is the ``torch.Size([0])`` placeholder, and drops the
ZeRO-3 attributes; and the module's hook dicts are copied with it, so the copy runs the engine's hooks,
which drive the engine's coordinator on the copy.  Partitioned, the copy holds no weights and its
forward raises ``AttributeError: 'Parameter' object has no attribute 'ds_status'`` far from the copy
(contract 008-e, DeepSpeed bug 13); with every param gathered (persistent ones, or inside
``GatheredParameters``) it holds the weights, and its forward raises the same once the hooks have begun
a new step of the engine's coordinator (seq-a).  A full copy would need an all-gather inside ``deepcopy``, a collective that
hangs when one rank copies alone, and the engine's hooks taken off the copy, so the reference refuses:

* a module an engine hooks refuses while the engine lives (:func:`refuse_module_copies`), naming it and
  the ways that work;
* a partitioned param refuses (:func:`convert_refusing_deepcopy`): a param that ``zero.Init`` made,
  copied before ``deepspeed.initialize``.  A gathered one (inside ``GatheredParameters``, as PEFT's
  ``modules_to_save`` copies it before the engine exists) copies like torch's.
"""

import functools

import torch


def _deepcopy(param, memo):
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

    if getattr(param, "ds_status", None) == ZeroParamStatus.AVAILABLE:
        return torch.nn.Parameter.__deepcopy__(param, memo)
    raise RuntimeError(
        f"copy.deepcopy of a partitioned ZeRO-3 parameter (ds_id {getattr(param, 'ds_id', '?')}, shape "
        f"{tuple(getattr(param, 'ds_shape', ()))}): this rank holds only its partition, and the copy would "
        "hold an empty tensor. Copy it inside deepspeed.zero.GatheredParameters (on every rank), or build "
        "a second model"
    )


def convert_refusing_deepcopy(original):
    """``Init._convert_to_deepspeed_param``: the param also gets a ``__deepcopy__`` of its own
    (``copy.deepcopy`` looks it up on the instance), which refuses while it is partitioned."""

    @functools.wraps(original)
    def convert(self, param):
        original(self, param)
        param.__deepcopy__ = functools.partial(_deepcopy, param)

    return convert


class RefusedCopy:
    """The ``__deepcopy__`` of a module an engine hooks (``copy.deepcopy`` looks it up on the instance):
    raises at the call.  Holds the module's name, not the module (it lives in the module's ``__dict__``)."""

    def __init__(self, name: str, kind: str):
        self.name, self.kind = name, kind

    def __call__(self, memo):
        what = f"module '{self.name}'" if self.name else "the model"
        raise RuntimeError(
            f"copy.deepcopy of {what} ({self.kind}), which a ZeRO-3 engine runs (engine.module or a submodule of "
            "it): the copy would run the engine's hooks, which drive the engine's parameter coordinator, and "
            "hold only this rank's partition of each partitioned parameter. Build a second model and load the "
            "weights into it (read inside deepspeed.zero.GatheredParameters, on every rank), or copy the "
            "model before deepspeed.initialize"
        )


def hooked_modules(root):
    """``(name, module)`` of every module DeepSpeed hooks under ``root``: down to z3 leaves, not inside
    them (``_register_deepspeed_module``)."""
    from deepspeed.utils import z3_leaf_module

    stack = [("", root)]
    while stack:
        name, module = stack.pop()
        yield name, module
        if not z3_leaf_module(module):
            stack.extend((f"{name}.{n}" if name else n, child) for n, child in module.named_children())


def refuse_module_copies(setup):
    """``DeepSpeedZeRoOffload.setup_zero_stage3_hooks``: every module it hooks also gets a
    :class:`RefusedCopy` as its ``__deepcopy__``, until :func:`allow_module_copies`."""

    @functools.wraps(setup)
    def setup_zero_stage3_hooks(self):
        setup(self)
        for name, module in hooked_modules(self.module):
            module.__deepcopy__ = RefusedCopy(name, type(module).__name__)

    return setup_zero_stage3_hooks


def allow_module_copies(root) -> None:
    """``destroy()``: the hooks are gone, and so is the refusal (a partitioned param still refuses)."""
    for module in root.modules():
        if isinstance(module.__dict__.get("__deepcopy__"), RefusedCopy):
            del module.__dict__["__deepcopy__"]
