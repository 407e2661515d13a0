"""The recorded module trace of one forward+backward pass, and what can be derived from it.

ZeRO-3 hooks call the coordinator once per submodule invocation ("step"). The first pass after an
invalidation only learns: it records which module ran at each step. When that pass ends
(``reset_step``) the order is checked to be identical on every rank, frozen into a :class:`Trace`,
and from then on the coordinator can look ahead: prefetch walks the trace's parameter list, and
release decisions scan the trace for upcoming reuse.

Everything here is immutable once built, so values derived from it (the release sets) can be cached
for exactly the lifetime of one trace and dropped with it.
"""

from collections.abc import Sequence
from dataclasses import dataclass

from deepspeed.runtime.zero.partitioned_param_coordinator import iter_params
from deepspeed.runtime.zero.utils import assert_ints_same_as_other_ranks
from deepspeed.utils import z3_leaf_module
from torch.nn import Module, Parameter


def zero_params(module: Module) -> list[Parameter]:
    """Every ZeRO-3 param under ``module`` (its subtree and its external params).  A param DeepSpeed
    never converted, such as one of a module attached after ``deepspeed.initialize``, is a plain
    torch tensor that no hook of stock's fetches: it is not the coordinator's, which never reads or
    moves it (contract 007-a)."""
    return [p for p in iter_params(module, recurse=True) if hasattr(p, "ds_id")]


def module_params(module: Module) -> list[Parameter]:
    """Parameters a module's hooks fetch and release: its own (plus external ones), and, for a z3
    leaf module, the ZeRO-3 params of its whole subtree, since no hook fires below a leaf."""
    if z3_leaf_module(module):
        return zero_params(module)
    return list(iter_params(module, recurse=False))


def module_param_set(module: Module, is_leaf: bool) -> set[Parameter]:
    """``set(module_params(module))`` without ``named_parameters``' generator machinery: read on
    every fetch, so it is kept to two dict walks for a non-leaf module."""
    if is_leaf:
        return set(zero_params(module))
    params = {p for p in module._parameters.values() if p is not None}
    external = getattr(module, "_external_params", None)
    if external:
        params.update(external.values())
    return params


@dataclass(frozen=True)
class ParamUse:
    """One use of a parameter by the module run at ``step`` of the trace."""

    param: Parameter
    step: int


class Trace:
    """A complete, rank-agreed order of module invocations and the parameter uses it implies.

    What the hooks need per step is computed here once, so a hook does lookups, not scans:
    ``step_params[s]`` (the frozenset of params the module at step ``s`` fetches, checked against
    the module's live params at each fetch: stock's "tracing error"), ``params_of[ds_id]``
    (what a module's release walks), ``cursor_after[s]`` (index in :attr:`param_uses` past step
    ``s``'s own uses), and the flat ``use_params`` / ``use_steps`` / ``use_numel`` of the uses.
    """

    def __init__(self, modules: Sequence[Module]):
        self.modules: tuple[Module, ...] = tuple(modules)
        uses = []
        step_params = []
        cursor_after = []
        self.params_of: dict[int, tuple[Parameter, ...]] = {}
        for step, module in enumerate(self.modules):
            params = sorted(set(module_params(module)), key=lambda p: p.ds_id)
            self.params_of[module.ds_id] = tuple(params)
            step_params.append(frozenset(params))
            uses.extend(ParamUse(param, step) for param in params)
            cursor_after.append(len(uses))
        self.param_uses: tuple[ParamUse, ...] = tuple(uses)
        self.step_params: tuple[frozenset[Parameter], ...] = tuple(step_params)
        self.cursor_after: tuple[int, ...] = tuple(cursor_after)
        self.use_params: tuple[Parameter, ...] = tuple(u.param for u in uses)
        self.use_steps: tuple[int, ...] = tuple(u.step for u in uses)
        self.use_numel: tuple[int, ...] = tuple(u.param.ds_numel for u in uses)
        self.on_nvme = any(getattr(p, "nvme_swapper", None) is not None for p in self.use_params)
        self._release_cache: dict[tuple[int, int], frozenset[int]] = {}

    @staticmethod
    def check_same_on_all_ranks(modules: Sequence[Module]) -> None:
        """Collective: every rank must have recorded the same module order, or prefetching would
        issue different all-gathers on different ranks and hang. Raises on disagreement."""
        assert_ints_same_as_other_ranks([m.ds_id for m in modules])

    def matches(self, step: int, module: Module) -> bool:
        return step < len(self.modules) and self.modules[step] is module

    def params_to_release(self, module: Module, step: int, max_reuse_distance: int) -> frozenset[int]:
        """ds_ids of ``module``'s non-persistent params that are not reused soon after ``step``.

        "Soon" is the reuse-distance window: the modules run from ``step`` on, until their
        parameters add up to ``max_reuse_distance`` elements. Each scanned module contributes the
        params its own hooks would fetch (its own z3-leaf flag decides recursion). This scan is the
        only thing that keeps a parameter resident past its module; distance 0 releases at once.

        Cached per (module, step) for the life of this trace; the result is a frozenset so no
        caller can alter what a later call returns.
        """
        key = (module.ds_id, step)
        cached = self._release_cache.get(key)
        if cached is None:
            candidates = {p.ds_id for p in module_params(module) if not p.ds_persist}
            scanned = 0
            for upcoming in self.modules[step:]:
                if scanned >= max_reuse_distance or not candidates:
                    break
                for param in module_params(upcoming):
                    candidates.discard(param.ds_id)
                    scanned += param.ds_numel
            cached = self._release_cache[key] = frozenset(candidates)
        return cached
