"""One odd world size against the reference, in every run.

Partitions that do not divide evenly, a slow rank that is the last of three, results judged beyond
rank 1: two contracts, not the suite (the whole suite at world size 3 takes minutes on 2 cores).
"""


def test_reference_passes_at_three_ranks(run_suite):
    run = run_suite("reference", "000-a,003-b", "--zero3-world-size=3")
    outcomes = run.outcomes()
    assert outcomes == {"000-a": "pass", "003-b": "pass"}, f"{outcomes}\n{run.stdout[-4000:]}"
    assert run.report["implementation"]["world_size"] == 3, run.report["implementation"]
    assert run.returncode == 0, run.stdout[-3000:]
