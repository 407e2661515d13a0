"""Which coordinator classes ``pytest_zero3.reference_impl.install`` hands the adaptive-prefetch keywords to.

``pytest_zero3/protocol.py`` documents ``adaptive_prefetch, adaptive_prefetch_min_sz,
adaptive_prefetch_max_sz, dp_process_group`` for any class implementing the adaptive bucket, not
only subclasses of the reference: a class gets them when its constructor names all four or takes
``**kwargs``; stock's constructor (which takes neither) never gets them.  Cost: no world, < 1 s.
"""


class NamesAdaptiveKeywords:
    def __init__(
        self,
        prefetch_bucket_sz,
        adaptive_prefetch=False,
        adaptive_prefetch_min_sz=0,
        adaptive_prefetch_max_sz=0,
        dp_process_group=None,
    ):
        pass


class TakesKwargs:
    def __init__(self, prefetch_bucket_sz, **kwargs):
        pass


class NamesSome:
    def __init__(self, prefetch_bucket_sz, adaptive_prefetch=False):
        pass


def test_adaptive_keywords_reach_any_class_that_takes_them():
    from deepspeed.runtime.zero.partitioned_param_coordinator import PartitionedParameterCoordinator
    from pytest_zero3.reference_impl import ReferenceCoordinator
    from pytest_zero3.reference_impl.install import accepts_adaptive_keywords

    assert accepts_adaptive_keywords(ReferenceCoordinator)
    assert accepts_adaptive_keywords(NamesAdaptiveKeywords)
    assert accepts_adaptive_keywords(TakesKwargs)
    assert not accepts_adaptive_keywords(NamesSome)
    assert not accepts_adaptive_keywords(PartitionedParameterCoordinator)


def test_reference_rejects_unknown_keywords():
    """Why: a deepspeed that passes a new keyword must be noticed, not silently ignored."""
    import pytest
    from pytest_zero3.reference_impl import ReferenceCoordinator

    with pytest.raises(TypeError, match="future_keyword"):
        ReferenceCoordinator(
            prefetch_bucket_sz=0,
            max_reuse_distance_in_numel=0,
            max_available_parameters_in_numel=0,
            allgather_stream=None,
            inflight_param_registry={},
            future_keyword=1,
        )
