"""Arrival processes: Poisson, Gamma renewal (vLLM's ``--burstiness`` is the
Gamma shape, inter-arrival CV = 1/sqrt(shape)), on/off bursts (a two-state
Markov-modulated Poisson process) and a trace's timestamps with optional
time scaling.

Imports: numpy, simspec.workloads.config.
"""

from __future__ import annotations

import math
import numpy as np

from simspec.types import require
from simspec.workloads.config import WorkloadConfig




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
