"""Config profiles and the user's ``--zero3-config`` for the conformance suite (``fixtures/profiles.py``).

With the default profile alone (``fp32``) test IDs carry no profile.  With ``--zero3-profile=NAME[,NAME]|all``
each contract runs once per selected profile that applies to it (its scenario's ``@contract(profiles=...)``),
its test ID ending in ``-NAME`` (the batched families' in ``[NAME-...]``); a contract no selected profile
applies to is not run.  Every world of a contract runs its scenario under that profile and the user's config overlay.
"""

import copy
import types

import pytest
from pytest_zero3.fixtures import contract, profiles
from pytest_zero3.fixtures.pytest_side import profile_options

from pytest_zero3 import accel, options, registry
from pytest_zero3.scenario import Unsupported

#: Added to a test whose config steps DeepSpeedCPUAdam (the bf16-offload profile, or a --zero3-config that
#: offloads the optimizer): the forkserver imports it, building DeepSpeedCPUAdam there once (under
#: --zero3-startup-timeout, never a scenario's timeout) when scripts/install.sh has not.
CPU_ADAM_PRELOAD = profiles.CPU_ADAM_PRELOAD
#: Added to every test of a run with a compile profile: dynamo's one-time set-up, paid in the forkserver.
COMPILE_PRELOAD = "pytest_zero3.fixtures.compile_warmup"
FIXTURES = "pytest_zero3.fixtures."


def _contract(definition) -> str:
    mark = definition.get_closest_marker("zero3_contract") if hasattr(definition, "get_closest_marker") else None
    if mark is None:
        for m in getattr(definition, "pytestmark", []):
            if m.name == "zero3_contract":
                mark = m
    if mark is None:
        return ""
    return mark.args[0] if mark.args else mark.kwargs.get("id", "")


def pytest_generate_tests(metafunc):
    if "zero3_world" not in metafunc.fixturenames:
        return
    names = options.settings(metafunc.config).profile
    if "zero3_scenario" in metafunc.fixturenames:
        metafunc.parametrize(
            ("zero3_scenario", "variant", "zero3_profile"), scenario_params(names), indirect=["zero3_profile"]
        )
        return
    if names == (profiles.DEFAULT,):
        return
    cid = _contract(metafunc.definition)
    params = []
    for name in names:
        if not profiles.applies(name, cid):
            continue
        marks = (
            [pytest.mark.zero3_preload(CPU_ADAM_PRELOAD)] if profiles.cpu_adam(profiles.PROFILES[name].overlay) else []
        )
        params.append(pytest.param(name, id=name, marks=marks))
    if not params:
        params = [pytest.param(None, id="no-profile", marks=pytest.mark.zero3_no_profile)]
    metafunc.parametrize("zero3_profile", params, indirect=True)


def scenario_params(names) -> list:
    """One param per decorated contract, variant and selected profile that applies, in the registry's order,
    its decorator's facts as markers; its ID ``CID[-VARIANT][-PROFILE]`` (the profile only where
    ``--zero3-profile`` selects others than ``fp32``)."""
    found = contract.scenarios()
    order = [cid for cid in registry.load() if cid in found] + sorted(set(found) - set(registry.load()))
    params = []
    for cid in order:
        sc = found[cid][0]
        marks = [pytest.mark.zero3_contract(cid), pytest.mark.zero3_preload(sc.module, *sc.preload)]
        if sc.timeout is not None:
            marks.append(pytest.mark.zero3_timeout(sc.timeout))
        if sc.world_size is not None:
            marks.append(pytest.mark.zero3_world_size(sc.world_size))
        for variant in sc.variants or (None,):
            applied = [name for name in names if profiles.applies(name, cid)]
            for name in applied:
                offload = profiles.cpu_adam(profiles.PROFILES[name].overlay)
                ids = [cid, variant, None if names == (profiles.DEFAULT,) else name]
                extra = [pytest.mark.zero3_preload(CPU_ADAM_PRELOAD)] if offload else []
                params.append(pytest.param(sc, variant, name, marks=marks + extra, id="-".join(filter(None, ids))))
            if not applied:
                ids = [cid, variant, "no-profile"]
                params.append(
                    pytest.param(
                        sc, variant, None, marks=[*marks, pytest.mark.zero3_no_profile], id="-".join(filter(None, ids))
                    )
                )
    return params


def pytest_itemcollected(item):
    """The forkserver imports the scenario modules a batched family's test module uses (a decorated
    contract's own module is a preload of its param: every world would import them again otherwise, about
    0.1 s of CPU per rank per world, measured); a --zero3-config that
    offloads the optimizer: every contract may step DeepSpeedCPUAdam; a compile profile: dynamo warmed."""
    if "zero3_world" not in getattr(item, "fixturenames", ()):
        return
    item.add_marker(pytest.mark.zero3_preload(*scenario_modules(getattr(item, "module", None))))
    settings = options.settings(item.config)
    if profiles.cpu_adam(profile_options.config_overlay(settings)):
        item.add_marker(pytest.mark.zero3_preload(CPU_ADAM_PRELOAD))
    if any(profiles.PROFILES[name].compile_backend for name in settings.profile if name in profiles.PROFILES):
        item.add_marker(pytest.mark.zero3_preload(COMPILE_PRELOAD))


def scenario_modules(module) -> tuple[str, ...]:
    """The ``pytest_zero3.fixtures`` modules ``module`` (a test module) imported: its scenarios' homes."""
    names = (
        {
            value.__name__
            for value in vars(module).values()
            if isinstance(value, types.ModuleType) and value.__name__.startswith(FIXTURES)
        }
        if module is not None
        else set()
    )
    return tuple(sorted(names))


def pytest_configure(config):
    config.addinivalue_line("markers", "zero3_no_profile: no selected --zero3-profile applies (deselected)")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config, items):
    drop = [item for item in items if item.get_closest_marker("zero3_no_profile")]
    if drop:
        config.hook.pytest_deselected(items=drop)
        items[:] = [item for item in items if item not in drop]
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: its collection order is the dispatch order
        items[:] = dispatch_order(items, options.settings(config).world_size)


#: Families whose tests all read one batch, run by the first of them under a lock the others wait on
#: (``fixtures/pytest_side/rule_batch.py``: the rule family's anchors and examples, 8-9 CPU-s of ranks).
BATCHED_FAMILIES = frozenset({"rule"})
#: Families whose one test trains several models in one world (the zoo's Hugging Face models at two
#: reuse distances, the seq family's drawn sequences): 1.6-4.3 CPU-s of ranks each, against about 0.3
#: for most contracts' worlds.
HEAVY_FAMILIES = frozenset({"zoo", "seq"})


def dispatch_order(items, world_size: int) -> list:
    """``items`` in the order pytest-xdist hands them out (``--dist loadgroup`` sends them in collection
    order, each worker kept at most three tests ahead): the heaviest worlds first, so that the workers end
    together, not one of them alone on a compiled world while the others idle.

    First, the first test of each of the :data:`BATCHED_FAMILIES` (it runs the batch); then every world
    under a compile profile (dynamo traces each model in each rank: 2.5-17 CPU-s a world, measured on the
    reference), then worlds resized for a profile (hpz: 4 ranks) and the :data:`HEAVY_FAMILIES`, then the
    rest; last, the other tests of a batched family, which only read the batch: handed out while it runs,
    their workers would wait on its lock (pytest-xdist 3.8 under pytest 9.2 cannot keep an
    ``xdist_group`` on one worker).  Within each class the order is the collection's; every worker
    computes the same order from the same items, as pytest-xdist requires."""
    batches: set = set()

    def rank(item) -> int:
        family = registry.family(_contract(item))
        if family in BATCHED_FAMILIES:
            if family in batches:
                return 4
            batches.add(family)
            return 0
        params = getattr(getattr(item, "callspec", None), "params", {})
        profile = profiles.PROFILES.get(params.get("zero3_profile") or profiles.DEFAULT)
        if profile is not None and profile.compile_backend:
            return 1
        if (profile is not None and profile.min_world_size > world_size) or family in HEAVY_FAMILIES:
            return 2
        return 3

    ranks = [rank(item) for item in items]  # in collection order: a batch's runner is its family's first test
    return [items[i] for i in sorted(range(len(items)), key=ranks.__getitem__)]


@pytest.fixture
def zero3_profile(request):
    """The profile this test runs under (``fp32`` unless ``--zero3-profile`` parametrised it)."""
    return getattr(request, "param", None) or profiles.DEFAULT


@pytest.fixture
def zero3_world(zero3_world, zero3_profile, request):
    """The plugin's world, running every scenario under ``zero3_profile`` and ``--zero3-config``."""
    settings = options.settings(request.config)
    profile = profiles.PROFILES[zero3_profile]
    world = zero3_world
    if profile.min_world_size > getattr(world, "size", profile.min_world_size) and hasattr(world, "resized"):
        world = world.resized(profile.min_world_size) or world  # short of devices: the rank says so
    user = profile_options.config_overlay(settings)
    profiles.activate(zero3_profile, user, getattr(world, "size", settings.world_size))  # the test's side
    yield ProfileWorld(world, zero3_profile, user, settings.poison)
    profiles.activate(profiles.DEFAULT, {})


class ProfileWorld:
    """A world whose :meth:`run` wraps the scenario in :func:`pytest_zero3.fixtures.profile_run.call` on every rank."""

    def __init__(self, world, profile: str, user: dict, poison: bool = False):
        self._world, self.profile, self._user, self._poison = world, profile, user, poison

    def run(self, fn, *args, **kwargs):
        self._check_device()
        return self._world.run(profiles.CALL, self.profile, self._user, fn, args, kwargs, poison=self._poison)

    def outcomes(self, fn, *args, **kwargs):
        self._check_device()
        return self._world.outcomes(profiles.CALL, self.profile, self._user, fn, args, kwargs, poison=self._poison)

    def _check_device(self):
        """A GPU-only profile where the ranks will run on the CPU accelerator: unsupported before any
        rank starts (the ranks check too, where the accelerator is known only there)."""
        profile = profiles.PROFILES[self.profile]
        world = self._world
        backend, size = getattr(world, "backend", accel.AUTO), getattr(world, "size", 1)
        if profile.gpu_only and accel.predicted(backend, size) == "cpu":
            raise Unsupported(f"profile {profile.name}: {profile.gpu_only}")

    def resized(self, size):
        other = self._world.resized(size)
        return None if other is None else ProfileWorld(other, self.profile, self._user, self._poison)

    def __copy__(self):
        return ProfileWorld(copy.copy(self._world), self.profile, self._user, self._poison)

    def __getattr__(self, name):  # size, backend, base_dir, ...: the wrapped world's
        if name.startswith("__") or "_world" not in self.__dict__:
            raise AttributeError(name)
        return getattr(self._world, name)

    def __setattr__(self, name, value):
        if name in ("_world", "profile", "_user"):
            object.__setattr__(self, name, value)
        else:  # e.g. a test resizing its copy of the world
            setattr(self._world, name, value)
