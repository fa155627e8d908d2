"""Prefill/decode disaggregation (simspec.fleet.disagg): the decode side's
steps cost what they cost on a replica that does both, the KV transfer is
priced as bytes over bandwidth plus latency and lands on TTFT, and the run
folder counts each side's requests."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from conftest import invoke
from simspec import config, experiment, metrics
from simspec.fleet import groups
from simspec.types import InputError

SPLIT = [{"name": "p", "replicas": 1, "role": "prefill"}, {"name": "d", "replicas": 1, "role": "decode"}]
ALONE = {"policies": ["ar"], "workload": {"arrival": "poisson", "rate_per_s": 0.05, "num_requests": 12,
                                          "output_mean_tokens": 20.0, "output_cv": 0.0, "multimodal_share": 0.5}}


def _run(fleet=None, **top):
    values = {**ALONE, **top}
    if fleet is not None:
        values["fleet"] = groups.groups_of(fleet, "test")
    return experiment.run(config.build({}, values))


def test_the_decode_side_pays_what_a_colocated_replica_pays_for_the_same_steps():
    # One request at a time (20 s apart): after its first token, each has the
    # same batch-of-one decode steps at the same contexts on either fleet.
    together = _run(replicas=2, router="round_robin").logs[0].table
    split = _run(SPLIT, kv_link="1e9:0").logs[0].table  # a free transfer
    tpot = lambda t: (t.finish_s - t.first_token_s) / (t.output_tokens - 1)  # noqa: E731
    assert np.allclose(tpot(split), tpot(together), rtol=1e-12)
    assert np.array_equal(split.id, together.id) and np.array_equal(split.arrival_s, together.arrival_s)


def test_the_transfer_is_bytes_over_bandwidth_plus_latency_and_lands_on_ttft():
    slow, fast = _run(SPLIT, kv_link="1:500"), _run(SPLIT, kv_link="1e9:0")
    scenario = slow.scenario
    per_token = scenario.members[0].model.kv_bytes_per_token
    context = np.array([r.context_tokens for r in sorted(scenario.requests, key=lambda r: r.id)], dtype=float)
    moved_s = 500e-6 + context * per_token / 1e9 - context * per_token / 1e18
    a, b = slow.logs[0].table, fast.logs[0].table
    assert np.allclose((a.first_token_s - b.first_token_s), moved_s, rtol=1e-9, atol=1e-12)
    assert np.allclose(a.finish_s - a.first_token_s, b.finish_s - b.first_token_s, rtol=1e-12)  # decode unchanged
    assert moved_s.min() > 0.01  # a 7B model's KV over 1 GB/s: tens of ms, not noise


def test_the_named_links_rank_by_bandwidth():
    ttft = {link: metrics.summarize(_run(SPLIT, kv_link=link).logs[0])["mean_ttft_ms"]
            for link in ("nvlink", "ib-400g", "ethernet-100g")}
    assert ttft["nvlink"] < ttft["ib-400g"] < ttft["ethernet-100g"]


def test_speculation_runs_on_the_decode_side():
    results = _run(SPLIT, policies=["ar", "linear:k=3"])
    assert experiment.replica_policies(results.scenario, "linear:k=3") == ["ar", "linear:k=3"]
    ar, spec = (metrics.summarize(log) for log in results.logs)
    assert ar["spec_decode_acceptance_length"] == 1.0 and spec["spec_decode_acceptance_length"] > 1.5
    assert spec["mean_tpot_ms"] < ar["mean_tpot_ms"]


def test_a_disaggregated_fleet_goes_round_a_config_file(tmp_path):
    cfg = config.build({}, {**ALONE, "fleet": groups.groups_of(SPLIT, "test"), "kv_link": "ethernet-100g"})
    path = tmp_path / "c.toml"
    path.write_text(config.to_toml(cfg))
    assert config.build(config.load(path)) == cfg


def test_cli_disaggregated_run_folder(tmp_path):
    (tmp_path / "f.toml").write_text('kv_link = "nvlink"\n[[group]]\nname = "p"\nrole = "prefill"\nreplicas = 1\n'
                                     '[[group]]\nname = "d"\nrole = "decode"\nreplicas = 2\n')
    code, out, err = invoke(["simulate", "--fleet", tmp_path / "f.toml", "--num-requests", "60", "--policy",
                             "linear:k=3", "--router", "least_requests", "--quiet", "--out", tmp_path / "run"])
    assert code == 0, err
    assert "kv cache over nvlink" in out
    rows = list(csv.DictReader((tmp_path / "run" / "replicas.csv").open()))
    assert [(r["group"], r["served"], int(r["requests"])) for r in rows][0] == ("p", "ar", 60)
    assert sum(int(r["requests"]) for r in rows[1:]) == 60


@pytest.mark.parametrize("fleet", [
    [{"replicas": 1, "role": "prefill"}],
    [{"replicas": 1, "role": "prefill"}, {"replicas": 1}],
])
def test_a_disaggregated_fleet_needs_both_sides(fleet):
    with pytest.raises(InputError, match="prefill and decode groups"):
        groups.groups_of(fleet, "test")
