"""``simspec calibrate vllm``: a real vLLM server's step costs and acceptance,
from what it writes (issue 20, item 1), in the files ``simspec simulate``
reads (``--cost-model steps:FILE``, ``--acceptance FILE``).

Imports: numpy, scipy, simspec.vllm_logs, simspec.costs (the step-cost
fit), simspec.acceptance, simspec.config, simspec.engines, simspec.sim and
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
  processing, so the fit is of that part: the engine's CPU time around it is
  not in it.
- **Acceptance** from the ``/metrics`` counters: per position j the rate
  accepted_per_pos[j] / num_drafts (drafts that had their j-th token
  accepted), which is what the simulator's chain acceptance must give at
  depth j. Those rates are mapped onto simspec's acceptance model (module
  simspec.acceptance.model) with its three parameters that shape a chain's
  acceptance: the top-1 logit, its decay per depth and the per-request
  spread (token and confidence noise off: the counters say nothing of
  them), fitted by least squares to the rates (Gauss-Hermite quadrature over
  the requests' spread). Two approximations, both written into
  ``acceptance.json``: a rate of exactly 1 (an identical-weight drafter) is
  held at the model's largest logit (rate 1 - 1e-6 a position); and ngram
  may draft fewer than K tokens (``draft_tokens / num_drafts`` < K), which
  the rates already count as not accepted, but the simulator drafts and
  verifies all K, so it prices a little more verification than vLLM ran.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from simspec import __version__, config as configuration, costs
from simspec.acceptance import AcceptanceModel
from simspec.acceptance.fit import ACCEPTANCE_FORMAT
from simspec.costs.steps import HeldOutError, StepCostFit, fit_iteration_costs
from simspec.files import dump_json, staged_folder, write_text
from simspec.runfolder import MARKER, check_target
from simspec.types import Request, require
from simspec.vllm_logs import BenchResult, ServerLog, ServerMetrics, SpecDecodeCounters, read_bench, read_metrics, \
    read_server_log

LOGIT_LIMIT = 13.8  # |top-1 logit| at most: a rate of 1 - 1e-6 a position
SIGMA_LIMIT = 20.0  # the requests' spread of that logit at most: a draft that copies whole runs or nothing is nearly flat
_Z = np.linspace(-8.0, 8.0, 4001)
QUADRATURE = (_Z, np.exp(-0.5 * _Z ** 2))  # nodes and weights for E over N(0, 1): a dense grid, not Gauss-Hermite,
# because at a large spread sigmoid(a + sigma z) is a step in z that a few nodes would place wrongly
COMPARED = ("mean_e2el_ms", "mean_tpot_ms", "mean_ttft_ms", "p95_e2el_ms", "output_throughput",
            "spec_decode_acceptance_length")


@dataclass(frozen=True, slots=True, kw_only=True)
class CalibrateVllmConfig:
    """What ``simspec calibrate vllm`` reads and how it fits."""

    log: str  # the `vllm serve` log with --enable-logging-iteration-details
    metrics: str  # a /metrics scrape of the same server, after its traffic
    benches: tuple[str, ...] = ()  # `vllm bench serve --save-result` files of the served model
    model: str  # the model spec `simspec simulate --model` will name (simspec.costs.specs.MODELS)
    device: str  # the device slug `simspec simulate --device` will name
    warmup_steps: int = 1  # first engine steps left out of the fit
    hold_out_every: int = 5  # every k-th remaining step held out of the fit
    sim_seeds: int = 3  # simulator seeds averaged in the replay of each benchmark

    def __post_init__(self):
        require(self.warmup_steps >= 0, f"warmup_steps must be >= 0 (got {self.warmup_steps})")
        require(self.hold_out_every >= 2, f"hold_out_every must be >= 2 (got {self.hold_out_every})")
        require(self.sim_seeds >= 1, f"sim_seeds must be >= 1 (got {self.sim_seeds})")


@dataclass(frozen=True, slots=True, kw_only=True)
class ChainAcceptance:
    """The counters' acceptance and the model mapped onto it."""

    counters: SpecDecodeCounters
    k: int  # num_speculative_tokens of the server
    rates: tuple[float, ...]  # [K] accepted_per_pos / num_drafts
    model_rates: tuple[float, ...]  # [K] the fitted model's chain rates at each depth
    model: AcceptanceModel

    @property
    def draft_tokens_per_draft(self) -> float:
        return self.counters.draft_tokens / self.counters.num_drafts


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
    fit: StepCostFit
    held_out: HeldOutError
    acceptance: ChainAcceptance | None  # None: the server ran without speculation
    comparisons: tuple[Comparison, ...]


# --- acceptance ---------------------------------------------------------------------------------------

def chain_rates(top1_logit: float, decay: float, sigma: float, k: int) -> np.ndarray:
    """[k] P(depths 1..j all accepted) per draft, as vLLM's counters average
    it, under simspec's acceptance model with token noise off: per request
    z ~ N(0, 1), p_d = sigmoid(top1_logit + sigma z - decay (d - 1)).

    The counters average over drafts, not requests: a request that accepts
    little takes more rounds for its output and so counts more often. A
    request of difficulty z drafts in proportion to 1 / E[tokens a round | z]
    = 1 / (1 + sum_j chain_j(z)) rounds a token, so each z is weighted by
    that (equal outputs across difficulties)."""
    nodes, weights = QUADRATURE
    logits = top1_logit + sigma * nodes[:, None] - decay * np.arange(k)[None, :]  # [N, k]
    chains = np.cumprod(1.0 / (1.0 + np.exp(-logits)), axis=1)  # [N, k]
    per_draft = weights / (1.0 + chains.sum(axis=1))  # [N] drafts a request of difficulty z makes, per token
    return per_draft @ chains / per_draft.sum()


def fit_chain_acceptance(counters: SpecDecodeCounters, k: int, name: str) -> ChainAcceptance:
    """The acceptance model whose chain rates match the counters' per-position
    rates (module docstring)."""
    require(counters.num_drafts > 0, "the speculative counters hold no draft (the server drafted nothing)")
    rates = np.array(counters.per_position_rates[:k] + (0.0,) * max(k - len(counters.per_position_rates), 0))
    target = np.clip(rates, 1e-6, 1 - 1e-6)

    def residual(theta):
        return chain_rates(theta[0], theta[1], theta[2], k) - target

    start = [float(np.clip(np.log(target[0] / (1 - target[0])), -LOGIT_LIMIT, LOGIT_LIMIT)), 0.1, 0.5]
    from scipy.optimize import least_squares  # only when calibrating: the CLI's parser imports this module

    best = least_squares(residual, start, bounds=([-LOGIT_LIMIT, 0.0, 0.0], [LOGIT_LIMIT, 5.0, SIGMA_LIMIT]))
    a, decay, sigma = (float(v) for v in best.x)
    model = AcceptanceModel(name=name, top1_logit=a, depth_decay_logit=decay, request_sigma=sigma,
                            token_sigma=0.0, visual_share=0.0)
    return ChainAcceptance(counters=counters, k=k, rates=tuple(float(r) for r in rates),
                           model_rates=tuple(float(r) for r in chain_rates(a, decay, sigma, k)), model=model)


def acceptance_record(chain: ChainAcceptance, fitted_to: str, metrics_path: str) -> dict:
    """``acceptance.json`` as ``simspec.acceptance.load_acceptance`` reads it,
    with the counters and the mapping's approximations."""
    c = chain.counters
    return {"format": ACCEPTANCE_FORMAT, "model": asdict(chain.model), "source": {
        "model": fitted_to, "from": f"vLLM /metrics counters ({metrics_path})",
        "num_speculative_tokens": chain.k, "num_drafts": c.num_drafts, "draft_tokens": c.draft_tokens,
        "accepted_tokens": c.accepted_tokens, "accepted_per_position": list(c.accepted_per_position),
        "per_position_rates": list(chain.rates), "model_per_position_rates": list(chain.model_rates),
        "draft_tokens_per_draft": chain.draft_tokens_per_draft, "acceptance_length": c.acceptance_length,
        "approximations": "chain rates fitted with token and confidence noise off; a rate of 1 held at "
                          "1 - 1e-6; the simulator drafts all K tokens where vLLM drafted "
                          f"{chain.draft_tokens_per_draft:.2f} a draft"}}


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
    chain = None
    if server.spec_decode is not None:
        chain = fit_chain_acceptance(server.spec_decode, log.num_speculative_tokens or
                                     len(server.spec_decode.accepted_per_position),
                                     f"calibrated:vllm-{log.speculative_method}")
    comparisons = tuple(replay(b, fit, chain, cfg, log, server) for b in benches if b.requests is not None)
    return VllmCalibration(config=cfg, log=log, server=server, fit=fit, held_out=held, acceptance=chain,
                           comparisons=comparisons)


def engine_of(cfg: CalibrateVllmConfig, log: ServerLog, server: ServerMetrics) -> configuration.SimConfig:
    """The simulator's scenario of the server: simspec's vllm mode on the
    device, with the server's KV cache size and block size."""
    engine: dict = {"kind": "vllm"}
    if log.kv_cache_tokens:
        engine["kv_cache_tokens"] = log.kv_cache_tokens
    if server.block_size_tokens:
        engine["block_size"] = server.block_size_tokens
    return configuration.build({}, {"model": cfg.model, "device": cfg.device, "engine": engine})


def bench_requests(bench: BenchResult) -> list[Request]:
    """The benchmark's completed requests as it sent them: arrivals from its
    first send, its prompt and output lengths, in arrival order."""
    r = bench.requests
    require(r is not None, f"{bench.path}: no per-request arrays (run vllm bench serve with --save-detailed)")
    ok = np.flatnonzero(r.ok)
    arrival = r.arrival_s
    order = ok[np.argsort(arrival[ok], kind="stable")]
    return [Request(id=i, arrival_s=float(arrival[j]), prompt_tokens=int(r.input_tokens[j]),
                    output_tokens=int(r.output_tokens[j])) for i, j in enumerate(order)]


def replay_requests(bench: BenchResult, policy: str, cost_model, acceptance: AcceptanceModel | None, engine,
                    kv_budget_tokens: int, seeds: int) -> tuple[dict[str, float], object]:
    """Serve ``bench``'s own arrivals and lengths in the simulator, ``seeds``
    times: the mean of each metric, and the first seed's run log."""
    from simspec import metrics, policies
    from simspec.sim import simulate

    requests = bench_requests(bench)
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
                     "not_identified": "attention's per-context term (no context lengths in the log: inside the "
                                       "per-token and per-sequence terms at these contexts), the LM head (in "
                                       "the per-token term), the drafter's terms (in the terms they grow with; "
                                       "0 in the model), scheduling and output processing (not in the elapsed "
                                       "time)"},
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
        write_text(folder / "step_costs.json", dump_json({**cal.fit.to_json(),
                                                          "held_out": asdict(cal.held_out)}, sort_keys=False))
        if cal.acceptance is not None:
            write_text(folder / "acceptance.json", dump_json(
                acceptance_record(cal.acceptance, cal.config.model, cal.config.metrics), sort_keys=False))
        write_text(folder / "calibration.json", dump_json(summary_record(cal, out), sort_keys=False))
        files = sorted(p.name for p in folder.iterdir())
        write_text(folder / MARKER, dump_json({"kind": "calibrate vllm", "simspec_version": __version__,
                                               "complete": True, "files": files}))
    return files
