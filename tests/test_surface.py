"""The ZeRO-3 surface map (``fixtures/pytest_side/surface.py``, ``conformance/surface.toml``): the installed DeepSpeed's
entry points, options and config keys all named, every named contract real, a fork's differences in the
header, and the coverage in the report.

All read with ast in this process (no torch, no deepspeed import, no world): a second or so in all.
"""

import importlib.util
import os
import shutil

import pytest
from forks import edit
from pytest_zero3.fixtures.pytest_side import surface

from conftest import ROOT
from pytest_zero3 import impl, registry, report


def _installed() -> str:
    return impl.describe_without_import(impl.parse("installed"))["deepspeed_path"]


def test_the_map_names_every_entry_of_the_installed_deepspeed():
    """Why: a release that adds a ZeRO-3 entry point, option or config key must be mapped (driven by a
    contract, or a stated reason) before the suite claims to cover it."""
    rows = surface.load()
    named = surface.entries(surface.read(_installed()), rows)
    unmapped = [e for e in named if e not in rows]
    assert not unmapped, (
        f"the installed deepspeed has {len(unmapped)} entries {surface.REGISTRY_NAME} does not name: "
        f"{', '.join(unmapped)}. Add a row for each to conformance/{surface.REGISTRY_NAME}: "
        'contracts = ["ID", ...] for the contracts that call it, or kind = "gap" (or gpu, nvme, not-zero3, '
        'deprecated, helper) with why = "..." (docs/reference/surface.md)'
    )


def test_every_contract_the_map_names_exists():
    bad = surface.unknown_contracts(surface.load())
    assert not bad, (
        f"{surface.REGISTRY_NAME} names contracts conformance/contracts.toml does not have: {bad}; "
        "fix the ID or remove it from the row"
    )


def test_the_reader_finds_each_part_of_the_surface():
    got = surface.read(_installed())
    assert got["engine.save_checkpoint"] == ("tag", "client_state", "save_latest", "exclude_frozen_parameters")
    assert got["engine.offload_states"] == ("include", "device", "pin_memory", "non_blocking")
    assert "engine.empty_partition_cache" in got and "engine.reload_states" in got
    assert "engine.zero_optimization_stage" not in got  # an accessor: its config key is mapped
    assert "engine.is_map_style_dataset" in got  # a static method with an argument is no accessor
    assert got["zero.GatheredParameters"] == ("modifier_rank", "fwd_module", "enabled")  # from partition_parameters
    assert "config_dict_or_path" in got["zero.Init"]
    assert {"utils.safe_get_full_grad", "utils.safe_set_local_optimizer_state", "utils.set_z3_leaf_modules"} <= set(got)
    assert "utils.logger" not in got  # only tensor_fragment's and z3_leaf_module's names
    assert "tag" in got["zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint"]
    keys = {e for e in got if e.startswith("config.")}
    assert {
        "config.gradient_clipping",
        "config.prescale_gradients",
        "config.gradient_predivide_factor",
        "config.communication_data_type",  # a default argument holds the constant
        "config.torch_autocast.dtype",  # a sub-dict
        "config.data_types.grad_accum_dtype",  # a getter's sub-dict kept in a local
        "config.checkpoint.tag_validation",  # the sub-dict handed to another function
        "config.bf16.enabled",  # the bf16 config model's fields
        "config.fp16.loss_scale",
    } <= keys, sorted(keys)


def test_coverage_counts_and_names_the_gaps():
    c = surface.coverage(_installed())
    d = c.as_dict()
    assert d["total"] == d["driven"] + d["with_reason"] + len(d["gaps"]) and not c.unknown
    rows = surface.load()
    assert d["driven"] >= 40 and all(rows[g].kind == "gap" for g in c.gaps)
    # every entry of the installed DeepSpeed is driven by a contract or has a reason it is not (issue 39)
    assert not c.gaps, f"not yet driven: {surface.grouped(c.gaps)}"
    line = report.surface_line(d)
    assert line.startswith(f"ZeRO-3 surface: {d['total']} entries, {d['driven']} driven by a contract, ")
    assert line.endswith(", 0 not yet driven"), line
    # options beside their entry point, once: "engine.f(a, b)", not "engine.f(a), engine.f(b)"
    assert surface.grouped(["e.f(a)", "e.f(b)", "e.g"]) == ["e.f(a, b)", "e.g"]
    gaps = report.surface_line({**d, "gaps": ["e.f(a)", "e.f(b)", "e.g"]}, gaps_shown=1)
    assert gaps.endswith("3 not yet driven: e.f(a, b) and 1 more (the reports list them)"), gaps
    assert surface.header(_installed()) is None  # nothing to say where the map matches


@pytest.fixture
def fork(tmp_path):
    """A fork with one engine method of its own, one removed, and a config key of its own (only the
    folders the reader reads: runtime/ and utils/)."""
    src = _installed()
    for part in ("runtime", "utils"):
        shutil.copytree(os.path.join(src, part), tmp_path / "deepspeed" / part, ignore=shutil.ignore_patterns("*.pyc"))
    (tmp_path / "deepspeed" / "__init__.py").write_text("")
    edit(
        str(tmp_path),
        "runtime/engine.py",
        "    def empty_partition_cache(self):\n",
        "    def fork_regather(self, *, eager=False):\n        pass\n\n    def fork_unused(self):\n",
    )
    edit(
        str(tmp_path),
        "runtime/config.py",
        "return get_scalar_param(param_dict, PRESCALE_GRADIENTS, PRESCALE_GRADIENTS_DEFAULT)",
        'return get_scalar_param(param_dict, "fork_prescale", False)',
    )
    return tmp_path


def test_a_forks_own_and_missing_entries_are_named_in_the_header(fork):
    where = str(fork / "deepspeed")
    c = surface.coverage(where)
    assert c.unknown == ("engine.fork_regather", "engine.fork_unused", "config.fork_prescale")
    assert "engine.empty_partition_cache" in c.missing and "config.prescale_gradients" in c.missing
    assert "engine.fork_regather(eager)" not in c.unknown  # an unmapped entry's options: not listed
    line = surface.header(where)
    assert line.startswith(
        "ZeRO-3 surface not in the surface map, driven by no contract: engine.fork_regather, engine.fork_unused, "
        "config.fork_prescale; in the map, missing in this implementation: "
    ), line
    assert "engine.empty_partition_cache" in line
    # the plugin's header carries it (the session reads no deepspeed to build it)
    spec = impl.parse(str(fork))
    lines = report.Report.header_lines(_Stub(spec))
    assert "zero3: " + line in lines


def test_a_malformed_row_names_the_entry_and_the_fix(tmp_path):
    bad = tmp_path / "surface.toml"
    for body, says in (
        ('contracts = ["base-a"]\nkind = "gap"\nwhy = "x"', "needs either contracts"),
        ('kind = "later"\nwhy = "x"', "has kind 'later'"),
        ('kind = "gap"', "lacks why"),
        ('contracts = ["base-a"]\nnote = "x"', "has unknown note"),
    ):
        bad.write_text(f'[entries."engine.step"]\n{body}\n')
        surface.load.cache_clear()
        with pytest.raises(ValueError, match=r"surface.toml: \[entries.'engine.step'\] " + says):
            surface.load(str(bad))
    surface.load.cache_clear()


def test_the_json_report_with_its_surface_conforms_to_the_schema():
    spec = importlib.util.spec_from_file_location("render_matrix", ROOT / "scripts" / "render_matrix.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    covered = surface.coverage(_installed()).as_dict()
    counts = dict.fromkeys(
        ("pass", "fail", "world_error", "known_failure", "unexpected_pass", "unsupported", "skipped", "not_run"), 0
    )
    doc = {
        "schema": report.SCHEMA,
        "version": report.SCHEMA_VERSION,
        "implementation": {"spec": "installed", "impl": "installed deepspeed", "backend": "gloo", "world_size": 2},
        "baseline": None,
        "summary": {**counts, "total": 0},
        "contracts": [],
        "surface": covered,
    }
    assert mod.validate(doc, mod.schema()) == []
    assert mod.validate({**doc, "surface": {**covered, "gaps": "x"}}, mod.schema()) != []
    assert report.surface_line(covered) in report.markdown(doc)


def test_the_map_ships_beside_the_contract_registry():
    assert surface.registry_path() == os.path.join(os.path.dirname(registry.path()), "surface.toml")
    assert os.path.isfile(surface.registry_path())


class _Stub:
    """What :meth:`Report.header_lines` reads of a report: its settings."""

    def __init__(self, spec):
        import types

        self.settings = types.SimpleNamespace(
            spec=spec, backend="gloo", timeout=60.0, baseline=None, profile=("fp32",), config=None, poison=False
        )

    def world_size(self) -> int:
        return 2
