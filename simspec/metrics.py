"""Serving metrics of a run, named and defined as ``vllm bench serve`` does.

Imports: the standard library, numpy and simspec.types.

Latencies (per request unless said otherwise, reported in ms):

- ``ttft`` = first_token_s - arrival_s
- ``e2el`` = finish_s - arrival_s
- ``tpot`` = (e2el - ttft) / (output_tokens - 1), only for requests with more
  than one output token (vLLM leaves the others out of the statistics)
- ``itl``  = gaps between consecutive emitted chunks of one request, pooled
  over all requests; the first chunk is the first token, so a request with c
  chunks gives c - 1 gaps.

Each as mean, median, std (population, ddof=0), p90, p95, p99 (numpy's
default linear percentiles). An empty population gives NaN, never an error,
so aggregations over runs skip it; with ``empty_as_zero`` (the ``vllm``
engine mode) it gives 0, as ``vllm bench serve`` does (``np.mean(ttfts or
0)`` and the like, vllm/benchmarks/serve.py 0.33, lines 782-806).
Only completed requests count: those with a finite ``first_token_s`` and
``finish_s`` (an interrupted run may log requests that never finished).

Speculative decoding, from the log's round counts (``RunLog.rounds``), as
``vllm bench serve`` computes them from the server's counters
(vllm/benchmarks/serve.py 0.33, lines 1134-1163; one draft is one
request's drafted round, vllm/v1/spec_decode/metrics.py 41-44):

- ``spec_decode_num_drafts``, ``spec_decode_draft_tokens``,
  ``spec_decode_accepted_tokens``: the counters (a tree's draft tokens are
  its nodes).
- ``spec_decode_acceptance_length`` = 1 + accepted / num_drafts (1.0 when
  nothing was drafted, where vLLM prints none).
- ``spec_decode_acceptance_rate`` = accepted / draft_tokens x 100, percent
  (NaN when nothing was drafted).
- ``spec_decode_per_position_acceptance_rates`` (only in
  :func:`summarize_full`): drafts that accepted position j over all drafts.
- simspec's own, under their own names: ``tokens_per_round`` = 1 +
  accepted / rounds, AR rounds included (what a policy that mixes AR and
  drafted rounds emits per verification), and ``draft_acceptance_by_depth``
  (only in :func:`summarize_full`): drafts that accepted >= j tokens over
  drafts that planned depth >= j.

``prefix_cache_hit_rate`` (simspec's own): prompt tokens, visual included,
that completed requests found in the prefix cache when first scheduled,
over all their prompt tokens (vLLM's per-request ``num_cached_tokens``).

Throughput counts the prompt tokens the server counts, visual placeholder
tokens included (vLLM takes ``prompt_tokens`` from the server's usage,
vllm/benchmarks/lib/endpoint_request_func.py 296-297). Goodput takes
``ttft``, ``tpot`` and ``e2el`` SLOs (serve.py 669-691).

ITL comes from the log's gaps (``RunLog.gaps``): exact while a run keeps
every gap, from fine bins beyond (simspec.logs).
"""

from __future__ import annotations

import math

import numpy as np

from simspec.logs import bin_value_s
from simspec.types import MAX_DEPTH, PLAN_KINDS, Gaps, RunLog, require

LATENCIES = ("ttft", "tpot", "itl", "e2el")
STATS = ("mean", "median", "std", "p90", "p95", "p99")

_NAN = float("nan")


def summarize(
    log: RunLog, *, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
    slo_e2el_ms: float | None = None, empty_as_zero: bool = False,
) -> dict[str, float]:
    """Every scalar metric of ``log``, keyed by its vLLM-style name.

    ``request_goodput`` (requests meeting every given SLO, per second) is
    present only when an SLO is given. As in vLLM an SLO is met when the
    latency is <= the SLO, and a request with one output token has tpot 0 for
    goodput. ``completed`` and ``preemptions`` are ints; the rest are floats.
    """
    for name, slo in (("slo_ttft_ms", slo_ttft_ms), ("slo_tpot_ms", slo_tpot_ms), ("slo_e2el_ms", slo_e2el_ms)):
        require(
            slo is None or (math.isfinite(slo) and slo > 0),
            f"{name} must be a positive number of milliseconds, got {slo}",
        )
    req = _request_columns(log)
    done = np.isfinite(req["first_token_s"]) & np.isfinite(req["finish_s"])
    duration_s = float(log.end_s - log.start_s)

    arrival_s = req["arrival_s"][done]
    ttft_s = req["first_token_s"][done] - arrival_s
    e2el_s = req["finish_s"][done] - arrival_s
    output_tokens = req["output_tokens"][done]
    multi = output_tokens > 1
    tpot_s = np.zeros(ttft_s.size)  # 0 for single-token requests, as vLLM's goodput
    tpot_s[multi] = (e2el_s[multi] - ttft_s[multi]) / (output_tokens[multi] - 1)

    out: dict[str, float] = {
        "completed": int(done.sum()),
        "duration_s": duration_s,
        "request_throughput": _per_s(done.sum(), duration_s),
    }
    slos = [(slo, s) for slo, s in ((slo_ttft_ms, ttft_s), (slo_tpot_ms, tpot_s), (slo_e2el_ms, e2el_s))
            if slo is not None]
    if slos:
        good = np.ones(ttft_s.size, dtype=bool)
        for slo, values_s in slos:
            good &= values_s * 1e3 <= slo
        out["request_goodput"] = _per_s(good.sum(), duration_s)
    out["output_throughput"] = _per_s(output_tokens.sum(), duration_s)
    prompt = req["prompt_tokens"][done].sum() + req["visual_tokens"][done].sum()  # as the server counts them
    out["total_token_throughput"] = _per_s(output_tokens.sum() + prompt, duration_s)

    populations_s = {"ttft": ttft_s, "tpot": tpot_s[multi], "e2el": e2el_s}
    for name in LATENCIES:
        stats = _itl_ms(log.gaps, done) if name == "itl" else _stats_ms(name, populations_s[name])
        out.update({k: 0.0 if empty_as_zero and math.isnan(v) else v for k, v in stats.items()})

    out.update(_acceptance(log))
    queue_s = req["admitted_s"] - req["arrival_s"]
    queue_s = queue_s[np.isfinite(queue_s)]
    out["mean_queue_delay_ms"] = float(queue_s.mean() * 1e3) if queue_s.size else _NAN
    out["gpu_busy_fraction"] = _per_s(busy_s(log), duration_s)
    rounds = np.asarray(log.steps.plans, dtype=np.int64)  # [3] AR / linear / tree
    total = int(rounds.sum())
    for kind, count in zip(PLAN_KINDS, rounds):
        out[f"plan_share_{kind}"] = float(count / total) if total else _NAN
    out["preemptions"] = int(req["preemptions"].sum())
    out["prefix_cache_hit_rate"] = _ratio(req["cached_tokens"][done].sum(), prompt)
    return out


def busy_s(log: RunLog) -> float:
    """Seconds the engine ran steps (summed over the kept steps, exactly as numpy does, where they are kept)."""
    return float(np.sum(log.step_duration_s, dtype=float)) if log.step_duration_s is not None else log.steps.busy_s


def mean_decode_batch(log: RunLog) -> float:
    """The decode batch size, weighted by the time each step took."""
    if log.step_batch is None:
        s = log.steps
        return s.batch_busy_s / s.decode_busy_s if s.decode_busy_s > 0 else 0.0
    busy = log.step_batch > 0
    weight = log.step_duration_s[busy]
    return float(np.sum(log.step_batch[busy] * weight) / np.sum(weight)) if weight.sum() > 0 else 0.0


def _over_time(log: RunLog, edges: np.ndarray, at_end: bool, values: np.ndarray, binned: np.ndarray) -> np.ndarray:
    """Per-step ``values`` [S, k] summed in the time bins ``edges`` [T + 1], by
    each step's start (or end); from the log's timeline where it has no steps."""
    if log.step_start_s is not None:
        t = np.asarray(log.step_start_s, dtype=float)
        if at_end:
            t = t + np.asarray(log.step_duration_s, dtype=float)
        return np.stack([np.histogram(t, edges, weights=values[:, k])[0] for k in range(values.shape[1])])
    width = log.timeline.width_s
    centers = (np.arange(len(binned)) + 0.5) * width
    return np.stack([np.histogram(centers, edges, weights=binned[:, k])[0] for k in range(binned.shape[1])])


def plan_mix(log: RunLog, edges: np.ndarray) -> np.ndarray:
    """[3, T] share of rounds planned AR / linear / tree in each time bin
    (``edges`` [T + 1] seconds); bins without rounds are all zero."""
    plans = None if log.step_plans is None else np.asarray(log.step_plans, dtype=float).reshape(-1, 3)
    rounds = _over_time(log, edges, False, plans, np.asarray(log.timeline.plans, dtype=float))  # [3, T]
    total = rounds.sum(axis=0)
    return np.divide(rounds, total, out=np.zeros_like(rounds), where=total > 0)


def tokens_per_s(log: RunLog, edges: np.ndarray) -> np.ndarray:
    """[T] output tokens per second in each time bin (tokens count at their step's end)."""
    tokens = None if log.step_tokens is None else np.asarray(log.step_tokens, dtype=float)[:, None]
    return _over_time(log, edges, True, tokens, np.asarray(log.timeline.tokens, dtype=float)[:, None])[0] / np.diff(edges)


def summarize_full(
    log: RunLog, *, slo_ttft_ms: float | None = None, slo_tpot_ms: float | None = None,
    slo_e2el_ms: float | None = None, empty_as_zero: bool = False,
) -> dict[str, float | list[float]]:
    """:func:`summarize` plus the per-position lists
    ``spec_decode_per_position_acceptance_rates`` and ``draft_acceptance_by_depth``."""
    out: dict[str, float | list[float]] = dict(
        summarize(log, slo_ttft_ms=slo_ttft_ms, slo_tpot_ms=slo_tpot_ms, slo_e2el_ms=slo_e2el_ms,
                  empty_as_zero=empty_as_zero)
    )
    out["spec_decode_per_position_acceptance_rates"] = per_position_acceptance(log)
    out["draft_acceptance_by_depth"] = acceptance_by_depth(log)
    return out


def _depth_counts(log: RunLog, max_depth: int | None) -> tuple[np.ndarray, np.ndarray, int]:
    reached = np.asarray(log.rounds.accepted_at_least or [0] * MAX_DEPTH, dtype=float)  # [MAX_DEPTH]
    planned = np.asarray(log.rounds.depth_at_least or [0] * MAX_DEPTH, dtype=float)
    if max_depth is None:
        max_depth = int(np.flatnonzero(planned > 0).max() + 1) if (planned > 0).any() else 0
    if max_depth < 0:
        raise ValueError(f"max_depth must be >= 0, got {max_depth}")
    return reached, planned, max_depth


def per_position_acceptance(log: RunLog, max_depth: int | None = None) -> list[float]:
    """vLLM's per-position acceptance rates at draft positions 1..max_depth
    (default: the deepest plan): drafts that accepted position j over all
    drafts (vllm/benchmarks/serve.py 0.33, line 1157)."""
    reached, _, max_depth = _depth_counts(log, max_depth)
    drafts = log.rounds.rounds
    rates = np.zeros(max_depth) if drafts else np.full(max_depth, np.nan)
    k = min(max_depth, MAX_DEPTH)
    if drafts:
        rates[:k] = reached[:k] / drafts
    return [float(r) for r in rates]


def acceptance_by_depth(log: RunLog, max_depth: int | None = None) -> list[float]:
    """Acceptance rate at depths 1..max_depth (default: deepest plan): drafts
    that accepted >= j tokens over drafts that planned depth >= j; NaN where
    none planned that deep. Equal to vLLM's per-position rates when every
    draft has the same depth."""
    reached, planned, max_depth = _depth_counts(log, max_depth)
    rates = np.full(max_depth, np.nan)
    np.divide(reached[:max_depth], planned[:max_depth], out=rates[:min(max_depth, MAX_DEPTH)],
              where=planned[:max_depth] > 0)
    return [float(r) for r in rates]


def _acceptance(log: RunLog) -> dict[str, float]:
    r = log.rounds
    if r.rounds and log.rounds_total < r.rounds:
        raise ValueError(
            f"RunLog.rounds_total ({log.rounds_total}) must count every round, "
            f"including the {r.rounds} drafted ones"
        )
    return {
        "spec_decode_num_drafts": int(r.rounds),
        "spec_decode_draft_tokens": int(r.drafted),
        "spec_decode_accepted_tokens": int(r.accepted),
        "spec_decode_acceptance_length": 1.0 + r.accepted / r.rounds if r.rounds else 1.0,
        "spec_decode_acceptance_rate": 100.0 * r.accepted / r.drafted if r.drafted else _NAN,
        "tokens_per_round": 1.0 + r.accepted / log.rounds_total if log.rounds_total else 1.0,
    }


def _itl_ms(gaps: Gaps, done: np.ndarray) -> dict[str, float]:
    """ITL statistics from a run's gaps: exact while every gap is kept (the
    completed requests' only), else from their bins (percentiles within
    half a bin's width, simspec.logs)."""
    if gaps.exact_s is not None:
        values = gaps.exact_s if done.all() else gaps.exact_s[done[gaps.exact_request]]
        return _stats_ms("itl", values)
    counts = gaps.bins
    n = int(counts.sum())
    if not n:
        return {f"{stat}_itl_ms": _NAN for stat in STATS}
    cumulative = np.cumsum(counts)
    values = {"mean": gaps.mean_s, "std": math.sqrt(gaps.m2_s2 / gaps.count)}
    for stat, q in (("median", 50), ("p90", 90), ("p95", 95), ("p99", 99)):
        rank = q / 100 * (n - 1)
        values[stat] = float(bin_value_s(int(np.searchsorted(cumulative, rank, side="right"))))
    return {f"{stat}_itl_ms": float(values[stat] * 1e3) for stat in STATS}


def _stats_ms(name: str, values_s: np.ndarray) -> dict[str, float]:
    x = np.asarray(values_s, dtype=float) * 1e3
    if x.size == 0:
        return {f"{stat}_{name}_ms": _NAN for stat in STATS}
    p90, p95, p99 = np.percentile(x, [90, 95, 99])
    values = (x.mean(), np.median(x), x.std(), p90, p95, p99)
    return {f"{stat}_{name}_ms": float(v) for stat, v in zip(STATS, values)}


def _ratio(part, whole) -> float:
    return float(part / whole) if whole > 0 else _NAN


def _per_s(amount, duration_s: float) -> float:
    if not (math.isfinite(duration_s) and duration_s > 0):
        return _NAN
    return float(amount) / duration_s


def _request_columns(log: RunLog) -> dict[str, np.ndarray]:
    t = log.table
    floats = ("arrival_s", "admitted_s", "first_token_s", "finish_s")
    ints = ("id", "prompt_tokens", "visual_tokens", "output_tokens", "preemptions", "cached_tokens")
    cols = {name: np.asarray(getattr(t, name), dtype=float) for name in floats}
    cols.update({name: np.asarray(getattr(t, name), dtype=np.int64) for name in ints})
    return cols
