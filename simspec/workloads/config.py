"""A workload's settings (:class:`WorkloadConfig`), their allowed ranges,
and the random streams a workload draws from (:class:`WorkloadStreams`).

Imports: numpy, simspec.workloads.traces (the trace's count bound), simspec.types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simspec.acceptance.classes import parse_mix
from simspec.types import InputError, check_types, require
from simspec.workloads.traces import MAX_COUNT, MAX_IMAGE_SIDE

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


def image_pixels(text: str) -> tuple[int, int]:
    """(width, height) of an image size ``WIDTHxHEIGHT`` (e.g. 1344x896)."""
    width, sep, height = text.strip().lower().partition("x")
    ok = sep and width.isdigit() and height.isdigit() and int(width) > 0 and int(height) > 0
    require(bool(ok), f"image_size must look like WIDTHxHEIGHT in pixels, each > 0 (got {text!r})")
    return int(width), int(height)


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageSizes:
    """A distribution of image sizes: each image of a request is one of
    ``sizes`` with probability ``weights`` (summing to 1)."""

    sizes: tuple[tuple[int, int], ...]  # [S] (width, height) pixels, distinct
    weights: tuple[float, ...]  # [S] > 0, normalised

    def describe(self) -> str:
        """``448x448`` for one size, ``448x448 50% / 1920x1080 50%`` for a distribution."""
        if len(self.sizes) == 1:
            return "{}x{}".format(*self.sizes[0])
        return " / ".join(f"{w}x{h} {p:.0%}" for (w, h), p in zip(self.sizes, self.weights))

    def draw(self, u: np.ndarray) -> np.ndarray:
        """Indices into ``sizes`` [M] of uniforms ``u`` [M] in [0, 1)."""
        edges = np.cumsum(self.weights)[:-1]  # [S - 1] the last edge is 1
        return np.searchsorted(edges, u, side="right")


def image_sizes(text: str) -> ImageSizes:
    """The distribution ``WxH[:WEIGHT],...`` (e.g.
    ``448x448:0.5,1280x720:0.3,1920x1080:0.2``): one size alone is every
    image's; weights are normalised, and with none given every size is
    equally likely."""
    entries = [e.strip() for e in text.split(",")]
    form = "WIDTHxHEIGHT or a list WIDTHxHEIGHT:WEIGHT,... (e.g. 448x448:0.5,1920x1080:0.5)"
    require(all(entries), f"image_size must be {form} (got {text!r}: an empty entry)")
    sizes, weights = [], []
    for entry in entries:
        size, sep, weight = entry.partition(":")
        width, height = image_pixels(size)
        require(width <= MAX_IMAGE_SIDE and height <= MAX_IMAGE_SIDE,
                f"image_size must be WIDTHxHEIGHT with each side in 1..{MAX_IMAGE_SIDE} pixels (got {width}x{height})")
        require((width, height) not in sizes, f"image_size lists {width}x{height} twice (got {text!r})")
        sizes.append((width, height))
        if sep:
            try:
                weights.append(float(weight))
            except ValueError:
                raise InputError(f"image_size weights must be numbers > 0 (got {weight!r} in {text!r})") from None
            require(math.isfinite(weights[-1]) and weights[-1] > 0,
                    f"image_size weights must be numbers > 0 (got {weight!r} in {text!r})")
    require(len(weights) in (0, len(sizes)),
            f"image_size: give a weight to every size or to none (got {text!r}; as {form})")
    weights = weights or [1.0] * len(sizes)
    total = math.fsum(weights)
    return ImageSizes(sizes=tuple(sizes), weights=tuple(w / total for w in weights))


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
    """How a synthetic workload is drawn, or which trace is replayed. The
    field defaults are the default scenario's workload (``simspec simulate``
    with no workload flags; :class:`simspec.config.SimConfig`'s default)."""

    arrival: str = "gamma"  # "poisson" | "gamma" | "onoff" | "trace"
    rate_per_s: float = 6.0  # mean request rate (ignored for trace)
    burstiness: float = 0.25  # Gamma shape; CV = 1/sqrt(shape), 0.25 -> CV 2
    on_s: float = 5.0  # onoff: mean ON period (exponential)
    off_s: float = 15.0  # onoff: mean OFF period (exponential)
    on_off_ratio: float = 10.0  # onoff: rate while ON / rate while OFF
    num_requests: int | None = 1000  # stop after this many requests ...
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
    # Every image's size, WIDTHxHEIGHT pixels, or a distribution of sizes
    # WxH:WEIGHT,... each image draws from (image_sizes; None: the model's
    # own default); a dynamic-resolution model (Qwen2-VL, Qwen2.5-VL) turns
    # each image's size into its visual tokens
    # (simspec.costs.ModelSpec.at_image_size), a fixed-size one keeps its
    # count. A trace's image-size columns, where a row has them, win.
    image_size: str | None = None
    # The request classes' mix, CLASS:SHARE,... (simspec.acceptance.classes;
    # "spec-bench": its six categories alike); each request draws its class
    # from it. None: no classes (every request at the acceptance model's level).
    mix: str | None = None
    # The requests' sampling temperature, 0 (greedy) to 1: a preset's
    # acceptance falls with it as published pairs at 0 and 1 say
    # (simspec.acceptance.presets.TemperatureRule).
    temperature: float = 0.0

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
        if self.image_size is not None:
            image_sizes(self.image_size)
        if self.mix is not None:
            parse_mix(self.mix)
        require(0.0 <= self.temperature <= 1.0, f"temperature must be in [0, 1]: published acceptance figures pair "
                                                f"temperature 0 with 1 (got {self.temperature})")
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
    sizes: np.random.Generator  # each image's size, from a distribution of them (image_size)
    tasks: np.random.Generator  # each request's class, from the mix

    @classmethod
    def from_seed_sequence(cls, ss: np.random.SeedSequence) -> WorkloadStreams:
        # Children come in the order they were added: spawning six leaves the first five as they were.
        arrivals, lengths, images, prefixes, sizes, tasks = (np.random.default_rng(s) for s in ss.spawn(6))
        return cls(arrivals=arrivals, lengths=lengths, images=images, prefixes=prefixes, sizes=sizes, tasks=tasks)
