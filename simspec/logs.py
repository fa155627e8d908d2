"""Building a run's log in bounded memory, for the simulator and the live engine.

Imports: numpy and simspec.types.

A run feeds its emitted chunks, drafted rounds and steps in blocks, in the
order they happened (:class:`LogBuilder`). What the metrics need is kept
as it arrives:

- chunk gaps (ITL): each chunk's time minus the same request's previous
  chunk's; every gap while there are at most EXACT_GAPS (metrics then are
  exact: numpy's statistics over the gaps in request order), beyond that a
  histogram of GAP_BINS log-spaced bins between MIN_GAP_S and MAX_GAP_S
  (relative width GAP_RATIO - 1: a percentile within half of it), with the
  exact count, mean and spread. The replicas of a fleet share the count
  (:class:`GapBudget`): past EXACT_GAPS over the fleet, each bins its own;
- drafted rounds as counts (RoundStats);
- per step its start, duration, batch, plan mix and tokens emitted.

The per-chunk and per-round arrays themselves are kept while the run has at
most DETAIL_EVENTS chunks (tests and golden timelines read them) and
dropped beyond, or not kept at all where the run says so
(``event_detail=False``: metrics, plots and run folders never read them,
and an hour's trace has millions). A million-request run thus needs a row
per request, a few numbers per step and the histogram.
"""

from __future__ import annotations

import math

import numpy as np

from simspec.types import MAX_DEPTH, Gaps, RequestTable, RoundStats, RunLog, StepStats, Timeline

EXACT_GAPS = 1 << 22  # gaps kept one by one at most (16 bytes each with their request)
DETAIL_EVENTS = 1 << 22  # chunks (and rounds) kept one by one at most
DETAIL_STEPS = 1 << 21  # steps kept one by one at most
TIMELINE_BINS = 4096  # bins of the steps over time (even)
TIMELINE_START_S = 1e-3  # their first width
MIN_GAP_S, MAX_GAP_S = 1e-7, 1e5
GAP_RATIO = 1.0 + 1e-4
GAP_BINS = int(math.ceil(math.log(MAX_GAP_S / MIN_GAP_S) / math.log(GAP_RATIO))) + 1


def gap_bin(gaps_s: np.ndarray) -> np.ndarray:
    """Each gap's bin (gaps below MIN_GAP_S in the first, above MAX_GAP_S in the last)."""
    x = np.log(np.clip(gaps_s, MIN_GAP_S, MAX_GAP_S) / MIN_GAP_S) / math.log(GAP_RATIO)
    return np.minimum(x.astype(np.int64), GAP_BINS - 1)


def bin_value_s(index: np.ndarray) -> np.ndarray:
    """The geometric middle of bins ``index``, seconds."""
    return MIN_GAP_S * GAP_RATIO ** (np.asarray(index, dtype=float) + 0.5)


class GapBudget:
    """The gaps kept one by one so far, by one log or by the replicas of a
    fleet together (each replica's log holding the same budget): past
    EXACT_GAPS, every log that holds it counts its gaps in bins, so a
    fleet's merged log is exact exactly where one replica's log of the same
    gaps would be, and its memory bounded as one's."""

    def __init__(self):
        self.kept = 0

    @property
    def spent(self) -> bool:
        return self.kept > EXACT_GAPS


class _Gaps:
    """Gaps between each request's consecutive chunks, exact or binned."""

    def __init__(self, n_requests: int, budget: GapBudget | None = None, last_s: np.ndarray | None = None):
        # [N] the request's previous chunk time (a fleet's alike replicas share one: each request is one's)
        self.last_s = np.full(n_requests, np.nan) if last_s is None else last_s
        self.requests: list[np.ndarray] = []
        self.values: list[np.ndarray] = []
        self.budget = GapBudget() if budget is None else budget
        self.bins: np.ndarray | None = None
        self.count, self.mean_s, self.m2 = 0, 0.0, 0.0

    def _to_bins(self) -> None:
        """From here on, counts in bins (the gaps kept so far too)."""
        self.bins = np.zeros(GAP_BINS, dtype=np.int64)
        for values in self.values:
            self.bins += np.bincount(gap_bin(values), minlength=GAP_BINS)
        self.requests, self.values = [], []

    def add(self, index: np.ndarray, time_s: np.ndarray) -> None:
        """Chunks of requests ``index`` [C] at ``time_s`` [C], in time order."""
        if not len(index):
            return
        order = stable_order(index)  # each request's chunks, still in time order
        idx, t = index[order], time_s[order]
        previous = np.empty(len(t))
        previous[1:] = t[:-1]
        first = np.ones(len(t), dtype=bool)
        first[1:] = idx[1:] != idx[:-1]
        previous[first] = self.last_s[idx[first]]
        last = np.ones(len(t), dtype=bool)
        last[:-1] = first[1:]
        self.last_s[idx[last]] = t[last]
        has = ~np.isnan(previous)
        gaps, who = t[has] - previous[has], idx[has]
        if len(gaps):  # Chan et al.'s pairwise update of the mean and the sum of squared deviations
            n, mean = len(gaps), float(gaps.mean())
            m2 = float(np.sum((gaps - mean) ** 2))
            total = self.count + n
            delta = mean - self.mean_s
            self.mean_s += delta * n / total
            self.m2 += m2 + delta * delta * self.count * n / total
            self.count = total
        if self.bins is None and self.budget.spent:  # another log that holds the budget spent it
            self._to_bins()
        if self.bins is None:
            self.requests.append(who)
            self.values.append(gaps)
            self.budget.kept += len(gaps)
            if self.budget.spent:
                self._to_bins()
        else:
            self.bins += np.bincount(gap_bin(gaps), minlength=GAP_BINS)

    def result(self, ids: np.ndarray) -> Gaps:
        if self.bins is None and self.budget.spent:
            self._to_bins()
        if self.bins is not None:
            return Gaps(count=self.count, bins=self.bins, mean_s=self.mean_s, m2_s2=self.m2)
        who = np.concatenate(self.requests) if self.requests else np.zeros(0, np.int64)
        values = np.concatenate(self.values) if self.values else np.zeros(0)
        order = stable_order(ids[who])  # by request id, each request's in time order
        return Gaps(count=self.count, exact_s=values[order], exact_request=who[order], mean_s=self.mean_s,
                    m2_s2=self.m2)


def stable_order(keys: np.ndarray) -> np.ndarray:
    """``np.argsort(keys, kind="stable")`` (the same permutation: a stable
    order is unique) in linear time where the keys are integers in
    [0, 2**32): numpy sorts 16-bit keys by radix, so the low half, then
    the high half stably; an hour's trace has millions of chunks, which
    numpy's stable sort of 64-bit keys (timsort) takes ~3x as long on."""
    if keys.dtype.kind not in "iu" or not len(keys):
        return np.argsort(keys, kind="stable")
    low, high = keys.min(), keys.max()  # one pass each, read once
    if low < 0 or high >= 1 << 32:
        return np.argsort(keys, kind="stable")
    order = np.argsort((keys & 0xFFFF).astype(np.uint16), kind="stable")
    if high < 1 << 16:
        return order
    return order[np.argsort((keys[order] >> 16).astype(np.uint16), kind="stable")]


class _Rounds:
    def __init__(self):
        self.rounds = self.accepted = self.drafted = 0
        self.accepted_at_least = np.zeros(MAX_DEPTH, dtype=np.int64)
        self.depth_at_least = np.zeros(MAX_DEPTH, dtype=np.int64)

    def add(self, accepted: np.ndarray, depth: np.ndarray, drafted: np.ndarray) -> None:
        self.rounds += len(accepted)
        self.accepted += int(accepted.sum())
        self.drafted += int(drafted.sum())
        self.accepted_at_least += _at_least(accepted)
        self.depth_at_least += _at_least(depth)

    def result(self) -> RoundStats:
        return RoundStats(rounds=self.rounds, accepted=self.accepted, drafted=self.drafted,
                          accepted_at_least=tuple(int(v) for v in self.accepted_at_least),
                          depth_at_least=tuple(int(v) for v in self.depth_at_least))


def _at_least(values: np.ndarray) -> np.ndarray:
    """[MAX_DEPTH] how many of ``values`` are >= j, j = 1..MAX_DEPTH."""
    counts = np.bincount(np.clip(values, 0, MAX_DEPTH), minlength=MAX_DEPTH + 1)
    return np.cumsum(counts[::-1])[::-1][1:]


class _Steps:
    """Steps summed, and binned over time (a Timeline), as they arrive."""

    def __init__(self):
        self.count, self.busy, self.decode_busy, self.batch_busy = 0, 0.0, 0.0, 0.0
        self.plans = np.zeros(3, dtype=np.int64)
        self.width = TIMELINE_START_S
        self.tokens = np.zeros(TIMELINE_BINS, dtype=np.int64)
        self.plan_bins = np.zeros((TIMELINE_BINS, 3), dtype=np.int64)

    def add(self, start_s, duration_s, batch, plans, tokens) -> None:
        self.count += len(start_s)
        self.busy += float(duration_s.sum())
        decode = batch > 0
        self.decode_busy += float(duration_s[decode].sum())
        self.batch_busy += float(np.dot(batch[decode], duration_s[decode]))
        self.plans += plans.sum(axis=0)
        if not len(start_s):
            return
        end_s = start_s + duration_s
        while max(end_s.max(), start_s.max()) >= self.width * TIMELINE_BINS:  # widen: pairs of bins merge
            self.tokens = np.concatenate([self.tokens.reshape(-1, 2).sum(axis=1), np.zeros(TIMELINE_BINS // 2, np.int64)])
            half = self.plan_bins.reshape(-1, 2, 3).sum(axis=1)
            self.plan_bins = np.concatenate([half, np.zeros((TIMELINE_BINS // 2, 3), np.int64)])
            self.width *= 2
        np.add.at(self.tokens, (np.maximum(end_s, 0) // self.width).astype(np.int64), tokens)
        np.add.at(self.plan_bins, (np.maximum(start_s, 0) // self.width).astype(np.int64), plans)

    def stats(self) -> StepStats:
        return StepStats(steps=self.count, busy_s=self.busy, plans=tuple(int(p) for p in self.plans),
                         decode_busy_s=self.decode_busy, batch_busy_s=self.batch_busy)

    def timeline(self) -> Timeline:
        return Timeline(width_s=self.width, tokens=self.tokens.copy(), plans=self.plan_bins.copy())


class LogBuilder:
    """A run's log, fed in blocks (module docstring). Requests are indexed
    0..N-1 here; ``ids`` [N] gives each its request id. ``event_detail``
    False keeps no per-chunk and per-round arrays (RunLog's ``chunk_*`` and
    ``round_*`` are None), whatever the run's size. ``gap_budget``: the
    count of exact gaps it shares with other logs (a fleet's replicas';
    None: its own); ``last_s``: each request's last chunk time, an [N]
    array of NaN to start (a fleet's alike replicas share one)."""

    def __init__(self, ids: np.ndarray, *, event_detail: bool = True, gap_budget: GapBudget | None = None,
                 last_s: np.ndarray | None = None):
        self.ids = np.asarray(ids, dtype=np.int64)
        self._gaps = _Gaps(len(self.ids), gap_budget, last_s)
        self._rounds = _Rounds()
        self._steps: dict[str, list[np.ndarray]] | None = {k: [] for k in ("start", "duration", "batch", "plans",
                                                                                  "tokens")}
        self._totals = _Steps()
        self._chunks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = [] if event_detail else None
        self._round_rows: list[tuple[np.ndarray, np.ndarray, np.ndarray]] | None = [] if event_detail else None
        self._events = 0

    def chunks(self, index: np.ndarray, time_s: np.ndarray, tokens: np.ndarray) -> None:
        """Chunks emitted by requests ``index`` at ``time_s`` with ``tokens`` tokens, in time order."""
        self._gaps.add(index, time_s)
        self._events += len(index)
        if self._chunks is not None:
            self._chunks.append((index.copy(), time_s.copy(), tokens.copy()))
            if self._events > DETAIL_EVENTS:
                self._chunks = self._round_rows = None

    def rounds(self, accepted: np.ndarray, depth: np.ndarray, drafted: np.ndarray) -> None:
        self._rounds.add(accepted, depth, drafted)
        if self._round_rows is not None:
            self._round_rows.append((accepted.copy(), depth.copy(), drafted.copy()))

    def steps(self, start_s: np.ndarray, duration_s: np.ndarray, batch: np.ndarray, plans: np.ndarray,
              tokens: np.ndarray) -> None:
        self._totals.add(start_s, duration_s, batch, plans, tokens)
        if self._steps is not None:
            for key, values in zip(self._steps, (start_s, duration_s, batch, plans, tokens)):
                self._steps[key].append(values.copy())
            if self._totals.count > DETAIL_STEPS:
                self._steps = None

    def finish(self, *, policy: str, table: RequestTable, complete: bool, notes: tuple[str, ...] = ()) -> RunLog:
        def column(key: str, dtype, width: int = 0) -> np.ndarray:
            parts = self._steps[key]
            empty = np.zeros((0, width) if width else 0, dtype=dtype)
            return np.concatenate(parts).astype(dtype) if parts else empty

        detail = {}
        if self._steps is not None:
            detail = dict(step_start_s=column("start", float), step_duration_s=column("duration", float),
                          step_plans=column("plans", np.int64, 3).reshape(-1, 3), step_batch=column("batch", np.int64),
                          step_tokens=column("tokens", np.int64))
        if self._chunks is not None:
            index = np.concatenate([c[0] for c in self._chunks]) if self._chunks else np.zeros(0, np.int64)
            detail.update(
                chunk_request=self.ids[index.astype(np.int64)],
                chunk_time_s=np.concatenate([c[1] for c in self._chunks]) if self._chunks else np.zeros(0),
                chunk_tokens=(np.concatenate([c[2] for c in self._chunks]) if self._chunks
                              else np.zeros(0)).astype(np.int64),
                **{name: (np.concatenate([r[k] for r in self._round_rows]) if self._round_rows
                          else np.zeros(0)).astype(np.int64)
                   for k, name in enumerate(("round_accepted", "round_depth", "round_drafted"))})
        finish_s = table.finish_s
        return RunLog(
            policy=policy, table=table, rounds=self._rounds.result(), gaps=self._gaps.result(self.ids),
            steps=self._totals.stats(), timeline=self._totals.timeline(),
            # the benchmark's start: time 0, or the first arrival if earlier (vllm bench serve's duration)
            start_s=min(0.0, float(table.arrival_s.min())) if len(table.arrival_s) else 0.0,
            end_s=float(np.nanmax(finish_s)) if np.isfinite(finish_s).any() else 0.0,
            rounds_total=int(sum(self._totals.plans)), complete=complete, notes=notes, **detail)


__all__ = ["LogBuilder", "GapBudget", "EXACT_GAPS", "DETAIL_EVENTS", "GAP_BINS", "gap_bin", "bin_value_s"]
