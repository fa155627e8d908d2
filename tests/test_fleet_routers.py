"""Routers that read the replicas' state (simspec.fleet.live): the replicas
run side by side and each arrival is routed from their state at its time.
The side-by-side loop gives a stateless router's fleet exactly; the
orderings a router must show; prefix affinity's cache hits."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import invoke
from simspec import config, experiment, metrics, policies
from simspec.fleet import routers
from simspec.fleet.run import simulate_fleet
from simspec.sim import simulate

STATEFUL = [r for r in routers.ROUTERS if r not in routers.STATELESS]


FRONTEND = {"frontend_s_per_request": 0.002, "frontend_s_per_text_token": 2e-6, "frontend_s_per_image": 0.015}


def _scenario(replicas: int, requests: int = 1500, per_replica_rate: float = 12.0, engine: str = "simspec",
              frontend: bool = False, **workload):
    fields = {"arrival": "poisson", "rate_per_s": per_replica_rate * replicas, "num_requests": requests, **workload}
    engine_fields = {"kind": engine, **(FRONTEND if frontend else {})}
    return experiment.resolve(config.build({}, {"workload": fields, "engine": engine_fields}))


def _serve(scenario, replicas: int, router: str, policy: str = "linear:k=3", **kw):
    c = scenario.config
    return simulate_fleet(scenario.requests, replicas=replicas, router=router, policy=policies.parse(policy),
                          label=policy, costs=scenario.costs, acceptance=scenario.acceptance, engine=kw.pop("engine", c.engine),
                          kv_budget_tokens=scenario.kv_budget_tokens, seed=0, event_detail=False, **kw)


@pytest.mark.parametrize("router", routers.STATELESS)
@pytest.mark.parametrize("policy,engine,frontend", [("ar", "simspec", False), ("marginal", "simspec", False),
                                                    ("linear:k=3", "vllm", True)])
def test_side_by_side_replicas_are_the_shares_run_alone(router, policy, engine, frontend):
    # The side-by-side loop stops every replica at every arrival of the fleet; a replica's course must
    # not change for it: a stateless router's fleet run both ways is the same to the last bit (vllm: async
    # scheduling and CUDA-graph regimes, with frontend delays that reorder arrivals: images wait longer).
    scenario = _scenario(3, 900, engine=engine, frontend=frontend)
    alone, side = (_serve(scenario, 3, router, policy, _live=live) for live in (False, True))
    assert np.array_equal(alone.assignment, side.assignment)
    for a, b in zip(alone.log.table, side.log.table):
        assert np.array_equal(a, b, equal_nan=True)
    assert alone.log.rounds == side.log.rounds and alone.log.steps == side.log.steps


@pytest.mark.parametrize("router,staleness_s,policy,engine,frontend", [
    ("least_requests", 0.0, "marginal", "simspec", False),
    ("least_tokens", 0.0, "linear:k=3", "vllm", False),
    ("least_requests", 0.05, "ar", "simspec", False),
    ("power_of_two", 0.0, "marginal", "simspec", False),
    ("power_of_two", 0.05, "linear:k=3", "vllm", False),
    ("spec_aware", 0.0, "marginal", "simspec", False),
    ("spec_aware", 0.05, "linear:k=3", "vllm", False),
    ("least_requests", 0.0, "linear:k=3", "vllm", True),  # frontend delays: requests join at their ready time
    ("power_of_two", 0.05, "ar", "vllm", True),
    ("spec_aware", 0.0, "marginal", "vllm", True),
])
def test_the_compiled_routing_loop_decides_as_the_python_one(router, staleness_s, policy, engine, frontend,
                                                             monkeypatch):
    # simspec.fleet.fastroute runs least_requests, least_tokens, power_of_two and spec_aware (its model of each
    # replica's batch too) in compiled code, engines' frontends too; switched off
    # the Python loop routes: the same replica for every request and the same logs to the last bit.
    from simspec.fleet import fastroute, live

    scenario = _scenario(3, 900, per_replica_rate=14.0, engine=engine, frontend=frontend)
    used, through = [], live._route_compiled
    monkeypatch.setattr(live, "_route_compiled", lambda *a: used.append(through(*a)) or used[-1])
    compiled = _serve(scenario, 3, router, policy, staleness_s=staleness_s)
    assert used[0] is not None and router in fastroute.ROUTERS  # it took the compiled loop
    monkeypatch.setattr(live, "COMPILED", False)
    python = _serve(scenario, 3, router, policy, staleness_s=staleness_s)
    assert len(used) == 1
    assert np.array_equal(compiled.assignment, python.assignment)
    for a, b in zip(compiled.log.table, python.log.table):
        assert np.array_equal(a, b, equal_nan=True)
    assert compiled.log.rounds == python.log.rounds and compiled.log.steps == python.log.steps


@pytest.mark.parametrize("policy,staleness_s", [("marginal", 0.0), ("linear:k=3", 0.05)])
def test_prefix_affinity_routes_compiled_as_in_python(policy, staleness_s, monkeypatch):
    # Two system prompts on three replicas at a high rate: the homes fill until the fleet is out of balance
    # and the escape sends requests to the least loaded; both branches, compiled and in Python, to the last bit.
    from simspec.fleet import fastroute, live

    scenario = _scenario(3, 900, per_replica_rate=30.0, multimodal_share=0.0, shared_prefix_tokens=1024,
                         shared_prefixes=2)
    engine = replace(scenario.config.engine, prefix_caching=True)
    used, through = [], live._route_compiled
    monkeypatch.setattr(live, "_route_compiled", lambda *a: used.append(1) or through(*a))
    compiled = _serve(scenario, 3, "prefix_affinity", policy, engine=engine, staleness_s=staleness_s)
    assert used and "prefix_affinity" in fastroute.ROUTERS
    monkeypatch.setattr(live, "COMPILED", False)
    python = _serve(scenario, 3, "prefix_affinity", policy, engine=engine, staleness_s=staleness_s)
    assert np.array_equal(compiled.assignment, python.assignment)
    for a, b in zip(compiled.log.table, python.log.table):
        assert np.array_equal(a, b, equal_nan=True)
    assert compiled.log.rounds == python.log.rounds and compiled.log.steps == python.log.steps
    homes = routers.router("prefix_affinity", 3, np.random.default_rng(0)).homes(scenario.requests)
    sent_home = (compiled.assignment == homes).mean()
    assert 0.3 < sent_home < 1.0  # some went home, some escaped the imbalance
    assert len(set(compiled.assignment.tolist())) == 3


@pytest.mark.parametrize("policy,engine", [("ar", "simspec"), ("marginal", "simspec"), ("linear:k=3", "vllm")])
def test_no_step_is_shorter_than_the_floor_the_router_skips_by(policy, engine):
    # fastroute leaves a replica behind an arrival when none of its requests can finish by it, reckoning
    # no step shorter than the cost tables' cheapest forward: every step a run takes is at least that.
    from simspec.fleet import fastroute
    from simspec.sim import simulate as serve

    scenario = _scenario(1, 600, per_replica_rate=14.0, engine=engine)
    c = scenario.config
    log = serve(scenario.requests, policy=policies.parse(policy), label=policy, costs=scenario.costs,
                acceptance=scenario.acceptance, engine=c.engine, kv_budget_tokens=scenario.kv_budget_tokens, seed=0)
    t = scenario.costs.tables
    cpu = t.overhead_s + t.overhead_per_request
    overlap = c.engine.async_scheduling
    floor = fastroute.step_floor_s(t.layers_s, t.head_s, cpu, overlap)
    assert 0 < floor <= log.step_duration_s.min()
    if not overlap:  # the CPU's part runs after the forward (beside it, it only counts once it is the longer)
        assert floor > fastroute.step_floor_s(t.layers_s, t.head_s)
    assert fastroute.step_floor_s(np.array([0.0, 2.0, 1.0]), np.array([0.0, 1.0, 1.0])) == 0.0  # a falling table: none


def test_least_requests_queues_less_than_random():
    scenario = _scenario(4, 3000, per_replica_rate=14.0)
    waits = {}
    for router in ("random", "least_requests"):
        table = _serve(scenario, 4, router).log.table
        waits[router] = table.first_token_s - table.arrival_s
    assert waits["least_requests"].mean() < waits["random"].mean()
    assert np.percentile(waits["least_requests"], 99) < np.percentile(waits["random"], 99)


@pytest.mark.parametrize("router", STATEFUL)
def test_stateful_routers_serve_every_request_once_and_repeat(router):
    scenario = _scenario(3, 600)
    a, b = (_serve(scenario, 3, router) for _ in range(2))
    assert a.log.complete and np.isfinite(a.log.table.finish_s).all()
    assert sorted(a.log.table.id.tolist()) == sorted(r.id for r in scenario.requests)
    assert np.array_equal(a.assignment, b.assignment)
    assert np.array_equal(a.log.table.finish_s, b.log.table.finish_s)
    assert len(set(a.assignment.tolist())) == 3  # all replicas used
    assert sum((a.assignment == k).sum() for k in range(3)) == len(scenario.requests)


def test_least_tokens_balances_work_not_count():
    scenario = _scenario(4, 2000, per_replica_rate=14.0)
    run = _serve(scenario, 4, "least_tokens")
    tokens = np.array([r.prompt_tokens + r.output_tokens for r in scenario.requests])
    per = np.array([tokens[run.assignment == k].sum() for k in range(4)])
    assert per.max() / per.min() < 1.1  # each replica gets close to a quarter of the work


def test_a_stale_router_balances_worse():
    scenario = _scenario(4, 2000, per_replica_rate=14.0)
    fresh, stale = (_serve(scenario, 4, "least_requests", staleness_s=s).log.table for s in (0.0, 2.0))
    wait = lambda t: (t.first_token_s - t.arrival_s).mean()
    assert wait(fresh) < wait(stale)


def test_prefix_affinity_raises_the_fleets_cache_hits():
    # 400 system prompts over 1,500 requests: spread round robin, most prompts are new to the replica
    # that gets them; sent home, each misses once in the fleet
    scenario = _scenario(4, 1500, multimodal_share=0.0, shared_prefix_tokens=1024, shared_prefixes=400)
    engine = replace(scenario.config.engine, prefix_caching=True)
    hits = {r: metrics.summarize(_serve(scenario, 4, r, engine=engine).log)["prefix_cache_hit_rate"]
            for r in ("round_robin", "prefix_affinity")}
    assert hits["prefix_affinity"] > 2 * hits["round_robin"]
    home = routers.router("prefix_affinity", 4, np.random.default_rng(0))
    assert len({home.home(p) for p in range(64)}) == 4  # the prefixes spread over the fleet
    assert all(home.home(p) == home.home(p) for p in range(8))


def test_power_of_two_reads_two_distinct_replicas():
    r = routers.router("power_of_two", 5, np.random.default_rng(3))
    pairs = [tuple(r.reads(None)) for _ in range(500)]
    assert all(a != b and 0 <= a < 5 and 0 <= b < 5 for a, b in pairs)
    assert len(set(pairs)) == 20  # every ordered pair drawn


def test_a_stateful_router_on_the_command_line(tmp_path):
    code, out, _ = invoke(["simulate", "--num-requests", "80", "--policy", "ar", "--replicas", "2",
                           "--router", "least_requests", "--out", str(tmp_path / "run")])
    assert code == 0 and "2 replicas (least_requests)" in out
    assert (tmp_path / "run" / "replicas.csv").read_text().count("\n") == 3


def _model(scenario, policy: str = "linear:k=3"):
    from simspec.fleet.predict import calibrate

    c = scenario.config
    return calibrate(scenario.requests, seed=0, policy=policies.parse(policy), costs=scenario.costs,
                     acceptance=scenario.acceptance, engine=c.engine, kv_budget_tokens=scenario.kv_budget_tokens)


def test_spec_aware_measures_the_replica_it_routes_to():
    scenario = _scenario(1, 600)
    linear, ar = _model(scenario), _model(scenario, "ar")
    assert ar.tokens_per_round_text == pytest.approx(1.0) and ar.tokens_per_round_image == pytest.approx(1.0)
    assert 1.5 < linear.tokens_per_round_text < 4.0  # a 3-token chain emits 1 to 4 tokens a round
    steps = np.array(linear.step_s)
    assert linear.batch_sizes[0] == 1 and linear.batch_sizes[-1] == scenario.config.engine.max_num_seqs
    assert steps[-1] > 2 * steps[0] and linear.prefill_s_per_token > 0
    # its prediction against the simulator: a burst of n requests, the predicted finish of the last one
    for n, tolerance in ((32, 0.25), (128, 0.25)):
        burst = [replace(r, arrival_s=0.0, id=k) for k, r in enumerate(scenario.requests[100:100 + n])]
        c = scenario.config
        log = simulate(burst, policy=policies.parse("linear:k=3"), label="burst", costs=scenario.costs,
                                  acceptance=scenario.acceptance, engine=c.engine,
                                  kv_budget_tokens=scenario.kv_budget_tokens, seed=1)
        fluid = routers._Fluid(linear)
        for r in burst[:-1]:
            fluid.add(r.id, linear.rounds(r), linear.prefill_s(r))
        finish = log.table.finish_s[list(log.table.id).index(burst[-1].id)]
        last = burst[-1]
        assert fluid.finish_in(linear.rounds(last), linear.prefill_s(last)) == pytest.approx(finish, rel=tolerance), n


def test_spec_aware_routes_away_from_a_full_batch():
    scenario = _scenario(1, 300)
    model = _model(scenario)
    r = routers.router("spec_aware", 2, np.random.default_rng(0), model)
    for i, request in enumerate(scenario.requests[:40]):
        r.choose(replace(request, arrival_s=0.0), None)
        r.sent(0, i, request)  # all to replica 0, whatever it chose
    assert r.choose(replace(scenario.requests[40], arrival_s=0.0), None) == 1
    with pytest.raises(Exception, match="spec_aware needs"):
        routers.router("spec_aware", 2, np.random.default_rng(0))


def _decode_in_by_definition(left, limit, sizes, step_s, rounds):
    """spec_aware's decode time as its model defines it, in numpy: every
    unfinished request in order, the batch shrinking as each finishes."""
    def step(batch):
        return float(np.interp(batch, sizes, step_s))
    active = left[left > 0]
    if len(active) < limit:
        total, before = 0.0, 0.0
        for k, rest in enumerate(np.sort(active)):
            total += (min(rest, rounds) - min(before, rounds)) * step(len(active) + 1 - k)
            before = rest
        return total + max(rounds - (before if len(active) else 0.0), 0.0) * step(1)
    queued = len(active) - limit
    wait = np.sort(active[:limit])[queued] if queued < limit else active.sum() / limit
    return (wait + rounds) * step(limit)


@pytest.mark.parametrize("limit", [1, 4, 16])
def test_spec_aware_model_decode_time_matches_its_definition(limit):
    from simspec.fleet import fluid
    rng = np.random.default_rng(limit)
    sizes, step_s = np.array([1.0, 2.0, 8.0, 16.0]), np.array([0.010, 0.011, 0.016, 0.025])
    steps = fluid.step_table(sizes, step_s, limit)
    assert steps[1:].tolist() == pytest.approx([np.interp(b, sizes, step_s) for b in range(1, limit + 1)], abs=0)
    for _ in range(200):
        count = int(rng.integers(0, 3 * limit + 2))
        left = np.where(rng.random(count) < 0.2, 0.0, rng.integers(1, 40, count) + rng.random(count))
        rounds = float(rng.choice([1.0, 7.0, 20.5, float(left.max()) if count and left.max() > 0 else 3.0]))
        got = fluid.decode_in(left, count, limit, steps, rounds, np.empty(max(count, 1)))
        assert got == pytest.approx(_decode_in_by_definition(left, limit, sizes, step_s, rounds), rel=1e-12), (count, rounds)


def test_shared_rows_are_what_each_replica_loop_writes():
    """A replica's Loop and Pending fields that the router reads in rows are
    views of those rows: their values kept, a write through either seen by
    the other, and every other field the replica's own array."""
    from simspec.fleet import fastroute
    from simspec.sim import fastloop
    loops = [fastloop.new_loop() for _ in range(3)]
    pendings = [fastloop.pending_for(4) for _ in range(3)]
    for k, (loop, pending) in enumerate(zip(loops, pendings)):
        loop.now_s[0], loop.finished[0], pending.resume[0] = 1.5 * k, 10 + k, k % 2
    rows, shared_loops, shared_pendings = fastroute.shared_rows(loops, pendings)
    np.testing.assert_array_equal(rows.now_s, [0.0, 1.5, 3.0])
    np.testing.assert_array_equal(rows.finished, [10, 11, 12])
    np.testing.assert_array_equal(rows.resume, [0, 1, 0])
    shared_loops[2].now_s[0] = 7.25  # the compiled loop's write, as it makes it
    shared_pendings[1].decided[0] = 1
    rows.until_s[0] = 0.5  # the router's
    assert rows.now_s[2] == 7.25 and rows.decided[1] == 1 and shared_loops[0].until_s[0] == 0.5
    for name in fastloop.Loop._fields:
        shared = getattr(shared_loops[1], name)
        assert shared.dtype == getattr(loops[1], name).dtype and shared.shape == (1,)
        assert any(np.shares_memory(shared, row) for row in rows) == (name in fastroute.Rows._fields), name
