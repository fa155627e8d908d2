"""Fleets of replica groups (simspec.fleet.groups): ``--fleet FILE.toml`` and
``[fleet]``; a one-group fleet is the identical-replica fleet, each group
serves with its own device, engine and policy, the run folder's fleet files."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from conftest import invoke
from simspec import config, experiment, metrics
from simspec.fleet import groups

BASE = {"policies": ["ar", "linear:k=3"], "workload": {"num_requests": 240, "rate_per_s": 30.0}}


def _cfg(fleet: list[dict], **top) -> config.SimConfig:
    return config.build({}, {**BASE, **top, "fleet": groups.groups_of(fleet, "test")})


@pytest.mark.parametrize("router", ["round_robin", "least_requests"])
def test_one_group_is_the_fleet_of_identical_replicas(router):
    plain = experiment.run(config.build({}, {**BASE, "replicas": 3, "router": router}))
    grouped = experiment.run(_cfg([{"replicas": 3}], router=router))
    assert grouped.metrics == plain.metrics
    for a, b in zip(plain.fleets, grouped.fleets):
        assert np.array_equal(a.assignment, b.assignment)
        assert np.array_equal(a.log.table.finish_s, b.log.table.finish_s)


def test_a_fleet_of_one_replica_is_the_plain_run():
    plain = experiment.run(config.build({}, BASE))
    assert experiment.run(_cfg([{"replicas": 1}])).metrics == plain.metrics


def test_each_group_serves_with_its_own_device_and_policy():
    cfg = _cfg([{"name": "fast", "replicas": 2, "device": "h100-sxm"},
                {"name": "slow", "replicas": 2, "device": "a40", "policy": "ar"}], router="least_requests")
    results = experiment.run(cfg)
    assert experiment.replica_groups(results.scenario) == ["fast", "fast", "slow", "slow"]
    spec_run = results.fleets[1]  # the linear:k=3 run: the slow group still serves ar
    fast = [metrics.summarize(log) for log in spec_run.replicas[:2]]
    slow = [metrics.summarize(log) for log in spec_run.replicas[2:]]
    assert all(m["spec_decode_acceptance_length"] > 1.5 for m in fast)
    assert all(m["spec_decode_acceptance_length"] == 1.0 for m in slow)
    assert max(m["mean_tpot_ms"] for m in fast) < min(m["mean_tpot_ms"] for m in slow)  # an A40 decodes slower
    assert spec_run.assignment.size == 240 and set(np.unique(spec_run.assignment)) == {0, 1, 2, 3}


@pytest.mark.parametrize("router", ["least_requests", "spec_aware"])
def test_groups_of_different_policies_and_gpus_route_compiled_as_in_python(router, monkeypatch):
    # Their arguments to the serving loop are of one type, so the compiled routing loop runs them; switched
    # off, the Python loop makes the same decisions and logs to the last bit.
    from simspec.fleet import live

    cfg = _cfg([{"name": "h100", "replicas": 2, "device": "h100-sxm", "policy": "marginal"},
                {"name": "a100", "replicas": 2, "device": "a100-80gb", "policy": "ar", "engine": {"max_num_seqs": 8}}],
               router=router, workload={"num_requests": 600, "rate_per_s": 40.0})
    used, through = [], live._route_compiled
    monkeypatch.setattr(live, "_route_compiled", lambda *a: used.append(through(*a)) or used[-1])
    compiled = experiment.run(cfg).fleets[0]
    assert len(used) == 1 and used[0] is not None  # it took the compiled loop
    monkeypatch.setattr(live, "COMPILED", False)
    python = experiment.run(cfg).fleets[0]
    assert len(used) == 1
    assert np.array_equal(compiled.assignment, python.assignment)
    assert set(np.unique(compiled.assignment)) == {0, 1, 2, 3}
    for a, b in zip(compiled.log.table, python.log.table):
        assert np.array_equal(a, b, equal_nan=True)


def test_a_fleet_whose_groups_all_name_a_policy_is_one_run():
    cfg = _cfg([{"name": "a", "replicas": 1, "policy": "linear:k=3"}, {"name": "b", "replicas": 1, "policy": "ar"}])
    results = experiment.run(cfg)
    assert list(results.metrics) == ["a linear:k=3 + b ar"]
    assert results.meta.policies == ("a linear:k=3 + b ar",)


def test_a_group_engine_table_sets_its_replicas_engine():
    cfg = _cfg([{"name": "small", "replicas": 1, "engine": {"max_num_seqs": 4}}, {"name": "big", "replicas": 1}])
    small, big = experiment.resolve(cfg).members
    assert small.config.engine.max_num_seqs == 4 and big.config.engine.max_num_seqs == cfg.engine.max_num_seqs
    vllm = _cfg([{"replicas": 1, "device": "a100-80gb", "engine": {"kind": "vllm"}}])
    member = experiment.resolve(vllm).members[0]
    assert member.config.engine.kind == "vllm" and member.config.engine.max_num_seqs == 256  # vLLM's A100 preset


def test_the_fleet_goes_round_a_config_file(tmp_path):
    cfg = _cfg([{"name": "h", "replicas": 2, "policy": "linear:k=2", "engine": {"max_num_seqs": 32}},
                {"name": "a", "replicas": 1, "device": "a100-80gb", "tp": 2}], router="power_of_two")
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml(cfg))
    assert config.build(config.load(path)) == cfg
    assert "[fleet]" in path.read_text()
    assert "fleet" not in config.to_toml(config.build({}, BASE))  # a config without a fleet reads as before


def test_spec_aware_measures_each_group():
    cfg = _cfg([{"name": "h100", "replicas": 2}, {"name": "a40", "replicas": 1, "device": "a40"}],
               router="spec_aware")
    cfg = config.build({}, {**BASE, "router": "spec_aware", "fleet": cfg.fleet,
                            "workload": {"num_requests": 240, "rate_per_s": 40.0}})
    run = experiment.run(cfg).fleets[1]
    counts = np.bincount(run.assignment, minlength=3)
    assert counts.sum() == 240 and counts[2] < counts[:2].min()  # the slower replica is predicted to finish later


def test_cli_fleet_file_writes_the_fleet_files(tmp_path):
    (tmp_path / "f.toml").write_text('router = "least_requests"\n[[group]]\nname = "h100"\nreplicas = 2\n'
                                     '[[group]]\nname = "a100"\nreplicas = 1\ndevice = "a100-80gb"\npolicy = "ar"\n')
    code, out, err = invoke(["simulate", "--fleet", tmp_path / "f.toml", "--num-requests", "120", "--policy", "ar",
                             "--policy", "linear:k=3", "--quiet", "--out", tmp_path / "run"])
    assert code == 0, err
    assert "fleet: h100 x2; a100 x1 (device a100-80gb, policy ar)" in out
    assert "linear:k=3 | a100 x1 (serving ar)" in out
    run = tmp_path / "run"
    for name in ("replicas.csv", "fleet_load.png", "fleet_latency_cdf.png"):
        assert (run / name).stat().st_size > 0
    rows = list(csv.DictReader((run / "replicas.csv").open()))
    assert [(r["policy"], r["group"], r["served"]) for r in rows] == [
        ("ar", "h100", "ar"), ("ar", "h100", "ar"), ("ar", "a100", "ar"),
        ("linear:k=3", "h100", "linear:k=3"), ("linear:k=3", "h100", "linear:k=3"), ("linear:k=3", "a100", "ar")]
    assert sum(int(r["requests"]) for r in rows) == 240
    assert json.loads((run / "simspec-run.json").read_text())["complete"]
    again = tmp_path / "again"
    assert invoke(["simulate", "--config", run / "config.toml", "--quiet", "--out", again])[0] == 0
    assert (again / "metrics.json").read_bytes() == (run / "metrics.json").read_bytes()
