"""The ``stage3_adaptive_prefetch_*`` ZeRO config keys (opt-in adaptive prefetch bucket, PR 8431).

deepspeed 0.19.8 parses ``zero_optimization`` into a pydantic model with ``extra="forbid"``, so
unknown keys are rejected. :class:`AdaptivePrefetchZeroConfig` is that model plus the three keys and
their validation; installing :func:`get_zero_config` in deepspeed makes ``deepspeed.initialize``
accept them, or fail with an error naming the offending key.
"""

from deepspeed.runtime.tensor_parallel.init_utils import load_ds_config
from deepspeed.runtime.zero.config import ZERO_OPTIMIZATION, DeepSpeedZeroConfig, read_zero_config_deprecated
from pydantic import Field, model_validator

DEFAULT_MIN_SIZE = 0
DEFAULT_MAX_SIZE = int(1e9)


class AdaptivePrefetchZeroConfig(DeepSpeedZeroConfig):
    """DeepSpeedZeroConfig with the adaptive prefetch keys.

    ``stage3_prefetch_bucket_size`` stays the (static or starting) bucket; with adaptation on it is
    clamped into ``[stage3_adaptive_prefetch_min_size, stage3_adaptive_prefetch_max_size]``.
    """

    adaptive_prefetch_bucket_size: bool = Field(False, alias="stage3_adaptive_prefetch_bucket_size")
    adaptive_prefetch_min_size: int = Field(DEFAULT_MIN_SIZE, ge=0, alias="stage3_adaptive_prefetch_min_size")
    adaptive_prefetch_max_size: int = Field(DEFAULT_MAX_SIZE, ge=0, alias="stage3_adaptive_prefetch_max_size")

    @model_validator(mode="after")
    def adaptive_prefetch_range_valid(self):
        if self.adaptive_prefetch_min_size > self.adaptive_prefetch_max_size:
            raise ValueError(
                f"stage3_adaptive_prefetch_min_size ({self.adaptive_prefetch_min_size}) must not exceed "
                f"stage3_adaptive_prefetch_max_size ({self.adaptive_prefetch_max_size})"
            )
        return self


def get_zero_config(param_dict: dict) -> AdaptivePrefetchZeroConfig:
    """Same contract as ``deepspeed.runtime.zero.config.get_zero_config``, with the extra keys."""
    section = param_dict.get(ZERO_OPTIMIZATION, {})
    if isinstance(section, bool):
        section = read_zero_config_deprecated(param_dict)
    return AdaptivePrefetchZeroConfig(**section)


def adaptive_coordinator_kwargs(ds_config) -> dict:
    """Coordinator constructor keywords for the adaptive bucket, from a raw deepspeed config."""
    if ds_config is None:
        ds_config = {}
    elif not isinstance(ds_config, dict):
        ds_config = load_ds_config(ds_config)
    zero = get_zero_config(ds_config)
    return dict(
        adaptive_prefetch=zero.adaptive_prefetch_bucket_size,
        adaptive_prefetch_min_sz=zero.adaptive_prefetch_min_size,
        adaptive_prefetch_max_sz=zero.adaptive_prefetch_max_size,
    )
