"""What the suite does on a DeepSpeed base older than a config key a contract is about.

Forks live on old bases (0.14.x to 0.16.x); the release sources of 0.14.4, 0.15.2 and 0.16.1 were run
as ``--zero3-impl=DIR`` (README, "Versions").  A contract whose rule is about a key the base's ZeRO
config does not know is *unsupported* there, with the key named, not a failure of the base.
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


@pytest.fixture(scope="module")
def older_base(tmp_path_factory):
    from forks import ForkCache

    return ForkCache(tmp_path_factory, {"no-trace-cache-warnings-key": NO_TRACE_CACHE_WARNINGS_KEY})


def test_a_key_the_base_lacks_makes_its_contract_unsupported(run_suite, older_base):
    """Why: on a base whose ZeRO config rejects log_trace_cache_warnings, base-k failed with a bare
    ValidationError: the base has no such switch, which is not a bug of the base."""
    run = run_suite(older_base("no-trace-cache-warnings-key"), "base-k")
    outcomes = run.outcomes()
    assert outcomes.get("base-k") == "unsupported", f"{outcomes}\n{run.stdout[-4000:]}"
    reason = next(c["reason"] for c in run.report["contracts"] if c["id"] == "base-k")
    assert "log_trace_cache_warnings" in reason and "no such key" in reason, reason
