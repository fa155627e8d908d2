"""``simspec calibrate vllm``: a real vLLM server's step costs and acceptance,
from what it writes, in the files ``simspec simulate``
reads (``--cost-model steps:FILE``, ``--acceptance FILE``).

Imports: numpy, scipy, simspec.vllm.logs, simspec.vllm.acceptance (the counters' mapping), simspec.costs (the step-cost
fit), simspec.acceptance, simspec.config, simspec.serving.modes, simspec.sim and
simspec.metrics (the replay of a benchmark), simspec.files,
simspec.runfolder. Never vLLM.

- **Step costs** from the server log's ``Iteration(N)`` lines (one an engine
  step: prefill and decode requests and tokens, elapsed ms), fitted by
  :func:`simspec.costs.steps.fit_iteration_costs` to the terms such totals
  identify: a fixed per-step part, a per-target-token part (prefill tokens +
  decode tokens, draft tokens included) and a per-sequence part. The first
  ``warmup_steps`` steps are left out (vLLM's first prefill runs 5-10x its
  later cost); every ``hold_out_every``-th of the rest is held out and
  priced by the fit for its held-out error. The elapsed time is the model's
  part of a step (drafting included) without scheduling and output
  processing, so the fit is of that part.
- **The engine's time outside the logged steps** (scheduling, output
  processing), from each saturated benchmark given (all requests at once,
  ``--max-concurrency``: the engine never idles, so the run's duration is
  its steps' elapsed time plus that time): its steps are the log lines
  whose clock falls in the run (:func:`simspec.vllm.logs.steps_during`), and
  :func:`fit_engine_gap` fits a per-step and a per-sequence part, which
  ``step_costs.json`` adds to the fit's. Without a saturated benchmark it is
  left out, and the output says so.
- **Acceptance** from the ``/metrics`` counters: per position j the rate
  accepted_per_pos[j] / num_drafts (drafts that had their j-th token
  accepted), which is what the simulator's chain acceptance must give at
  depth j. Those rates are mapped onto simspec's acceptance model (module
  simspec.acceptance.model) with its three parameters that shape a chain's
  acceptance: the top-1 logit, its decay per depth and the per-request
  spread (token and confidence noise off: the counters say nothing of
  them), fitted by least squares to the rates (a dense grid over the
  requests' spread). Flat rates (a drafter that agrees only where the
  target repeats itself: once the first token is accepted, the rest nearly
  always are) fit two different worlds: requests that accept everything or
  nothing, or rounds that do. The benchmarks' per-request chunks tell them
  apart (``itls``: one gap per streamed chunk, a chunk per engine step, so
  a request's output tokens over its chunks are its tokens a round): where
  every round is a K-token draft (the chunks' pooled tokens a round are the
  counters' acceptance length within 3%), a fourth parameter, the round term
  ``round_sigma`` shared by a round's nodes, is fitted with the others to
  the rates and the requests' standard deviation of tokens a round
  (:func:`request_spread`). Two approximations, both written into
  ``acceptance.json``: a rate of exactly 1 (an identical-weight drafter) is
  held at the model's largest logit (rate 1 - 1e-6 a position); and ngram
  may draft fewer than K tokens (``draft_tokens / num_drafts`` < K), which
  the rates already count as not accepted, but the simulator drafts and
  verifies all K, so it prices a little more verification than vLLM ran.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import numpy as np

from simspec import __version__, config as configuration, costs
from simspec.acceptance import AcceptanceModel
from simspec.costs.steps import HeldOutError, StepCostFit, fit_iteration_costs
from simspec.files import dump_json, staged_folder, write_text
from simspec.runfolder import MARKER, check_target
from simspec.types import Request, require
from simspec.vllm.acceptance import ChainAcceptance, acceptance_record, fit_chain_acceptance, request_rounds
from simspec.vllm.logs import (BenchResult, EngineStep, ServerLog, ServerMetrics, read_bench, read_metrics,
                               read_server_log, steps_during)

COMPARED = ("mean_e2el_ms", "mean_tpot_ms", "mean_ttft_ms", "p95_e2el_ms", "output_throughput",
            "spec_decode_acceptance_length")


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateVllmConfig:
    """What ``simspec calibrate vllm`` reads and how it fits."""

    log: str  # the `vllm serve` log with --enable-logging-iteration-details
    metrics: str  # a /metrics scrape of the same server, after its traffic
    benches: tuple[str, ...] = ()  # `vllm bench serve --save-result` files of the served model
    model: str  # the model spec `simspec simulate --model` will name (simspec.costs.catalog.MODELS)
    device: str  # the device slug `simspec simulate --device` will name
    warmup_steps: int = 1  # first engine steps left out of the fit
    hold_out_every: int = 5  # every k-th remaining step held out of the fit
    sim_seeds: int = 3  # simulator seeds averaged in the replay of each benchmark

    def __post_init__(self):
        require(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        require(self.hold_out_every >= 2, f"hold_out_every must be >= 2 (got {self.hold_out_every})")
        require(self.sim_seeds >= 1, f"sim_seeds must be >= 1 (got {self.sim_seeds})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Comparison:
    """One benchmark replayed into the simulator: live vs simulated."""

    bench: str
    policy: str
    requests: int
    live: dict[str, float]  # COMPARED -> vllm bench's value
    simulated: dict[str, float]  # COMPARED -> the simulator's, mean over sim_seeds


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmCalibration:
    config: CalibrateVllmConfig
    log: ServerLog
    server: ServerMetrics
    fit: StepCostFit  # the iteration lines' fit
    held_out: HeldOutError
    acceptance: ChainAcceptance | None  # None: the server ran without speculation
    comparisons: tuple[Comparison, ...]
    gap: EngineGap | None = None  # the engine's time outside the logged steps; None: no saturated benchmark
    gap_notes: tuple[str, ...] = ()  # saturated benchmarks the log could not place

    @property
    def cost_fit(self) -> StepCostFit:
        """What ``step_costs.json`` holds and the replays price with: the fit, plus the gap where fitted."""
        return self.fit if self.gap is None else with_gap(self.fit, self.gap)


# --- the engine's time outside the logged steps --------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class EngineGap:
    """The engine's time a step outside the logged elapsed time: scheduling,
    input preparation and output processing, serial with the model where
    the server does not overlap them (vLLM on a CPU; vLLM before 2026)."""

    per_step_s: float
    per_sequence_s: float
    runs: tuple[str, ...]
    residual_pct: tuple[float, ...]  # per run: (predicted - measured) / measured gap, %


def fit_engine_gap(runs: list[tuple[str, float, tuple[EngineStep, ...]]]) -> EngineGap:
    """Per-step and per-sequence seconds outside the logged elapsed time
    from runs that never let the engine idle (all requests at once with a
    cap on those in flight): such a run's duration is its steps' elapsed
    time plus this gap over its steps. ``runs`` are (name, duration s,
    the run's steps). Non-negative least squares of relative error over
    two or more runs; one run gives a per-step part alone."""
    rows, gaps = [], []
    for _, duration_s, steps in runs:
        requests = np.array([s.prefill_requests + s.decode_requests for s in steps], dtype=float)
        elapsed_s = np.array([s.elapsed_ms / 1e3 for s in steps], dtype=float)
        rows.append([len(steps), requests.sum()])
        gaps.append(duration_s - elapsed_s.sum())
    x, y = np.array(rows, dtype=float), np.array(gaps)
    if len(runs) == 1:
        coef = np.array([max(y[0], 0.0) / x[0, 0], 0.0])
    else:
        from scipy.optimize import nnls  # only when fitting

        scale = np.where(y > 0, y, 1.0)
        coef, _ = nnls(x / scale[:, None], y / scale)
    predicted = x @ coef
    return EngineGap(per_step_s=float(coef[0]), per_sequence_s=float(coef[1]), runs=tuple(r[0] for r in runs),
                     residual_pct=tuple(float((p / g - 1) * 100) if g > 0 else math.nan
                                        for p, g in zip(predicted, y)))


def with_gap(fit: StepCostFit, gap: EngineGap) -> StepCostFit:
    """The step-cost fit with the engine's time outside the logged steps added."""
    c = dict(fit.coefficients_s)
    c["overhead"] += gap.per_step_s
    c["attn_request"] += gap.per_sequence_s
    return replace(fit, coefficients_s=c, label=fit.label + " + the engine's CPU time outside it (saturated runs)")


def saturated_runs(log: ServerLog, benches: list[BenchResult]) -> tuple[list, tuple[str, ...]]:
    """(name, duration, steps) of each benchmark that kept the engine busy
    (all requests at once, ``--max-concurrency`` set), its steps the log's
    lines during it (:func:`~simspec.vllm.logs.steps_during`), and a note
    for each saturated benchmark that could not be placed in the log."""
    found, notes = [], []
    for b in benches:
        if not (math.isinf(b.request_rate) and b.max_concurrency):
            continue
        steps = steps_during(log, b)
        if steps:
            found.append((Path(b.path).name, b.summary["duration"], steps))
        else:
            notes.append(f"{Path(b.path).name}: no iteration line of the log falls in its time "
                         f"(date {b.date or '?'}, {b.summary.get('duration', 0):.1f} s): not used for the gap")
    return found, tuple(notes)


# --- the calibration ----------------------------------------------------------------------------------

def read_inputs(cfg: CalibrateVllmConfig) -> tuple[ServerLog, ServerMetrics, list[BenchResult]]:
    """The three inputs, checked against each other (one-line InputErrors)."""
    costs.model_spec(cfg.model)
    costs.gpu_spec(cfg.device)  # simulate must know both: refused here, before any work
    log = read_server_log(cfg.log)
    server = read_metrics(cfg.metrics)
    if log.speculative_method is not None:
        require(server.spec_decode is not None,
                f"{cfg.metrics}: no vllm:spec_decode_* counters, but {cfg.log} runs {log.speculative_method} "
                f"speculation (give a /metrics scrape of that server)")
    elif server.spec_decode is not None:
        require(False, f"{cfg.metrics} has speculative counters but {cfg.log} runs without speculation "
                       f"(give the log and the scrape of one server)")
    benches = [read_bench(path, model=log.model) for path in cfg.benches]
    return log, server, benches


def calibrate(cfg: CalibrateVllmConfig) -> VllmCalibration:
    log, server, benches = read_inputs(cfg)
    steps = log.arrays()
    keep = slice(cfg.warmup_steps, None)
    tokens = (steps.prefill_tokens + steps.decode_tokens)[keep]
    requests = (steps.prefill_requests + steps.decode_requests)[keep]
    label = f"fitted to vLLM {log.version or '?'} iteration log ({Path(cfg.log).name})"
    _, fit, held = fit_iteration_costs(tokens, requests, steps.elapsed_ms[keep] / 1e3, label, model=cfg.model,
                                       device=cfg.device, hold_out_every=cfg.hold_out_every)
    saturated, gap_notes = saturated_runs(log, benches)
    gap = fit_engine_gap(saturated) if saturated else None
    chain = None
    if server.spec_decode is not None:
        chain = fit_chain_acceptance(server.spec_decode, log.num_speculative_tokens or
                                     len(server.spec_decode.accepted_per_position),
                                     f"calibrated:vllm-{log.speculative_method}", request_rounds(benches))
    priced = fit if gap is None else with_gap(fit, gap)
    comparisons = tuple(replay(b, priced, chain, cfg, log, server) for b in benches if b.requests is not None)
    return VllmCalibration(config=cfg, log=log, server=server, fit=fit, held_out=held, acceptance=chain,
                           comparisons=comparisons, gap=gap, gap_notes=gap_notes)


def engine_of(cfg: CalibrateVllmConfig, log: ServerLog, server: ServerMetrics) -> configuration.SimConfig:
    """The simulator's scenario of the server: simspec's vllm mode on the
    device, with the server's KV cache size and block size."""
    engine: dict = {"kind": "vllm"}
    if log.kv_cache_tokens:
        engine["kv_cache_tokens"] = log.kv_cache_tokens
    if server.block_size_tokens:
        engine["block_size"] = server.block_size_tokens
    return configuration.build({}, {"model": cfg.model, "device": cfg.device, "engine": engine})


def bench_requests(bench: BenchResult, cached: np.ndarray | None = None) -> list[Request]:
    """The benchmark's completed requests as it sent them: arrivals from its
    start (its first send after :attr:`~simspec.vllm.logs.BenchResult.lead_s`,
    so the simulated run's duration spans what the benchmark's did), its
    prompt and output lengths, in arrival order. ``cached``
    (per request of the bench, in its order): prompt tokens the server had
    in its prefix cache already, left out of the prompt the simulator
    prefills (the fitted step costs have no per-context term, so this
    prices what the server computed)."""
    r = bench.requests
    require(r is not None, f"{bench.path}: no per-request arrays (run vllm bench serve with --save-detailed)")
    ok = np.flatnonzero(r.ok)
    arrival = r.arrival_s + bench.lead_s
    order = ok[np.argsort(arrival[ok], kind="stable")]
    hit = np.zeros(len(r.input_tokens), np.int64) if cached is None else np.asarray(cached, np.int64)
    return [Request(id=i, arrival_s=float(arrival[j]), prompt_tokens=int(r.input_tokens[j] - hit[j]),
                    output_tokens=int(r.output_tokens[j])) for i, j in enumerate(order)]


def replay_requests(bench: BenchResult, policy: str, cost_model, acceptance: AcceptanceModel | None, engine,
                    kv_budget_tokens: int, seeds: int, cached: np.ndarray | None = None
                    ) -> tuple[dict[str, float], object]:
    """Serve ``bench``'s own arrivals and lengths in the simulator, ``seeds``
    times: the mean of each metric, and the first seed's run log
    (``cached``: as :func:`bench_requests`)."""
    from simspec import metrics, policies
    from simspec.sim import simulate

    requests = bench_requests(bench, cached)
    logs = [simulate(requests, policy=policies.parse(policy), label=policy, costs=cost_model,
                     acceptance=acceptance or AcceptanceModel.iid(0.5), engine=engine,
                     kv_budget_tokens=kv_budget_tokens, seed=seed) for seed in range(seeds)]
    rows = [metrics.summarize(log) for log in logs]
    return {k: float(np.mean([row[k] for row in rows])) for k in rows[0]}, logs[0]


def replay(bench: BenchResult, fit: StepCostFit, chain: ChainAcceptance | None, cfg: CalibrateVllmConfig,
           log: ServerLog, server: ServerMetrics) -> Comparison:
    """Serve ``bench``'s own arrivals and lengths in the simulator with the
    calibration (policy ar for a run without drafts, else linear:k=K)."""
    spec = "ar" if bench.spec_decode is None or chain is None else f"linear:k={chain.k}"
    scenario = engine_of(cfg, log, server)
    model, gpu = costs.model_spec(cfg.model), costs.gpu_spec(cfg.device)
    budget = scenario.engine.kv_budget_tokens(model, gpu)
    means, _ = replay_requests(bench, spec, fit.cost_model(), chain.model if chain is not None else None,
                               scenario.engine, budget, cfg.sim_seeds)
    simulated = {k: means[k] for k in COMPARED}
    live = {k: float(bench.summary.get(k, np.nan)) for k in COMPARED}
    if bench.spec_decode is None:
        live["spec_decode_acceptance_length"] = 1.0
    return Comparison(bench=bench.path, policy=spec, requests=len(bench_requests(bench)), live=live,
                      simulated=simulated)


# --- output -------------------------------------------------------------------------------------------

def simulate_command(out: str | Path, cal: VllmCalibration) -> str:
    """The ``simspec simulate`` line that uses the folder."""
    cfg, k = cal.config, cal.acceptance.k if cal.acceptance else 0
    line = (f"simspec simulate --engine vllm --model {cfg.model} --device {cfg.device} "
            f"--cost-model steps:{Path(out) / 'step_costs.json'}")
    if cal.log.kv_cache_tokens:
        line += f" --kv-cache-tokens {cal.log.kv_cache_tokens}"
    if cal.acceptance:
        line += f" --acceptance {Path(out) / 'acceptance.json'} --policy ar --policy linear:k={k}"
    return line + " --multimodal-share 0"


def summary_record(cal: VllmCalibration, out: str | Path) -> dict:
    log, cfg = cal.log, cal.config
    return {
        "format": "simspec-vllm-calibration/1", "simspec_version": __version__,
        "inputs": {"log": cfg.log, "metrics": cfg.metrics, "benches": list(cfg.benches)},
        "served": {"model": log.model, "vllm_version": log.version, "dtype": log.dtype,
                   "speculative_method": log.speculative_method, "speculative_model": log.speculative_model,
                   "num_speculative_tokens": log.num_speculative_tokens, "kv_cache_tokens": log.kv_cache_tokens,
                   "block_size_tokens": cal.server.block_size_tokens, "max_model_len": log.max_model_len,
                   "prefix_caching": log.prefix_caching, "chunked_prefill": log.chunked_prefill},
        "stands_in": {"model": cfg.model, "device": cfg.device,
                      "why": "simulate needs a model spec and a device it knows; with a steps cost model the "
                             "spec's shapes price nothing, its name and context limit are checked, and the KV "
                             "cache is the server's (--kv-cache-tokens)"},
        "step_fit": {"terms": ["overhead", "target_token", "attn_request"], "warmup_steps": cfg.warmup_steps,
                     "steps_in_log": len(log.steps), "coefficients_s": {
                         k: cal.fit.coefficients_s[k] for k in ("overhead", "target_token", "attn_request")},
                     "fitted_median_pct": cal.fit.median_abs_pct_error, "held_out": asdict(cal.held_out),
                     "outside_elapsed": None if cal.gap is None else asdict(cal.gap),
                     "outside_elapsed_notes": list(cal.gap_notes),
                     "not_identified": "attention's per-context term (no context lengths in the log: inside the "
                                       "per-token and per-sequence terms at these contexts), the LM head (in "
                                       "the per-token term), the drafter's terms (in the terms they grow with; "
                                       "0 in the model); scheduling and output processing are not in the "
                                       "elapsed time: outside_elapsed adds them where a saturated benchmark "
                                       "(all requests at once, --max-concurrency) was given"},
        "acceptance": None if cal.acceptance is None else {
            "per_position_rates": list(cal.acceptance.rates),
            "model_per_position_rates": list(cal.acceptance.model_rates),
            "acceptance_length": cal.acceptance.counters.acceptance_length,
            "draft_tokens_per_draft": cal.acceptance.draft_tokens_per_draft},
        "comparisons": [asdict(c) for c in cal.comparisons],
        "simulate": simulate_command(out, cal),
    }


def write(out: str | Path, cal: VllmCalibration) -> list[str]:
    """Write the folder (built beside ``out``, moved into place whole, the
    marker last); returns its files."""
    check_target(out)
    with staged_folder(out) as folder:
        write_text(folder / "step_costs.json", dump_json({
            **cal.cost_fit.to_json(), "held_out": asdict(cal.held_out),
            "outside_elapsed": None if cal.gap is None else asdict(cal.gap)}, sort_keys=False))
        if cal.acceptance is not None:
            write_text(folder / "acceptance.json", dump_json(
                acceptance_record(cal.acceptance, cal.config.model, cal.config.metrics), sort_keys=False))
        write_text(folder / "calibration.json", dump_json(summary_record(cal, out), sort_keys=False))
        files = sorted(p.name for p in folder.iterdir())
        write_text(folder / MARKER, dump_json({"kind": "calibrate vllm", "simspec_version": __version__,
                                               "complete": True, "files": files}))
    return files
