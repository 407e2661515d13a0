"""What the rule family costs: seconds per generated example (engine build, steps, probe) and per judge.

Prints, for the anchors plus the default (or ``--examples``) generated examples, the mean and the
spread of the per-example wall time on each rank, the judging time (pure Python, parent side), and
how many examples the default budget runs, with each example's violations.  (A failing example is
replayed by the suite itself: ``pytest --zero3-replay=...``, as its failure prints.)

    DS_ACCELERATOR=cpu python benchmarks/rules.py [--impl reference|installed] [--examples N] [--seed S]
"""

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from benchmarks.ranks import join_world, launch  # noqa: E402


def worker(rank, args, store):
    join_world(rank, args.world, store)
    if args.impl == "reference":
        from pytest_zero3 import reference_impl

        reference_impl.install()
    from pytest_zero3.fixtures.rule import examples
    from pytest_zero3.fixtures.rule import generated as f

    out = []
    for spec in args.specs:
        t0 = time.perf_counter()
        result = f.run_one(spec)
        run_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        bad = examples.violations(result)
        out.append((run_s, time.perf_counter() - t0, bad))
    if rank == 0:
        runs = [r for r, _, _ in out]
        judges = [j for _, j, _ in out]
        print(
            f"impl {args.impl}, world {args.world}, {len(out)} examples ({args.n_anchors} anchors + "
            f"{len(out) - args.n_anchors} generated)"
        )
        print(
            f"per example: run {statistics.mean(runs):.2f} s (min {min(runs):.2f}, max {max(runs):.2f}), "
            f"judge {1000 * statistics.mean(judges):.1f} ms; total {sum(runs) + sum(judges):.1f} s"
        )
        for i, ((run_s, _, bad), spec) in enumerate(zip(out, args.specs)):
            print(
                f"example {i}: {run_s:.2f} s: {spec['blocks']} steps {spec['steps']} x{spec['grad_acc']} "
                f"width {spec['width']} eval_at {spec['eval_at']} zero {spec['zero']}"
            )
            by_rule = {}
            for v in bad:
                by_rule.setdefault(v.rule, []).append(v)
            for rule, vs in sorted(by_rule.items()):
                print(f"example {i}: {rule}: {len(vs)} violations; first: {vs[0]}"[:600])


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--impl", choices=("reference", "installed"), default="reference")
    parser.add_argument("--world", type=int, default=2, help="world size of the anchors (each example has its own)")
    parser.add_argument("--examples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=None)
    args = parser.parse_args()
    from pytest_zero3.fixtures.pytest_side.rule_anchors import ANCHORS
    from pytest_zero3.fixtures.pytest_side.rule_generation import draw_examples
    from pytest_zero3.fixtures.pytest_side.rule_plan import DEFAULT_EXAMPLES

    n = DEFAULT_EXAMPLES if args.examples is None else args.examples
    specs = list(ANCHORS.values()) + draw_examples(n, args.seed)
    print(f"default budget: {len(ANCHORS)} anchors + {DEFAULT_EXAMPLES} generated examples")
    groups = {}  # an example runs at its own drawn world size; the anchors at --world
    for spec in specs:
        groups.setdefault(spec.get("ranks") or args.world, []).append(spec)
    for world, group in sorted(groups.items()):
        args.world, args.specs = world, group
        args.n_anchors = sum(spec.get("ranks") is None for spec in group)
        launch(worker, args)


if __name__ == "__main__":
    main()
