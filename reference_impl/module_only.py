"""``load_checkpoint(load_module_only=True)`` under ZeRO-3: the trained weights, not the fresh ones.

DeepSpeed 0.19.8 takes the module's weights from the ZeRO checkpoint (consolidated from every rank's
fp32 partitions) only when ``load_optimizer_states`` is False.  With the default True and
``load_module_only=True`` (warm-starting from a checkpoint, DeepSpeed's docstring's example) it loads
the module state dict saved beside them, whose ZeRO-3 params are ``torch.Size([0])`` placeholders:
nothing is copied, the fp32 masters are then rebuilt from the untouched weights, and the engine
trains on from its own initial weights without a word (contract 008-d, DeepSpeed bug 14).  Module
only means the optimizer's states are not loaded anyway, so the reference loads the weights the way
``load_optimizer_states=False`` does.
"""

import functools
import inspect


def load_module_only_weights(original):
    """``DeepSpeedEngine._load_checkpoint``: module only under ZeRO-3 loads the consolidated weights."""
    signature = inspect.signature(original)

    @functools.wraps(original)
    def _load_checkpoint(self, *args, **kwargs):
        arguments = signature.bind(self, *args, **kwargs)
        arguments.apply_defaults()
        values = arguments.arguments
        if values["load_module_only"] and self.zero_optimization_partition_weights():
            values["load_optimizer_states"] = False
        return original(*arguments.args, **arguments.kwargs)

    return _load_checkpoint
