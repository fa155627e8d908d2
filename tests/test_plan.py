"""simspec plan: SLO and price parsing, and a small search whose winner is
checked by serving it again, independently of the planner."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from conftest import invoke
from simspec import experiment, metrics, plan as planning, policies, seeds
from simspec.costs.gpus import GPUS
from simspec.plan import search
from simspec.config import SimConfig
from simspec.fleet.run import simulate_fleet
from simspec.types import InputError
from simspec.workloads import WorkloadConfig


def test_slo_names_bounds_and_ratio():
    slo = planning.parse_slo("p50_ttft_ms=200")
    assert (slo.metric, slo.bound, slo.key) == ("p50_ttft_ms", 200.0, "median_ttft_ms")
    assert slo.ratio({"median_ttft_ms": 100.0}) == pytest.approx(0.5)
    share = planning.parse_slo("goodput_share=0.8")
    assert share.ratio({"request_goodput": 4.0, "request_throughput": 5.0}) == pytest.approx(1.0)
    assert share.ratio({"request_goodput": 2.0, "request_throughput": 5.0}) == pytest.approx(2.0)
    for bad, says in (("p99_speed_ms=5", "METRIC=BOUND"), ("p99_ttft_ms=-1", "positive"),
                      ("p99_ttft_ms=soon", "number"), ("goodput_share=0", "(0, 1]"), ("p99_ttft_ms", "METRIC")):
        with pytest.raises(InputError, match=None) as err:
            planning.parse_slo(bad)
        assert says in str(err.value)


def test_price_file_replaces_the_table(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text("[prices]\nh100-sxm = 2.5\n")
    assert planning.load_prices(path) == {"h100-sxm": 2.5}
    assert set(planning.PRICES) == set(GPUS)  # the shipped table prices every GPU simspec knows
    with pytest.raises(InputError, match="no price for a100-80gb"):
        planning.PlanConfig(devices=("h100-sxm", "a100-80gb"), slos=(planning.parse_slo("p99_ttft_ms=9"),),
                            prices=planning.load_prices(path))


SLOS = (planning.parse_slo("p99_ttft_ms=1500"), planning.parse_slo("p99_tpot_ms=40"))
BASE = SimConfig(workload=WorkloadConfig(arrival="poisson", rate_per_s=24.0, num_requests=200))


@pytest.fixture(scope="module")
def small_plan():
    pc = planning.PlanConfig(devices=("h100-sxm", "a100-80gb"), tps=(1, 2), policies=("ar", "linear:k=3"),
                             slos=SLOS, requests=150, confirm_seeds=2, finalists=3, jobs=1)
    return pc, planning.plan(BASE, pc)


def test_the_winner_meets_every_slo_when_served_again(small_plan):
    pc, p = small_plan
    w = p.winner
    assert w is not None and w.status == "confirmed"
    confirmed = [r for r in p.rows if r.status == "confirmed"]
    assert [r.usd_per_hour for r in confirmed] == sorted(r.usd_per_hour for r in confirmed)
    assert w.usd_per_hour == pytest.approx(w.replicas * w.candidate.tp * planning.PRICES[w.candidate.device])
    # Served again here, outside the planner, on the planner's first confirm seed: every SLO within its bound.
    seed = int(seeds.stream(BASE.seed, search.CONFIRM_SEED_TAG).spawn(pc.confirm_seeds)[0]
               .generate_state(1)[0])
    config = search.at_rate(w.candidate.config(BASE), p.target_per_s, 24.0, requests=pc.requests * w.replicas,
                              seed=seed)
    s = experiment.resolve(config)
    log = simulate_fleet(s.requests, replicas=w.replicas, router=BASE.router, policy=policies.parse(w.candidate.policy),
                         label="x", costs=s.costs, acceptance=s.acceptance, engine=config.engine,
                         kv_budget_tokens=s.kv_budget_tokens, seed=seed).log
    summary = metrics.summarize(log)
    assert summary["p99_ttft_ms"] <= 1500 and summary["p99_tpot_ms"] <= 40
    # one replica fewer misses an SLO on some confirm seed: the count is the least that serves
    if w.replicas > 1:
        missed = []
        for x in seeds.stream(BASE.seed, search.CONFIRM_SEED_TAG).spawn(pc.confirm_seeds):
            seed = int(x.generate_state(1)[0])
            cfg = search.at_rate(w.candidate.config(BASE), p.target_per_s, 24.0,
                                   requests=pc.requests * (w.replicas - 1), seed=seed)
            s = experiment.resolve(cfg)
            fewer = metrics.summarize(simulate_fleet(
                s.requests, replicas=w.replicas - 1, router=BASE.router, policy=policies.parse(w.candidate.policy),
                label="x", costs=s.costs, acceptance=s.acceptance, engine=cfg.engine,
                kv_budget_tokens=s.kv_budget_tokens, seed=seed).log)
            missed.append(fewer["p99_ttft_ms"] > 1500 or fewer["p99_tpot_ms"] > 40)
        assert any(missed)


def test_rows_sized_from_capacity_and_headroom(small_plan):
    _, p = small_plan
    for r in p.rows:
        if r.status == "estimated":
            assert r.replicas == max(1, math.ceil(p.target_per_s / r.capacity_per_s - 1e-9))
    table = planning.table(p)
    assert table[0]["rank"] == 1 and all(row["headroom_per_s"] != "" for row in table if row["status"] == "confirmed")


def test_the_same_seed_gives_the_same_plan(small_plan, tmp_path):
    pc, p = small_plan
    again = planning.plan(BASE, pc)
    assert planning.table(again) == planning.table(p)
    written = planning.write(p, tmp_path / "a")
    assert [f.name for f in written] == ["plan.csv", "plan.parquet", "pareto.csv", "pareto.png"]
    planning.write(again, tmp_path / "b")
    for name in ("plan.csv", "pareto.csv", "pareto.png"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()


@pytest.mark.slow
def test_ray_local_gives_the_serial_plan(small_plan):
    ray = pytest.importorskip("ray")
    from simspec import pool

    pc, p = small_plan
    try:
        pool.connect("local", 2)
    except Exception as err:  # noqa: BLE001 - no Ray on this machine is a skip, not a failure
        pytest.skip(f"cannot start a local Ray: {err}")
    try:
        on_ray = planning.plan(BASE, replace(pc, ray="local", jobs=2))
    finally:
        ray.shutdown()
    assert planning.table(on_ray) == planning.table(p)


def test_an_slo_nothing_meets_is_named_with_the_closest():
    pc = planning.PlanConfig(devices=("h100-sxm",), tps=(1,), policies=("ar",),
                             slos=(planning.parse_slo("p99_tpot_ms=1"),), requests=60, confirm_seeds=1, jobs=1)
    p = planning.plan(replace(BASE, workload=replace(BASE.workload, num_requests=60)), pc)
    assert p.winner is None and p.pruned == 1
    line = planning.verdict(p)
    assert line.startswith("no candidate meets every SLO") and "p99_tpot_ms" in line


def test_a_candidate_that_does_not_fit_is_counted_not_fatal():
    text = replace(BASE, model="Llama-3.1-70B",
                   workload=replace(BASE.workload, multimodal_share=0.0, rate_per_s=2.0, num_requests=60))
    pc = planning.PlanConfig(devices=("h100-sxm",), tps=(1, 4), policies=("ar",),
                             slos=(planning.parse_slo("p99_ttft_ms=5000"),), requests=60, confirm_seeds=1, jobs=1)
    p = planning.plan(text, pc)
    assert p.unfit == 1
    assert [r.candidate.tp for r in p.rows if r.status == "unfit"] == [1]
    assert p.winner is not None and p.winner.candidate.tp == 4
    assert "--tensor-parallel-size 4" in planning.launch(p, text)


def test_the_command_prints_the_plan_and_writes_its_files(tmp_path):
    from conftest import invoke

    code, out, err = invoke(["plan", "--arrival", "poisson", "--rate", "12", "--devices", "h100-sxm", "--tp", "1",
                             "--policies", "ar,linear:k=3", "--slo", "p99_ttft_ms=2000", "--slo", "p99_tpot_ms=50",
                             "--requests", "80", "--confirm-seeds", "1", "--jobs", "1", "--quiet",
                             "--out", str(tmp_path / "p")])
    assert code == 0, err
    assert "cheapest within every SLO: " in out and "vllm serve LLaVA-1.5-7B --tensor-parallel-size 1" in out
    assert sorted(f.name for f in (tmp_path / "p").iterdir()) == ["pareto.csv", "pareto.png", "plan.csv",
                                                                  "plan.parquet"]


def test_the_sensitivity_check_serves_the_winner_again_with_the_acceptance_moved(small_plan):
    pc, p = small_plan
    w = p.winner
    at_own = planning.winner_at(BASE, pc, p, 1.0)
    assert at_own[0] == pytest.approx(max(w.ratios))  # the confirmation itself, at the model's own level
    if w.candidate.policy != "ar":
        lower, higher = (planning.winner_at(BASE, pc, p, scale)[0] for scale in (0.7, 1.3))
        assert lower > at_own[0] > higher  # less acceptance, slower decoding: closer to the bound


def test_cli_plan_sensitivity_line(tmp_path):
    code, out, err = invoke(["plan", "--rate", "12", "--arrival", "poisson", "--num-requests", "100",
                             "--slo", "p99_tpot_ms=40", "--devices", "h100-sxm", "--tp", "1",
                             "--policies", "linear:k=3", "--requests", "100", "--confirm-seeds", "1", "--jobs", "1",
                             "--quiet", "--sensitivity"])
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("sensitivity:"))
    assert "0.90x the acceptance length" in line and "1.10x" in line and ("robust" in line)


def test_engine_modes_are_candidates_with_their_own_defaults_on_each_gpu():
    """--engines: each engine x policy pair the engine can run, each on its
    own batch defaults for the GPU (vLLM: 1,024 sequences on an H100, 256
    on an A100), the fields the scenario set itself kept; the default, the
    scenario's own engine, keeps its engine as it was."""
    from simspec import config as configuration

    base = configuration.build({}, {"engine": {"max_num_batched_tokens": 4096}})
    pc = planning.PlanConfig(devices=("h100-sxm", "a100-80gb"), tps=(1,), policies=("ar", "marginal"),
                             engines=("simspec", "vllm"), slos=SLOS)
    cands, left_out = search.candidates(base, pc)
    assert left_out == ("marginal on vllm",)
    vllm = {c.device: c for c in cands if c.engine == "vllm"}
    assert {c.policy for c in vllm.values()} == {"ar"}
    assert (vllm["h100-sxm"].max_num_seqs, vllm["a100-80gb"].max_num_seqs) == (1024, 256)
    for c in vllm.values():
        engine = c.config(base).engine
        assert engine.kind == "vllm" and engine.max_num_batched_tokens == 4096  # the scenario's own setting
        assert engine.cudagraph_mode == "full_and_piecewise" and engine.async_scheduling  # vLLM's preset
    own = [c for c in cands if c.engine == "simspec"]
    assert len(own) == 4 and all(c.config(base).engine == replace(base.engine, max_num_seqs=c.max_num_seqs)
                                 for c in own)
    default, none_left = search.candidates(base, replace(pc, engines=()))
    assert none_left == () and all(c.config(base).engine == replace(base.engine, max_num_seqs=c.max_num_seqs)
                                   for c in default)
    with pytest.raises(InputError, match="vllm can run none of marginal"):
        search.candidates(base, replace(pc, engines=("vllm",), policies=("marginal",)))


def test_routers_are_searched_each_fleet_behind_its_own(monkeypatch):
    """--routers: every replica setup behind each router; one replica's
    capacity measured once a setup (it has no router); each router's fleet
    confirmed behind that router (served again here, outside the planner);
    the router a column where several are searched."""
    base = SimConfig(workload=WorkloadConfig(arrival="gamma", burstiness=0.25, rate_per_s=40.0, num_requests=200))
    pc = planning.PlanConfig(devices=("h100-sxm",), tps=(1,), policies=("ar", "linear:k=3"), slos=SLOS,
                             routers=("round_robin", "least_requests"), requests=150, confirm_seeds=1, finalists=2,
                             jobs=1)
    cands, _ = search.candidates(base, pc)
    assert [(c.policy, c.router) for c in cands] == [("ar", "round_robin"), ("ar", "least_requests"),
                                                     ("linear:k=3", "round_robin"), ("linear:k=3", "least_requests")]
    probed = []
    measure = search.capacity
    monkeypatch.setattr(search, "capacity", lambda job: probed.append(job[1]) or measure(job))
    p = planning.plan(base, pc)
    assert sorted(c.policy for c in probed) == ["ar", "linear:k=3"] and all(c.router == "" for c in probed)
    by = {(r.candidate.policy, r.candidate.router): r for r in p.rows}
    for policy in ("ar", "linear:k=3"):
        assert by[policy, "round_robin"].capacity_per_s == by[policy, "least_requests"].capacity_per_s
    served = [r for r in p.rows if r.status == "confirmed"]
    assert {r.candidate.router for r in served} == {"round_robin", "least_requests"}  # a setup's routers both served
    pairs = [(by[q, "round_robin"], by[q, "least_requests"]) for q in ("ar", "linear:k=3")]
    assert any(a.status == b.status == "confirmed" and a.values != b.values for a, b in pairs)  # the router tells
    seed = search.confirm_seeds(base, pc)[0]
    for r in served:
        config = search.at_rate(r.candidate.config(base), p.target_per_s, 40.0, requests=pc.requests * r.replicas,
                                seed=seed)
        assert config.router == r.candidate.router
        s = experiment.resolve(config)
        again = metrics.summarize(simulate_fleet(
            s.requests, replicas=r.replicas, router=r.candidate.router, policy=policies.parse(r.candidate.policy),
            label="x", costs=s.costs, acceptance=s.acceptance, engine=config.engine,
            kv_budget_tokens=s.kv_budget_tokens, seed=seed, event_detail=False).log)
        assert r.values["p99_ttft_ms"] == again["p99_ttft_ms"] and r.values["p99_tpot_ms"] == again["p99_tpot_ms"]
    assert "router" in planning.markdown(p).splitlines()[0]
    one = planning.plan(base, replace(pc, routers=("least_requests",)))
    assert "router" not in planning.markdown(one).splitlines()[0]


def test_disaggregated_units_are_candidates_served_as_split_fleets():
    """--splits: each setup also as units of P prefill and D decode
    replicas, sized in units and priced for all their GPUs; a confirmed
    split fleet served again here as a fleet file's prefill and decode
    groups gives the plan's figures; the verdict and launch lines say the
    two sides."""
    from simspec.fleet.groups import Group

    base = SimConfig(workload=WorkloadConfig(arrival="poisson", rate_per_s=8.0, num_requests=100,
                                             prompt_mean_tokens=3000, multimodal_share=0.0))
    slos = (planning.parse_slo("p99_ttft_ms=3000"), planning.parse_slo("p99_tpot_ms=14"))
    pc = planning.PlanConfig(devices=("h100-sxm",), tps=(1,), policies=("linear:k=3",), slos=slos, splits=((1, 2),),
                             requests=100, confirm_seeds=1, finalists=2, jobs=1)
    cands, _ = search.candidates(base, pc)
    assert [(c.split, c.unit) for c in cands] == [((), 1), ((1, 2), 3)]
    p = planning.plan(base, pc)
    split = next(r for r in p.rows if r.candidate.split)
    assert split.status == "confirmed"
    assert split.gpus == split.replicas * 3 and split.usd_per_hour == pytest.approx(
        split.gpus * planning.PRICES["h100-sxm"])
    shown = next(row for row in planning.table(p) if row["split"] == "1P2D")
    assert shown["replicas"] == 3 * split.replicas
    seed = search.confirm_seeds(base, pc)[0]
    one = search.at_rate(split.candidate.config(base), p.target_per_s, 8.0, requests=pc.requests * 3 * split.replicas,
                         seed=seed)
    fleet = replace(one, fleet=(Group(name="p", replicas=split.replicas, role="prefill"),
                                Group(name="d", replicas=2 * split.replicas, role="decode")))
    again = metrics.summarize(experiment.run(fleet, event_detail=False).logs[0])
    assert split.values["p99_ttft_ms"] == again["p99_ttft_ms"] and split.values["p99_tpot_ms"] == again["p99_tpot_ms"]
    colocated = next(r for r in p.rows if not r.candidate.split)
    assert colocated.values != split.values  # the split serves differently
    won = planning.Plan(rows=(split,), target_per_s=p.target_per_s, slos=slos, unfit=0, pruned=0, ranking="",
                        simulated_requests=0)
    assert (f"{split.replicas} prefill h100-sxm replicas at tp 1 + {2 * split.replicas} decode h100-sxm replicas"
            in planning.verdict(won))
    lines = planning.launch(won, base).splitlines()
    assert "NixlConnector" in lines[0] and "--speculative-config" not in lines[0]
    assert "NixlConnector" in lines[1] and '"num_speculative_tokens": 3' in lines[1]
    assert any("--disaggregation-mode prefill" in x for x in lines) and any("--disaggregation-mode decode" in x
                                                                            for x in lines)


def test_a_prefill_side_on_other_gpus_is_priced_and_served_on_them():
    """--prefill-devices / --prefill-tp: a unit's prefill replicas on their
    own GPU and degree, each side at its own price; the confirmed fleet
    served again as prefill and decode groups on those GPUs gives the
    plan's figures; the launch lines name each side's GPU and degree."""
    from simspec.fleet.groups import Group

    base = SimConfig(workload=WorkloadConfig(arrival="poisson", rate_per_s=6.0, num_requests=100,
                                             prompt_mean_tokens=1500, multimodal_share=0.0))
    slos = (planning.parse_slo("p99_ttft_ms=3000"), planning.parse_slo("p99_tpot_ms=30"))
    pc = planning.PlanConfig(devices=("h100-sxm",), tps=(1,), policies=("ar",), slos=slos, splits=((1, 1),),
                             prefill_devices=("a100-80gb",), prefill_tps=(2,), requests=100, confirm_seeds=1,
                             finalists=2, jobs=1)
    cands, _ = search.candidates(base, pc)
    assert [(c.split, c.prefill_side) for c in cands] == [((), ("h100-sxm", 1)), ((1, 1), ("a100-80gb", 2))]
    split = cands[1]
    assert split.gpus_per_unit == 3 and split.split_label == "1P1D (prefill a100-80gb tp2)"
    assert split.unit_usd_per_hour(planning.PRICES) == pytest.approx(
        2 * planning.PRICES["a100-80gb"] + planning.PRICES["h100-sxm"])
    p = planning.plan(base, pc)
    row = next(r for r in p.rows if r.candidate.split)
    assert row.status == "confirmed" and row.gpus == 3 * row.replicas
    assert row.usd_per_hour == pytest.approx(row.replicas * split.unit_usd_per_hour(planning.PRICES))
    seed = search.confirm_seeds(base, pc)[0]
    one = search.at_rate(split.config(base), p.target_per_s, 6.0, requests=pc.requests * 2 * row.replicas, seed=seed)
    fleet = replace(one, fleet=(Group(name="p", replicas=row.replicas, role="prefill", device="a100-80gb", tp=2,
                                      engine=(("max_num_seqs", split.max_num_seqs),)),
                                Group(name="d", replicas=row.replicas, role="decode")))
    again = metrics.summarize(experiment.run(fleet, event_detail=False).logs[0])
    assert row.values["p99_ttft_ms"] == again["p99_ttft_ms"] and row.values["p99_tpot_ms"] == again["p99_tpot_ms"]
    won = planning.Plan(rows=(row,), target_per_s=p.target_per_s, slos=slos, unfit=0, pruned=0, ranking="",
                        simulated_requests=0)
    assert f"{row.replicas} prefill a100-80gb replicas at tp 2 + {row.replicas} decode h100-sxm" in planning.verdict(won)
    first, second = planning.launch(won, base).splitlines()[:2]
    assert "a100-80gb" in first and "--tensor-parallel-size 2" in first
    assert "h100-sxm" in second and "--tensor-parallel-size 1" in second
