"""pytest-zero3: a pytest plugin and conformance suite for DeepSpeed ZeRO-3 parameter coordinators.

Public API (small on purpose):

* the ``zero3_world`` fixture (:class:`pytest_zero3.world.World`): ``zero3_world.run(fn, *args)`` runs a
  module-level scenario function on every rank of a fresh torch.distributed world and returns the
  per-rank results;
* inside a scenario, :mod:`pytest_zero3.scenario` (``rank()``, ``world_size()``, ``agree()``,
  ``unsupported()``);
* the markers ``zero3_contract``, ``zero3_world_size``, ``zero3_timeout`` and ``zero3_preload``.

Importing this package imports neither torch nor deepspeed.
"""

__version__ = "0.1.0"
