"""Keys accepted but read by nothing in their composition: an error naming the file, the key
and why (exit 2) where the user clearly expected an effect, a one-line note where it is
harmless; the CLI, ``sim.run_experiment`` and ``sim.simulate`` alike."""
from __future__ import annotations

import warnings

import pytest
import yaml

import sim
from sim.api import run_experiment
from sim.cli.main import main as batchsim
from sim.core.types import Request
from sim.experiments.config import ConfigError, expand_runs
from tests.helpers import SMALL_EXPERIMENT as SMALL

_WHY_UNLIMITED = ("kv.unlimited: true ignores KV capacity and every other kv key; drop one of "
                  "them")


@pytest.mark.parametrize(("block", "field", "problem"), [
    ({"cost": {"kind": "roofline", "step_s": 0.01}, "kv": {}}, "cost.step_s",
     "0.01 has no effect: only cost.kind: constant reads it (cost.kind is roofline)"),
    ({"cost": {"kind": "linear", "base_s": 0.01, "step_s": 0.02}}, "cost.step_s",
     "0.02 has no effect: only cost.kind: constant reads it (cost.kind is linear)"),
    ({"cost": {"kind": "constant", "step_s": 0.01, "weight_dtype": "fp8"}}, "cost.weight_dtype",
     "'fp8' has no effect: only cost.kind: roofline reads it (cost.kind is constant)"),
    ({"kv": {"unlimited": True, "num_blocks": 100}}, "kv.num_blocks",
     f"100 has no effect: {_WHY_UNLIMITED}"),
    ({"kv": {"unlimited": True, "prefix_caching": True}}, "kv.prefix_caching",
     f"True has no effect: {_WHY_UNLIMITED}"),
    ({"kv": {"num_blocks": 400, "gpu_memory_utilization": 0.5}}, "kv.gpu_memory_utilization",
     "0.5 has no effect: kv.num_blocks sets the capacity it would derive from HBM; drop one of "
     "them"),
])
def test_a_key_nothing_reads_is_an_error_naming_file_and_key(tmp_path, capsys, block, field,
                                                              problem) -> None:
    """``cost.step_s`` under the roofline model and ``kv.num_blocks`` beside
    ``kv.unlimited: true`` were silently ignored."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**SMALL, **block}, sort_keys=False))
    assert batchsim(["run", str(exp), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr() == ("", f"batchsim: error: {exp}: {field}: {problem}\n")
    assert not (tmp_path / "o").exists()
    with pytest.raises(ConfigError) as caught:
        run_experiment(exp, out=tmp_path / "o", quiet=True)
    assert (caught.value.source, caught.value.field, caught.value.problem) == (
        str(exp), field, problem)


@pytest.mark.parametrize("kv", [{"unlimited": True, "num_blocks": 100},
                                {"num_blocks": 400, "gpu_memory_utilization": 0.5}])
def test_simulate_refuses_the_same_kv_keys(kv) -> None:
    """``sim.simulate(kv=...)`` applies the same rule to its one run, with the same words."""
    field = "num_blocks" if "unlimited" in kv else "gpu_memory_utilization"
    with pytest.raises(sim.InputError, match=rf"^kv\.{field}: .* has no effect: "):
        sim.simulate([Request(0, 0.0, 8, 4)], cost=sim.ConstantCost(0.01), kv=kv)


def test_slab_keys_without_the_slab_are_noted_not_refused(tmp_path, capsys) -> None:
    """``kv.reserve_tokens`` under the paged allocator is harmless but unused: one note on
    stderr (run unchanged); ``sim.simulate`` says the same as a ``UserWarning``. A sweep whose
    slab runs read it says nothing."""
    kv = {**SMALL["kv"], "reserve_tokens": 2048}
    note = ("kv.reserve_tokens (2048) is not used: only kv.allocator: slab with "
            "kv.slab_reserve: max_model_len reads it")
    notes: list[str] = []
    expand_runs({**SMALL, "kv": kv}, notify=notes.append)
    assert notes == [note]
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**SMALL, "kv": kv}, sort_keys=False))
    assert batchsim(["run", str(exp), "--out", str(tmp_path / "o")]) == 0
    assert capsys.readouterr().err.splitlines()[0] == f"batchsim: {note}"
    with pytest.warns(UserWarning, match=rf"^{note.replace('(', '.').replace(')', '.')}$"):
        sim.simulate([Request(0, 0.0, 8, 4)], cost=sim.ConstantCost(0.01), kv=kv)
    notes.clear()
    expand_runs({**SMALL, "kv": kv, "sweep": {"kv.allocator": ["slab", "paged"]}},
                notify=notes.append)
    assert notes == []
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the paged run's kv argument leaves the key out
        from sim.experiments.runner import kv_spec

        _, runs = expand_runs({**SMALL, "kv": kv, "sweep": {"kv.allocator": ["slab", "paged"]}})
        assert [("reserve_tokens" in (kv_spec(r.config) or {})) for r in runs] == [True, False]


def test_a_sweep_of_the_cost_kind_keeps_each_kinds_keys() -> None:
    """A key one run of a sweep reads is fine: ``cost.step_s`` beside
    ``sweep: {cost.kind: [constant, linear]}``."""
    raw = {**SMALL, "cost": {"step_s": 0.01, "base_s": 0.01},
           "sweep": {"cost.kind": ["constant", "linear"]}}
    notes: list[str] = []
    _, runs = expand_runs(raw, notify=notes.append)
    assert len(runs) == 2 and notes == []


def test_an_interval_level_without_draws_is_noted() -> None:
    """``intervals.level`` with ``intervals.draws: 0`` drew no intervals without a word."""
    notes: list[str] = []
    expand_runs({**SMALL, "intervals": {"level": 0.95}}, notify=notes.append)
    assert notes == ["intervals.level (0.95) is not used: intervals.draws is 0 (no prediction "
                     "intervals)"]
    notes.clear()
    expand_runs({**SMALL, "intervals": {"level": 0.95, "draws": 4}}, notify=notes.append)
    assert notes == []
