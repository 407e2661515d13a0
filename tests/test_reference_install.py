"""``pytest_zero3.reference_impl.install``: which coordinator classes get the adaptive-prefetch keywords,
and what install and uninstall do with the table of patches (``PATCHES``).

``pytest_zero3/protocol.py`` documents ``adaptive_prefetch, adaptive_prefetch_min_sz,
adaptive_prefetch_max_sz, dp_process_group`` for any class implementing the adaptive bucket, not
only subclasses of the reference: a class gets them when its constructor names all four or takes
``**kwargs``; stock's constructor (which takes neither) never gets them.  Cost: no world, about 1 s
after deepspeed's import.
"""

import importlib


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


def test_uninstall_restores_what_install_replaced():
    """Why: a session on the installed deepspeed after one on the reference, in one process, must run
    stock: every row of the table back, the module stack's live entries kept, a second install only
    swapping the coordinator class."""
    import torch
    from deepspeed.runtime.zero import parameter_offload
    from pytest_zero3.reference_impl import ReferenceCoordinator

    install = importlib.import_module("pytest_zero3.reference_impl.install")  # the package's name is the function
    was = install.is_installed()
    install.uninstall()
    try:
        before = {(id(p.owner), p.attribute): vars(p.owner)[p.attribute] for p in install.PATCHES}
        stack = parameter_offload.FWD_MODULE_STACK
        install.install()
        assert install.is_installed()
        for p in install.PATCHES:
            assert getattr(p.owner, p.attribute) is not before[(id(p.owner), p.attribute)], p.attribute
        assert parameter_offload.PartitionedParameterCoordinator is ReferenceCoordinator
        init = vars(parameter_offload.DeepSpeedZeRoOffload)["__init__"]
        install.install(coordinator=NamesAdaptiveKeywords)
        assert parameter_offload.PartitionedParameterCoordinator is NamesAdaptiveKeywords
        assert vars(parameter_offload.DeepSpeedZeRoOffload)["__init__"] is init
        module = torch.nn.Linear(1, 1)
        parameter_offload.FWD_MODULE_STACK.append(module)
        install.uninstall()
        assert not install.is_installed()
        for p in install.PATCHES:
            assert vars(p.owner)[p.attribute] is before[(id(p.owner), p.attribute)], p.attribute
        assert parameter_offload.FWD_MODULE_STACK is stack and stack[-1] is module
        stack.remove(module)
    finally:
        install.uninstall()
        if was:
            install.install()


def test_rows_apply_from_their_release_and_uninstall_deletes_what_was_inherited(monkeypatch):
    install = importlib.import_module("pytest_zero3.reference_impl.install")

    class Base:
        def inherited(self):
            return "base"

    class Owner(Base):
        own = "own"

    rows = (
        install.Patch(Owner, "own", install._wrapper(str.upper), "own attribute"),
        install.Patch(Owner, "inherited", install._replacement(lambda self: "patched"), "inherited method"),
        install.Patch(Owner, "later", install._replacement(1), "a row for a later deepspeed", since="999"),
    )
    was = install.is_installed()
    install.uninstall()
    monkeypatch.setattr(install, "PATCHES", rows)
    try:
        install.install()
        assert Owner.own == "OWN" and Owner().inherited() == "patched" and not hasattr(Owner, "later")
        install.uninstall()
        assert vars(Owner).get("own") == "own" and "inherited" not in vars(Owner) and Owner().inherited() == "base"
    finally:
        install.uninstall()
        monkeypatch.undo()
        if was:
            install.install()
