"""pytest-zero3: a pytest plugin and conformance suite for DeepSpeed ZeRO-3 parameter coordinators.

Public API (small on purpose):

* the ``zero3_world`` fixture (:class:`pytest_zero3.world.World`): ``zero3_world.run(fn, *args)`` runs a
  module-level scenario function on every rank of a fresh torch.distributed world and returns the
  per-rank results;
* inside a scenario, :mod:`pytest_zero3.scenario` (``rank()``, ``world_size()``, ``agree()``,
  ``unsupported()``);
* the markers ``zero3_contract``, ``zero3_world_size``, ``zero3_timeout`` and ``zero3_preload``;
* :func:`judge` (and the ``zero3_judge`` fixture): the rule model watching an engine you built yourself,
  in your own test or training script (:mod:`pytest_zero3.judging`).

One namespace: the suite, its scenarios and the reference are ``pytest_zero3.conformance``,
``pytest_zero3.fixtures`` and ``pytest_zero3.reference_impl``.  A wheel maps the repository's
top-level folders into the package at build time (``package-dir`` in pyproject.toml); in a checkout
(run in place or installed editable) those folders sit next to this package, so the package's
search path is extended with the repository root, which makes the same import names work.

Layers, top to bottom.  A module imports only from its own layer and the layers below it, and no
import circle forms, counting function-local imports (import-linter's contracts in pyproject.toml,
checked by ``scripts/lint_imports.py`` in CI):

1. the suite: ``conformance``, the contracts pytest collects;
2. pytest's face, in pytest's process: ``plugin`` (the pytest11 entry point), ``cli``, ``report``,
   ``gitbisect``, ``baseline``, ``expectations``, ``markers``, ``options``, ``judging``;
3. the fixtures: ``fixtures``, what scenarios are built from; they run inside ranks, but for
   ``fixtures.pytest_side``, which pytest's face alone imports and which imports neither torch nor
   deepspeed (two more contracts), and the torch-free modules both sides read;
4. worlds, one scenario call on every rank: ``launcher`` (under torchrun), ``world`` (forked ranks);
5. processes: ``spawner``, ``zygote``, ``preload``, ``rank``: forkservers and the ranks they fork;
6. shared types: ``job``, ``impl``, ``outcome``, ``scenario``, ``registry``, ``dsops``, ``protocol``,
   ``_compat``, ``problem`` (a problem as a record: its text and its key), and ``accel``, the one
   adapter to DeepSpeed's accelerator;
7. the reference: ``reference_impl``, the coordinator and fixes a rank installs for ``--zero3-impl=reference``.

Worlds and processes run the fixtures' scenario functions by reference (pickled), never import them;
a forkserver starts by importing ``preload``, named as a string.  A function-local import of a module
of this package is there only because the import must wait (it loads torch or deepspeed, the fixtures,
or an atexit hook) and says so beside it.

Importing this package imports neither torch nor deepspeed.
"""

import os as _os

__version__ = "0.1.0"

_here = _os.path.dirname(_os.path.abspath(__file__))
_root = _os.path.dirname(_here)
if not _os.path.isdir(_os.path.join(_here, "conformance")) and _os.path.isfile(
    _os.path.join(_root, "conformance", "__init__.py")
):
    __path__.append(_root)  # noqa: F821 - the package's own search path
del _here, _root


def judge(engine, every: int = 1, check: bool = True, config=None):
    """Judge ``engine``'s ZeRO-3 coordinator against the rule model while it trains (a context manager).

    ``with pytest_zero3.judge(engine, every=10) as j: <train>``; see :func:`pytest_zero3.judging.judge`
    (its exception on a broken rule: :class:`pytest_zero3.judging.RuleViolations`, an ``AssertionError``).
    """
    # lazy: this package's __init__ runs in every process that imports any of its modules (pytest, the
    # forkservers, the ranks), so it imports none of them
    from pytest_zero3 import judging

    return judging.judge(engine, every=every, check=check, config=config)
