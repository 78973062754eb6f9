"""One integer rule (``sim.core.fields.check_int``): a whole float such as ``64.0`` is refused
by every integer key alike (config blocks, policy parameters, workload keys), from YAML
(exit 2, file, key and problem named) and from Python with the same words; numpy integers
are integers everywhere."""
from __future__ import annotations

import numpy as np
import pytest
import yaml

import sim
from policies import make_policy
from sim.cli.main import main as batchsim
from sim.core.fields import check_int
from sim.core.types import Request
from sim.workload.build import build_workload
from tests.helpers import SMALL_EXPERIMENT as SMALL


@pytest.mark.parametrize(("change", "field", "value"), [
    ({"kv": {"num_blocks": 400, "block_size": 16.0}}, "kv.block_size", 16.0),
    ({"policy": {"name": "continuous", "max_num_seqs": 64.0}}, "policy.max_num_seqs", 64.0),
    ({"workload": {**SMALL["workload"], "num_requests": 30.0}}, "workload.num_requests", 30.0),
])
def test_a_whole_float_is_refused_by_every_integer_key(tmp_path, capsys, change, field,
                                                       value) -> None:
    """Plugin parameters and workload keys took ``64.0`` where every other key refused it."""
    exp = tmp_path / "exp.yaml"
    exp.write_text(yaml.safe_dump({**SMALL, **change}, sort_keys=False))
    assert batchsim(["run", str(exp), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr() == (
        "", f"batchsim: error: {exp}: {field}: expected int, got float {value!r}\n")


def test_python_refuses_the_same_whole_floats_with_the_same_words() -> None:
    with pytest.raises(sim.InputError) as info:
        make_policy({"name": "continuous", "max_num_seqs": 64.0})
    assert str(info.value) == "policy.max_num_seqs: expected int, got float 64.0"
    with pytest.raises(sim.InputError) as info:
        build_workload({**SMALL["workload"], "num_requests": 30.0}, np.random.default_rng(0))
    assert str(info.value) == "workload.num_requests: expected int, got float 30.0"
    with pytest.raises(sim.InputError) as info:
        sim.simulate([Request(0, 0.0, 8, 4)], cost=sim.ConstantCost(0.01),
                     kv={"num_blocks": 400, "block_size": 16.0})
    assert str(info.value) == "kv.block_size: expected int, got float 16.0"
    with pytest.raises(sim.InputError, match=r"^x: expected int, got bool True$"):
        check_int(True, "x")


def test_numpy_integers_are_integers_everywhere() -> None:
    """``np.int64(64)`` counts as an integer for a policy, a workload and a conversation
    spec alike (conversations took Python ints only)."""
    assert make_policy({"name": "continuous", "max_num_seqs": np.int64(64)}).max_num_seqs == 64
    reqs = build_workload({**SMALL["workload"], "num_requests": np.int32(3)},
                          np.random.default_rng(0))
    assert len(reqs) == 3
    conv = {"conversations": {"num_conversations": np.int64(2), "turns": np.int64(2),
                              "rate": 1.0}}
    assert len(build_workload(conv, np.random.default_rng(0))) == 4
    with pytest.raises(sim.InputError, match=r"^workload\.conversations\.num_conversations: "
                       r"expected an integer in \(0, 20,000,000\], got 2\.0$"):
        build_workload({"conversations": {"num_conversations": 2.0}}, np.random.default_rng(0))
