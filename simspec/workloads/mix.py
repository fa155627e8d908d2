"""The request mix: each request's text prompt, images (each worth the
model's fixed number of visual tokens), shared prefixes and output length,
drawn from lognormal distributions or taken from a trace.

Imports: numpy, simspec.workloads.config, .arrivals, .traces, simspec.types.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simspec.types import InputError, Request, require
from simspec.workloads.arrivals import arrival_times
from simspec.workloads.config import WorkloadConfig, WorkloadStreams
from simspec.workloads.traces import read_trace




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
