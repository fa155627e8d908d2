"""Workloads: when requests arrive and what they ask for.

Arrival processes are Poisson, Gamma renewal (vLLM's ``--burstiness`` is the
Gamma shape, inter-arrival CV = 1/sqrt(shape)), on/off bursts (a two-state
Markov-modulated Poisson process) and replay of a real trace with optional
time scaling. Each request gets a text prompt, zero or more images (each
worth the model's fixed number of visual tokens) and an output length, drawn
from lognormal distributions or taken from the trace. Trace readers cover the
Azure LLM 2023 and Azure LMM 2025 CSV schemas and vLLM/AIPerf Mooncake-style
JSONL. Implements DESIGN.md, section "Workloads".

Imports: the standard library, numpy, pandas and ``simspec.types`` only (no
simpy, no torch), so workloads can be built and inspected without the engine.

Randomness comes from three streams (:class:`WorkloadStreams`): arrivals,
lengths, images. Each request consumes a fixed number of draws from the
lengths and images streams whatever the settings, so two scenarios with the
same seed share arrival times and lengths and differ only in what changed
(common random numbers); e.g. raising ``multimodal_share`` only adds images.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simspec.traces import MAX_COUNT, Trace, read_trace  # noqa: F401 - workloads.read_trace, as before
from simspec.types import InputError, Request, check_types, require

ARRIVALS = ("poisson", "gamma", "onoff", "trace")
OVER_CONTEXT = ("clip", "error")
RESCALES = ("none", "vllm")
MAX_REQUESTS = 10_000_000
"""Requests one run may serve at most (a run of 10 million takes hours; the memory stays bounded)."""
# Allowed ranges of the synthetic workload's numbers: wide enough for any
# study, narrow enough that no draw overflows or takes forever.
BOUNDS = {
    "rate_per_s": (1e-6, 1e6),  # requests/s
    "burstiness": (1e-3, 1e3),  # Gamma shape: CV from 31.6 to 0.03
    "on_s": (1e-6, 1e6), "off_s": (1e-6, 1e6),  # s
    "prompt_mean_tokens": (1.0, float(MAX_COUNT)), "output_mean_tokens": (1.0, float(MAX_COUNT)),
    "trace_speedup": (1e-6, 1e6), "on_off_ratio": (1.0, 1e6),
    "prompt_cv": (0.0, 100.0), "output_cv": (0.0, 100.0),  # lognormal spread
}


def cv_to_burstiness(cv: float) -> float:
    """Gamma shape (vLLM ``--burstiness``) whose inter-arrival CV is ``cv``."""
    low, high = (1 / math.sqrt(b) for b in reversed(BOUNDS["burstiness"]))
    require(low <= cv <= high, f"cv must be in [{low:.4g}, {high:.4g}] (got {cv})")
    return 1.0 / cv**2


def arrival_cv(workload: "WorkloadConfig") -> float:
    """The inter-arrival CV a tuned schedule is picked by: 1/sqrt(shape) for
    Gamma arrivals, 1 otherwise (Poisson; traces and on/off as tuned)."""
    return workload.burstiness ** -0.5 if workload.arrival == "gamma" else 1.0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadConfig:
    """How a synthetic workload is drawn, or which trace is replayed."""

    arrival: str = "gamma"  # "poisson" | "gamma" | "onoff" | "trace"
    rate_per_s: float = 2.0  # mean request rate (ignored for trace)
    burstiness: float = 0.25  # Gamma shape; CV = 1/sqrt(shape), 0.25 -> CV 2
    on_s: float = 5.0  # onoff: mean ON period (exponential)
    off_s: float = 15.0  # onoff: mean OFF period (exponential)
    on_off_ratio: float = 10.0  # onoff: rate while ON / rate while OFF
    num_requests: int | None = 500  # stop after this many requests ...
    duration_s: float | None = None  # ... or at this time (trace: both None = whole trace)
    multimodal_share: float = 0.5  # share of requests with images (synthetic, text-only traces)
    images_min: int = 1  # images per multimodal request: uniform in [min, max]
    images_max: int = 1
    prompt_mean_tokens: float = 256.0  # text prompt: lognormal mean and CV
    prompt_cv: float = 1.0
    output_mean_tokens: float = 200.0  # output: lognormal mean and CV
    output_cv: float = 0.8
    trace_path: str | None = None
    trace_speedup: float = 1.0  # trace arrival times are divided by this
    # A request longer than the model's context: "clip" cuts its prompt
    # (down to 1 token), then its output, to fit, and the run reports how
    # many it cut; "error" refuses the workload, naming the request.
    over_context: str = "clip"
    # "vllm": Poisson or Gamma arrivals drawn as `vllm bench serve` draws
    # them: num_requests gaps, summed, then scaled so that the last request
    # arrives at num_requests / rate_per_s, the first one gap after the
    # benchmark starts (vllm/benchmarks/serve.py 0.33, lines 485-526).
    arrival_rescale: str = "none"
    # Shared content, for the engines' prefix caching: every text-only
    # request's prompt starts with one of shared_prefixes system prompts of
    # shared_prefix_tokens tokens (uniform; added before its drawn prompt);
    # with image_pool P > 0 a multimodal request's first image is one of P
    # images (uniform), whose visual tokens (at the prompt's start) it
    # shares with every request showing the same image. 0 shares nothing.
    shared_prefix_tokens: int = 0
    shared_prefixes: int = 1
    image_pool: int = 0

    cv_to_burstiness = staticmethod(cv_to_burstiness)

    def __post_init__(self) -> None:
        check_types(self)
        allowed = ", ".join(ARRIVALS)
        require(self.arrival in ARRIVALS, f"arrival must be one of {allowed} (got {self.arrival!r})")
        for name, (low, high) in BOUNDS.items():
            value = getattr(self, name)
            require(low <= value <= high, f"{name} must be in [{low:g}, {high:g}] (got {value})")  # nan fails too
        require(
            0 <= self.multimodal_share <= 1,
            f"multimodal_share must be in [0, 1] (got {self.multimodal_share})",
        )
        require(self.images_min >= 1, f"images_min must be >= 1 (got {self.images_min})")
        require(
            self.images_max >= self.images_min,
            f"images_max must be >= images_min = {self.images_min} (got {self.images_max})",
        )
        require(self.arrival_rescale in RESCALES,
                f"arrival_rescale must be one of {', '.join(RESCALES)} (got {self.arrival_rescale!r})")
        if self.arrival_rescale == "vllm":
            require(self.arrival in ("poisson", "gamma") and self.num_requests is not None,
                    f"arrival_rescale vllm rescales poisson or gamma arrivals of num_requests requests "
                    f"(got arrival {self.arrival!r}, num_requests {self.num_requests})")
        require(0 <= self.shared_prefix_tokens <= MAX_COUNT,
                f"shared_prefix_tokens must be in 0..{MAX_COUNT} (got {self.shared_prefix_tokens})")
        require(1 <= self.shared_prefixes <= MAX_REQUESTS,
                f"shared_prefixes must be in 1..{MAX_REQUESTS} (got {self.shared_prefixes})")
        require(0 <= self.image_pool <= MAX_REQUESTS, f"image_pool must be in 0..{MAX_REQUESTS} (got {self.image_pool})")
        require(self.over_context in OVER_CONTEXT,
                f"over_context must be one of {', '.join(OVER_CONTEXT)} (got {self.over_context!r})")
        if self.num_requests is not None:
            require(1 <= self.num_requests <= MAX_REQUESTS,
                    f"num_requests must be in 1..{MAX_REQUESTS:,} (got {self.num_requests:,})")
        if self.duration_s is not None:
            require(
                self.duration_s > 0 and math.isfinite(self.duration_s),
                f"duration_s must be > 0 (got {self.duration_s})",
            )
        both = self.num_requests is not None and self.duration_s is not None
        if self.arrival == "trace":
            require(self.trace_path is not None, "trace_path must be set when arrival is 'trace' (got None)")
            require(
                not both,
                f"num_requests and duration_s: set at most one for a trace "
                f"(got {self.num_requests} and {self.duration_s})",
            )
        else:
            require(
                (self.num_requests is None) != (self.duration_s is None),
                f"num_requests and duration_s: set exactly one "
                f"(got {self.num_requests} and {self.duration_s})",
            )
            if self.duration_s is not None:
                expected = self.rate_per_s * self.duration_s
                require(expected <= MAX_REQUESTS, f"duration_s x rate_per_s must bring at most {MAX_REQUESTS:,} "
                                                  f"requests (got {self.duration_s:g} s x {self.rate_per_s:g}/s = "
                                                  f"{expected:,.0f})")


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadStreams:
    """One random stream per source, so scenarios share random numbers."""

    arrivals: np.random.Generator
    lengths: np.random.Generator
    images: np.random.Generator
    prefixes: np.random.Generator  # which system prompt, which image (shared content)

    @classmethod
    def from_seed_sequence(cls, ss: np.random.SeedSequence) -> WorkloadStreams:
        arrivals, lengths, images, prefixes = (np.random.default_rng(s) for s in ss.spawn(4))
        return cls(arrivals=arrivals, lengths=lengths, images=images, prefixes=prefixes)


# --------------------------------------------------------------------------
# Arrival processes


def arrival_times(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    """Arrival times [n] float64 seconds, sorted, the first request at 0
    (with ``arrival_rescale = "vllm"``: one scaled gap after 0).

    ``n`` is ``cfg.num_requests``, or every arrival before ``cfg.duration_s``.
    Starting at the first arrival makes a run begin with work, as vLLM's
    benchmark client does.
    """
    require(cfg.arrival != "trace", "arrival must be poisson, gamma or onoff for arrival_times (got 'trace')")
    if cfg.arrival == "onoff":
        return _onoff_times(cfg, rng)
    if cfg.arrival == "poisson":
        mean_gap_s = 1.0 / cfg.rate_per_s
        return _renewal_times(cfg, lambda size: rng.exponential(mean_gap_s, size), gap_cv=1.0)
    # Gamma with shape b and scale 1/(rate b) has mean gap 1/rate and CV 1/sqrt(b).
    scale_s = 1.0 / (cfg.rate_per_s * cfg.burstiness)
    return _renewal_times(
        cfg, lambda size: rng.gamma(cfg.burstiness, scale_s, size), gap_cv=cfg.burstiness**-0.5
    )


def _renewal_times(cfg: WorkloadConfig, gaps, *, gap_cv: float) -> np.ndarray:
    """Cumulative sums of i.i.d. gaps, ``gaps(size)`` drawing them."""
    if cfg.arrival_rescale == "vllm":
        times = np.cumsum(gaps(cfg.num_requests))
        return times * (cfg.num_requests / cfg.rate_per_s / times[-1]) if times[-1] > 0 else times
    if cfg.num_requests is not None:
        return np.concatenate(([0.0], np.cumsum(gaps(cfg.num_requests - 1))))
    # Draw in chunks sized to cover the horizon with high probability; a short
    # chunk only costs another round, never a different distribution.
    expected = cfg.rate_per_s * cfg.duration_s
    chunk = int(expected + 6 * max(gap_cv, 1.0) * math.sqrt(expected) + 16)
    parts, end_s = [np.zeros(1)], 0.0
    while end_s < cfg.duration_s:
        times = end_s + np.cumsum(gaps(chunk))
        parts.append(times)
        end_s = times[-1]
    times = np.concatenate(parts)
    return times[times < cfg.duration_s]


def _onoff_times(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    """Two-state MMPP: exponential ON/OFF periods, Poisson arrivals in each.

    Rates are set so the long-run mean is ``rate_per_s``:
    (on_s r + off_s) rate_off = (on_s + off_s) rate_per_s, rate_on = r rate_off.
    The first state is drawn from the stationary distribution, so the process
    has no start-up transient; times are then shifted so the first arrival is 0.
    """
    rate_off = cfg.rate_per_s * (cfg.on_s + cfg.off_s) / (cfg.on_off_ratio * cfg.on_s + cfg.off_s)
    rate_on = cfg.on_off_ratio * rate_off
    on_first = rng.random() < cfg.on_s / (cfg.on_s + cfg.off_s)
    per_cycle = cfg.rate_per_s * (cfg.on_s + cfg.off_s)  # expected arrivals per ON+OFF cycle
    want = cfg.num_requests if cfg.num_requests is not None else cfg.rate_per_s * cfg.duration_s
    periods = 2 * int(1.5 * want / per_cycle + 8)  # even, so each chunk starts in the same state

    parts, count, end_s, first_s = [], 0, 0.0, None
    while True:
        on = (np.arange(periods) % 2 == 0) == on_first  # [P]
        length_s = rng.exponential(np.where(on, cfg.on_s, cfg.off_s))  # [P]
        start_s = end_s + np.cumsum(length_s) - length_s  # [P]
        arrivals = rng.poisson(np.where(on, rate_on, rate_off) * length_s)  # [P]
        # Given its count, a Poisson process's points are uniform over the period.
        offset = rng.random(arrivals.sum()) * np.repeat(length_s, arrivals)
        times = np.sort(np.repeat(start_s, arrivals) + offset)
        parts.append(times)
        count += times.size
        end_s = start_s[-1] + length_s[-1]
        if first_s is None:
            if not times.size:
                continue
            first_s = times[0]
        if cfg.num_requests is not None and count >= cfg.num_requests:
            break
        if cfg.duration_s is not None and end_s >= first_s + cfg.duration_s:
            break
    times = np.concatenate(parts) - first_s
    if cfg.num_requests is not None:
        return times[: cfg.num_requests]
    return times[times < cfg.duration_s]


# --------------------------------------------------------------------------
# Traces


# --------------------------------------------------------------------------
# Requests


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A run's requests, and how many were cut to fit the context."""

    requests: tuple[Request, ...]
    clipped: int  # requests whose prompt or output was cut (over_context = "clip")


def make_requests(cfg: WorkloadConfig, streams: WorkloadStreams, *, visual_tokens_per_image: int,
                  max_context_tokens: int) -> list[Request]:
    """:func:`make_workload`'s requests, as a list."""
    return list(make_workload(cfg, streams, visual_tokens_per_image=visual_tokens_per_image,
                              max_context_tokens=max_context_tokens).requests)


def make_workload(
    cfg: WorkloadConfig,
    streams: WorkloadStreams,
    *,
    visual_tokens_per_image: int,
    max_context_tokens: int,
) -> Workload:
    """The requests of one run, ids 0..n-1 in arrival order.

    ``visual_tokens_per_image`` 0 means a text-only model, which rejects any
    workload that would carry images. Every request fits the context window:
    prompt + visual + output tokens <= ``max_context_tokens``; one longer is
    cut to fit and counted, or refused (``cfg.over_context``).
    """
    require(
        visual_tokens_per_image >= 0, f"visual_tokens_per_image must be >= 0 (got {visual_tokens_per_image})"
    )
    require(max_context_tokens >= 2, f"max_context_tokens must be >= 2 (got {max_context_tokens})")

    trace = None
    if cfg.arrival == "trace":  # only the rows the run replays are kept (the cut below is exact)
        within_s = cfg.duration_s * cfg.trace_speedup * (1 + 1e-9) + 1e-6 if cfg.duration_s is not None else None
        trace = read_trace(cfg.trace_path, limit=cfg.num_requests, within_s=within_s)
    if trace is None:
        arrival_s = arrival_times(cfg, streams.arrivals)
    else:
        arrival_s = trace.arrival_s / cfg.trace_speedup
        keep = arrival_s.size
        if cfg.num_requests is not None:
            keep = min(keep, cfg.num_requests)
        elif cfg.duration_s is not None:
            keep = int(np.searchsorted(arrival_s, cfg.duration_s, side="left"))
        arrival_s = arrival_s[:keep]
    n = arrival_s.size

    # Drawn for every request (two numbers per request per stream), so
    # lengths and images do not move when the other settings change.
    z = streams.lengths.standard_normal((n, 2))  # [n, 2] prompt, output
    u = streams.images.random((n, 2))  # [n, 2] has-images, how many
    if trace is None:
        prompt = _lognormal(z[:, 0], cfg.prompt_mean_tokens, cfg.prompt_cv)
        output = _lognormal(z[:, 1], cfg.output_mean_tokens, cfg.output_cv)
    else:
        prompt, output = trace.prompt_tokens[:n], trace.output_tokens[:n]

    if trace is not None and trace.images is not None:
        images = trace.images[:n]
        if visual_tokens_per_image == 0 and images.any():
            i = int(np.argmax(images > 0))
            raise InputError(
                f"NumImages must be 0 for a text-only model (visual_tokens_per_image is 0; "
                f"trace {cfg.trace_path} request {i} has {images[i]})"
            )
    else:
        require(
            visual_tokens_per_image > 0 or cfg.multimodal_share == 0,
            f"multimodal_share must be 0 for a text-only model "
            f"(visual_tokens_per_image is 0; got {cfg.multimodal_share})",
        )
        # Checked on the config, not the draws, so a seed cannot decide it.
        most = (max_context_tokens - 2) // max(visual_tokens_per_image, 1)
        require(
            cfg.multimodal_share == 0 or cfg.images_max <= most,
            f"images_max must be <= {most} for this model ({cfg.images_max} images x "
            f"{visual_tokens_per_image} visual tokens leave no room for text and output "
            f"in max_context_tokens = {max_context_tokens})",
        )
        span = cfg.images_max - cfg.images_min + 1
        count = cfg.images_min + np.minimum((u[:, 1] * span).astype(np.int64), span - 1)
        images = np.where(u[:, 0] < cfg.multimodal_share, count, 0)

    prompt, output = np.asarray(prompt, np.int64), np.asarray(output, np.int64)
    prompt = prompt + np.where(images == 0, cfg.shared_prefix_tokens, 0)  # the system prompt, before the user's
    over = prompt + output + images * visual_tokens_per_image > max_context_tokens
    if over.any() and cfg.over_context == "error":
        i = int(np.argmax(over))
        raise InputError(f"request {i} needs {int(prompt[i] + output[i] + images[i] * visual_tokens_per_image):,} "
                         f"tokens ({prompt[i]} prompt, {output[i]} output, {images[i]} images), more than the "
                         f"model's context of {max_context_tokens:,} ({int(over.sum())} requests do; over_context = "
                         f"'clip' cuts them to fit)")
    prompt, output = _fit_context(prompt, output, images, visual_tokens_per_image, max_context_tokens)
    prefix_id, prefix_tokens = _shared_prefixes(cfg, streams.prefixes, prompt, images, visual_tokens_per_image)
    # Small tuples are shared between requests with the same image count.
    image_tokens = {k: (visual_tokens_per_image,) * k for k in np.unique(images).tolist()}
    return Workload(clipped=int(over.sum()), requests=tuple(
        Request(id=i, arrival_s=t, prompt_tokens=p, image_tokens=image_tokens[k], output_tokens=o, prefix_id=g,
                prefix_tokens=s)
        for i, (t, p, k, o, g, s) in enumerate(
            zip(arrival_s.tolist(), prompt.tolist(), images.tolist(), output.tolist(), prefix_id.tolist(),
                prefix_tokens.tolist())
        )
    ))


def _shared_prefixes(cfg: WorkloadConfig, rng: np.random.Generator, prompt: np.ndarray, images: np.ndarray,
                     per_image: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (prefix_id, prefix_tokens): ids 0..shared_prefixes-1
    are system prompts (all of one, or less where a prompt was cut to fit
    the context), shared_prefixes + j is image j of the pool; -1, 0 where
    nothing is shared. Two draws per request whatever the settings."""
    u = rng.random((prompt.size, 2))  # [n, 2] which system prompt, which image
    prefix_id = np.full(prompt.size, -1, np.int64)
    prefix_tokens = np.zeros(prompt.size, np.int64)
    text = images == 0
    if cfg.shared_prefix_tokens > 0:
        tokens = np.minimum(cfg.shared_prefix_tokens, prompt - 1)
        shared = text & (tokens > 0)
        prefix_id[shared] = np.minimum((u[shared, 0] * cfg.shared_prefixes).astype(np.int64), cfg.shared_prefixes - 1)
        prefix_tokens[shared] = tokens[shared]
    if cfg.image_pool > 0 and per_image > 0:
        shown = ~text
        image = np.minimum((u[shown, 1] * cfg.image_pool).astype(np.int64), cfg.image_pool - 1)
        prefix_id[shown] = cfg.shared_prefixes + image
        prefix_tokens[shown] = per_image
    return prefix_id, prefix_tokens


def _lognormal(z: np.ndarray, mean: float, cv: float) -> np.ndarray:
    """Integer lengths [n] >= 1 from standard normals z [n]: a lognormal with
    the given mean and CV (sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2/2).
    CV 0 gives the constant ``mean``."""
    sigma2 = math.log1p(cv * cv)
    values = np.exp(math.log(mean) - sigma2 / 2 + math.sqrt(sigma2) * z)
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _fit_context(
    prompt: np.ndarray, output: np.ndarray, images: np.ndarray, per_image: int, max_context: int
) -> tuple[np.ndarray, np.ndarray]:
    """Shrink prompts (down to 1 token), then outputs, so each request fits.

    Visual tokens are never cut: a model cannot take part of an image.
    """
    visual = images * per_image  # [n]
    room = max_context - visual - 2  # tokens left beyond the 1-token prompt and output minimum
    if (room < 0).any():
        i = int(np.argmin(room))
        raise InputError(
            f"NumImages: trace request {i} has {images[i]} images x {per_image} visual tokens = "
            f"{visual[i]}, which leaves no room for text and output in max_context_tokens = {max_context}"
        )
    prompt = np.maximum(np.minimum(prompt, max_context - visual - output), 1)
    output = np.minimum(output, max_context - visual - prompt)
    return prompt, output
