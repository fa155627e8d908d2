"""Fleets of identical replicas behind a router (simspec.fleet): exact
queueing results, a fleet of one is today's run, the merged log's counts."""

from __future__ import annotations

import json

import numpy as np
import pytest

from conftest import invoke
from simspec import config, experiment, metrics
from simspec.fleet import routers
from simspec.fleet.run import replica_seeds

STEP_MS, OUTPUT = 1.0, 10  # every request: one prefill step and 9 decode steps of 1 ms: 10 ms of service
SERVICE_S = STEP_MS * OUTPUT / 1e3


def _queue(replicas: int, rho: float, requests: int, router: str):
    """N single-server replicas with a fixed service time under Poisson arrivals at ``rho`` per replica."""
    cfg = config.build({}, {
        "cost_model": f"constant:{STEP_MS}", "replicas": replicas, "router": router, "policies": ["ar"],
        "workload": {"arrival": "poisson", "rate_per_s": rho / SERVICE_S * replicas, "num_requests": requests,
                     "multimodal_share": 0.0, "prompt_mean_tokens": 16.0, "prompt_cv": 0.0,
                     "output_mean_tokens": float(OUTPUT), "output_cv": 0.0},
        "engine": {"max_num_seqs": 1}})
    table = experiment.run(cfg).logs[0].table
    return table.admitted_s - table.arrival_s, table.finish_s - table.admitted_s


def test_random_routing_makes_independent_md1_queues():
    rho = 0.5
    wait_s, service_s = _queue(2, rho, 200_000, "random")
    assert np.allclose(service_s, SERVICE_S, rtol=1e-9)  # deterministic service, as M/D/1 has
    pollaczek_khinchine_s = rho * SERVICE_S / (2 * (1 - rho))
    assert wait_s.mean() == pytest.approx(pollaczek_khinchine_s, rel=0.02)


def test_round_robin_waits_less_as_the_fleet_grows():
    # each replica sees every N-th arrival: Erlang-N gaps, less variable as N grows, at the same load
    waits = [_queue(n, 0.5, 20_000, "round_robin")[0].mean() for n in (1, 2, 4)]
    assert waits[0] > waits[1] > waits[2] > 0


def test_routers_split_the_stream():
    arrival = np.sort(np.random.default_rng(0).uniform(0, 100, 10_000))
    robin = routers.route(arrival, replicas=4, router="round_robin", rng=np.random.default_rng(1))
    assert robin.tolist()[:8] == [0, 1, 2, 3, 0, 1, 2, 3]
    drawn = routers.route(arrival, replicas=4, router="random", rng=np.random.default_rng(1))
    counts = np.bincount(drawn, minlength=4)
    assert abs(counts - 2500).max() < 4 * np.sqrt(10_000 * 0.25 * 0.75)  # binomial, 4 sigma
    assert len(set(replica_seeds(0, 8))) == 8


def test_a_fleet_of_one_is_the_one_replica_run(tmp_path):
    args = ["simulate", "--num-requests", "60", "--policy", "ar", "--policy", "linear:k=3", "--out"]
    assert invoke([*args, str(tmp_path / "plain")])[0] == 0
    assert invoke([*args, str(tmp_path / "one"), "--replicas", "1"])[0] == 0
    assert invoke([*args, str(tmp_path / "random"), "--replicas", "1", "--router", "random"])[0] == 0
    for name in ("metrics.json", "requests.csv", "config.toml"):  # the same file, the same scenario id
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "one" / name).read_bytes(), name
    for name in ("metrics.json", "requests.csv"):  # one replica: the router has nothing to choose
        assert (tmp_path / "plain" / name).read_bytes() == (tmp_path / "random" / name).read_bytes(), name


def test_a_fleet_merges_its_replicas(tmp_path):
    code, out, _ = invoke(["simulate", "--num-requests", "200", "--rate", "12", "--replicas", "3", "--policy", "ar",
                  "--policy", "linear:k=3", "--out", str(tmp_path / "f")])
    assert code == 0 and "fleet: 3 replicas behind round_robin" in out
    table = json.loads((tmp_path / "f" / "metrics.json").read_text())
    rows = (tmp_path / "f" / "replicas.csv").read_text().splitlines()
    assert len(rows) == 1 + 2 * 3
    invoke(["simulate", "--num-requests", "200", "--rate", "12", "--replicas", "3", "--policy", "ar",
                    "--policy", "linear:k=3", "--out", str(tmp_path / "g")])
    assert (tmp_path / "g" / "metrics.json").read_bytes() == (tmp_path / "f" / "metrics.json").read_bytes()
    for policy in ("ar", "linear:k=3"):
        assert table[policy]["completed"] == 200
        served = [int(r.split(",")[2]) for r in rows[1:] if r.startswith(policy + ",")]
        assert sum(served) == 200 and max(served) - min(served) <= 1  # round robin
        assert 0 < table[policy]["gpu_busy_fraction"] <= 1
    assert table["linear:k=3"]["spec_decode_acceptance_length"] > 1.5


def test_merged_counts_are_the_replicas_sums():
    cfg = config.build({}, {"replicas": 2, "router": "random", "policies": ["linear:k=3"],
                            "workload": {"num_requests": 120, "rate_per_s": 8.0}})
    result = experiment.run(cfg)
    run, merged = result.fleets[0], result.logs[0]
    parts = [log for log in run.replicas if log is not None]
    assert merged.rounds.accepted == sum(p.rounds.accepted for p in parts)
    assert merged.gaps.count == sum(p.gaps.count for p in parts)
    assert merged.steps.steps == sum(p.steps.steps for p in parts)
    assert sorted(merged.table.id.tolist()) == merged.table.id.tolist() == sorted(
        i for p in parts for i in p.table.id.tolist())
    pooled = np.concatenate([p.gaps.exact_s for p in parts])
    assert metrics.summarize(merged)["mean_itl_ms"] == pytest.approx(pooled.mean() * 1e3, rel=1e-9)


@pytest.mark.parametrize("router", ["round_robin", "least_requests"])
def test_a_fleet_keeps_gaps_one_by_one_as_one_log_would(monkeypatch, router):
    # the replicas share one count of exact gaps: past the limit over the fleet, the merged log is binned,
    # as one replica's log of as many gaps would be, though each replica kept fewer than the limit
    from simspec import logs
    from simspec.fleet import merge
    cfg = config.build({}, {"replicas": 3, "router": router, "policies": ["ar"],
                            "workload": {"num_requests": 90, "rate_per_s": 8.0}})
    exact = experiment.run(cfg)
    total = exact.logs[0].gaps.count
    parts = [log for log in exact.fleets[0].replicas if log is not None]
    assert exact.logs[0].gaps.exact_s is not None and len(parts) == 3
    assert max(p.gaps.count for p in parts) < total // 2
    limit = total // 2
    monkeypatch.setattr(logs, "EXACT_GAPS", limit)
    monkeypatch.setattr(merge, "EXACT_GAPS", limit)
    binned = experiment.run(cfg)
    gaps = binned.logs[0].gaps
    assert gaps.exact_s is None and gaps.bins.sum() == gaps.count == total
    assert gaps.mean_s == pytest.approx(exact.logs[0].gaps.mean_s, rel=1e-12)
    assert np.array_equal(gaps.bins, np.bincount(logs.gap_bin(exact.logs[0].gaps.exact_s), minlength=logs.GAP_BINS))
    late = [p for p in binned.fleets[0].replicas if p is not None]
    assert any(p.gaps.exact_s is None for p in late)  # a replica still serving when the fleet's count passed binned its own
    assert np.array_equal(binned.logs[0].table.finish_s, exact.logs[0].table.finish_s)  # the run itself is the same


def test_alike_replicas_share_their_per_request_arrays(monkeypatch):
    # a routed fleet's replicas of one setup keep one array of each per-request figure (each request is one
    # replica's alone): the same run as with an array a replica, in a fleet's memory of one replica's
    from simspec.sim import replica
    made = []
    original = replica.Replica.__init__

    def init(self, *args, private=False, **kwargs):
        if private:
            kwargs["pool"] = None
        original(self, *args, **kwargs)
        made.append(self)

    cfg = config.build({}, {"replicas": 3, "router": "least_requests", "policies": ["linear:k=3"],
                            "workload": {"num_requests": 150, "rate_per_s": 20.0}})
    monkeypatch.setattr(replica.Replica, "__init__", init)
    shared = experiment.run(cfg).logs[0]
    routed = [r for r in made if r.routed]
    assert len(routed) == 3
    for name in ("finish_s", "admitted_s"):
        assert all(getattr(r, name) is getattr(routed[0], name) for r in routed)
    assert all(r.state.emitted is routed[0].state.emitted and r.scheduler.target is routed[0].scheduler.target
               for r in routed)
    assert routed[0].scheduler.queues.waiting is not routed[1].scheduler.queues.waiting  # a queue is a replica's
    monkeypatch.setattr(replica.Replica, "__init__", lambda self, *a, **k: init(self, *a, private=True, **k))
    made.clear()
    private = experiment.run(cfg).logs[0]
    assert len({id(r.finish_s) for r in made if r.routed}) == 3
    for column in ("finish_s", "first_token_s", "output_tokens", "preemptions"):
        assert np.array_equal(getattr(shared.table, column), getattr(private.table, column)), column
