"""simspec plan's inputs and records: SLOs, the price table, the search's
settings, a candidate, its row in the plan, and the plan.

Imports: the standard library, simspec.config, simspec.costs, simspec.fleet (the router and link names),
simspec.policies, simspec.types.
"""

from __future__ import annotations

import math
import tomllib
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from simspec import metrics, policies
from simspec.config import SimConfig
from simspec.costs.gpus import GPUS
from simspec.costs.specs import TP_DEGREES
from simspec.fleet.groups import DEFAULT_LINK, parse_link
from simspec.fleet.routers import ROUTERS
from simspec.serving import modes
from simspec.serving.config import EngineConfig
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
MAX_GROWTH = 1e4
MAX_SPLIT = 32  # replicas of one side in a disaggregated unit


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


def parse_splits(text: str) -> tuple[tuple[int, int], ...]:
    """``1:1,1:3`` -> ((1, 1), (1, 3)) (PlanConfig checks the counts' ranges);
    a one-line error naming the form otherwise."""
    out = []
    for part in (x.strip() for x in text.replace(";", ",").split(",") if x.strip()):
        prefill, sep, decode = part.partition(":")
        try:
            out.append((int(prefill), int(decode)))
        except ValueError:
            sep = ""
        require(sep, f"--splits must be PREFILL:DECODE replica counts separated by commas, e.g. 1:1,1:3 "
                     f"(got {text!r})")
    return tuple(out)


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
    engines: tuple[str, ...] = ()  # engine modes (simspec, vllm, sglang); () = the scenario's
    batch_limits: tuple[int, ...] = ()  # max_num_seqs candidates; () = the scenario's
    routers: tuple[str, ...] = ()  # routers a fleet is confirmed behind; () = the scenario's
    # prefill:decode replicas of a disaggregated unit, each a candidate beside the colocated replica; () = none
    splits: tuple[tuple[int, int], ...] = ()
    # a disaggregated unit's prefill side: GPUs and degrees searched for it; () = the decode side's own
    prefill_devices: tuple[str, ...] = ()
    prefill_tps: tuple[int, ...] = ()
    kv_link: str = DEFAULT_LINK  # what a disaggregated fleet's KV cache moves over (simspec.fleet.groups.LINKS)
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
        for kind in self.engines:
            require(kind in modes.KINDS, f"--engines: {kind!r} is not an engine mode (one of {', '.join(modes.KINDS)})")
        for name in self.routers:
            require(name in ROUTERS, f"--routers: {name!r} is not a router (one of {', '.join(ROUTERS)})")
        for split in self.splits:
            require(len(split) == 2 and all(isinstance(n, int) and 1 <= n <= MAX_SPLIT for n in split),
                    f"--splits: each is PREFILL:DECODE replicas, both in 1..{MAX_SPLIT} (got {split!r})")
        require(self.splits or not (self.prefill_devices or self.prefill_tps),
                "--prefill-devices and --prefill-tp set the prefill side of --splits' units: give --splits too")
        for d in self.prefill_devices:
            require(d in GPUS, f"--prefill-devices: {d!r} is not a GPU (one of {', '.join(GPUS)})")
            require(d in self.prices, f"price table: no price for {d} (add it to the --prices file, or leave {d} out "
                                      f"of --prefill-devices)")
        for t in self.prefill_tps:
            require(t in TP_DEGREES, f"--prefill-tp must be among {', '.join(map(str, TP_DEGREES))} (got {t})")
        parse_link(self.kv_link)
        require(0 < self.growth <= MAX_GROWTH, f"--growth must be in (0, {MAX_GROWTH:g}] (got {self.growth})")
        require(50 <= self.requests <= 100_000, f"--requests must be in 50..100000 (got {self.requests})")
        require(1 <= self.confirm_seeds <= 20, f"--confirm-seeds must be in 1..20 (got {self.confirm_seeds})")
        require(1 <= self.finalists <= 100, f"--finalists must be in 1..100 (got {self.finalists})")
        require(self.jobs >= 1, f"--jobs must be >= 1 (got {self.jobs})")


def engine_at(base: SimConfig, kind: str, device: str, tp: int) -> EngineConfig:
    """The engine a candidate runs: mode ``kind``'s preset on ``device`` at
    degree ``tp`` (vLLM's batch defaults follow the GPU's memory), under
    the fields the scenario set itself (those that differ from its own
    mode's preset on its own device)."""
    own = _preset(base.engine.kind, base.device, base.tp)
    mine = {f.name: getattr(base.engine, f.name) for f in fields(EngineConfig)
            if f.name != "kind" and getattr(base.engine, f.name) != getattr(own, f.name)}
    values = {**{f.name: getattr(_preset(kind, device, tp), f.name) for f in fields(EngineConfig)}, **mine}
    return EngineConfig(**values)


def _preset(kind: str, device: str, tp: int) -> EngineConfig:
    return EngineConfig(**{**{f.name: getattr(EngineConfig(), f.name) for f in fields(EngineConfig)},
                           **modes.preset(kind, device, tp)})


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    device: str
    tp: int
    max_num_seqs: int
    policy: str
    engine: str = "simspec"  # the engine mode
    router: str = ""  # what its fleet is served behind ("": the scenario's router)
    # (prefill, decode) replicas of a disaggregated unit, the fleet that many units; (): one colocated replica
    split: tuple[int, int] = ()
    prefill_device: str = ""  # a unit's prefill replicas' GPU ("": the decode side's, ``device``)
    prefill_tp: int = 0  # ... and degree (0: ``tp``)

    def config(self, base: SimConfig) -> SimConfig:
        """One replica of the candidate (its fleet's router set, for the fleets made of it)."""
        return replace(base, device=self.device, tp=self.tp, policies=(self.policy,), replicas=1,
                       router=self.router or base.router,
                       engine=replace(engine_at(base, self.engine, self.device, self.tp),
                                      max_num_seqs=self.max_num_seqs))

    @property
    def replica(self) -> "Candidate":
        """The candidate without its router: what one replica's (or unit's) capacity is measured on."""
        return replace(self, router="")

    @property
    def sides(self) -> tuple[int, int]:
        """(prefill, decode) replicas of a unit of the fleet: a colocated
        candidate's unit is one replica, which does both (counted as decode)."""
        return self.split or (0, 1)

    @property
    def unit(self) -> int:
        """Replicas a unit of the fleet."""
        return sum(self.sides)

    @property
    def prefill_side(self) -> tuple[str, int]:
        """(GPU, degree) of a disaggregated unit's prefill replicas."""
        return self.prefill_device or self.device, self.prefill_tp or self.tp

    @property
    def gpus_per_unit(self) -> int:
        """GPUs of a unit's replicas, both sides."""
        prefill, decode = self.sides
        return prefill * self.prefill_side[1] + decode * self.tp

    def unit_usd_per_hour(self, prices: dict) -> float:
        """$/hour of a unit's replicas, each side at its own GPU's price."""
        (prefill, decode), (device, tp) = self.sides, self.prefill_side
        return prefill * tp * prices[device] + decode * self.tp * prices[self.device]

    @property
    def split_label(self) -> str:
        """``1P2D``, with the prefill side's GPU and degree where they are not the decode side's; "" colocated."""
        if not self.split:
            return ""
        device, tp = self.prefill_side
        other = f" (prefill {device} tp{tp})" if (device, tp) != (self.device, self.tp) else ""
        return f"{self.split[0]}P{self.split[1]}D{other}"

    @property
    def label(self) -> str:
        mode = f" on {self.engine}" if self.engine != "simspec" else ""
        behind = f" behind {self.router}" if self.router else ""
        split = f" {self.split_label}" if self.split else ""
        return f"{self.device} tp{self.tp} seqs{self.max_num_seqs} {self.policy}{mode}{split}{behind}"


@dataclass(slots=True, kw_only=True)
class Row:
    candidate: Candidate
    status: str  # "unfit", "cannot meet", "estimated", "confirmed", "missed"
    # one replica's (a disaggregated candidate: one unit's) price (Candidate.unit_usd_per_hour) and highest rate
    # within every SLO
    unit_usd_per_hour: float
    capacity_per_s: float = math.nan
    replicas: int = 0  # the fleet's replicas (a disaggregated candidate: its units)
    values: dict = field(default_factory=dict)  # SLO metric -> value (confirmed: mean over seeds)
    worst_ratio: float = math.nan  # the tightest SLO's value / bound
    worst_slo: str = ""
    ratios: tuple = ()  # the tightest ratio per confirm seed
    output_tokens_per_s: float = math.nan
    note: str = ""

    @property
    def gpus(self) -> int:
        return self.replicas * self.candidate.gpus_per_unit

    @property
    def usd_per_hour(self) -> float:
        return self.replicas * self.unit_usd_per_hour

    @property
    def tokens_per_usd(self) -> float:
        return self.output_tokens_per_s * 3600 / self.usd_per_hour if self.usd_per_hour else math.nan




@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    rows: tuple[Row, ...]  # confirmed first (by $/hour), then the rest by estimated $/hour
    target_per_s: float
    slos: tuple[Slo, ...]
    unfit: int
    pruned: int
    ranking: str  # the paired interval between the first two, in words
    simulated_requests: int
    left_out: tuple[str, ...] = ()  # engine/policy pairs not searched: the engine cannot run the policy
    router: str = "round_robin"  # the scenario's: the fleets of candidates that name none are served behind it

    @property
    def winner(self) -> Row | None:
        return self.rows[0] if self.rows and self.rows[0].status == "confirmed" else None

    def router_of(self, candidate: Candidate) -> str:
        """The router ``candidate``'s fleet is served behind."""
        return candidate.router or self.router



__all__ = ["PRICES", "PRICES_SOURCE", "Slo", "parse_slo", "load_prices", "slo_names", "PlanConfig", "engine_at",
           "Candidate",
           "Row", "Plan", "GOODPUT", "LATENCY_STATS", "MAX_GROWTH", "MAX_SPLIT", "parse_splits"]
