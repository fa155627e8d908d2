"""What the ``spec_aware`` router knows of a replica, measured: one replica
serves a short burst of the workload, and its steps and chunks give the
decode step time by batch size and the policy's tokens per round for text
requests and for requests with images (:class:`simspec.fleet.routers.ReplicaModel`).

Imports: numpy, simspec.seeds, simspec.sim, simspec.fleet.routers, simspec.types.

The burst is the workload's first ``BURST`` requests, all arriving at 0,
served on its own seed stream (it draws nothing from the fleet's streams):
the batch fills to the limit and drains to one, so every batch size from
one to the limit is stepped. A batch size's step time is the median of its
steps (a median leaves out the steps that also ran prefill chunks); the time the steps took beyond those
medians, over the burst's prompt tokens, is the prefill time per prompt
token; a request's tokens per round are its tokens after the first over
its chunks after the first.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Sequence

import numpy as np

from simspec import seeds
from simspec.fleet.routers import ReplicaModel
from simspec.sim import simulate
from simspec.types import Request

BURST = 256  # requests of the calibration burst


def calibrate(requests: Sequence[Request], *, seed: int, **serve) -> ReplicaModel:
    """The replica model of ``serve`` (simspec.sim.simulate's arguments) on ``requests``' mix."""
    burst = [replace(r, arrival_s=0.0) for r in requests[:BURST]]
    serve = {**serve, "event_detail": True, "gap_budget": None}  # its own log, not the fleet's
    child = int(seeds.stream(seed, "router-model").generate_state(1)[0])
    log = simulate(burst, label="calibration", seed=child, **serve)
    batch, duration = log.step_batch, log.step_duration_s
    sizes = np.unique(batch[batch > 0])
    medians = [float(np.median(duration[batch == b])) for b in sizes]
    decode_s = np.interp(batch, sizes, medians) * (batch > 0)
    prompt = sum(r.prompt_tokens + sum(r.image_tokens) for r in burst)
    prefill = max(float(duration.sum() - decode_s.sum()), 0.0) / max(prompt, 1)
    per_request = _tokens_per_round(log)
    images = np.array([bool(r.image_tokens) for r in burst])
    overall = float(np.nanmean(per_request)) if np.isfinite(per_request).any() else 1.0

    def mean_of(rows: np.ndarray) -> float:
        values = per_request[rows]
        values = values[np.isfinite(values)]
        return float(values.mean()) if len(values) else overall

    return ReplicaModel(batch_sizes=tuple(int(b) for b in sizes), step_s=tuple(medians),
                        batch_limit=int(serve["engine"].max_num_seqs),
                        tokens_per_round_text=mean_of(~images), tokens_per_round_image=mean_of(images),
                        prefill_s_per_token=prefill)


def _tokens_per_round(log) -> np.ndarray:
    """[N] each request's tokens per chunk after its first chunk (NaN: one chunk only), in table order."""
    ids = log.table.id
    by_id = np.argsort(ids, kind="stable")
    rows = by_id[np.searchsorted(ids[by_id], log.chunk_request)]
    chunks = np.bincount(rows, minlength=len(ids)).astype(float)
    tokens = np.bincount(rows, weights=log.chunk_tokens, minlength=len(ids))
    in_time = np.argsort(log.chunk_time_s, kind="stable")
    seen, first = np.unique(rows[in_time], return_index=True)  # each row's earliest chunk
    first_tokens = np.zeros(len(ids))
    first_tokens[seen] = log.chunk_tokens[in_time[first]]
    with np.errstate(invalid="ignore", divide="ignore"):
        out = (tokens - first_tokens) / (chunks - 1)
    out[chunks < 2] = np.nan
    return out


__all__ = ["BURST", "calibrate"]
