"""What a live run records: each step's shape and time, and the run's log.

Imports: numpy, simspec.logs, simspec.types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.logs import LogBuilder
from simspec.types import AcceptanceTrace, RequestTable, RunLog

TRACE_RANKS = 8  # candidate ranks recorded per depth in acceptance traces


def acceptance_trace(request: int, first: object, chain: list, known: int, new_tokens: list[int], accepted: int,
                     first_index: int, context: int) -> AcceptanceTrace:
    """One round's trace: the target token's rank among the candidates the
    drafter proposed along its rank-1 chain (0: not among the top
    TRACE_RANKS), depth by depth while the chain is the target's path and
    the target's token is known, with the drafter's confidences at each
    depth. ``first`` holds the first level's candidates and confidences
    (``cand``, ``conf``), ``chain`` the deeper levels' nodes."""
    ranks, confs = [], []
    for d in range(known):
        if d > accepted:  # the target's token at this depth was never computed
            break
        cands, conf = (first.cand, first.conf) if d == 0 else (chain[d - 1].cand, chain[d - 1].conf)
        if cands is None:
            break
        truth = new_tokens[d]
        top = cands[:TRACE_RANKS]
        rank = top.index(truth) + 1 if truth in top else 0
        ranks.append(rank)
        confs.append(tuple(round(float(c), 5) for c in conf[:TRACE_RANKS]))
        if rank != 1:
            break
    return AcceptanceTrace(request=request, output_index=first_index, context=context, ranks=tuple(ranks),
                           conf=tuple(confs))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One engine step's work (the cost model's inputs) and its wall time."""

    start_s: float
    duration_s: float
    forward_tokens: int
    kv_read_tokens: int
    attn_pairs: int
    attn_requests: int  # sequences in the target forward (prefill chunks + decode rounds)
    logit_tokens: int
    vision_tokens: int
    draft_level_tokens: tuple[int, ...]  # rows of each drafter call (EngineConfig.drafting = "chain" prices these)
    draft_kept_visual_tokens: int
    select_requests: int
    select_visual_tokens: int
    batch: int
    plans: tuple[int, int, int]
    padded_kv_tokens: int = 0  # attention rows x the longest cached context (the dense caches it gathers)
    prefill_tokens: int = 0  # of forward_tokens etc.: the prefill chunks' part
    prefill_kv_tokens: int = 0
    prefill_attn_pairs: int = 0
    prefill_requests: int = 0
    verifying: bool = False  # some decode round verified drafts
    draft_s: float = 0.0  # of duration_s: drafting (selection and planning included)
    target_s: float = 0.0  # ... the vision encoder, the target forward and acceptance
    idle_s: float = 0.0  # the engine had nothing to run for this long just before the step (0: it had work)


@dataclass(frozen=True, slots=True)
class LiveResult:
    log: RunLog
    steps: tuple[StepRecord, ...]
    traces: tuple[AcceptanceTrace, ...]  # one per drafted round
    outputs: dict[int, list[int]]  # request id -> generated tokens


def run_log(label: str, run, notes: tuple[str, ...]) -> RunLog:
    """The RunLog of a live run (simspec.live.engine._Run: its requests, their
    emitted tokens and times, the chunks, rounds and steps it recorded)."""
    requests, steps = run.requests, run.steps
    builder = LogBuilder(np.array([r.id for r in requests], dtype=np.int64))
    idx = np.array([c[0] for c in run.chunks], dtype=np.int64)
    times = np.array([c[1] for c in run.chunks], dtype=float)
    order = np.argsort(times, kind="stable")
    builder.chunks(idx[order], times[order], np.array([c[2] for c in run.chunks], dtype=np.int64)[order])
    rd = np.array(run.rounds, dtype=np.int64).reshape(-1, 3)
    builder.rounds(rd[:, 0], rd[:, 1], rd[:, 2])
    builder.steps(np.array([s.start_s for s in steps], dtype=float), np.array([s.duration_s for s in steps], dtype=float),
                  np.array([s.batch for s in steps], dtype=np.int64),
                  np.array([s.plans for s in steps], dtype=np.int64).reshape(-1, 3),
                  np.array(run.step_tokens, dtype=np.int64))
    table = RequestTable(
        id=np.array([r.id for r in requests], np.int64), arrival_s=np.array([r.arrival_s for r in requests], float),
        admitted_s=run.admitted_s, first_token_s=run.first_s, finish_s=run.finish_s,
        prompt_tokens=np.array([r.prompt_tokens for r in requests], np.int64),
        output_tokens=np.array([min(len(run.seqs[i].emitted), r.output_tokens) for i, r in enumerate(requests)],
                               np.int64),
        images=np.array([r.images for r in requests], np.int64),
        visual_tokens=np.array([r.visual_tokens for r in requests], np.int64),
        preemptions=np.zeros(len(requests), np.int64), cached_tokens=run.scheduler.cached_tokens.copy())
    return builder.finish(policy=label, table=table, complete=bool(np.isfinite(run.finish_s).all()), notes=notes)
