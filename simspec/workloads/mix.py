"""The request mix: each request's text prompt, images (each worth the
visual tokens its size gives by the model's rule, or the model's fixed
number), shared prefixes and output length, drawn from lognormal
distributions or taken from a trace.

Imports: numpy, simspec.workloads.config, .arrivals, .traces, simspec.types.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import numpy as np

from simspec.acceptance.classes import parse_mix
from simspec.types import InputError, Request, require
from simspec.workloads.arrivals import arrival_times
from simspec.workloads.config import WorkloadConfig, WorkloadStreams, image_sizes
from simspec.workloads.traces import MAX_IMAGE_SIDE, Trace, read_trace

ImageRule = Callable[[int, int], int]
"""The model's rule: visual tokens of one image of (width, height) pixels."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    """A run's requests, and how many were cut to fit the context."""

    requests: tuple[Request, ...]
    clipped: int  # requests whose prompt or output was cut (over_context = "clip")


def make_requests(cfg: WorkloadConfig, streams: WorkloadStreams, *, visual_tokens_per_image: int,
                  max_context_tokens: int, image_tokens: ImageRule | None = None) -> list[Request]:
    """:func:`make_workload`'s requests, as a list."""
    return list(make_workload(cfg, streams, visual_tokens_per_image=visual_tokens_per_image,
                              max_context_tokens=max_context_tokens, image_tokens=image_tokens).requests)


def make_workload(
    cfg: WorkloadConfig,
    streams: WorkloadStreams,
    *,
    visual_tokens_per_image: int,
    max_context_tokens: int,
    image_tokens: ImageRule | None = None,
) -> Workload:
    """The requests of one run, ids 0..n-1 in arrival order.

    ``visual_tokens_per_image`` 0 means a text-only model, which rejects any
    workload that would carry images. Every request fits the context window:
    prompt + visual + output tokens <= ``max_context_tokens``; one longer is
    cut to fit and counted, or refused (``cfg.over_context``).

    With ``image_tokens`` (the model's rule), each image's size gives its
    visual tokens: the trace row's size where it has one, else a draw from
    ``cfg.image_size`` (one uniform per image from ``streams.sizes``, in
    request order); an image with neither has ``visual_tokens_per_image``.
    Without it, or with one size for every image, every image has the same
    count (the rule's for that size).

    The streams are drawn in one order whatever the settings (arrivals,
    lengths, image counts, shared content, sizes), so lengths and images do
    not move when other settings change.
    """
    require(
        visual_tokens_per_image >= 0, f"visual_tokens_per_image must be >= 0 (got {visual_tokens_per_image})"
    )
    require(max_context_tokens >= 2, f"max_context_tokens must be >= 2 (got {max_context_tokens})")
    trace, arrival_s = _arrivals(cfg, streams)
    n = arrival_s.size
    prompt, output, u = _lengths(cfg, streams, trace, n)

    sizes = image_sizes(cfg.image_size) if cfg.image_size is not None and image_tokens is not None else None
    sized = trace is not None and trace.image_width is not None and image_tokens is not None
    if sizes is not None and len(sizes.sizes) == 1:
        visual_tokens_per_image = image_tokens(*sizes.sizes[0])  # one size: every image's count, as one number
    # The most visual tokens one image can have, for the images_max check.
    largest = visual_tokens_per_image if sizes is None else max(image_tokens(*wh) for wh in sizes.sizes)
    images = _image_counts(cfg, trace, u, n, visual_tokens_per_image, largest, max_context_tokens)

    prompt = prompt + np.where(images == 0, cfg.shared_prefix_tokens, 0)  # the system prompt, before the user's
    picks = streams.prefixes.random((n, 2))  # [n, 2] which system prompt, which image (shared content)
    pool = _pool_images(cfg, picks[:, 1], images, visual_tokens_per_image)
    per_image = None  # [sum(images)] each image's visual tokens; None: all visual_tokens_per_image
    first = np.cumsum(images) - images  # [n] each request's first image in per_image
    if sized or (sizes is not None and len(sizes.sizes) > 1):
        per_image = _image_tokens(sizes, trace if sized else None, streams.sizes, images, image_tokens,
                                  visual_tokens_per_image)
        _share_pool_images(per_image, first, pool)
    visual, first_tokens = _visual(per_image, first, images, visual_tokens_per_image)

    over = prompt + output + visual > max_context_tokens
    if over.any() and cfg.over_context == "error":
        i = int(np.argmax(over))
        raise InputError(f"request {i} needs {int(prompt[i] + output[i] + visual[i]):,} "
                         f"tokens ({prompt[i]} prompt, {output[i]} output, {images[i]} images), more than the "
                         f"model's context of {max_context_tokens:,} ({int(over.sum())} requests do; over_context = "
                         f"'clip' cuts them to fit)")
    shown = functools.partial(_shown, images=images, per_image=per_image, first=first,
                              default=visual_tokens_per_image)
    prompt, output = _fit_context(prompt, output, visual, shown, max_context_tokens)
    prefix_id, prefix_tokens = _shared_prefixes(cfg, picks[:, 0], pool, prompt, images, first_tokens)
    if per_image is None:  # small tuples shared between requests with the same image count
        counts = {k: (visual_tokens_per_image,) * k for k in np.unique(images).tolist()}
        each = [counts[k] for k in images.tolist()]
    else:
        each = _tuples(per_image, first, images)
    tasks = _tasks(cfg, streams, n, trace)
    return Workload(clipped=int(over.sum()), requests=tuple(
        Request(id=i, arrival_s=t, prompt_tokens=p, image_tokens=e, output_tokens=o, prefix_id=g, prefix_tokens=s,
                task=c)
        for i, (t, p, e, o, g, s, c) in enumerate(
            zip(arrival_s.tolist(), prompt.tolist(), each, output.tolist(), prefix_id.tolist(),
                prefix_tokens.tolist(), tasks)
        )
    ))


def _tasks(cfg: WorkloadConfig, streams: WorkloadStreams, n: int, trace: Trace | None) -> list[str]:
    """Each request's class: the trace's where its row gives one, else a
    draw from ``cfg.mix`` (its own stream, one draw a request whatever the
    trace gives: nothing else moves), else ""."""
    given = list(trace.task[:n]) if trace is not None and trace.task is not None else [""] * n
    if cfg.mix is None:
        return given
    mix = parse_mix(cfg.mix)
    shares = np.array([share for _, share in mix.shares])
    drawn = streams.tasks.choice(len(shares), size=n, p=shares / shares.sum())
    return [g or mix.names[k] for g, k in zip(given, drawn.tolist())]


def _arrivals(cfg: WorkloadConfig, streams: WorkloadStreams) -> tuple[Trace | None, np.ndarray]:
    """The trace the run replays (None: a synthetic workload) and every request's arrival, seconds."""
    if cfg.arrival != "trace":
        return None, arrival_times(cfg, streams.arrivals)
    within_s = cfg.duration_s * cfg.trace_speedup * (1 + 1e-9) + 1e-6 if cfg.duration_s is not None else None
    trace = read_trace(cfg.trace_path, limit=cfg.num_requests, within_s=within_s)  # only the rows replayed
    arrival_s = trace.arrival_s / cfg.trace_speedup
    keep = arrival_s.size
    if cfg.num_requests is not None:
        keep = min(keep, cfg.num_requests)
    elif cfg.duration_s is not None:
        keep = int(np.searchsorted(arrival_s, cfg.duration_s, side="left"))
    return trace, arrival_s[:keep]


def _lengths(cfg: WorkloadConfig, streams: WorkloadStreams, trace: Trace | None,
             n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Prompt and output tokens [n] (drawn, or the trace's), and the image
    draws [n, 2] (has images, how many): two numbers per request from each
    stream whatever the trace gives."""
    z = streams.lengths.standard_normal((n, 2))  # [n, 2] prompt, output
    u = streams.images.random((n, 2))  # [n, 2] has-images, how many
    if trace is None:
        prompt = _lognormal(z[:, 0], cfg.prompt_mean_tokens, cfg.prompt_cv)
        output = _lognormal(z[:, 1], cfg.output_mean_tokens, cfg.output_cv)
    else:
        prompt, output = trace.prompt_tokens[:n], trace.output_tokens[:n]
    return np.asarray(prompt, np.int64), np.asarray(output, np.int64), u


def _image_counts(cfg: WorkloadConfig, trace: Trace | None, u: np.ndarray, n: int, visual_tokens_per_image: int,
                  largest: int, max_context_tokens: int) -> np.ndarray:
    """Images of each request [n]: the trace's, or drawn; a text-only model
    (``visual_tokens_per_image`` 0) takes none, and images_max must leave
    room in the context at ``largest`` tokens an image (checked on the
    config, not the draws, so a seed cannot decide it)."""
    if trace is not None and trace.images is not None:
        images = trace.images[:n]
        if visual_tokens_per_image == 0 and images.any():
            i = int(np.argmax(images > 0))
            raise InputError(
                f"NumImages must be 0 for a text-only model (visual_tokens_per_image is 0; "
                f"trace {cfg.trace_path} request {i} has {images[i]})"
            )
        return images
    require(
        visual_tokens_per_image > 0 or cfg.multimodal_share == 0,
        f"multimodal_share must be 0 for a text-only model "
        f"(visual_tokens_per_image is 0; got {cfg.multimodal_share})",
    )
    most = (max_context_tokens - 2) // max(largest, 1)
    require(
        cfg.multimodal_share == 0 or cfg.images_max <= most,
        f"images_max must be <= {most} for this model ({cfg.images_max} images x "
        f"{largest} visual tokens leave no room for text and output "
        f"in max_context_tokens = {max_context_tokens})",
    )
    span = cfg.images_max - cfg.images_min + 1
    count = cfg.images_min + np.minimum((u[:, 1] * span).astype(np.int64), span - 1)
    return np.where(u[:, 0] < cfg.multimodal_share, count, 0)


def _visual(per_image: np.ndarray | None, first: np.ndarray, images: np.ndarray,
            default: int) -> tuple[np.ndarray, np.ndarray]:
    """Each request's visual tokens [n] and its first image's [n] (``default`` an image where per_image is None)."""
    n = images.size
    if per_image is None:
        return images * default, np.full(n, default, np.int64)
    ends = np.concatenate([[0], np.cumsum(per_image)])
    first_tokens = np.zeros(n, np.int64)
    first_tokens[images > 0] = per_image[first[images > 0]]
    return ends[first + images] - ends[first], first_tokens


def _shown(i: int, *, images: np.ndarray, per_image: np.ndarray | None, first: np.ndarray, default: int) -> str:
    """Request i's images and their visual tokens, for messages."""
    if per_image is None:
        each = (default,) * int(images[i])
    else:
        each = tuple(per_image[first[i]:first[i] + images[i]].tolist())
    if len(set(each)) <= 1:
        return f"{images[i]} images x {each[0] if each else 0} visual tokens"
    return f"{images[i]} images of {' + '.join(map(str, each))} visual tokens"


def _image_tokens(sizes, trace: Trace | None, rng: np.random.Generator, images: np.ndarray, rule: ImageRule,
                  default: int) -> np.ndarray:
    """Each image's visual tokens [sum(images)], in request order: by the
    rule from its request's trace size, else from a size drawn from
    ``sizes`` (one uniform per image, drawn whatever the trace gives), else
    ``default``."""
    n = images.size
    owner = np.repeat(np.arange(n), images)  # [M] the request of each image
    width, height = np.zeros(owner.size, np.int64), np.zeros(owner.size, np.int64)
    if sizes is not None:
        drawn = np.asarray(sizes.sizes, np.int64)[sizes.draw(rng.random(owner.size))]  # [M, 2]
        width, height = drawn[:, 0], drawn[:, 1]
    if trace is not None:
        w, h = trace.image_width[:n][owner], trace.image_height[:n][owner]
        given = w > 0
        width, height = np.where(given, w, width), np.where(given, h, height)
    key = width * (MAX_IMAGE_SIDE + 1) + height  # [M] one integer per size; 0: none
    unique, inverse = np.unique(key, return_inverse=True)
    tokens = np.array([rule(int(k // (MAX_IMAGE_SIDE + 1)), int(k % (MAX_IMAGE_SIDE + 1))) if k else default
                       for k in unique.tolist()], np.int64)
    return tokens[inverse.reshape(-1)] if owner.size else np.zeros(0, np.int64)


def _pool_images(cfg: WorkloadConfig, u: np.ndarray, images: np.ndarray, per_image: int) -> np.ndarray:
    """Which pool image [n] each multimodal request shows first (uniform
    ``u`` [n] in [0, 1)); -1 for none (no pool, a text request)."""
    pool = np.full(images.size, -1, np.int64)
    if cfg.image_pool > 0 and per_image > 0:
        shown = images > 0
        pool[shown] = np.minimum((u[shown] * cfg.image_pool).astype(np.int64), cfg.image_pool - 1)
    return pool


def _share_pool_images(per_image: np.ndarray, first: np.ndarray, pool: np.ndarray) -> None:
    """A pool image is one image: every request showing it has, as its
    first image, the size (the visual tokens) of the first request that
    showed it. In place on ``per_image`` [M]."""
    shown = np.flatnonzero(pool >= 0)
    if shown.size == 0:
        return
    ids, at = pool[shown], first[shown]
    unique, earliest, inverse = np.unique(ids, return_index=True, return_inverse=True)
    per_image[at] = per_image[at[earliest]][inverse.reshape(-1)]


def _tuples(per_image: np.ndarray, first: np.ndarray, images: np.ndarray) -> list[tuple[int, ...]]:
    """Each request's image tokens as a tuple, equal tuples shared."""
    flat, shared = per_image.tolist(), {}
    return [shared.setdefault(t, t) for t in (tuple(flat[f:f + k]) for f, k in zip(first.tolist(), images.tolist()))]


def _shared_prefixes(cfg: WorkloadConfig, u: np.ndarray, pool: np.ndarray, prompt: np.ndarray, images: np.ndarray,
                     first_tokens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each request's (prefix_id, prefix_tokens): ids 0..shared_prefixes-1
    are system prompts (all of one, picked by ``u`` [n], or less where a
    prompt was cut to fit the context), shared_prefixes + j is image j of
    the pool (``pool`` [n], :func:`_pool_images`), whose ``first_tokens``
    [n] visual tokens are shared; -1, 0 where nothing is shared."""
    prefix_id = np.full(prompt.size, -1, np.int64)
    prefix_tokens = np.zeros(prompt.size, np.int64)
    text = images == 0
    if cfg.shared_prefix_tokens > 0:
        tokens = np.minimum(cfg.shared_prefix_tokens, prompt - 1)
        shared = text & (tokens > 0)
        prefix_id[shared] = np.minimum((u[shared] * cfg.shared_prefixes).astype(np.int64), cfg.shared_prefixes - 1)
        prefix_tokens[shared] = tokens[shared]
    shown = pool >= 0
    prefix_id[shown] = cfg.shared_prefixes + pool[shown]
    prefix_tokens[shown] = first_tokens[shown]
    return prefix_id, prefix_tokens


def _lognormal(z: np.ndarray, mean: float, cv: float) -> np.ndarray:
    """Integer lengths [n] >= 1 from standard normals z [n]: a lognormal with
    the given mean and CV (sigma^2 = ln(1 + cv^2), mu = ln(mean) - sigma^2/2).
    CV 0 gives the constant ``mean``."""
    sigma2 = math.log1p(cv * cv)
    values = np.exp(math.log(mean) - sigma2 / 2 + math.sqrt(sigma2) * z)
    return np.maximum(np.rint(values), 1).astype(np.int64)


def _fit_context(
    prompt: np.ndarray, output: np.ndarray, visual: np.ndarray, shown: Callable[[int], str], max_context: int
) -> tuple[np.ndarray, np.ndarray]:
    """Shrink prompts (down to 1 token), then outputs, so each request fits
    beside its ``visual`` [n] tokens (``shown(i)`` says request i's images).

    Visual tokens are never cut: a model cannot take part of an image.
    """
    room = max_context - visual - 2  # tokens left beyond the 1-token prompt and output minimum
    if (room < 0).any():
        i = int(np.argmin(room))
        raise InputError(
            f"NumImages: trace request {i} has {shown(i)} = "
            f"{visual[i]}, which leaves no room for text and output in max_context_tokens = {max_context}"
        )
    prompt = np.maximum(np.minimum(prompt, max_context - visual - output), 1)
    output = np.minimum(output, max_context - visual - prompt)
    return prompt, output
