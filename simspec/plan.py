"""``simspec plan``: the cheapest deployment that meets a set of SLOs.

Imports: numpy, simspec's modules; pandas, matplotlib and tqdm inside the
functions that write or show.

A candidate is one replica's setup (GPU kind, tensor-parallel degree,
batch limit, speculative policy); the fleet is N such replicas behind the
scenario's router. The search, as Vidur-Search sizes its candidates:

1. **Fit.** A candidate whose model does not fit its GPUs at its degree
   (no KV cache left) is skipped and counted.
2. **Capacity.** The highest request rate one replica serves within every
   SLO, by bisection on the rate between the replica's saturation rate
   (:func:`simspec.experiment.burst_rate`) and 1/64 of it, on a sample of
   the workload's mix and arrival process at that rate. A candidate that
   misses an SLO at 1/64 of its saturation rate cannot meet it at any
   replica count (a TPOT the batch-1 step already exceeds) and is pruned.
3. **Sizing.** ``ceil(target / capacity)`` replicas, and the fleet's price
   per hour from the price table.
4. **Confirmation.** The cheapest candidates by that estimate are served
   as whole fleets at the target rate, on fresh seeds shared by every
   candidate (common random numbers); a fleet that misses an SLO on any
   seed gets one more replica (up to two more), one that meets it on every
   seed is tried with one fewer (a fleet pools its load, so the one-replica
   estimate errs high). Each confirmed fleet's SLO metrics are the means
   over the seeds; the ranking's confidence is the paired interval of the
   tightest SLO's ratio between the first two.

SLOs are bounds on any latency statistic of the run's metrics
(``p99_ttft_ms=2000``: at most 2000 ms) or a share of requests meeting the
per-request SLOs (``goodput_share=0.9``: at least 90% of requests within
``--slo-ttft-ms`` / ``--slo-tpot-ms`` / ``--slo-e2el-ms``).
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from simspec import experiment, metrics, policies, seeds as seeding
from simspec.config import SimConfig
from simspec.costs.gpus import GPUS, gpu_spec
from simspec.costs.specs import TP_DEGREES
from simspec.fleet.run import simulate_fleet
from simspec.types import InputError, require

PRICES_SOURCE = ("RunPod Serverless pricing, docs.runpod.io/serverless/pricing (read 2026-12-04): the 'active' "
                 "(always-on) worker rate per second x 3600")
PRICES: dict[str, float] = {
    # $ per GPU-hour, on demand, always on: RunPod's active-worker rates per second
    # (H100 PRO $0.00093, H200 PRO $0.00124, B200 $0.00190, A100 80 GB $0.00060,
    # L40/L40S $0.00037, A6000/A40 $0.00024) times 3600. One vendor for every GPU
    # so that the kinds compare at one provider's margins; `--prices FILE` for your own.
    "h100-sxm": 0.00093 * 3600,
    "h200": 0.00124 * 3600,
    "b200": 0.00190 * 3600,
    "a100-80gb": 0.00060 * 3600,
    "l40s": 0.00037 * 3600,
    "a40": 0.00024 * 3600,
}

LATENCY_STATS = ("mean", "median", "p50", "p90", "p95", "p99")
GOODPUT = "goodput_share"
SEARCH_SEED_TAG = "plan-search"
CONFIRM_SEED_TAG = "plan-confirm"
MAX_GROWTH = 1e4
BISECTION_STEPS = 7
MAX_REPLICAS_OVER = 4  # a confirmation stops at this many times the estimated replicas
LOW_LOAD = 1 / 64  # the probe below which a candidate that misses an SLO is pruned


@dataclass(frozen=True, slots=True)
class Slo:
    """One service-level objective: ``metric`` (a run-metric name) at most
    ``bound``, or, for goodput_share, at least ``bound``."""

    metric: str
    bound: float

    @property
    def key(self) -> str:
        """The run-metric name the bound reads (p50 is the median)."""
        return self.metric.replace("p50_", "median_", 1)

    def ratio(self, summary: dict) -> float:
        """How far the run is from the bound: <= 1 meets it (value / bound,
        or bound / share for goodput_share)."""
        if self.metric == GOODPUT:
            share = summary["request_goodput"] / summary["request_throughput"] if summary["request_throughput"] else 0.0
            return math.inf if share <= 0 else self.bound / share
        value = summary[self.key]
        return math.inf if not math.isfinite(value) else value / self.bound

    def value(self, summary: dict) -> float:
        if self.metric == GOODPUT:
            return summary["request_goodput"] / summary["request_throughput"] if summary["request_throughput"] else 0.0
        return float(summary[self.key])


def slo_names() -> list[str]:
    return [f"{s}_{lat}_ms" for s in LATENCY_STATS for lat in metrics.LATENCIES] + [GOODPUT]


def parse_slo(text: str) -> Slo:
    """``p99_ttft_ms=2000`` -> Slo; a one-line error naming the metric or the bound."""
    name, sep, value = text.partition("=")
    name = name.strip()
    require(sep and name in slo_names(),
            f"--slo must be METRIC=BOUND with METRIC one of {{mean,median,p50,p90,p95,p99}}_{{ttft,tpot,itl,e2el}}_ms "
            f"or {GOODPUT} (got {text!r})")
    try:
        bound = float(value)
    except ValueError:
        raise InputError(f"--slo {name}: the bound must be a number (got {value!r})") from None
    if name == GOODPUT:
        require(0 < bound <= 1, f"--slo {GOODPUT} must be in (0, 1] (got {value})")
    else:
        require(math.isfinite(bound) and bound > 0, f"--slo {name} must be a positive number of ms (got {value})")
    return Slo(name, bound)


def load_prices(path: str | Path | None) -> dict[str, float]:
    """The shipped price table, or a TOML file's ``[prices]`` (``h100-sxm = 2.49``, $/GPU-hour) instead of it."""
    if path is None:
        return dict(PRICES)
    table = {}
    try:
        data = tomllib.loads(Path(path).read_text())
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"--prices {path}: not TOML ({err})") from None
    given = data.get("prices", data)
    require(isinstance(given, dict), f"--prices {path}: expected a [prices] table of GPU = $/GPU-hour")
    for slug, price in given.items():
        require(slug in GPUS, f"--prices {path}: unknown GPU {slug!r} (one of {', '.join(GPUS)})")
        require(isinstance(price, (int, float)) and not isinstance(price, bool) and price > 0,
                f"--prices {path}: {slug} must be a positive $/GPU-hour (got {price!r})")
        table[slug] = float(price)
    return table


@dataclass(frozen=True, slots=True, kw_only=True)
class PlanConfig:
    devices: tuple[str, ...] = ("h100-sxm", "a100-80gb")
    tps: tuple[int, ...] = TP_DEGREES
    policies: tuple[str, ...] = ("ar", "linear:k=3")
    batch_limits: tuple[int, ...] = ()  # max_num_seqs candidates; () = the scenario's
    slos: tuple[Slo, ...] = ()
    growth: float = 1.0
    requests: int = 400  # requests per capacity probe
    confirm_seeds: int = 2
    finalists: int = 4  # candidates confirmed as whole fleets
    jobs: int = 2
    ray: str | None = None  # "local", "auto", HOST:PORT or ray://HOST:PORT: the jobs run on Ray
    prices: dict = field(default_factory=lambda: dict(PRICES))

    def __post_init__(self) -> None:
        require(self.slos, "plan needs at least one --slo (e.g. --slo p99_ttft_ms=2000)")
        require(self.devices, "--devices: name at least one GPU")
        for d in self.devices:
            require(d in GPUS, f"--devices: {d!r} is not a GPU (one of {', '.join(GPUS)})")
            require(d in self.prices, f"price table: no price for {d} (add it to the --prices file, or leave {d} out of --devices)")
        for t in self.tps:
            require(t in TP_DEGREES, f"--tp must be among {', '.join(map(str, TP_DEGREES))} (got {t})")
        for spec in self.policies:
            policies.parse(spec)
        require(0 < self.growth <= MAX_GROWTH, f"--growth must be in (0, {MAX_GROWTH:g}] (got {self.growth})")
        require(50 <= self.requests <= 100_000, f"--requests must be in 50..100000 (got {self.requests})")
        require(1 <= self.confirm_seeds <= 20, f"--confirm-seeds must be in 1..20 (got {self.confirm_seeds})")
        require(1 <= self.finalists <= 100, f"--finalists must be in 1..100 (got {self.finalists})")
        require(self.jobs >= 1, f"--jobs must be >= 1 (got {self.jobs})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    device: str
    tp: int
    max_num_seqs: int
    policy: str

    def config(self, base: SimConfig) -> SimConfig:
        return replace(base, device=self.device, tp=self.tp, policies=(self.policy,), replicas=1,
                       engine=replace(base.engine, max_num_seqs=self.max_num_seqs))

    @property
    def label(self) -> str:
        return f"{self.device} tp{self.tp} seqs{self.max_num_seqs} {self.policy}"


@dataclass(slots=True, kw_only=True)
class Row:
    candidate: Candidate
    status: str  # "unfit", "cannot meet", "estimated", "confirmed", "missed"
    price_per_gpu_hour: float
    capacity_per_s: float = math.nan  # one replica's highest rate within every SLO
    replicas: int = 0
    values: dict = field(default_factory=dict)  # SLO metric -> value (confirmed: mean over seeds)
    worst_ratio: float = math.nan  # the tightest SLO's value / bound
    worst_slo: str = ""
    ratios: tuple = ()  # the tightest ratio per confirm seed
    output_tokens_per_s: float = math.nan
    note: str = ""

    @property
    def gpus(self) -> int:
        return self.replicas * self.candidate.tp

    @property
    def usd_per_hour(self) -> float:
        return self.gpus * self.price_per_gpu_hour

    @property
    def tokens_per_usd(self) -> float:
        return self.output_tokens_per_s * 3600 / self.usd_per_hour if self.usd_per_hour else math.nan


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


def _summary(config: SimConfig, replicas: int, router: str) -> dict:
    s = experiment.resolve(config)
    run = simulate_fleet(s.requests, replicas=replicas, router=router, staleness_s=config.router_staleness_ms / 1e3,
                         policy=policies.parse(config.policies[0]), label=config.policies[0], costs=s.costs,
                         acceptance=s.acceptance, engine=config.engine, kv_budget_tokens=s.kv_budget_tokens,
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
    base, cand, slos, requests, native = job
    config = cand.config(base)
    seed = int(seeding.stream(base.seed, SEARCH_SEED_TAG).generate_state(1)[0])
    unfit = _fits(config)
    if unfit is not None:
        return "unfit", math.nan, unfit, 0
    sample = experiment.resolve(at_rate(config, native, native, requests=requests, seed=seed))
    saturation = experiment.burst_rate(sample.requests, policy=cand.policy, costs=sample.costs,
                                       acceptance=sample.acceptance, engine=config.engine,
                                       kv_budget_tokens=sample.kv_budget_tokens, seed=seed)

    served = [len(sample.requests)]

    def ratio(rate: float) -> tuple[float, str]:
        served[0] += requests
        return _worst(slos, _summary(at_rate(config, rate, native, requests=requests, seed=seed), 1, "round_robin"))

    lo, hi = saturation * LOW_LOAD, saturation
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
    base, cand, slos, n, target, native, seeds, per_replica = job
    config = cand.config(base)

    served = [0]

    def run(count: int) -> list[dict]:
        size = None if base.workload.arrival == "trace" else per_replica * count
        summaries = [_summary(at_rate(config, target, native, requests=size, seed=seed), count, base.router)
                     for seed in seeds]
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
        count = n
        while count > 1 and ok(count - 1):
            count -= 1
        return count, tried[count], served[0]
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


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    rows: tuple[Row, ...]  # confirmed first (by $/hour), then the rest by estimated $/hour
    target_per_s: float
    slos: tuple[Slo, ...]
    unfit: int
    pruned: int
    ranking: str  # the paired interval between the first two, in words
    simulated_requests: int

    @property
    def winner(self) -> Row | None:
        return self.rows[0] if self.rows and self.rows[0].status == "confirmed" else None


def candidates(base: SimConfig, pc: PlanConfig) -> list[Candidate]:
    limits = pc.batch_limits or (base.engine.max_num_seqs,)
    return [Candidate(device=d, tp=t, max_num_seqs=b, policy=p)
            for d in pc.devices for t in pc.tps for b in limits for p in pc.policies]


def _confirm(rows: list[Row], runner, context, bar) -> int:
    """Serve each of ``rows`` as a whole fleet (:func:`confirm`) and record
    its replicas and SLO metrics; the requests simulated."""
    base, pc, target, native, confirm_seeds = context
    jobs = [(base, r.candidate, pc.slos, r.replicas, target, native, confirm_seeds, pc.requests) for r in rows]
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
    cands = candidates(base, pc)
    fitting = [c for c in cands if _fits(c.config(base)) is None]
    if not fitting:
        raise InputError(f"no candidate fits its model: {_fits(cands[0].config(base))}")
    native = native_rate(fitting[0].config(base))  # a trace's rate: its arrivals, read with a model that fits
    target = native * pc.growth
    runner = pool.Ray(pc.ray, pc.jobs) if pc.ray else pool.executor(pc.jobs, len(cands))
    rows: list[Row] = []
    simulated = 0
    try:
        jobs = [(base, c, pc.slos, pc.requests, native) for c in cands]
        results: list = [None] * len(cands)
        with tqdm(total=len(cands), unit="candidate", desc="capacity", disable=not progress, leave=False) as bar:
            for i, result in runner.imap(capacity, jobs):
                results[i] = result
                bar.update()
        for c, (status, cap, note, served) in zip(cands, results):
            simulated += served
            row = Row(candidate=c, status=status if status != "ok" else "estimated",
                      price_per_gpu_hour=pc.prices[c.device], capacity_per_s=cap, note=note)
            if status == "ok":
                row.replicas = max(1, math.ceil(target / cap - 1e-9))
            rows.append(row)
        sized = sorted((r for r in rows if r.status == "estimated"), key=lambda r: (r.usd_per_hour, r.candidate.label))
        confirm_seeds = [int(x.generate_state(1)[0])
                         for x in seeding.stream(base.seed, CONFIRM_SEED_TAG).spawn(pc.confirm_seeds)]
        finalists = sized[:pc.finalists]
        bar = tqdm(unit="fleet", desc="confirm", disable=not progress, leave=False)
        while finalists:
            simulated += _confirm(finalists, runner, (base, pc, target, native, confirm_seeds), bar)
            # Confirmed fleets may cost more than their estimates: confirm, in turn, every candidate whose
            # estimate is below the cheapest confirmed fleet (up to 4 x --finalists in all).
            best = min((r.usd_per_hour for r in sized if r.status == "confirmed"), default=math.inf)
            left = [r for r in sized if r.status == "estimated" and r.usd_per_hour < best]
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
                ranking=ranking, simulated_requests=simulated)


# -- what plan shows and writes --------------------------------------------------------------------------------

COLUMNS = ("rank", "status", "device", "tp", "max_num_seqs", "policy", "replicas", "gpus", "usd_per_hour",
           "capacity_per_replica", "headroom_per_s", "tokens_per_usd", "tightest_slo", "tightest_ratio")


def table(p: Plan) -> list[dict]:
    out = []
    for i, r in enumerate(p.rows):
        c = r.candidate
        row = {"rank": i + 1 if r.status == "confirmed" else "", "status": r.status, "device": c.device, "tp": c.tp,
               "max_num_seqs": c.max_num_seqs, "policy": c.policy, "replicas": r.replicas or "",
               "gpus": r.gpus or "", "usd_per_hour": round(r.usd_per_hour, 2) if r.replicas else "",
               "capacity_per_replica": round(r.capacity_per_s, 3) if math.isfinite(r.capacity_per_s) else "",
               "headroom_per_s": round(r.capacity_per_s * r.replicas, 2) if r.replicas and math.isfinite(
                   r.capacity_per_s) else "",
               "tokens_per_usd": round(r.tokens_per_usd) if math.isfinite(r.tokens_per_usd) else "",
               "tightest_slo": r.worst_slo, "tightest_ratio": round(r.worst_ratio, 3) if math.isfinite(
                   r.worst_ratio) else ""}
        for s in p.slos:
            v = r.values.get(s.metric)
            row[s.metric] = round(v, 3) if v is not None else ""
        row["note"] = r.note
        out.append(row)
    return out


def markdown(p: Plan, limit: int = 12) -> str:
    rows = [r for r in table(p) if r["status"] in ("confirmed", "missed", "estimated")][:limit]
    if not rows:
        return "(no candidate fits and can meet the SLOs)\n"
    cols = [c for c in COLUMNS if c not in ("tightest_slo",)] + [s.metric for s in p.slos]
    lines = ["| " + " | ".join(cols) + " |", "|" + "|".join(" --- " for _ in cols) + "|"]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def verdict(p: Plan) -> str:
    w = p.winner
    if w is not None:
        c = w.candidate
        return (f"cheapest within every SLO: {w.replicas} x {c.device} at tp {c.tp} ({w.gpus} GPU{'s' * (w.gpus > 1)}), "
                f"{c.policy}, "
                f"max_num_seqs {c.max_num_seqs}: ${w.usd_per_hour:,.2f}/h, {w.tokens_per_usd:,.0f} output tokens/$")
    tried = [r for r in p.rows if r.status == "missed"] or [r for r in p.rows if r.note and r.status == "cannot meet"]
    if not tried:
        return "no candidate meets the SLOs: none fits its model at the candidate tensor-parallel degrees"
    close = min(tried, key=lambda r: r.worst_ratio if math.isfinite(r.worst_ratio) else math.inf)
    miss = (f"misses {close.worst_slo} by {close.worst_ratio - 1:.0%} at {close.replicas} replicas"
            if math.isfinite(close.worst_ratio) else close.note)
    return f"no candidate meets every SLO; the closest, {close.candidate.label}, {miss}"


def launch(p: Plan, base: SimConfig) -> str:
    """The winner's serving command for vLLM and SGLang (one replica; run ``replicas`` of them behind the router)."""
    w = p.winner
    if w is None:
        return ""
    c = w.candidate
    spec = policies.parse(c.policy)
    k = getattr(spec, "k", None)
    vllm = f"vllm serve {base.model} --tensor-parallel-size {c.tp} --max-num-seqs {c.max_num_seqs}"
    sglang = f"python -m sglang.launch_server --model-path {base.model} --tp {c.tp} --max-running-requests {c.max_num_seqs}"
    note = ""
    if spec.name == "linear" and k:
        vllm += (" --speculative-config '{\"method\": \"eagle\", \"model\": \"<your EAGLE drafter>\", "
                 f"\"num_speculative_tokens\": {k}}}'")
        sglang += (f" --speculative-algorithm EAGLE --speculative-draft-model-path <your EAGLE drafter> "
                   f"--speculative-num-steps {k} --speculative-eagle-topk 1 --speculative-num-draft-tokens {k + 1}")
    elif spec.name != "ar":
        note = (f"\n(note: {c.policy} has no one-flag engine setting; tune it and use `simspec export` for the "
                f"engine's nearest settings)")
    return f"vLLM:   {vllm}\nSGLang: {sglang}{note}"


def frame(p: Plan):
    """:func:`table` as a typed pandas DataFrame (numbers as numbers, an empty cell missing)."""
    import pandas as pd

    typed = pd.DataFrame(table(p)).replace("", None).infer_objects()
    return typed.astype({"rank": "Int64", "tightest_slo": "string", "note": "string"})


def write(p: Plan, out: str | Path) -> list[Path]:
    """plan.csv, plan.parquet and pareto.png (and pareto.csv) under ``out``, each written whole or not at all."""
    import pandas as pd

    from simspec.files import write_bytes, write_text

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_text(out / "plan.csv", pd.DataFrame(table(p)).to_csv(index=False))
    write_bytes(out / "plan.parquet", frame(p).to_parquet(index=False))
    front = pareto(p)
    write_text(out / "pareto.csv", pd.DataFrame(
        [{"device": r.candidate.device, "tp": r.candidate.tp, "max_num_seqs": r.candidate.max_num_seqs,
          "policy": r.candidate.policy, "replicas": r.replicas, "usd_per_hour": round(r.usd_per_hour, 2),
          "tightest_ratio": round(r.worst_ratio, 4)} for r in front]).to_csv(index=False))
    write_bytes(out / "pareto.png", pareto_plot(p, front))
    return [out / name for name in ("plan.csv", "plan.parquet", "pareto.csv", "pareto.png")]


def pareto(p: Plan) -> list[Row]:
    """The confirmed and missed fleets no other beats on both $/hour and the tightest SLO ratio."""
    pts = sorted((r for r in p.rows if r.status in ("confirmed", "missed") and math.isfinite(r.worst_ratio)),
                 key=lambda r: (r.usd_per_hour, r.worst_ratio))
    front, best = [], math.inf
    for r in pts:
        if r.worst_ratio < best:
            front.append(r)
            best = r.worst_ratio
    return front


def pareto_plot(p: Plan, front: list[Row] | None = None) -> bytes:
    """The Pareto plot (PNG): every confirmed or missed fleet by $/hour and tightest SLO ratio, the front dashed."""
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    front = pareto(p) if front is None else front
    pts = [r for r in p.rows if r.status in ("confirmed", "missed") and math.isfinite(r.worst_ratio)]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for status, marker in (("confirmed", "o"), ("missed", "x")):
        sel = [r for r in pts if r.status == status]
        ax.scatter([r.usd_per_hour for r in sel], [r.worst_ratio for r in sel], marker=marker, label=status)
    if front:
        ax.plot([r.usd_per_hour for r in front], [r.worst_ratio for r in front], "k--", lw=1, label="Pareto front")
    ax.axhline(1.0, color="red", lw=0.8)
    ax.set_xlabel("fleet $ per hour")
    ax.set_ylabel("tightest SLO: value / bound (<= 1 meets)")
    ax.set_title(f"{p.target_per_s:.3g} req/s")
    ax.legend()
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)
    return buf.getvalue()


__all__ = ["PRICES", "PRICES_SOURCE", "Slo", "parse_slo", "load_prices", "PlanConfig", "Candidate", "Row", "Plan",
           "plan", "table", "frame", "markdown", "verdict", "launch", "write", "pareto", "pareto_plot",
           "slo_names"]
