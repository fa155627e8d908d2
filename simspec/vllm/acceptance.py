"""The acceptance a real vLLM's ``/metrics`` counters show, mapped onto
simspec's acceptance model (simspec.acceptance.model), for ``simspec
calibrate vllm`` and ``simspec validate --against vllm``.

Per position j the counters give the rate accepted_per_pos[j] / num_drafts
(drafts that had their j-th token accepted), which is what the simulator's
chain acceptance must give at depth j. The model's three parameters that
shape a chain's acceptance (the top-1 logit, its decay per depth, the
per-request spread) are fitted by least squares to those rates; where the
benchmarks' per-request chunks show every round is a K-token draft, a
fourth, the round term ``round_sigma``, is fitted with them to the
requests' spread of tokens a round (simspec.vllm.calibrate's docstring
says why and what is approximated).

Imports: numpy, scipy (inside the fits), simspec.acceptance, simspec.vllm.logs, simspec.types.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from simspec.acceptance import AcceptanceModel
from simspec.acceptance.fit import ACCEPTANCE_FORMAT
from simspec.types import require
from simspec.vllm.logs import SpecDecodeCounters

LOGIT_LIMIT = 13.8  # |top-1 logit| at most: a rate of 1 - 1e-6 a position
SIGMA_LIMIT = 20.0  # the requests' spread of that logit at most: a draft that copies whole runs or nothing is nearly flat
_Z = np.linspace(-8.0, 8.0, 4001)
QUADRATURE = (_Z, np.exp(-0.5 * _Z ** 2))  # nodes and weights for E over N(0, 1): a dense grid, not Gauss-Hermite,
# because at a large spread sigmoid(a + sigma z) is a step in z that a few nodes would place wrongly
GRID_STEP = 0.02  # logit units between the points a round term's average is computed on
MIN_SPREAD_REQUESTS = 8  # requests with per-request timing the spread fit needs at least
ROUNDS_MATCH = 0.03  # the chunks' tokens a round within this of the counters' acceptance length

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
