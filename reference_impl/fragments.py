"""The tensor-fragment API (``deepspeed.utils.safe_*``) as its docstrings promise it, under ZeRO-3.

DeepSpeed 0.19.8 breaks it in three places that contract family 008 judges against the plain-torch twin:

* a full write (``safe_set_full_grad``, ``safe_set_full_fp32_param``, ``safe_set_full_optimizer_state``)
  cuts this rank's slice out of the value with ``narrow`` and no padding: on the last ranks of a param
  whose size does not divide by the world size it raises ("start + length exceeds dimension size");
* with the optimizer offloaded, gradients accumulate in the device partition and reach the host copy
  only at the accumulation boundary, but every read and write goes to the host copy: between the
  micro-batches of a step, ``safe_get_full_grad``/``safe_get_local_grad`` return the last boundary's
  gradient and a write is lost;
* ``safe_update_full_grad_vectorized`` cuts each rank's slice of the updated gradient the same way, in
  the middle of its all-gathers: the last rank raises on an odd-sized param and skips the gathers of
  the params after it, which the other ranks wait in (gloo aborts; NCCL hangs);
* with the optimizer offloaded, the step clips by per-param norms taken at the reduction:
  ``safe_set_local_grad`` refreshes the written param's, ``safe_set_full_grad`` does not, so the step
  clips by the norm of gradients that are no longer there.
"""

import torch


def _slice(value, numel: int, rank: int):
    """This rank's ``numel`` elements of ``value`` flattened and zero-padded to ``numel`` per rank."""
    flat = value.detach().flatten()
    padded = torch.zeros(numel * (rank + 1), dtype=flat.dtype, device=flat.device)
    end = min(flat.numel(), padded.numel())
    padded[:end] = flat[:end]
    return padded.narrow(0, numel * rank, numel)


def grad_partition(original):
    """``_get_fp32_grad_state_partition``: between the micro-batches of an offloaded step, the device
    partition where the gradients accumulate (the host copy holds the last boundary's)."""

    def partition(self, param, release_swap_buffers):
        if self.offload_optimizer and not self.is_gradient_accumulation_boundary():
            grads = self._DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition
            if param.ds_id in grads:
                group_idx = self.grad_position[self.get_param_id(param)][0]
                return grads[param.ds_id].narrow(0, 0, param.ds_tensor.ds_numel), group_idx
        return original(self, param, release_swap_buffers)

    return partition


def set_fp32_grad_for_param(self, value, param):
    """``safe_set_full_grad``: this rank's padded slice, and the param's norm for clipping refreshed."""
    if not param.requires_grad:
        return
    fp32_grad, group_idx = self._get_fp32_grad_state_partition(param=param, release_swap_buffers=False)
    part = _slice(value, fp32_grad.numel(), self._get_param_partition_rank(param))
    if self.offload_optimizer:
        self.norm_for_param_grads[self.get_param_id(param)] = self._constant_buffered_norm2(part.float())
    fp32_grad.data.copy_(part.to(fp32_grad.device))
    if self._swappable_optimizer_subgroup(group_idx):
        self._writeback_swap_state(group_idx, write_opt_state=False, write_gradients=True)


def set_full_hp_param(self, value, param, optim_state_key=None):
    """``safe_set_full_fp32_param``/``safe_set_full_optimizer_state``: this rank's padded slice."""
    if not param.requires_grad:
        return
    assert value.numel() == param.ds_numel, f"Number of elements do not match: {value.numel()} != {param.ds_numel}"
    state, group_idx = self._get_fp32_opt_state_partition(
        param, release_swap_buffers=False, optim_state_key=optim_state_key
    )
    part = _slice(value, state.numel(), self._get_param_partition_rank(param))
    state.data.copy_(part.to(device=state.device, dtype=state.dtype))
    if self._swappable_optimizer_subgroup(group_idx):
        self._optimizer_states_and_gradient_swap_out(group_idx)


def update_fp32_grad_for_param_vectorized(self, update_func, param_list):
    """``safe_update_full_grad_vectorized``: per param, the full fp32 gradient gathered, updated, and this
    rank's padded slice written back (and, offloaded, its clipping norm refreshed), on every rank alike."""
    for param in [p for p in param_list if p.requires_grad]:
        grad, group_idx = self._get_fp32_grad_state_partition(param=param, release_swap_buffers=False)
        full = self._fp32_state_allgather(param, grad)
        part = _slice(update_func(full, param), grad.numel(), self._get_param_partition_rank(param))
        if self.offload_optimizer:
            self.norm_for_param_grads[self.get_param_id(param)] = self._constant_buffered_norm2(part.float())
        grad.data.copy_(part.to(device=grad.device, dtype=grad.dtype))
        if self._swappable_optimizer_subgroup(group_idx):
            self._writeback_swap_state(group_idx, write_opt_state=False, write_gradients=True)
