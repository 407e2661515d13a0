"""Frozen params through a ZeRO-3 universal checkpoint.

DeepSpeed's ZeRO-3 universal checkpoint (``ds_to_universal`` + ``load_universal``) restores only the
params the optimizer owns: a frozen param (LoRA's base, a frozen embedding) keeps whatever the
fresh engine initialised it to, silently (contract 004-e).  The saved checkpoint does hold them:
every rank's model-states file carries its shard (``frozen_param_fragments``) and the full shapes
(``frozen_param_shapes``), and the converter copies those files into the universal folder.  After
DeepSpeed's own load, this rebuilds each frozen param from the shards and keeps this rank's
partition of it, whatever the world size.
"""

import glob
import os
import re

import torch


def _rank_of(path: str) -> int:
    match = re.search(r"zero_pp_rank_(\d+)_", os.path.basename(path))
    return int(match.group(1)) if match else 0


def restore_frozen_params(optimizer, checkpoint_folder: str) -> None:
    """Load the frozen params of ``optimizer.module`` from the model-states files in ``checkpoint_folder``."""
    files = sorted(glob.glob(os.path.join(checkpoint_folder, "zero_pp_rank_*_model_states.pt")), key=_rank_of)
    if not files:
        return
    states = [torch.load(f, map_location="cpu", weights_only=False) for f in files]
    shapes = states[0].get("frozen_param_shapes") or {}
    params = dict(optimizer.module.named_parameters())
    for name, shape in shapes.items():
        param = params.get(name)
        fragments = [s.get("frozen_param_fragments", {}).get(name) for s in states]
        if param is None or any(f is None for f in fragments) or not hasattr(param, "ds_tensor"):
            continue
        numel = torch.Size(shape).numel()
        full = torch.cat([f.flatten() for f in fragments])[:numel]
        part = param.ds_tensor
        start = optimizer._get_param_partition_rank(param) * part.numel()
        chunk = full[start : start + part.numel()]
        with torch.no_grad():
            part.zero_()
            part.narrow(0, 0, chunk.numel()).copy_(chunk.to(part.dtype))
            if param.numel() == numel:  # gathered (persistent) params hold the full tensor too
                param.data.copy_(full.view(shape).to(param.dtype))


def load_universal_with_frozen(original):
    """Wrap ``DeepSpeedZeroOptimizer_Stage3._load_universal_checkpoint``: DeepSpeed's load, then the frozen params."""
    import functools

    @functools.wraps(original)
    def _load_universal_checkpoint(self, checkpoint_folder, *args, **kwargs):
        original(self, checkpoint_folder, *args, **kwargs)
        restore_frozen_params(self, checkpoint_folder)

    return _load_universal_checkpoint
