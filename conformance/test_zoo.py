"""Contract family ``zoo``: small real Hugging Face models trained and then used for ``generate()`` under ZeRO-3.

Why: the rule family's generated models are Linear chains; real models bring what users run into:
tied embeddings shared by the first and last module (GPT-2, T5), an encoder that ``generate()`` calls
outside the root module's forward (T5), data-dependent expert routing behind z3 leaves (Mixtral), a
frozen tower and a trainable projector in ``eval()`` while the rest trains (LLaVA), rotary-embedding
modules without params, KV-cache generation loops whose passes differ in length
from the recorded training pass, and persistent norms next to partitioned matrices.

One contract per model: each model is a shape of real training, and a fork's failure names the model
it breaks (the message names the rule, the pass and the param; the expectations file pins the cause
per model).  Each contract checks, at reuse distances 0 and 2000 with a prefetch bucket of 1000
elements (:mod:`pytest_zero3.fixtures.zoo_generate`; the verdicts :mod:`pytest_zero3.fixtures.zoo_records`):

* every hook event of the 3 training steps and of every ``generate()`` forward, on every rank, against
  the rule model (:func:`pytest_zero3.fixtures.rule.rules.judge`, the ``rule`` family's rules a-g);
* losses (mean over ranks) and final weights against the same model trained in plain torch;
* ``generate()`` tokens identical, and scores within 1e-5 relative, to a plain-torch copy of the model
  holding the ZeRO-3 run's final weights.

Cost: one world runs every selected model (transformers is imported once, by the forkserver), one
engine per model and distance: 10 engines.
"""

from __future__ import annotations

import importlib.util

import pytest
from pytest_zero3.fixtures import verdicts
from pytest_zero3.fixtures import zoo_records as fz

from pytest_zero3.job import Named

#: The model each contract runs (fixtures/models/zoo.py).
MODEL_OF = {"zoo-a": "llama", "zoo-b": "gpt2", "zoo-c": "t5", "zoo-d": "mixtral", "zoo-e": "llava"}
#: The zoo's scenario, named: imported only in the ranks (it imports torch; this process judges their
#: records with the torch-free :mod:`pytest_zero3.fixtures.zoo_records`).
RUN_ZOO = Named("pytest_zero3.fixtures.zoo_generate", "run_zoo")


class ZooRun:
    """The session's runs of the zoo: every model whose contract the session selected, in one world.

    Under pytest-xdist each worker sees every collected item but runs only some, so there each test runs
    its own model in its own world (with ``--dist loadgroup`` the ``xdist_group`` keeps them on one worker).
    """

    def __init__(self, session):
        self.models: list[str] = []
        if not hasattr(session.config, "workerinput"):
            for item in session.items:
                mark = item.get_closest_marker("zero3_contract")
                cid = mark.args[0] if mark is not None and mark.args else None
                if cid in MODEL_OF and MODEL_OF[cid] not in self.models:
                    self.models.append(MODEL_OF[cid])
        self.results: dict[str, list[list[dict]]] = {}
        self.errors: dict[str, BaseException] = {}

    def of(self, zero3_world, model: str) -> list[list[dict]]:
        """Per config, each rank's record of ``model`` (its world runs at the first call that needs it)."""
        if model not in self.results and model not in self.errors:
            pending = [m for m in self.models if m not in self.results and m not in self.errors]
            models = pending if model in pending else [model]
            try:
                per_rank = zero3_world.run(RUN_ZOO, models)
            except BaseException as exc:  # every contract of the world fails with the world's failure
                self.errors.update(dict.fromkeys(models, exc))
                raise
            for m in models:
                self.results[m] = [[rank[m][i] for rank in per_rank] for i in range(len(per_rank[0][m]))]
        if model in self.errors:
            raise self.errors[model]
        return self.results[model]


@pytest.fixture(scope="session")
def zero3_zoo(request):
    return ZooRun(request.session)


@pytest.mark.zero3_preload("transformers", "pytest_zero3.fixtures.zoo_generate")
@pytest.mark.zero3_timeout(300)
@pytest.mark.xdist_group("zero3-zoo")
@pytest.mark.parametrize(
    "contract",
    [
        pytest.param("zoo-a", marks=pytest.mark.zero3_contract("zoo-a"), id="zoo-a-llama"),
        pytest.param("zoo-b", marks=pytest.mark.zero3_contract("zoo-b"), id="zoo-b-gpt2"),
        pytest.param("zoo-c", marks=pytest.mark.zero3_contract("zoo-c"), id="zoo-c-t5"),
        pytest.param("zoo-d", marks=pytest.mark.zero3_contract("zoo-d"), id="zoo-d-mixtral"),
        pytest.param("zoo-e", marks=pytest.mark.zero3_contract("zoo-e"), id="zoo-e-llava"),
    ],
)
def test_zoo(zero3_world, zero3_zoo, contract):
    if importlib.util.find_spec("transformers") is None:
        pytest.skip("the zoo needs transformers installed (pip install 'transformers>=5')")
    model = MODEL_OF[contract]
    runs = zero3_zoo.of(zero3_world, model)
    verdicts.assert_clean([_preconditions(model, runs, rank) for rank in range(len(runs[0]))], "scenario precondition")
    found = [[] for _ in runs[0]]  # per rank, (kind, line) over both configs
    for per_rank in runs:
        for rank, rows in enumerate(fz.problems(per_rank)):
            found[rank] += rows
    kinds = [kind for rows in found for kind, _ in rows]
    heading = f"{model} under ZeRO-3"  # the summary names what broke: the problems' keys leave it out
    verdicts.assert_clean([[line for _, line in rows] for rows in found], f"{heading}: {fz.summary(kinds)}", heading)


def _preconditions(model: str, runs, rank: int) -> list[str]:
    """What must hold of one rank's runs for the zoo's rules to judge anything: the probe saw every
    training step and the generate() forwards, prefetch ran, LLaVA's frozen tower is in eval()."""
    out = []
    for per_rank in runs:
        run, label = per_rank[rank], f"{model}, {fz.describe(per_rank[rank]['zero'])}"
        if "error" in run:
            continue
        steps = len(run.get("steps", []))
        if steps <= fz.STEPS:
            line = (
                f"{label}: the probe saw {steps} passes, expected {fz.STEPS} training steps and the generate() forwards"
            )
            out.append(verdicts.record(line, "scenario precondition: the probe saw every pass", at=label))
        if not fz.prefetched(run):
            line = (
                f"{label}: no hook event after the first pass gathered params ahead of its module: prefetch (bucket "
                f"{fz.PREFETCH_BUCKET}) never ran"
            )
            out.append(verdicts.record(line, "scenario precondition: prefetch ran", at=label))
        held = run.get("eval_in_training", [])
        if model == "llava" and not {"model.vision_tower", "model.multi_modal_projector"} <= set(held):
            line = (
                f"{label}: the vision tower and the projector must be in eval() while training; modules in eval(): "
                f"{held[:8]}"
            )
            out.append(
                verdicts.record(line, "scenario precondition: the vision tower and the projector in eval()", at=label)
            )
    return out
