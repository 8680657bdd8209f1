"""Saved policies: exact round trip, both path forms, and clear errors for anything missing or corrupted."""
from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from agents.dqn.networks import init_params
from quarl.policy.spec import mlp_q_network
from quarl.quant.payload import MAGIC
from quarl.quant.policy_io import META_FILE, POLICY_FILE, load_policy, save_policy


@pytest.fixture()
def policy():
    spec = mlp_q_network(4, (8, 8), 2)
    return spec, init_params(spec, jax.random.PRNGKey(0))  # a real haiku tree of jax arrays


def _save(path, spec, params, **kw):
    return save_policy(path, spec, params, task="CartPole-v1", agent="dqn", **kw)


def test_round_trip_from_a_run_directory(tmp_path, policy):
    spec, params = policy
    written = _save(tmp_path / "run", spec, params, steps=1234, extra={"seed": 3, "precision": "int8"})
    assert written == tmp_path / "run" / POLICY_FILE
    assert written.read_bytes()[:4] == MAGIC  # the payload format, not pickle
    loaded = load_policy(tmp_path / "run")
    assert loaded.spec == spec
    assert (loaded.task, loaded.agent, loaded.steps) == ("CartPole-v1", "dqn", 1234)
    assert loaded.meta["extra"] == {"seed": 3, "precision": "int8"}
    assert sorted(loaded.params) == sorted(params)
    for module in params:
        for name in params[module]:
            got = loaded.params[module][name]
            assert got.dtype == np.float32 and got.flags.writeable
            np.testing.assert_array_equal(got, np.asarray(params[module][name]))
    sidecar = json.loads((tmp_path / "run" / META_FILE).read_text())
    assert sidecar["steps"] == 1234 and sidecar["nbytes"] == written.stat().st_size


def test_round_trip_through_a_file_path(tmp_path, policy):
    spec, params = policy
    path = _save(tmp_path / "best.qrlp", spec, params)
    assert path.exists() and (tmp_path / "best.json").exists()
    loaded = load_policy(path)
    np.testing.assert_array_equal(loaded.params["linear_2"]["w"], np.asarray(params["linear_2"]["w"]))
    assert loaded.steps == 0


def test_missing_policy_is_a_clear_error(tmp_path):
    with pytest.raises(ValueError, match="no trained policy"):
        load_policy(tmp_path)
    with pytest.raises(ValueError, match="no trained policy"):
        load_policy(tmp_path / "nope")


@pytest.mark.parametrize("damage", ["flip", "truncate", "garbage"])
def test_corrupt_payload_is_a_clear_error(tmp_path, policy, damage):
    spec, params = policy
    path = _save(tmp_path, spec, params)
    data = bytearray(path.read_bytes())
    if damage == "flip":
        data[len(data) // 2] ^= 0xFF
    elif damage == "truncate":
        data = data[: len(data) - 10]
    else:
        data = bytearray(b"not a policy at all")
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match=f"corrupt policy file {path}"):
        load_policy(tmp_path)


def test_sidecar_must_exist_and_match_the_payload(tmp_path, policy):
    spec, params = policy
    _save(tmp_path / "a", spec, params)
    _save(tmp_path / "b", spec, jax.tree.map(lambda x: np.asarray(x) * 2, params))
    (tmp_path / "a" / META_FILE).write_bytes((tmp_path / "b" / META_FILE).read_bytes())
    with pytest.raises(ValueError, match="does not match its sidecar"):
        load_policy(tmp_path / "a")
    (tmp_path / "b" / META_FILE).unlink()
    with pytest.raises(ValueError, match="sidecar .* is missing"):
        load_policy(tmp_path / "b")
    (tmp_path / "b" / META_FILE).write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        load_policy(tmp_path / "b")


def test_save_rejects_bad_policies_and_arguments(tmp_path, policy):
    spec, params = policy
    nan = jax.tree.map(np.array, params)
    nan["linear_0"]["w"][0, 0] = np.nan
    with pytest.raises(ValueError, match="NaN"):
        _save(tmp_path, spec, nan)
    with pytest.raises(ValueError, match="shape"):
        _save(tmp_path, mlp_q_network(4, (8, 16), 2), params)
    with pytest.raises(ValueError, match="no module 'linear_0'"):  # the tree is checked against spec.param_shapes()
        _save(tmp_path, spec, {k: v for k, v in params.items() if k != "linear_0"})
    with pytest.raises(ValueError, match="task"):
        save_policy(tmp_path, spec, params, task="", agent="dqn")
    with pytest.raises(ValueError, match="steps"):
        _save(tmp_path, spec, params, steps=-1)
    with pytest.raises(ValueError, match="extra"):
        _save(tmp_path, spec, params, extra={"x": float("nan")})
    with pytest.raises(ValueError, match="extra"):
        _save(tmp_path, spec, params, extra={"x": np.zeros(2)})
    assert not (tmp_path / POLICY_FILE).exists()  # nothing is written for a rejected policy
