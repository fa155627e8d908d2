"""``simspec validate --against vllm``, its second phase: fit simspec to
the calibration runs a live phase kept (step costs, the engine's time
outside the logged steps, acceptance, the frontend's latency) and compare
its predictions with the held-out runs (simspec.validation.vllm_live's
docstring says how each is fitted).

Imports: numpy, simspec.validation.vllm_live (the settings, the run
folder's names), simspec.vllm.calibrate, simspec.vllm.logs,
simspec.costs.steps, simspec.files.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simspec import __version__
from simspec.vllm.acceptance import ChainAcceptance, fit_chain_acceptance, request_rounds
from simspec.vllm.calibrate import EngineGap, fit_engine_gap, replay_requests, with_gap
from simspec.costs.steps import HeldOutError, StepCostFit, fit_iteration_costs
from simspec.files import read_json
from simspec.types import require
from simspec.vllm.logs import BenchResult, EngineStep, ServerLog, SpecDecodeCounters, parse_bench, parse_metrics, \
    read_server_log
from simspec.vllm.server import Traffic
from simspec.validation.vllm_live import (BOUNDS, RUNS, ValidateVllmConfig, config_from_json, speculative_config,
                                          target_name)


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRun:
    """One benchmark as the live phase kept it."""

    method: str
    phase: str
    repeat: int
    traffic: Traffic
    bench: BenchResult
    steps: tuple[EngineStep, ...]  # the server log's iteration lines during the run (engine 0's indices)
    counters: SpecDecodeCounters | None  # the counters' difference over the run
    loadavg: tuple[float, float]  # 1-minute load average before and after


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodCalibration:
    method: str
    policy: str  # the simulator's: ar or linear:k=K
    fit: StepCostFit  # the iteration fit with the gap added
    iteration_fit: StepCostFit  # the iteration fit alone
    held_out: HeldOutError
    gap: EngineGap
    frontend_s: float
    acceptance: ChainAcceptance | None
    kv_cache_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One metric of one method at one load."""

    live: float  # mean over the live repeats
    sim: float  # mean over the repeats' replays
    live_runs: tuple[float, ...]
    bound_pct: float
    # simulated with each held-out run's own acceptance (its counters) instead of the calibration's:
    # what the cost model alone gets wrong (None without speculation)
    sim_own_acceptance: float | None = None
    # the acceptance length only: its sampling error over the held-out run's prompts (standard error, % of it;
    # RequestRounds.relative_se), and the calibration's over its prompts; None without per-request timing
    sampling_se_pct: float | None = None
    calibration_se_pct: float | None = None

    @property
    def sampling_z(self) -> float | None:
        """The error in standard errors of the two prompt sets' difference (None: not an acceptance cell)."""
        if self.sampling_se_pct is None or self.calibration_se_pct is None:
            return None
        se = math.hypot(self.sampling_se_pct, self.calibration_se_pct)
        return self.error_pct / se if se > 0 else None  # an oracle's: every request accepts everything

    @property
    def error_pct(self) -> float:
        return (self.sim / self.live - 1) * 100 if self.live else math.nan

    @property
    def spread_pct(self) -> float:
        """The live repeats' (max - min) / mean, %: how far the live side reproduces itself."""
        runs = np.array(self.live_runs)
        return float((runs.max() - runs.min()) / runs.mean() * 100) if len(runs) > 1 and runs.mean() else math.nan

    @property
    def within(self) -> bool:
        return abs(self.error_pct) <= self.bound_pct

    def to_json(self) -> dict:
        own = self.sim_own_acceptance
        return {"live": self.live, "sim": self.sim, "error_pct": self.error_pct, "bound_pct": self.bound_pct,
                "within_bound": self.within, "live_runs": list(self.live_runs), "live_spread_pct": self.spread_pct,
                "sim_own_acceptance": own,
                "error_own_acceptance_pct": None if own is None or not self.live else (own / self.live - 1) * 100,
                **({} if self.sampling_se_pct is None else {
                    "sampling_se_pct": self.sampling_se_pct, "calibration_sampling_se_pct": self.calibration_se_pct,
                    "error_in_standard_errors": self.sampling_z})}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCheck:
    """One live run's logged steps against the method's fitted step costs:
    what the cost model gets wrong with the right steps, and how much the
    live engine's time for one step shape moves from run to run."""

    run: str  # "cal-sat4", "low #2", ...
    steps: int
    priced_pct: float  # the fit's price of the run's own logged steps / their logged time - 1, %
    shape_ms: float  # median logged time of the method's commonest decode-only shape in this run (nan: none)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmValidation:
    config: ValidateVllmConfig
    calibrations: dict[str, MethodCalibration]
    table: dict[str, dict[str, dict[str, Cell]]]  # load -> method -> metric -> cell
    loadavg: dict[str, dict[str, float]]  # load -> method -> mean 1-minute load average over its runs
    replays: dict[tuple[str, str], tuple]  # (load, method) -> (live e2el s, simulated e2el s) of the first repeat
    versions: dict[str, str | None] = field(default_factory=dict)
    prefix_notes: tuple[str, ...] = ()  # runs whose prompts the server had cached (prefix_hits)
    step_checks: dict[str, tuple[tuple[int, int], tuple[StepCheck, ...]]] = field(default_factory=dict)
    """method -> ((decode sequences, decode tokens) of its commonest decode-only step, a check per run)"""

    def ranking(self, load: str, side: str) -> list[str]:
        methods = self.table[load]
        return sorted(methods, key=lambda m: getattr(methods[m]["mean_e2el_ms"], side))


def _counters(before_text: str, after_text: str, path: str) -> tuple[SpecDecodeCounters | None, int | None]:
    """The speculative counters' difference over a run, and the server's KV block size."""
    before, after = parse_metrics(before_text, path), parse_metrics(after_text, path)
    if after.spec_decode is None:
        return None, after.block_size_tokens
    empty = SpecDecodeCounters(num_drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position=())
    return after.spec_decode.minus(before.spec_decode or empty), after.block_size_tokens


def load_runs(out: Path) -> tuple[ValidateVllmConfig, list[LiveRun], dict[str, ServerLog], int | None]:
    """What the live phase kept in ``out`` (``runs.json`` and the files it lists), and the
    servers' KV block size from their /metrics (None where no scrape says)."""
    record = read_json(out / RUNS, "validation runs")
    require(isinstance(record, dict) and record.get("format") == "simspec-vllm-validation-runs/1",
            f"{out / RUNS}: not a `simspec validate --against vllm` runs file")
    cfg = config_from_json(record["config"])
    logs: dict[str, ServerLog] = {}
    for s in record["servers"]:
        path = Path(s["log"]) if Path(s["log"]).is_absolute() else out / s["log"]
        logs[s["method"]] = read_server_log(path)
    runs, block = [], None
    for r in record["runs"]:
        start, end = r["iterations"]
        log = logs[r["method"]]
        bench_path = out / r["bench"]
        counters, block_size = _counters((out / r["metrics_before"]).read_text(),
                                         (out / r["metrics_after"]).read_text(), str(out / r["metrics_after"]))
        block = block or block_size
        runs.append(LiveRun(
            method=r["method"], phase=r["phase"], repeat=r["repeat"], traffic=Traffic.from_json(r["traffic"]),
            bench=parse_bench(read_json(bench_path, "vllm bench result"), str(bench_path)),
            steps=tuple(s for s in log.steps if start < s.index <= end and not s.dummy),
            counters=counters,
            loadavg=(float(r["loadavg_before"][0]), float(r["loadavg_after"][0]))))
    return cfg, runs, logs, block


def _step_columns(steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.array([s.prefill_tokens + s.decode_tokens for s in steps], dtype=float)
    requests = np.array([s.prefill_requests + s.decode_requests for s in steps], dtype=float)
    elapsed = np.array([s.elapsed_ms / 1e3 for s in steps], dtype=float)
    return tokens, requests, elapsed


def fit_gap(runs: list[LiveRun]) -> EngineGap:
    """Per-step and per-sequence time outside the elapsed time, from runs
    that never let the engine idle (step 2 of the module docstring)."""
    saturated = [r for r in runs if r.traffic.saturating]
    require(bool(saturated), "no saturating calibration run to fit the engine's CPU time to")
    for r in saturated:
        require(len(r.steps) > 0, f"{r.bench.path}: no iteration lines in the server log during the run")
    return fit_engine_gap([(Path(r.bench.path).name, r.bench.summary["duration"], r.steps) for r in saturated])


def _engine(kv_tokens: int, block_size: int, frontend_s: float):
    from simspec.serving import modes
    from simspec.serving.config import EngineConfig

    fields = modes.preset("vllm", "cpu")  # vLLM's CPU defaults
    return EngineConfig(**{**fields, "block_size": block_size, "kv_cache_tokens": kv_tokens,
                           "frontend_s_per_request": frontend_s})


def calibrate_method(method: str, runs: list[LiveRun], log: ServerLog, cfg: ValidateVllmConfig,
                     block: int) -> MethodCalibration:
    cal = [r for r in runs if r.method == method and r.phase == "calibration"]
    require(bool(cal), f"{method}: no calibration runs kept")
    steps = [s for r in cal for s in r.steps]
    tokens, requests, elapsed = _step_columns(steps)
    model = target_name(cfg)
    label = f"fitted to vLLM {log.version or '?'} iteration lines of {method}'s calibration runs"
    _, iteration_fit, held = fit_iteration_costs(tokens, requests, elapsed, label, model=model, device="cpu",
                                                 hold_out_every=5)
    gap = fit_gap(cal)
    fit = with_gap(iteration_fit, gap)
    chain = None
    if method != "none":
        counters = _sum_counters([r.counters for r in cal])
        require(counters is not None and counters.num_drafts > 0,
                f"{method}: the server drafted nothing in the calibration runs")
        chain = fit_chain_acceptance(counters, cfg.k, f"calibrated:vllm-{method}",
                                     request_rounds([r.bench for r in cal]))
    policy = "ar" if chain is None else f"linear:k={cfg.k}"
    kv_tokens = log.kv_cache_tokens or 1 << 20
    light = next(r for r in cal if not r.traffic.saturating)
    sim, _ = replay_requests(light.bench, policy, fit.cost_model(), chain.model if chain else None,
                             _engine(kv_tokens, block, 0.0), kv_tokens, cfg.sim_seeds)
    frontend = max(0.0, (light.bench.summary["mean_ttft_ms"] - sim["mean_ttft_ms"]) / 1e3)
    return MethodCalibration(method=method, policy=policy, fit=fit, iteration_fit=iteration_fit, held_out=held,
                             gap=gap, frontend_s=frontend, acceptance=chain, kv_cache_tokens=kv_tokens,
                             block_size=block)


def step_checks(cal: MethodCalibration, runs: list[LiveRun]) -> tuple[tuple[int, int], tuple[StepCheck, ...]]:
    """Each of the method's runs (calibration and held out, in the order
    they ran): its logged steps priced by the iteration fit against their
    logged time, and the median time of the method's commonest decode-only
    step shape in it. The first says how far the step costs alone are off
    on a run; the second, how far the live engine is from itself on one
    step shape, which no cost model can follow."""
    shapes = [(s.decode_requests, s.decode_tokens) for r in runs for s in r.steps
              if s.prefill_requests == 0 and s.decode_requests > 0]
    values, counts = np.unique(np.array(shapes or [(0, 0)]), axis=0, return_counts=True)
    common = tuple(int(v) for v in values[int(np.argmax(counts))])
    c = cal.iteration_fit.coefficients_s
    checks = []
    for r in runs:
        tokens, requests, elapsed = _step_columns(r.steps)
        if not len(elapsed):
            continue
        priced = c["overhead"] * len(elapsed) + c["target_token"] * tokens.sum() + c["attn_request"] * requests.sum()
        same = [s.elapsed_ms for s in r.steps
                if s.prefill_requests == 0 and (s.decode_requests, s.decode_tokens) == common]
        name = r.traffic.name if r.phase == "calibration" else f"{r.traffic.name} #{r.repeat + 1}"
        checks.append(StepCheck(run=name, steps=len(elapsed), priced_pct=float((priced / elapsed.sum() - 1) * 100),
                                shape_ms=float(np.median(same)) if len(same) >= 5 else math.nan))
    return common, tuple(checks)


def _sum_counters(parts) -> SpecDecodeCounters | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    k = max(len(p.accepted_per_position) for p in parts)
    return SpecDecodeCounters(
        num_drafts=sum(p.num_drafts for p in parts), draft_tokens=sum(p.draft_tokens for p in parts),
        accepted_tokens=sum(p.accepted_tokens for p in parts),
        accepted_per_position=tuple(sum(p.accepted_per_position[j] if j < len(p.accepted_per_position) else 0
                                        for p in parts) for j in range(k)))


def prefix_hits(runs: list[LiveRun], block: int | None, spec_tokens: dict[str, int] | None = None
                ) -> tuple[dict[int, np.ndarray], tuple[str, ...]]:
    """The prompt tokens each request of a run found in its server's prefix
    cache (by ``id(run)``; ``runs`` in the order they ran), and a note per
    run that found any. ``spec_tokens``: each method's K (0 or absent: no
    speculation).

    vLLM's random dataset gives the same prompts for the same traffic and
    seed, and the server keeps a served prompt's full KV blocks cached (its
    prefix caching is on by default): a repeat of a traffic computes only
    what is past the last full block of each prompt, at most prompt - 1
    tokens (vllm/v1/core/kv_cache_manager.py 0.33 l.296-302). When it
    speculates, a request left with one prompt token to compute may be
    scheduled as 1 + K rows, K of them placeholder drafts, which the log
    counts as context tokens (vllm/v1/core/sched/scheduler.py 0.32
    l.1131-1152: new requests are padded to the speculative width when no
    other prefill was scheduled before them in the step). The rule is used
    for a run only when it gives exactly the prompt tokens the server logged
    as computed during the run, up to K for each request so left; otherwise
    the note says what the log shows and the run is replayed whole."""
    hits, notes, served = {}, [], {}
    for r in runs:
        seen = served.setdefault(r.method, set())
        req = r.bench.requests
        if req is None:
            continue
        sent = int(req.input_tokens[req.ok].sum())
        computed = sum(s.prefill_tokens for s in r.steps)
        label = f"{r.method} {r.traffic.name} #{r.repeat + 1}"
        if r.traffic in seen and block:
            hit = np.where(req.ok, (req.input_tokens - 1) // block * block, 0)
            k = (spec_tokens or {}).get(r.method, 0)
            padded = computed - (sent - int(hit.sum()))
            one_left = int(np.sum(req.ok & (req.input_tokens - hit == 1)))
            if padded == 0 or (k > 0 and padded % k == 0 and 0 < padded // k <= one_left):
                hits[id(r)] = hit
                if hit.any():
                    pad = (f" ({padded} of them vLLM's placeholder draft rows for {padded // k} request(s) left "
                           f"with one prompt token)" if padded else "")
                    notes.append(f"{label}: {int(hit.sum())} of {sent} prompt tokens found in the prefix cache (its "
                                 f"prompts were served before; {block}-token blocks), as the log's {computed} "
                                 f"computed tokens confirm{pad}: replayed without them")
            else:
                notes.append(f"{label}: the log computed {computed} of {sent} prompt tokens, not the "
                             f"{sent - int(hit.sum())} the block rule says: replayed whole")
        elif computed < sent:
            notes.append(f"{label}: the log computed {computed} of {sent} prompt tokens (a prefix-cache hit not "
                         f"explained by an earlier run): replayed whole")
        seen.add(r.traffic)
    return hits, tuple(notes)


def _live_value(run: LiveRun, metric: str) -> float:
    if metric == "spec_decode_acceptance_length":
        return run.counters.acceptance_length if run.counters is not None else 1.0
    return float(run.bench.summary[metric])


def analyse(out: Path, say=print) -> VllmValidation:
    """Fit every method on its calibration runs and compare its held-out runs (module docstring)."""
    cfg, runs, logs, block = load_runs(out)
    block = block or 16
    calibrations = {method: calibrate_method(method, runs, logs[method], cfg, block)
                    for method in cfg.methods if method in logs}
    table: dict[str, dict[str, dict[str, Cell]]] = {}
    loadavg: dict[str, dict[str, float]] = {}
    replays = {}
    drafts = {m: (speculative_config(m, cfg.models, cfg.k) or {}).get("num_speculative_tokens", 0)
              for m in cfg.methods}  # K per method, as the server was started
    hits, notes = prefix_hits(runs, block, drafts)
    for traffic in cfg.held_out:
        for method, cal in calibrations.items():
            held = [r for r in runs if r.method == method and r.phase == "held_out" and r.traffic.name == traffic.name]
            if not held:
                continue
            engine = _engine(cal.kv_cache_tokens, cal.block_size, cal.frontend_s)
            sims = [replay_requests(r.bench, cal.policy, cal.fit.cost_model(),
                                    cal.acceptance.model if cal.acceptance else None, engine, cal.kv_cache_tokens,
                                    cfg.sim_seeds, hits.get(id(r))) for r in held]
            own, sampling = None, {}
            if cal.acceptance is not None:  # the cost model alone: each run priced with its own counters' acceptance
                rounds = [request_rounds([r.bench]) for r in held]
                own = [replay_requests(r.bench, cal.policy, cal.fit.cost_model(),
                                       fit_chain_acceptance(r.counters, cfg.k, f"own:{method}", rr).model, engine,
                                       cal.kv_cache_tokens, cfg.sim_seeds, hits.get(id(r)))[0]
                       for r, rr in zip(held, rounds)]
                if cal.acceptance.sampling_se is not None and rounds[0] is not None:  # the repeats: the same prompts
                    sampling = {"sampling_se_pct": 100 * rounds[0].relative_se,
                                "calibration_se_pct": 100 * cal.acceptance.sampling_se}
            table.setdefault(traffic.name, {})[method] = {
                m: Cell(live=float(np.mean([_live_value(r, m) for r in held])),
                        sim=float(np.mean([s[m] for s, _ in sims])),
                        live_runs=tuple(_live_value(r, m) for r in held), bound_pct=bound,
                        sim_own_acceptance=None if own is None else float(np.mean([s[m] for s in own])),
                        **(sampling if m == "spec_decode_acceptance_length" else {}))
                for m, bound in BOUNDS.items()}
            loadavg.setdefault(traffic.name, {})[method] = float(np.mean([np.mean(r.loadavg) for r in held]))
            replays[(traffic.name, method)] = (held[0].bench.requests.e2el_s[held[0].bench.requests.ok],
                                               sims[0][1])
    version = next((log.version for log in logs.values() if log.version), None)
    checks = {method: step_checks(cal, [r for r in runs if r.method == method and r.phase != "warmup"])
              for method, cal in calibrations.items()}
    return VllmValidation(config=cfg, calibrations=calibrations, table=table, loadavg=loadavg, replays=replays,
                          versions={"vllm": version, "simspec": __version__}, prefix_notes=notes,
                          step_checks=checks)


__all__ = ["LiveRun", "MethodCalibration", "Cell", "StepCheck", "VllmValidation", "load_runs", "fit_gap",
           "calibrate_method", "step_checks", "prefix_hits", "analyse"]
