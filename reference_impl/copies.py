"""``copy.deepcopy`` of a ZeRO-3 param that is partitioned: refused at the call, with the way out.

DeepSpeed 0.19.8 deep-copies a wrapped model (``copy.deepcopy(engine.module)``: EMA weights, an RL
reference copy) without a word: torch's ``Parameter.__deepcopy__`` copies the data, which on a
partitioned param is the ``torch.Size([0])`` placeholder, and drops the ZeRO-3 attributes.  The copy
holds no weights, its ``state_dict()`` is empty tensors, and its forward (the engine's hooks came
along) raises ``AttributeError: 'Parameter' object has no attribute 'ds_status'`` far from the copy
(contract 008-e, DeepSpeed bug 13).  A full copy would need an all-gather inside ``deepcopy``, a
collective that hangs when one rank copies alone, so the reference refuses instead, naming the
param and the two ways that work.  A gathered param (inside ``GatheredParameters``, as PEFT's
``modules_to_save`` copies it) copies like torch's.
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
