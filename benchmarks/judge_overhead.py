"""What ``pytest_zero3.judge`` costs per training step, measured side by side in one run.

Each rank builds three engines of the same benchmark model (``models.py``): one without a judge, one
judged every step, one judged every ``--every``-th step, each judge attached before its engine's
first step and kept for the whole run (as in a training script).  Then they train in interleaved
blocks of ``--every`` steps (the order rotates every round, so load on a shared machine falls on all
three alike); a block of the sampling engine holds exactly one judged step, as every block of its
steady state does.  The first ``--warmup`` rounds are not counted.

Printed per model, rank 0's timings (the ranks run in lockstep): milliseconds per step of each, and
the ratios judged/unjudged as the median over blocks with a bootstrap 95% interval (``stats.py``),
plus the violations found (there should be none on the reference).  Two clocks: wall time, and the
rank's CPU time (``time.process_time``).  The judge's cost is CPU work in the rank; on a shared
machine the wall clock also counts waiting for a core (and for the other rank in each collective),
which other people's jobs make noisy.  Under heavy load neither ratio settles to a few per cent in
minutes, so the judge's own work is also measured directly: the main thread's CPU time spent inside
the probe's hooks and the judge (``time.thread_time`` around them), per step, as a share of the
unjudged engine's CPU time per step.  That share is what the judge adds, and it does not depend on
what else the machine runs.

    DS_ACCELERATOR=cpu python benchmarks/judge_overhead.py [--impl reference] [--rounds 30] [--every 8]
"""

import argparse
import os
import sys
import time

os.environ.setdefault("DS_ACCELERATOR", "cpu")

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import models  # noqa: E402
from ranks import join_world, launch  # noqa: E402
from stats import ratio_interval  # noqa: E402

VARIANTS = ("none", "every 1", "every N")


def time_the_probe() -> None:
    """Accumulate, per probe, the main thread's CPU seconds inside its hooks (and the judging they run)
    in ``probe.own_cpu[judged]``, split by whether the step they belong to is judged (a step is judged
    at the next step's start; the all-gather counters, a dict update per gathered param, are left out)."""
    from pytest_zero3.fixtures.rule.event_probe import EventProbe

    def add(probe, judged: bool, seconds: float) -> None:
        if not hasattr(probe, "own_cpu"):
            probe.own_cpu = {True: 0.0, False: 0.0}
        probe.own_cpu[judged] += seconds

    def timed(fn, judged_of):
        def wrapper(self, *args, **kwargs):
            judged, start = judged_of(self), time.thread_time()
            try:
                return fn(self, *args, **kwargs)
            finally:
                add(self, judged, time.thread_time() - start)

        return wrapper

    EventProbe._start_step = timed(EventProbe._start_step, lambda p: p._step is not None and p._step.judged)
    EventProbe._end_of_backward = timed(EventProbe._end_of_backward, lambda p: p._full)
    # the end of each module's backward: the forward pre hook that places the observer nodes, and the record
    EventProbe._observe_inputs = timed(EventProbe._observe_inputs, lambda p: p._full)
    EventProbe._grads_in = timed(EventProbe._grads_in, lambda p: p._full)
    recorder = EventProbe._recorder

    def timed_recorder(self, kind):
        record = recorder(self, kind)

        def timed_record(*args):
            judged, start = self._full, time.thread_time()
            record(*args)
            add(self, judged, time.thread_time() - start)

        return timed_record

    EventProbe._recorder = timed_recorder


def config(args):
    return {
        "train_batch_size": args.batch * args.world,
        "train_micro_batch_size_per_gpu": args.batch,
        "zero_optimization": {
            "stage": 3,
            "stage3_param_persistence_threshold": 0,
            "stage3_prefetch_bucket_size": args.prefetch_bucket,
            "stage3_max_reuse_distance": args.reuse_distance,
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "gradient_clipping": 0.0,
        "steps_per_print": 10**9,
    }


def worker(rank, args, store):
    join_world(rank, args.world, store)
    import deepspeed

    from pytest_zero3 import impl, judging

    impl.apply(impl.parse(args.impl))
    time_the_probe()
    for name in args.models:
        engines, judges = {}, {}
        for variant in VARIANTS:
            model, make_batch = models.build(name, args)
            engines[variant], *_ = deepspeed.initialize(
                model=model, model_parameters=model.parameters(), config=config(args)
            )
            if variant != "none":
                every = 1 if variant == "every 1" else args.every
                judges[variant] = judging.judge(engines[variant], every=every, check=False).attach()
        generator = torch.Generator().manual_seed(1234 + rank)
        blocks = {v: [] for v in VARIANTS}
        cpu = {v: [] for v in VARIANTS}
        own = {}  # variant -> (the probe's CPU seconds, steps judged, steps seen) before the counted rounds
        for round_ in range(args.warmup + args.rounds):
            if round_ == args.warmup:
                own = {v: (dict(j._probe.own_cpu), j.steps_judged, j.steps_seen) for v, j in judges.items()}
            shift = round_ % len(VARIANTS)
            for variant in VARIANTS[shift:] + VARIANTS[:shift]:
                engine = engines[variant]
                batches = [make_batch(generator) for _ in range(args.every)]
                start, start_cpu = time.perf_counter(), time.process_time()
                for x, y in batches:
                    loss = torch.nn.functional.mse_loss(engine(x), y)
                    engine.backward(loss)
                    engine.step()
                if round_ >= args.warmup:
                    blocks[variant].append(time.perf_counter() - start)
                    cpu[variant].append(time.process_time() - start_cpu)
        for variant, j in judges.items():
            cpu0, judged0, seen0 = own[variant]
            judged, seen = j.steps_judged - judged0, j.steps_seen - seen0
            own[variant] = {
                "per step": (sum(j._probe.own_cpu.values()) - sum(cpu0.values())) / (args.rounds * args.every),
                "judged": (j._probe.own_cpu[True] - cpu0[True]) / max(judged, 1),
                "skipped": (j._probe.own_cpu[False] - cpu0[False]) / max(seen - judged, 1),
            }
        for j in judges.values():
            j.detach()
        if rank == 0:
            report(name, args, blocks, cpu, judges, own)
        for engine in engines.values():
            engine.destroy()


def report(name, args, blocks, cpu, judges, own):
    n = args.every
    print(f"model {name}: {args.rounds} rounds of {n} steps per variant, impl {args.impl}, world {args.world}")
    for variant in VARIANTS:
        label = variant.replace("N", str(n))
        wall = sorted(1000 * b / n for b in blocks[variant])[len(blocks[variant]) // 2]
        cpu_ms = sorted(1000 * b / n for b in cpu[variant])[len(cpu[variant]) // 2]
        extra = ""
        if variant in judges:
            j = judges[variant]
            extra = f", {j.steps_judged} of {j.steps_seen} steps judged, {len(j.violations)} violations"
        print(f"  {label:>9}: {wall:8.2f} ms/step wall, {cpu_ms:8.2f} ms/step CPU (median block){extra}")
    for variant in VARIANTS[1:]:
        label = variant.replace("N", str(n))
        for clock, samples in (("CPU", cpu), ("wall", blocks)):
            low, mid, high = ratio_interval(samples[variant], samples["none"])
            print(f"  ratio {label:>9} / none ({clock:>4}): {mid:.3f}  (95% interval {low:.3f}-{high:.3f})")
        base = sorted(cpu["none"])[len(cpu["none"]) // 2] / n
        print(
            f"  judge's own work, {label:>9}: {1000 * own[variant]['per step']:.2f} ms CPU per step = "
            f"{100 * own[variant]['per step'] / base:.1f}% of an unjudged step's CPU time"
        )
    # measured on the sampling engine: a judged step's own work J and a skipped step's S
    judged, skipped = own["every N"]["judged"], own["every N"]["skipped"]
    print(
        f"  per judged step {1000 * judged:.2f} ms, per skipped step {1000 * skipped:.3f} ms; so every N costs "
        + ", ".join(f"N={m}: {100 * (judged + (m - 1) * skipped) / m / base:.1f}%" for m in (8, 32, 100, 1000))
    )
    sys.stdout.flush()


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", default="reference", help="--zero3-impl SPEC the ranks run (default reference)")
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--every", type=int, default=8, help="the sampling judge's N (also the block length)")
    parser.add_argument("--rounds", type=int, default=30, help="counted blocks per variant")
    parser.add_argument("--warmup", type=int, default=2, help="rounds not counted")
    parser.add_argument("--prefetch-bucket", type=int, default=50_000)
    parser.add_argument("--reuse-distance", type=int, default=0)
    models.add_arguments(parser)
    args = parser.parse_args()
    from pytest_zero3 import impl

    impl.prepare_process(impl.parse(args.impl))
    launch(worker, args)


if __name__ == "__main__":
    main()
