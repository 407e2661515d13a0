"""The all-reduce fetch (``stage3_use_all_reduce_for_fetch_params``) in the dtype each param is promised
to travel in.

Stock 0.19.8's ``_all_gather_coalesced`` fetches two or more params by one all-reduce of a flat buffer in
the one dtype of their partitions (``get_only_unique_item``).  That raises where a fetch holds params of
two dtypes (a frozen bf16 base beside fp32 adapters: DeepSpeed bug 22), and under ``torch_autocast`` it
gathers the lower-precision-safe modules' params in the weights' dtype, where the all-gather fetch and the
all-reduce fetch of a single param (``_all_gather_sequential``) gather them in the autocast dtype
(``get_allgather_dtype``): the forward's values then depend on how the coordinator batched the fetch, a
stock-only detail (DeepSpeed bug 25: stage 3's linear adds the bias in place, in its own dtype, for an
input that is not 2-D; an embedding tied to a Linear head is looked up as fetched).  The reference groups a
fetch by the dtype its params are stored in and the one they travel in, and all-reduces each group in the
latter: every element has one nonzero term, so the sum is exact in any dtype, and it equals the all-gather.
"""

import torch


def _dtypes(param, travelling) -> tuple:
    """The dtype ``param``'s partition is stored in and the one it travels in (``travelling``: the
    release's ``get_allgather_dtype`` where it has it, ``torch_autocast``'s dtype for a param it marked,
    else the stored one)."""
    stored = param.ds_tensor.dtype
    return stored, (travelling(param, param.ds_tensor) if travelling is not None else stored)


def by_dtypes(init, gather):
    """``param.all_gather_coalesced`` (``gather``, stock's, of the ``Init`` ``init``) under the all-reduce
    fetch: a fetch whose params all travel in their stored dtype, one of it, goes to stock; otherwise one
    handle per (stored, travelling) dtype pair, in the same order on every rank: stock's where the two are
    the same, :func:`all_reduce_in` where they differ."""
    from deepspeed.runtime.zero import partition_parameters

    travelling = getattr(partition_parameters, "get_allgather_dtype", None)  # looked up once, not per fetch

    def all_gather_coalesced(params, safe_mode=False, quantize=False):
        params = list(params)
        if quantize or not params or not getattr(init, "use_all_reduce_for_fetch_params", False):
            return gather(params, safe_mode=safe_mode, quantize=quantize)
        groups: dict = {}
        for p in params:
            groups.setdefault(_dtypes(p, travelling), []).append(p)
        if len(groups) == 1 and next(iter(groups))[0] == next(iter(groups))[1]:
            return gather(params, safe_mode=safe_mode)
        handles = []
        for (stored, fetched), members in sorted(groups.items(), key=lambda kv: (str(kv[0][0]), str(kv[0][1]))):
            cast = fetched != stored and members[0].ds_secondary_tensor is None  # hpZ's secondary: all-gathered
            one_group = len({id(init.get_partition_dp_group(p)) for p in members}) == 1
            if cast and one_group and init._partition_world_size(members[0]) > 1:
                handles.append(all_reduce_in(init, members, fetched, safe_mode))
            else:
                handles.append(gather(members, safe_mode=safe_mode))
        return partition_parameters.MultipleAllGatherHandles(handles)

    return all_gather_coalesced


class CastAllReduceHandle:
    """The all-reduce of :func:`all_reduce_in` in flight: its wait gives each param its full data, in the
    dtype its partition is stored in, and marks it available."""

    def __init__(self, handle, params, flat):
        self.handle, self.params, self.flat = handle, params, flat
        self.complete = False

    def wait(self, **kwargs) -> None:
        from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus

        if self.complete:
            return
        self.handle.wait()
        start = 0
        for p in self.params:
            p.data = self.flat.narrow(0, start, p.ds_numel).view(p.ds_shape).to(p.ds_tensor.dtype)
            start += p.ds_numel_aligned
            p.ds_status = ZeroParamStatus.AVAILABLE
        self.flat = None
        self.complete = True


def all_reduce_in(init, params, dtype: torch.dtype, safe_mode: bool = False) -> CastAllReduceHandle:
    """Fetch ``params`` (one partition group, none of them gathered) by one all-reduce in ``dtype``: each
    rank writes its partitions, cast, into a zeroed flat buffer at their place in the full params.  Until
    the wait each param keeps its partitioned data (as stock's all-gather does when it casts)."""
    import deepspeed.comm as dist
    from deepspeed.accelerator import get_accelerator
    from deepspeed.runtime.zero.partition_parameters import ZeroParamStatus
    from deepspeed.runtime.zero.utils import assert_ints_same_as_other_ranks

    params = sorted(params, key=lambda p: p.ds_id)  # the same layout on every rank
    init._ensure_availability_of_partitioned_params(params)  # NVMe: swapped in first, as stock's fetch
    for p in params:
        if p.ds_status != ZeroParamStatus.NOT_AVAILABLE:
            raise RuntimeError(p.ds_summary())
        p.ds_status = ZeroParamStatus.INFLIGHT
    if safe_mode:
        assert_ints_same_as_other_ranks([p.ds_id for p in params])
        assert_ints_same_as_other_ranks([p.ds_tensor.ds_numel for p in params])
    group = init.get_partition_dp_group(params[0])
    rank = init._partition_rank(params[0])
    flat = torch.zeros(
        sum(p.ds_numel_aligned for p in params), dtype=dtype, device=get_accelerator().current_device_name()
    )
    start = 0
    for p in params:
        part = p.ds_tensor.ds_numel
        flat.narrow(0, start + part * rank, part).copy_(p.ds_tensor)
        start += p.ds_numel_aligned
    return CastAllReduceHandle(dist.all_reduce(flat, group=group, async_op=True), params, flat)
