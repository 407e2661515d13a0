"""Every contract of the suite: one test, parametrized by the decorated scenarios (``fixtures/contract.py``).

A contract is its scenario, in its topic's module under ``fixtures/``: ``@contract("000-a", ...)`` says
what it runs under (profiles, variants, world size, timeout, preloads), and the scenario judges its own
result in the ranks.  Here every rank's problem lines meet the one assertion; nothing is judged in this
process, and collecting reads the decorators from the source, importing no scenario (nor torch).
"""

from pytest_zero3.fixtures import verdicts


def test_contract(zero3_world, zero3_scenario, variant, tmp_path):
    """Why: each contract's own docstring, on its scenario, says why its rule matters."""
    for what, results in zero3_scenario.verdicts(zero3_world, variant, str(tmp_path)):
        verdicts.assert_clean(results, what)
