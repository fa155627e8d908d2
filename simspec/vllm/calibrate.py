"""``simspec calibrate vllm``: a real vLLM server's step costs and acceptance,
from what it writes, in the files ``simspec simulate``
reads (``--cost-model steps:FILE``, ``--acceptance FILE``).

Imports: numpy, scipy, simspec.vllm.logs, simspec.costs (the step-cost
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
from simspec.acceptance.fit import ACCEPTANCE_FORMAT
from simspec.costs.steps import HeldOutError, StepCostFit, fit_iteration_costs
from simspec.files import dump_json, staged_folder, write_text
from simspec.runfolder import MARKER, check_target
from simspec.types import Request, require
from simspec.vllm.logs import BenchResult, EngineStep, ServerLog, ServerMetrics, SpecDecodeCounters, read_bench, \
    read_metrics, read_server_log, steps_during

LOGIT_LIMIT = 13.8  # |top-1 logit| at most: a rate of 1 - 1e-6 a position
SIGMA_LIMIT = 20.0  # the requests' spread of that logit at most: a draft that copies whole runs or nothing is nearly flat
_Z = np.linspace(-8.0, 8.0, 4001)
QUADRATURE = (_Z, np.exp(-0.5 * _Z ** 2))  # nodes and weights for E over N(0, 1): a dense grid, not Gauss-Hermite,
# because at a large spread sigmoid(a + sigma z) is a step in z that a few nodes would place wrongly
GRID_STEP = 0.02  # logit units between the points a round term's average is computed on
MIN_SPREAD_REQUESTS = 8  # requests with per-request timing the spread fit needs at least
ROUNDS_MATCH = 0.03  # the chunks' tokens a round within this of the counters' acceptance length
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
    # (the requests' standard deviation of tokens a round, the model's) where
    # per-request timing was given; None without
    spread: tuple[float, float] | None = None
    spread_unused: str | None = None  # why the spread did not shape the fit (None: it did, or none was given)
    # the pooled tokens a round's standard error over the requests, as a share (RequestRounds.relative_se):
    # how far the counters' acceptance would move on other prompts of the same shape; None without timing
    sampling_se: float | None = None
    requests: int = 0  # how many requests' timing gave the spread and sampling_se

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


# --- acceptance ---------------------------------------------------------------------------------------

def round_chains(points: np.ndarray, decay: float, round_sigma: float, k: int) -> np.ndarray:
    """[P, k] P(depths 1..j all accepted) for a round whose depth-1 logit is
    ``points`` + round_sigma w, w ~ N(0, 1), averaged over w: each chain
    evaluated on a fine logit grid and smoothed by the round term's Gaussian
    (a convolution), read back at ``points``."""
    if round_sigma <= 0.0:
        return np.cumprod(1.0 / (1.0 + np.exp(-(points[:, None] - decay * np.arange(k)[None, :]))), axis=1)
    reach = 8.0 * round_sigma
    grid = np.arange(points.min() - reach - 1.0, points.max() + reach + 1.0 + GRID_STEP, GRID_STEP)
    chains = np.cumprod(1.0 / (1.0 + np.exp(-(grid[:, None] - decay * np.arange(k)[None, :]))), axis=1)  # [G, k]
    offsets = np.arange(-int(reach / GRID_STEP), int(reach / GRID_STEP) + 1) * GRID_STEP
    kernel = np.exp(-0.5 * (offsets / round_sigma) ** 2)
    kernel /= kernel.sum()
    from scipy.signal import fftconvolve  # only when calibrating: the CLI's parser imports this module

    smooth = fftconvolve(chains, kernel[:, None], mode="same", axes=0)  # symmetric kernel: E over w at each point
    return np.stack([np.interp(points, grid, smooth[:, j]) for j in range(k)], axis=1)


def _chains(top1_logit: float, decay: float, sigma: float, k: int, round_sigma: float = 0.0) -> np.ndarray:
    """[N, k] expected chains over the quadrature's request difficulties z."""
    return round_chains(top1_logit + sigma * QUADRATURE[0], decay, round_sigma, k)


def _rates(chains: np.ndarray) -> np.ndarray:
    """[k] the chains averaged over drafts (:func:`chain_rates`)."""
    per_draft = QUADRATURE[1] / (1.0 + chains.sum(axis=1))  # drafts a difficulty makes per output token
    return per_draft @ chains / per_draft.sum()


def _spread(chains: np.ndarray, tokens_after_first: np.ndarray) -> tuple[float, float]:
    """(mean, standard deviation) over requests of tokens a round (:func:`request_spread`)."""
    weights = QUADRATURE[1] / QUADRATURE[1].sum()
    k = chains.shape[1]
    m = 1.0 + chains.sum(axis=1)  # tokens a round: 1 + accepted, E[accepted] = sum_j P(accepted >= j)
    second = chains @ (2.0 * np.arange(1, k + 1) - 1.0)  # E[accepted^2] = sum_j (2j - 1) P(accepted >= j)
    v = second - (m - 1.0) ** 2
    mean = float(weights @ m)
    var = float(weights @ (m - mean) ** 2 + (weights @ (v * m)) * np.mean(1.0 / tokens_after_first))
    return mean, float(np.sqrt(max(var, 0.0)))


def chain_rates(top1_logit: float, decay: float, sigma: float, k: int, round_sigma: float = 0.0) -> np.ndarray:
    """[k] P(depths 1..j all accepted) per draft, as vLLM's counters average
    it, under simspec's acceptance model with token noise off: per request
    z ~ N(0, 1) and per round w ~ N(0, 1),
    p_d = sigmoid(top1_logit + sigma z + round_sigma w - decay (d - 1)).

    The counters average over drafts, not requests: a request that accepts
    little takes more rounds for its output and so counts more often. A
    request of difficulty z drafts in proportion to 1 / E[tokens a round | z]
    = 1 / (1 + sum_j chain_j(z)) rounds a token, so each z is weighted by
    that (equal outputs across difficulties)."""
    return _rates(_chains(top1_logit, decay, sigma, k, round_sigma))


def request_spread(top1_logit: float, decay: float, sigma: float, k: int, round_sigma: float,
                   tokens_after_first: np.ndarray) -> tuple[float, float]:
    """(mean, standard deviation) over requests of each request's tokens a
    round, for requests of ``tokens_after_first`` output tokens after the
    first: the spread of the difficulties' means, plus the sampling spread
    of a mean over a request's rounds (variance v(z) m(z) / L for L tokens
    in about L / m(z) rounds of mean m(z) and variance v(z))."""
    return _spread(_chains(top1_logit, decay, sigma, k, round_sigma), tokens_after_first)


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRounds:
    """Each completed request's tokens a streamed chunk after its first, from
    benchmarks' per-request timing (``itls``: one gap a chunk; vLLM streams
    a request's tokens of one engine step as one chunk, so a chunk is a
    round)."""

    tokens_per_round: np.ndarray  # [R]
    tokens_after_first: np.ndarray  # [R] output tokens after the first

    @property
    def rounds(self) -> np.ndarray:
        """[R] each request's chunks after its first."""
        return self.tokens_after_first / self.tokens_per_round

    @property
    def pooled(self) -> float:
        return float(self.tokens_after_first.sum() / self.rounds.sum())

    @property
    def spread(self) -> float:
        return float(self.tokens_per_round.std(ddof=1))

    @property
    def relative_se(self) -> float:
        """The pooled tokens a round's standard error over these requests,
        as a share of it: how far the same measurement on another set of
        prompts of this shape would typically land (a ratio estimator's
        linearised variance, sum(a) / sum(r) with a the tokens and r the
        rounds of each request)."""
        tokens, rounds = self.tokens_after_first, self.rounds
        n, ratio = len(tokens), float(tokens.sum() / rounds.sum())
        residual = tokens - ratio * rounds
        return float(np.sqrt((residual @ residual) / (n * (n - 1))) / rounds.mean() / ratio)


def request_rounds(benches) -> RequestRounds | None:
    """The requests of ``benches`` (BenchResult) with at least two chunks
    after their first token; None when there are fewer than MIN_SPREAD_REQUESTS."""
    per_round, after = [], []
    for bench in benches:
        r = bench.requests
        if r is None:
            continue
        for ok, out, gaps in zip(r.ok, r.output_tokens, r.itl_s):
            if ok and len(gaps) >= 2 and out - 1 >= len(gaps):
                per_round.append((out - 1) / len(gaps))
                after.append(out - 1)
    if len(per_round) < MIN_SPREAD_REQUESTS:
        return None
    return RequestRounds(tokens_per_round=np.array(per_round), tokens_after_first=np.array(after, float))


def spread_usable(counters: SpecDecodeCounters, k: int, rounds: RequestRounds | None, rates: np.ndarray) -> str | None:
    """Why the requests' spread cannot shape the fit (None: it can). Each
    round must be a draft of K tokens, as the simulator drafts: the chunks'
    pooled tokens a round must be the counters' acceptance length (ngram,
    which finds no match in some rounds, drafts fewer), and the rates must
    leave room for a spread (not an oracle's 1s)."""
    if rounds is None:
        return f"fewer than {MIN_SPREAD_REQUESTS} requests with per-request token timing"
    if counters.draft_tokens < (k - 0.01) * counters.num_drafts:
        return f"the drafter proposed {counters.draft_tokens / counters.num_drafts:.2f} of {k} tokens a draft"
    gap = rounds.pooled / counters.acceptance_length - 1.0
    if abs(gap) > ROUNDS_MATCH:
        return (f"the chunks' {rounds.pooled:.3f} tokens a round differ from the counters' acceptance length "
                f"{counters.acceptance_length:.3f} by {100 * gap:+.1f}% (rounds without drafts, or merged chunks)")
    if rates.min() >= 0.999 or rates.max() <= 0.001:
        return "every draft token accepted (or none): no spread to fit"
    return None


def fit_chain_acceptance(counters: SpecDecodeCounters, k: int, name: str,
                         rounds: RequestRounds | None = None) -> ChainAcceptance:
    """The acceptance model whose chain rates match the counters' per-position
    rates, and, where ``rounds`` may shape it (:func:`spread_usable`), whose
    requests' spread of tokens a round matches theirs (module docstring)."""
    require(counters.num_drafts > 0, "the speculative counters hold no draft (the server drafted nothing)")
    rates = np.array(counters.per_position_rates[:k] + (0.0,) * max(k - len(counters.per_position_rates), 0))
    target = np.clip(rates, 1e-6, 1 - 1e-6)

    def residual(theta):
        return chain_rates(theta[0], theta[1], theta[2], k) - target

    start = [float(np.clip(np.log(target[0] / (1 - target[0])), -LOGIT_LIMIT, LOGIT_LIMIT)), 0.1, 0.5]
    from scipy.optimize import least_squares  # only when calibrating: the CLI's parser imports this module

    best = least_squares(residual, start, bounds=([-LOGIT_LIMIT, 0.0, 0.0], [LOGIT_LIMIT, 5.0, SIGMA_LIMIT]))
    a, decay, sigma = (float(v) for v in best.x)
    round_sigma, why_not = 0.0, spread_usable(counters, k, rounds, rates)
    if why_not is None:
        observed = rounds.spread

        def with_spread(theta):  # one evaluation of the chains for both targets
            chains = _chains(theta[0], theta[1], theta[2], k, theta[3])
            spread = _spread(chains, rounds.tokens_after_first)[1]
            return np.append(_rates(chains) - target, (spread - observed) / (1.0 + k))

        fitted = least_squares(with_spread, [a, decay, sigma, 1.0],
                               bounds=([-LOGIT_LIMIT, 0.0, 0.0, 0.0], [LOGIT_LIMIT, 5.0, SIGMA_LIMIT, SIGMA_LIMIT]))
        a, decay, sigma, round_sigma = (float(v) for v in fitted.x)
    model = AcceptanceModel(name=name, top1_logit=a, depth_decay_logit=decay, request_sigma=sigma,
                            round_sigma=round_sigma, token_sigma=0.0, visual_share=0.0)
    chains = _chains(a, decay, sigma, k, round_sigma)
    spread = None if rounds is None else (rounds.spread, _spread(chains, rounds.tokens_after_first)[1])
    return ChainAcceptance(counters=counters, k=k, rates=tuple(float(r) for r in rates),
                           model_rates=tuple(float(r) for r in _rates(chains)),
                           model=model, spread=spread, spread_unused=why_not,
                           sampling_se=None if rounds is None else rounds.relative_se,
                           requests=0 if rounds is None else len(rounds.tokens_per_round))


def spread_text(chain: ChainAcceptance) -> str:
    """One phrase on the requests' spread of tokens a round and the fit's use of it."""
    if chain.spread is None:
        return "no per-request token timing (requests' spread not fitted)"
    measured, model = chain.spread
    use = (f"round term {chain.model.round_sigma:.2f} fitted to it" if chain.spread_unused is None
           else f"not fitted: {chain.spread_unused}")
    return (f"requests' s.d. of tokens a round {measured:.3f} (model {model:.3f}; {use}); sampling error of "
            f"the acceptance over these {chain.requests} requests' prompts ±{100 * chain.sampling_se:.1f}%")


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
        "requests_spread_of_tokens_per_round": None if chain.spread is None else
        {"measured": chain.spread[0], "model": chain.spread[1], "shaped_the_fit": chain.spread_unused is None,
         "why_not": chain.spread_unused, "requests": chain.requests,
         "acceptance_sampling_relative_se": chain.sampling_se},
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
