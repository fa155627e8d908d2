"""What a live run records: each step's shape and time, and the run's log.

Imports: numpy and simspec.types.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.types import AcceptanceTrace, RequestRecord, RunLog


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
    """The RunLog of a live run (simspec.engine.live._Run: its requests, their
    emitted tokens and times, the chunks, rounds and steps it recorded)."""
    requests, steps = run.requests, run.steps
    records = tuple(
        RequestRecord(id=r.id, arrival_s=r.arrival_s, admitted_s=float(run.admitted_s[i]),
                      first_token_s=float(run.first_s[i]), finish_s=float(run.finish_s[i]),
                      prompt_tokens=r.prompt_tokens, output_tokens=min(len(run.seqs[i].emitted), r.output_tokens),
                      images=r.images, visual_tokens=r.visual_tokens)
        for i, r in enumerate(requests))
    ids = np.array([r.id for r in requests], dtype=np.int64)
    idx = np.array([c[0] for c in run.chunks], dtype=np.int64)
    times = np.array([c[1] for c in run.chunks])
    tokens = np.array([c[2] for c in run.chunks], dtype=np.int64)
    order = np.argsort(times, kind="stable")
    rd = np.array(run.rounds, dtype=np.int64).reshape(-1, 3)
    finish = run.finish_s
    return RunLog(
        policy=label, requests=records, chunk_request=ids[idx[order]] if len(idx) else idx,
        chunk_time_s=times[order], chunk_tokens=tokens[order], round_accepted=rd[:, 0], round_depth=rd[:, 1],
        round_drafted=rd[:, 2], step_start_s=np.array([s.start_s for s in steps]),
        step_duration_s=np.array([s.duration_s for s in steps]),
        step_plans=np.array([s.plans for s in steps], dtype=np.int64).reshape(-1, 3),
        step_batch=np.array([s.batch for s in steps], dtype=np.int64),
        start_s=float(min((r.arrival_s for r in requests), default=0.0)),
        end_s=float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0,
        rounds_total=int(sum(s.batch for s in steps)), complete=bool(np.isfinite(finish).all()), notes=notes)
