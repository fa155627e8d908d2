"""simspec plan's search (the package docstring): each candidate's fit and
capacity, the replicas it needs, and the finalists confirmed as whole fleets.

Imports: numpy, simspec's modules, simspec.plan.records; tqdm and simspec.pool inside :func:`plan`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from simspec import acceptance, experiment, metrics, policies, seeds as seeding
from simspec.config import SimConfig, group_config
from simspec.costs.gpus import gpu_spec
from simspec.fleet.groups import Group
from simspec.fleet.run import simulate_fleet
from simspec.plan.records import GOODPUT, Candidate, Plan, PlanConfig, Row, engine_at
from simspec.serving import modes
from simspec.types import InputError, require

SEARCH_SEED_TAG = "plan-search"
CONFIRM_SEED_TAG = "plan-confirm"
BISECTION_STEPS = 7
MAX_REPLICAS_OVER = 4  # a confirmation stops at this many times the estimated replicas
LOW_LOAD = 1 / 64  # the probe below which a candidate that misses an SLO is pruned

# -- the workload at a rate ------------------------------------------------------------------------------------

def native_rate(base: SimConfig) -> float:
    """A trace's own request rate (at its speedup), requests/s; for a synthetic workload its rate."""
    w = base.workload
    if w.arrival != "trace":
        return w.rate_per_s
    requests = experiment.resolve(base).requests
    require(len(requests) >= 2, f"trace {w.trace_path}: needs at least two requests to have a rate")
    span = requests[-1].arrival_s - requests[0].arrival_s
    require(span > 0, f"trace {w.trace_path}: every request arrives at once; no rate to plan for")
    return (len(requests) - 1) / span


def at_rate(base: SimConfig, rate: float, native: float, *, requests: int | None, seed: int) -> SimConfig:
    """``base``'s workload at ``rate`` requests/s: a synthetic one's rate, a
    trace's speedup; ``requests``: the first that many (None: the config's)."""
    w = base.workload
    if w.arrival == "trace":
        w = replace(w, trace_speedup=w.trace_speedup * rate / native)
    else:
        w = replace(w, rate_per_s=rate)
    if requests is not None:
        w = replace(w, num_requests=requests, duration_s=None)
    return replace(base, workload=w, seed=seed)


def split_fleet(config: SimConfig, cand: Candidate, units: int, kv_link: str) -> SimConfig:
    """``config`` (one replica's setup) as ``units`` of ``cand``'s
    disaggregated units, the KV cache moving over ``kv_link``
    (simspec.fleet.disagg; the decode side serves the policy). A prefill
    side on another GPU or degree runs its engine's preset there (as a
    fleet file's group does) at the candidate's batch limit."""
    prefill, decode = cand.split
    device, tp = cand.prefill_side
    own = (device, tp) == (cand.device, cand.tp)
    groups = (Group(name="prefill", replicas=prefill * units, role="prefill", device=None if own else device,
                    tp=None if own else tp, engine=() if own else (("max_num_seqs", cand.max_num_seqs),)),
              Group(name="decode", replicas=decode * units, role="decode"))
    return replace(config, fleet=groups, replicas=1, kv_link=kv_link)


def _summary(config: SimConfig, replicas: int, router: str, accepting=None, cand: Candidate | None = None,
             kv_link: str = "") -> dict:
    """One fleet's run at ``config``: ``replicas`` of its replica, or, for a
    disaggregated ``cand``, as many of its units; ``accepting``: an
    acceptance model in place of the config's (the sensitivity check)."""
    if cand is not None and cand.split:
        s = experiment.resolve(split_fleet(replace(config, router=router), cand, replicas, kv_link))
        if accepting is not None:
            s = replace(s, acceptance=accepting)
        log = experiment.run_scenario(s, event_detail=False).logs[0]
        return metrics.summarize(log, slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms,
                                 slo_e2el_ms=config.slo_e2el_ms)
    s = experiment.resolve(config)
    model = accepting if accepting is not None else s.acceptance
    run = simulate_fleet(s.requests, replicas=replicas, router=router, staleness_s=config.router_staleness_ms / 1e3,
                         policy=policies.parse(config.policies[0]), label=config.policies[0], costs=s.costs,
                         acceptance=model, engine=config.engine, kv_budget_tokens=s.kv_budget_tokens,
                         seed=config.seed, event_detail=False)
    return metrics.summarize(run.log, slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms,
                             slo_e2el_ms=config.slo_e2el_ms)


def _worst(slos, summary) -> tuple[float, str]:
    ratios = [(s.ratio(summary), s.metric) for s in slos]
    return max(ratios)


def _fits(config: SimConfig) -> str | None:
    """None when the model's weights and some KV cache fit the candidate's
    GPUs, else why not; any other error is the scenario's and is raised."""
    try:
        config.engine.kv_budget_tokens(experiment.model_of(config), gpu_spec(config.device))
    except InputError as err:
        return str(err)
    return None


# -- one candidate's capacity (a pool job) ---------------------------------------------------------------------

def capacity(job) -> tuple[str, float, str, int]:
    """(status, one replica's capacity in requests/s, note, requests
    simulated) of a candidate: "unfit", "cannot meet" or "ok" (module
    docstring, steps 1-2)."""
    base, cand, slos, requests, native, kv_link = job
    config = cand.config(base)
    seed = int(seeding.stream(base.seed, SEARCH_SEED_TAG).generate_state(1)[0])
    sides = [config]  # a disaggregated unit fits where each side's replica does, as its fleet group runs it
    if cand.split:
        fleet = split_fleet(config, cand, 1, kv_link)
        sides = [group_config(fleet, g) for g in fleet.fleet]
    unfit = next((why for why in map(_fits, sides) if why is not None), None)
    if unfit is not None:
        return "unfit", math.nan, unfit, 0
    sample = experiment.resolve(at_rate(config, native, native, requests=requests, seed=seed))
    saturation = experiment.burst_rate(sample.requests, policy=cand.policy, costs=sample.costs,
                                       acceptance=sample.acceptance, engine=config.engine,
                                       kv_budget_tokens=sample.kv_budget_tokens, seed=seed)

    served = [len(sample.requests)]

    def ratio(rate: float) -> tuple[float, str]:
        served[0] += requests
        return _worst(slos, _summary(at_rate(config, rate, native, requests=requests, seed=seed), 1, config.router,
                                     cand=cand, kv_link=kv_link))

    # a disaggregated unit's replicas share its load: as many times one replica's saturation, twice over (a decode
    # replica that prefills nothing serves more than one that does), the bisection's top
    lo, hi = saturation * LOW_LOAD * cand.unit, saturation * (2 * cand.unit if cand.split else 1)
    worst, which = ratio(lo)
    if worst > 1:
        return ("cannot meet", math.nan, f"{which} {worst:.2f}x its bound at {lo:.3g} req/s (1/64 of saturation)",
                served[0])
    if ratio(hi)[0] <= 1:
        return "ok", hi, "", served[0]
    for _ in range(BISECTION_STEPS):  # on a log scale: the bounds are 64x apart
        mid = math.sqrt(lo * hi)
        if ratio(mid)[0] <= 1:
            lo = mid
        else:
            hi = mid
    return "ok", lo, "", served[0]


# -- a fleet at the target rate --------------------------------------------------------------------------------

def confirm(job) -> tuple[int, list[dict], int]:
    """(replicas, per-seed summaries, requests simulated) of a sized
    candidate served as a whole fleet at the target rate (module docstring,
    step 4); replicas 0: it missed an SLO at MAX_REPLICAS_OVER times its
    estimate."""
    base, cand, slos, n, target, native, seeds, per_replica, kv_link = job
    config = cand.config(base)

    served = [0]

    def run(count: int) -> list[dict]:
        size = None if base.workload.arrival == "trace" else per_replica * count * cand.unit
        summaries = [_summary(at_rate(config, target, native, requests=size, seed=seed), count, config.router,
                              cand=cand, kv_link=kv_link) for seed in seeds]
        served[0] += sum(int(x["completed"]) for x in summaries)
        return summaries

    def met(summaries) -> bool:
        return all(_worst(slos, s)[0] <= 1 for s in summaries)

    tried: dict[int, list[dict]] = {}

    def ok(count: int) -> bool:
        if count not in tried:
            tried[count] = run(count)
        return met(tried[count])

    if ok(n):  # a fleet pools its load: fewer than the estimate may do
        high, step = n, 1  # a count that meets; below it, 1, 2, 4... fewer until one misses
        while high > 1 and ok(max(high - step, 1)):
            high, step = max(high - step, 1), 2 * step
        low = max(high - step, 0)  # one that misses (0: none tried below a fleet of one)
    else:
        low, high = n, n + 1  # a count that misses, one being tried
        while not ok(high):  # grow by half until the fleet meets every SLO
            if high >= MAX_REPLICAS_OVER * n:
                return 0, tried[high], served[0]
            low, high = high, min(math.ceil(high * 1.5), MAX_REPLICAS_OVER * n)
    while high - low > 1:  # then bisect between the two
        mid = (low + high) // 2
        if ok(mid):
            high = mid
        else:
            low = mid
    return high, tried[high], served[0]



def confirm_seeds(base: SimConfig, pc: PlanConfig) -> list[int]:
    """The seeds every finalist is confirmed on (common random numbers)."""
    return [int(x.generate_state(1)[0]) for x in seeding.stream(base.seed, CONFIRM_SEED_TAG).spawn(pc.confirm_seeds)]


def winner_at(base: SimConfig, pc: PlanConfig, result: Plan, scale: float) -> tuple[float, str]:
    """The winner's fleet, at its replica count and the target rate on the
    confirmation seeds, with the acceptance length ``scale`` x its own
    (simspec.sensitivity): its tightest SLO ratio over the seeds and that SLO."""
    from simspec.sensitivity import shifted_logit

    w = result.winner
    require(w is not None, "plan --sensitivity: no fleet meets every SLO, so there is no answer to check")
    config = w.candidate.config(base)
    native = native_rate(config)
    own = acceptance.build(config.acceptance, experiment.model_of(config).name, config.workload.temperature)
    moved = own.with_top1_logit(shifted_logit(own, scale)) if scale != 1.0 else own
    size = None if base.workload.arrival == "trace" else pc.requests * w.replicas * w.candidate.unit
    worst = [_worst(pc.slos, _summary(at_rate(config, result.target_per_s, native, requests=size, seed=seed),
                                      w.replicas, config.router, moved, w.candidate, pc.kv_link))
             for seed in confirm_seeds(base, pc)]
    return max(worst)


def candidates(base: SimConfig, pc: PlanConfig) -> tuple[list[Candidate], tuple[str, ...]]:
    """Every engine x GPU x degree x batch limit x policy, each as one
    colocated replica and as each of ``pc.splits``' disaggregated units
    (their prefill side on each of ``pc.prefill_devices`` x
    ``pc.prefill_tps``, else the decode side's GPU and degree) (x router,
    where ``pc.routers`` names them), and the engine / policy pairs left out
    because the engine cannot run the policy. A candidate's batch limit
    defaults to its engine's on its GPU."""
    engines = pc.engines or (base.engine.kind,)
    runs, left_out = [], []
    for kind in engines:
        for p in pc.policies:
            try:
                modes.check_policy(kind, p)
                runs.append((kind, p))
            except InputError:
                left_out.append(f"{p} on {kind}")
    if not runs:
        can = "; ".join(f"{k} runs {', '.join(modes.RUNS[k])}" for k in engines)
        raise InputError(f"no candidate: {' or '.join(engines)} can run none of {', '.join(pc.policies)} ({can})")
    out = []
    for kind, p in runs:
        for d in pc.devices:
            for t in pc.tps:
                limits = pc.batch_limits or (engine_at(base, kind, d, t).max_num_seqs,)
                sides = [((), "", 0)] + [(split, pd if pd != d else "", pt if pt != t else 0) for split in pc.splits
                                         for pd in pc.prefill_devices or (d,) for pt in pc.prefill_tps or (t,)]
                out += [Candidate(device=d, tp=t, max_num_seqs=b, policy=p, engine=kind, router=r, split=split,
                                  prefill_device=pd, prefill_tp=pt)
                        for b in limits for split, pd, pt in sides for r in pc.routers or ("",)]
    return out, tuple(left_out)


def _confirm(rows: list[Row], runner, context, bar) -> int:
    """Serve each of ``rows`` as a whole fleet (:func:`confirm`) and record
    its replicas and SLO metrics; the requests simulated."""
    base, pc, target, native, confirm_seeds = context
    jobs = [(base, r.candidate, pc.slos, r.replicas, target, native, confirm_seeds, pc.requests, pc.kv_link)
            for r in rows]
    simulated = 0
    for i, (count, summaries, served) in runner.imap(confirm, jobs):
        row = rows[i]
        row.status = "confirmed" if count else "missed"
        row.replicas = count or MAX_REPLICAS_OVER * row.replicas
        row.values = {s.metric: float(np.mean([s.value(x) for x in summaries])) for s in pc.slos}
        worst = [_worst(pc.slos, x) for x in summaries]
        row.ratios = tuple(w for w, _ in worst)
        row.worst_ratio = float(np.mean(row.ratios))
        row.worst_slo = max(worst)[1]
        row.output_tokens_per_s = float(np.mean([x["output_throughput"] for x in summaries]))
        simulated += served
        bar.update()
    return simulated


def plan(base: SimConfig, pc: PlanConfig, *, progress: bool = False) -> Plan:
    """Search ``pc``'s candidates for ``base``'s model and traffic (module docstring)."""
    from tqdm import tqdm

    from simspec import pool
    from simspec.tune.records import paired

    if any(s.metric == GOODPUT for s in pc.slos):
        require(base.slo_ttft_ms or base.slo_tpot_ms or base.slo_e2el_ms,
                f"--slo {GOODPUT} counts requests within the per-request SLOs: give --slo-ttft-ms, --slo-tpot-ms "
                f"and/or --slo-e2el-ms")
    cands, left_out = candidates(base, pc)
    fitting = [c for c in cands if _fits(c.config(base)) is None]
    if not fitting:
        raise InputError(f"no candidate fits its model: {_fits(cands[0].config(base))}")
    native = native_rate(fitting[0].config(base))  # a trace's rate: its arrivals, read with a model that fits
    target = native * pc.growth
    runner = pool.Ray(pc.ray, pc.jobs) if pc.ray else pool.executor(pc.jobs, len(cands))
    rows: list[Row] = []
    simulated = 0
    try:
        # one replica's capacity does not depend on the router its fleet is served behind: one job a replica setup
        setups = list(dict.fromkeys(c.replica for c in cands))
        jobs = [(base, c, pc.slos, pc.requests, native, pc.kv_link) for c in setups]
        results: list = [None] * len(setups)
        with tqdm(total=len(setups), unit="candidate", desc="capacity", disable=not progress, leave=False) as bar:
            for i, result in runner.imap(capacity, jobs):
                results[i] = result
                simulated += result[3]
                bar.update()
        measured = dict(zip(setups, results))
        for c in cands:
            status, cap, note, _ = measured[c.replica]
            row = Row(candidate=c, status=status if status != "ok" else "estimated",
                      unit_usd_per_hour=c.unit_usd_per_hour(pc.prices), capacity_per_s=cap, note=note)
            if status == "ok":
                row.replicas = max(1, math.ceil(target / cap - 1e-9))
            rows.append(row)
        sized = sorted((r for r in rows if r.status == "estimated"), key=lambda r: (r.usd_per_hour, r.candidate.label))
        seeds = confirm_seeds(base, pc)
        finalists = sized[:pc.finalists]
        bar = tqdm(unit="fleet", desc="confirm", disable=not progress, leave=False)
        while finalists:
            simulated += _confirm(finalists, runner, (base, pc, target, native, seeds), bar)
            # Confirmed fleets may cost more than their estimates: confirm, in turn, every candidate whose
            # estimate is below the cheapest confirmed fleet, and the other routers of a replica setup confirmed
            # behind one, so that its routers compare as fleets (up to 4 x --finalists in all).
            best = min((r.usd_per_hour for r in sized if r.status == "confirmed"), default=math.inf)
            served = {r.candidate.replica for r in sized if r.status in ("confirmed", "missed")}
            left = [r for r in sized
                    if r.status == "estimated" and (r.usd_per_hour < best or r.candidate.replica in served)]
            budget = 4 * pc.finalists - sum(r.status in ("confirmed", "missed") for r in sized)
            finalists = left[:min(pc.finalists, budget)]
        bar.close()
    finally:
        runner.close()
    order = {"confirmed": 0, "missed": 1, "estimated": 2, "cannot meet": 3, "unfit": 4}
    rows.sort(key=lambda r: (order[r.status], r.usd_per_hour if r.replicas else math.inf,
                             r.worst_ratio if math.isfinite(r.worst_ratio) else math.inf, r.candidate.label))
    confirmed = [r for r in rows if r.status == "confirmed"]
    ranking = ""
    if len(confirmed) >= 2:
        a, b = confirmed[0], confirmed[1]
        gap = paired(a.ratios, b.ratios)
        cheaper = b.usd_per_hour - a.usd_per_hour
        ranking = (f"#1 {'costs $' + format(cheaper, ',.2f') + '/h less than' if cheaper > 0.005 else 'ties on cost with'} "
                   f"#2 ({b.candidate.label}); its tightest SLO ratio minus "
                   f"#2's: {gap.diff:+.3f} (95% paired interval {gap.low:+.3f} to {gap.high:+.3f} over "
                   f"{len(a.ratios)} seeds)")
    return Plan(rows=tuple(rows), target_per_s=target, slos=pc.slos,
                unfit=sum(r.status == "unfit" for r in rows), pruned=sum(r.status == "cannot meet" for r in rows),
                ranking=ranking, simulated_requests=simulated, left_out=left_out, router=base.router)




__all__ = ["plan", "candidates", "capacity", "confirm", "native_rate", "at_rate", "split_fleet"]
