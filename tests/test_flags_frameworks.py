"""Known-bad forks for the frameworks family: 0.19.8 with one edit on a path only the frameworks take.

Each is a copy of the installed deepspeed with one edit (:mod:`forks`); the frameworks family must flag
it, naming what the user would see (the run selects that contract alone).  The last fork is on no framework
path: it proves that the rule model watches the engine a framework built.  A fork run copies DeepSpeed and
starts a world of its own: about half a minute each on 2 cores, so they run with the proofs (``--proofs``,
scripts/proofs.sh).  What the rest of the suite does with each fork: docs/results/proofs.md.
"""

from __future__ import annotations

import pytest
from forks import BREAK_BACKWARD_RELEASE

#: The engine gives a scheduler callable (what the Trainer passes when the config has an optimizer and
#: no scheduler) the ZeRO-3 optimizer wrapper instead of the optimizer it wraps: torch's schedulers
#: refuse it ("is not an Optimizer").  DeepSpeed's own schedules take the wrapper, so 008-l's callable
#: (a WarmupLR) lets it through.
SCHEDULER_GETS_WRAPPER = (
    "runtime/engine.py",
    "self.lr_scheduler = self.client_lr_scheduler(self.basic_optimizer)",
    "self.lr_scheduler = self.client_lr_scheduler(self.optimizer)",
)
#: load_checkpoint restores only DeepSpeed's own schedules: a torch scheduler (the Trainer's, built by
#: its callable) restarts from step 0 after transformers' deepspeed_load_checkpoint.
LOAD_SKIPS_TORCH_SCHEDULER = (
    "runtime/engine.py",
    "            if load_lr_scheduler_states and self.lr_scheduler is not None:\n",
    "            if load_lr_scheduler_states and self.lr_scheduler is not None and not isinstance(\n"
    "                    self.lr_scheduler, torch.optim.lr_scheduler.LRScheduler):\n",
)
#: save_checkpoint wrapped (a logging or timing decorator without functools.wraps): its signature no
#: longer names exclude_frozen_parameters, which the Trainer reads with inspect.signature before it asks
#: for it, so a PEFT fine-tune's every checkpoint carries the whole frozen base.  Every caller that passes
#: the option itself (008-i's exclude_frozen variant) still gets it.
SAVE_CHECKPOINT_SIGNATURE_HIDDEN = (
    "runtime/engine.py",
    "    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):",
    "    @(lambda save: lambda self, *args, **kwargs: save(self, *args, **kwargs))\n"
    "    def save_checkpoint(self, save_dir, tag=None, client_state={}, save_latest=True, exclude_frozen_parameters=False):",
)

#: An engine built without an optimizer (TRL's reference model, prepare_deepspeed) partitions every param
#: whatever the config's persistence threshold says (its DeepSpeedZeRoOffload built with threshold 0): the
#: reference model's small params are all-gathered at every forward, and the rule model watching it finds
#: persistent params partitioned (rule-e).  007-b's reference engine runs at threshold 0, and lets it through.
INFERENCE_PARTITIONS_ALL = (
    "runtime/engine.py",
    "                    param_persistence_threshold=self.zero_param_persistence_threshold(),\n"
    "                    model_persistence_threshold=self.zero_model_persistence_threshold(),\n"
    "                    offload_param_config=self.zero_offload_param(),\n"
    "                    mpu=self.mpu,\n",
    "                    param_persistence_threshold=0,\n"
    "                    model_persistence_threshold=self.zero_model_persistence_threshold(),\n"
    "                    offload_param_config=self.zero_offload_param(),\n"
    "                    mpu=self.mpu,\n",
)

#: The contracts that drive a framework outside the test extra: without it they are unsupported, so a fork
#: cannot fail them (the proof is skipped, naming the install).
NEEDS = {"fw-d": "trl"}

#: fork -> (its edit, the contract that flags it, what the failure says); the last: the rule model watching
#: the engine accelerate built (a fork of the rule family's known-bads: backward releases deferred)
FORKS = {
    "scheduler-gets-wrapper": (SCHEDULER_GETS_WRAPPER, "fw-a", "DeepSpeedZeroOptimizer_Stage3 is not an Optimizer"),
    "load-skips-torch-scheduler": (
        LOAD_SKIPS_TORCH_SCHEDULER,
        "fw-a",
        "Trainer resumed from checkpoint-4: step 6 learning_rate",
    ),
    "save-checkpoint-signature-hidden": (
        SAVE_CHECKPOINT_SIGNATURE_HIDDEN,
        "fw-c",
        "not the 16 trainable ones (exclude_frozen_parameters)",
    ),
    "inference-partitions-all": (
        INFERENCE_PARTITIONS_ALL,
        "fw-d",
        "TRL's reference model: the rule model: rank 0: rule-e",
    ),
    "backward-release-deferred": (BREAK_BACKWARD_RELEASE, "fw-b", "Accelerator: the rule model: rank 0: rule-b"),
}


@pytest.mark.proof
@pytest.mark.parametrize("name", FORKS)
def test_frameworks_flag_each_fork(run_suite, tmp_path_factory, name):
    """Why: a contract is proven only by an implementation that breaks it; each fork breaks a path only
    the frameworks take, and the family fails on it with the user's symptom."""
    import importlib.util

    from forks import ForkCache

    change, cid, says = FORKS[name]
    needed = NEEDS.get(cid)
    if needed and importlib.util.find_spec(needed) is None:
        pytest.skip(f"{cid} drives {needed}, not installed: pip install -c constraints.txt '.[frameworks]'")
    fork = ForkCache(tmp_path_factory, {name: change})(name)
    run = run_suite(fork, cid)
    assert run.outcomes().get(cid) == "fail", run.stdout[-4000:]
    assert says in run.stdout, run.stdout[-4000:]
