"""One log of a fleet's run, merged from its replicas' logs: what the
metrics, tables and run folders read of a one-replica run.

Imports: numpy, simspec.logs (gap bins, the timeline's size), simspec.types.

Requests are one table sorted by id; rounds, steps and gaps are summed (the
gaps kept one by one where every replica kept them and they are at most
simspec.logs.EXACT_GAPS, as one log keeps them, else counted in the shared
bins, their mean and spread pooled); the timeline is re-binned to
the widest replica's bin width (widths are the same start width doubled,
so bins nest). Per-step, per-chunk and per-round arrays are left out, as
a long run leaves them out. Busy time is summed over replicas (the
experiment divides the fleet's ``gpu_busy_fraction`` by the replicas: the
mean replica's share of the run).
"""

from __future__ import annotations

import numpy as np

from simspec.logs import EXACT_GAPS, GAP_BINS, TIMELINE_BINS, gap_bin, stable_order
from simspec.types import Gaps, RequestTable, RoundStats, RunLog, StepStats, Timeline


def merge(logs: list[RunLog], policy: str) -> RunLog:
    """The fleet's log of ``logs``, one per replica, all of ``policy``."""
    table, rows = _table([log.table for log in logs])
    return RunLog(policy=policy, table=table, rounds=_rounds([log.rounds for log in logs]),
                  gaps=_gaps([log.gaps for log in logs], rows), steps=_steps([log.steps for log in logs]),
                  timeline=_timeline([log.timeline for log in logs]),
                  start_s=min(log.start_s for log in logs), end_s=max(log.end_s for log in logs),
                  rounds_total=sum(log.rounds_total for log in logs), complete=all(log.complete for log in logs),
                  notes=tuple(dict.fromkeys(note for log in logs for note in log.notes)))


def _table(tables: list[RequestTable]) -> tuple[RequestTable, list[np.ndarray]]:
    """The requests of every replica by id, and for each replica where its rows went."""
    joined = RequestTable(*(np.concatenate(column) for column in zip(*tables)))
    order = stable_order(joined.id)
    new_row = np.empty(len(order), dtype=np.int64)
    new_row[order] = np.arange(len(order))
    bounds = np.cumsum([0] + [len(t.id) for t in tables])
    return RequestTable(*(column[order] for column in joined)), [new_row[a:b] for a, b in zip(bounds, bounds[1:])]


def _padded_sum(rows: list[tuple[int, ...]]) -> tuple[int, ...]:
    width = max((len(r) for r in rows), default=0)
    return tuple(int(sum(r[j] for r in rows if j < len(r))) for j in range(width))


def _rounds(stats: list[RoundStats]) -> RoundStats:
    return RoundStats(rounds=sum(s.rounds for s in stats), accepted=sum(s.accepted for s in stats),
                      drafted=sum(s.drafted for s in stats),
                      accepted_at_least=_padded_sum([s.accepted_at_least for s in stats]),
                      depth_at_least=_padded_sum([s.depth_at_least for s in stats]))


def _gaps(gaps: list[Gaps], rows: list[np.ndarray]) -> Gaps:
    count = sum(g.count for g in gaps)
    mean = sum(g.mean_s * g.count for g in gaps) / count if count else 0.0
    m2 = sum(g.m2_s2 + g.count * (g.mean_s - mean) ** 2 for g in gaps)  # pooled (Chan et al.'s parallel form)
    if all(g.exact_s is not None for g in gaps) and count <= EXACT_GAPS:
        values = np.concatenate([g.exact_s for g in gaps])
        who = np.concatenate([row[g.exact_request] for g, row in zip(gaps, rows)])
        order = stable_order(who)
        return Gaps(count=count, exact_s=values[order], exact_request=who[order], mean_s=mean, m2_s2=m2)
    bins = np.zeros(GAP_BINS, dtype=np.int64)
    for g in gaps:
        bins += g.bins if g.bins is not None else np.bincount(gap_bin(g.exact_s), minlength=GAP_BINS)
    return Gaps(count=count, bins=bins, mean_s=mean, m2_s2=m2)


def _steps(stats: list[StepStats]) -> StepStats:
    return StepStats(steps=sum(s.steps for s in stats), busy_s=sum(s.busy_s for s in stats),
                     plans=tuple(int(sum(s.plans[k] for s in stats)) for k in range(3)),
                     decode_busy_s=sum(s.decode_busy_s for s in stats), batch_busy_s=sum(s.batch_busy_s for s in stats))


def _timeline(timelines: list[Timeline]) -> Timeline:
    width = max(t.width_s for t in timelines)
    tokens = np.zeros(TIMELINE_BINS, dtype=np.int64)
    plans = np.zeros((TIMELINE_BINS, 3), dtype=np.int64)
    for t in timelines:
        if t.tokens is None:
            continue
        group = int(round(width / t.width_s))  # bins of this replica in one fleet bin
        n = len(t.tokens) // group
        tokens[:n] += t.tokens[:n * group].reshape(n, group).sum(axis=1)
        plans[:n] += t.plans[:n * group].reshape(n, group, 3).sum(axis=1)
    return Timeline(width_s=width, tokens=tokens, plans=plans)


__all__ = ["merge"]
