"""What the suite does on a DeepSpeed base older than a config key or a tool a contract is about.

Forks live on old bases (0.14.x to 0.16.x); the release sources of 0.14.4, 0.15.2 and 0.16.1 were run
as ``--zero3-impl=DIR`` (README, "Versions").  A contract whose rule is about a key the base's ZeRO
config does not know, or a tool the base does not have, is *unsupported* there, with the key or the
tool named, not a failure of the base.
"""

import pytest

#: The installed deepspeed as a base from before ``log_trace_cache_warnings`` (0.16.1 has no such key):
#: the ZeRO config field is gone, and the engine reads the default where the field was.
NO_TRACE_CACHE_WARNINGS_KEY = [
    ("runtime/zero/config.py", "    log_trace_cache_warnings: bool = False\n", ""),
    (
        "runtime/engine.py",
        "        return self._config.zero_config.log_trace_cache_warnings\n",
        "        return False\n",
    ),
]


#: ... and from before 0.14.5, whose ds_to_universal knows only ZeRO-1/2 checkpoints (on 0.14.4 it
#: looks for mp_rank_* model files and finds none in a ZeRO-3 checkpoint).
NO_ZERO3_UNIVERSAL = (
    "checkpoint/ds_to_universal.py",
    "def extract_zero_shards_stage3(",
    "def _not_in_this_base_extract_zero_shards_stage3(",
)


@pytest.fixture(scope="module")
def older_base(tmp_path_factory):
    from forks import ForkCache

    return ForkCache(tmp_path_factory, {"older": [*NO_TRACE_CACHE_WARNINGS_KEY, NO_ZERO3_UNIVERSAL]})


def test_a_key_or_tool_the_base_lacks_makes_its_contract_unsupported(run_suite, older_base):
    """Why: on a base whose ZeRO config rejects log_trace_cache_warnings, base-k failed with a bare
    ValidationError; on 0.14.4, 004-e failed in ds_to_universal ("no mp_rank files").  The base has
    no such switch, and no ZeRO-3 universal checkpoint: neither is a bug of the base."""
    run = run_suite(older_base("older"), "base-k,004-e")
    outcomes = run.outcomes()
    assert outcomes == {"base-k": "unsupported", "004-e": "unsupported"}, f"{outcomes}\n{run.stdout[-4000:]}"
    reasons = {c["id"]: c["reason"] for c in run.report["contracts"]}
    assert "log_trace_cache_warnings" in reasons["base-k"] and "no such key" in reasons["base-k"], reasons
    assert "cannot convert a ZeRO-3 checkpoint" in reasons["004-e"], reasons
