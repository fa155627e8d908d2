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

import json
import math
import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from simspec.types import InputError, Request, require

ARRIVALS = ("poisson", "gamma", "onoff", "trace")


def cv_to_burstiness(cv: float) -> float:
    """Gamma shape (vLLM ``--burstiness``) whose inter-arrival CV is ``cv``."""
    require(cv > 0 and math.isfinite(cv), f"cv must be > 0 (got {cv})")
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

    cv_to_burstiness = staticmethod(cv_to_burstiness)

    def __post_init__(self) -> None:
        allowed = ", ".join(ARRIVALS)
        require(self.arrival in ARRIVALS, f"arrival must be one of {allowed} (got {self.arrival!r})")
        for name in ("rate_per_s", "burstiness", "on_s", "off_s", "prompt_mean_tokens", "trace_speedup"):
            value = getattr(self, name)
            require(value > 0 and math.isfinite(value), f"{name} must be > 0 (got {value})")
        require(
            self.on_off_ratio >= 1 and math.isfinite(self.on_off_ratio),
            f"on_off_ratio must be >= 1 (got {self.on_off_ratio})",
        )
        require(
            self.output_mean_tokens >= 1 and math.isfinite(self.output_mean_tokens),
            f"output_mean_tokens must be >= 1 (got {self.output_mean_tokens})",
        )
        for name in ("prompt_cv", "output_cv"):
            value = getattr(self, name)
            require(value >= 0 and math.isfinite(value), f"{name} must be >= 0 (got {value})")
        require(
            0 <= self.multimodal_share <= 1,
            f"multimodal_share must be in [0, 1] (got {self.multimodal_share})",
        )
        require(self.images_min >= 1, f"images_min must be >= 1 (got {self.images_min})")
        require(
            self.images_max >= self.images_min,
            f"images_max must be >= images_min = {self.images_min} (got {self.images_max})",
        )
        if self.num_requests is not None:
            require(self.num_requests >= 1, f"num_requests must be >= 1 (got {self.num_requests})")
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


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadStreams:
    """One random stream per source, so scenarios share random numbers."""

    arrivals: np.random.Generator
    lengths: np.random.Generator
    images: np.random.Generator

    @classmethod
    def from_seed_sequence(cls, ss: np.random.SeedSequence) -> WorkloadStreams:
        arrivals, lengths, images = (np.random.default_rng(s) for s in ss.spawn(3))
        return cls(arrivals=arrivals, lengths=lengths, images=images)


# --------------------------------------------------------------------------
# Arrival processes


def arrival_times(cfg: WorkloadConfig, rng: np.random.Generator) -> np.ndarray:
    """Arrival times [n] float64 seconds, sorted, the first request at 0.

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


@dataclass(frozen=True, slots=True, kw_only=True)
class Trace:
    """A request trace as read from disk, sorted by arrival."""

    arrival_s: np.ndarray  # [N] float, starts at 0, sorted
    prompt_tokens: np.ndarray  # [N] int >= 1
    output_tokens: np.ndarray  # [N] int >= 1
    images: np.ndarray | None  # [N] int >= 0, None when the schema has no image column
    source: str  # schema name: "azure-llm-2023", "azure-lmm-2025", "mooncake-jsonl"


_CSV_SCHEMAS = {
    # Checked in order: the LMM schema is a superset of the LLM one.
    "azure-lmm-2025": ("TIMESTAMP", "NumImages", "ContextTokens", "GeneratedTokens"),
    "azure-llm-2023": ("TIMESTAMP", "ContextTokens", "GeneratedTokens"),
}
_JSONL_IMAGE_KEYS = ("num_images", "images")


def read_trace(path: str | os.PathLike) -> Trace:
    """Read a trace, detecting its schema: JSONL when the name ends in
    ``.jsonl``/``.json`` or the first line is a JSON object, CSV otherwise.

    Rows are numbered from 1 after a CSV header; JSONL errors give the line.
    Unsorted times are sorted (stable), so equal times keep file order.
    """
    path = Path(path)
    require(path.is_file(), f"trace {path}: no such file")
    with path.open("r", encoding="utf-8") as f:
        first = next((line.strip() for line in f if line.strip()), "")
    require(first != "", f"trace {path}: the file is empty (no rows)")
    if path.suffix.lower() in (".jsonl", ".json") or first.startswith("{"):
        return _read_jsonl(path)
    return _read_csv(path)


def _read_csv(path: Path) -> Trace:
    table = pd.read_csv(path, dtype=str, keep_default_na=False, skipinitialspace=True)
    columns = set(table.columns)
    source = next((name for name, cols in _CSV_SCHEMAS.items() if columns.issuperset(cols)), None)
    expected = " or ".join(",".join(cols) for cols in reversed(_CSV_SCHEMAS.values()))
    require(
        source is not None,
        f"trace {path}: columns {','.join(table.columns)} match no known schema (expected {expected})",
    )
    require(len(table) > 0, f"trace {path}: no rows after the header")

    raw_time = table["TIMESTAMP"]
    # ISO8601 covers both "2023-11-16 18:15:46.6805900" and "2024-10-15T12:00:05.819Z";
    # utc=True puts naive and Z-suffixed stamps on one clock.
    stamp = pd.to_datetime(raw_time, format="ISO8601", errors="coerce", utc=True)
    bad = stamp.isna().to_numpy()
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"trace {path}: TIMESTAMP is not a date-time (row {i + 1} has {raw_time.iloc[i]!r})")
    seconds = ((stamp - stamp.min()) / pd.Timedelta(seconds=1)).to_numpy(np.float64)

    def counts(column: str, minimum: int) -> np.ndarray:
        return _counts(path, column, table[column].to_numpy(dtype=object), minimum, "row")

    images = counts("NumImages", 0) if "NumImages" in _CSV_SCHEMAS[source] else None
    return _sorted_trace(
        seconds,
        prompt=counts("ContextTokens", 1),
        output=counts("GeneratedTokens", 1),
        images=images,
        source=source,
    )


def _read_jsonl(path: Path) -> Trace:
    timestamp_ms, prompt, output, images, lines = [], [], [], [], []
    has_images = False
    with path.open("r", encoding="utf-8") as f:
        for number, line in enumerate(f, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as err:
                raise InputError(f"trace {path}: line {number} is not valid JSON ({err.msg})") from None
            require(isinstance(row, dict), f"trace {path}: line {number} is not a JSON object")
            missing = [k for k in ("timestamp", "input_length", "output_length") if k not in row]
            require(
                not missing,
                f"trace {path}: line {number} lacks {', '.join(missing)} "
                f"(expected timestamp, input_length, output_length, optional num_images)",
            )
            count = next((row[k] for k in _JSONL_IMAGE_KEYS if k in row), 0)
            has_images |= any(k in row for k in _JSONL_IMAGE_KEYS)
            # Some writers list the images themselves rather than counting them.
            images.append(len(count) if isinstance(count, list) else count)
            timestamp_ms.append(row["timestamp"])
            prompt.append(row["input_length"])
            output.append(row["output_length"])
            lines.append(number)
    lines = np.asarray(lines)
    stamp_ms = _numbers(path, "timestamp", np.asarray(timestamp_ms, dtype=object), lines, "line")
    seconds = (stamp_ms - stamp_ms.min()) / 1000.0
    return _sorted_trace(
        seconds,
        prompt=_counts(path, "input_length", np.asarray(prompt, dtype=object), 1, "line", lines),
        output=_counts(path, "output_length", np.asarray(output, dtype=object), 1, "line", lines),
        images=(
            _counts(path, "num_images", np.asarray(images, dtype=object), 0, "line", lines)
            if has_images
            else None
        ),
        source="mooncake-jsonl",
    )


def _numbers(path: Path, name: str, raw: np.ndarray, rows: np.ndarray, unit: str) -> np.ndarray:
    """Parse ``raw`` [N] (strings or JSON values) as finite floats or raise
    naming the first bad one. ``rows`` [N] numbers the entries for messages."""
    values = pd.to_numeric(pd.Series(raw), errors="coerce").to_numpy(np.float64)
    # JSON booleans would parse as 0/1; they are never a count or a time.
    bad = ~np.isfinite(values) | np.array([isinstance(v, bool) for v in raw], dtype=bool)
    if bad.any():
        i = int(np.argmax(bad))
        raise InputError(f"trace {path}: {name} must be a number ({unit} {rows[i]} has {raw[i]!r})")
    return values


def _counts(
    path: Path, name: str, raw: np.ndarray, minimum: int, unit: str, rows: np.ndarray | None = None
) -> np.ndarray:
    """Parse a token or image count column: integers >= ``minimum``."""
    rows = np.arange(1, raw.size + 1) if rows is None else rows
    values = _numbers(path, name, raw, rows, unit)
    fractional = values != np.round(values)
    if fractional.any():
        i = int(np.argmax(fractional))
        raise InputError(f"trace {path}: {name} must be an integer ({unit} {rows[i]} has {raw[i]!r})")
    low = values < minimum
    if low.any():
        i = int(np.argmax(low))
        raise InputError(f"trace {path}: {name} must be >= {minimum} ({unit} {rows[i]} has {int(values[i])})")
    return values.astype(np.int64)


def _sorted_trace(
    seconds: np.ndarray, *, prompt: np.ndarray, output: np.ndarray, images: np.ndarray | None, source: str
) -> Trace:
    order = np.argsort(seconds, kind="stable")
    return Trace(
        arrival_s=seconds[order],
        prompt_tokens=prompt[order],
        output_tokens=output[order],
        images=None if images is None else images[order],
        source=source,
    )


# --------------------------------------------------------------------------
# Requests


def make_requests(
    cfg: WorkloadConfig,
    streams: WorkloadStreams,
    *,
    visual_tokens_per_image: int,
    max_context_tokens: int,
) -> list[Request]:
    """The requests of one run, ids 0..n-1 in arrival order.

    ``visual_tokens_per_image`` 0 means a text-only model, which rejects any
    workload that would carry images. Every request fits the context window:
    prompt + visual + output tokens <= ``max_context_tokens``.
    """
    require(
        visual_tokens_per_image >= 0, f"visual_tokens_per_image must be >= 0 (got {visual_tokens_per_image})"
    )
    require(max_context_tokens >= 2, f"max_context_tokens must be >= 2 (got {max_context_tokens})")

    trace = read_trace(cfg.trace_path) if cfg.arrival == "trace" else None
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

    prompt, output = _fit_context(
        np.asarray(prompt, np.int64), np.asarray(output, np.int64), images,
        visual_tokens_per_image, max_context_tokens,
    )
    # Small tuples are shared between requests with the same image count.
    image_tokens = {k: (visual_tokens_per_image,) * k for k in np.unique(images).tolist()}
    return [
        Request(id=i, arrival_s=t, prompt_tokens=p, image_tokens=image_tokens[k], output_tokens=o)
        for i, (t, p, k, o) in enumerate(
            zip(arrival_s.tolist(), prompt.tolist(), images.tolist(), output.tolist())
        )
    ]


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
