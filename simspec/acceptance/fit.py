"""Acceptance models fitted to live acceptance traces, and their files.

Imports: numpy, scipy (minimize), simspec.files, simspec.types,
simspec.acceptance.model.

A trace row is one drafted round: the target token's rank among the
drafter's candidates at each depth along the rank-1 chain (0: not among
them), while the chain is the target's path, and the drafter's confidences.
The rank-based model (simspec.acceptance.model) is fitted by simulated
moments with common random numbers: per-depth conditional top-1 rates, the
spread of per-request top-1 rates, the rank tail, and the calibration of
confidence against acceptance. The drafter's visual context is the one the
traces were recorded with, so ``visual_share`` is 0: the model already
holds that context's acceptance.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np

from simspec.acceptance.model import AcceptanceModel, draw_round, normals_per_round
from simspec.files import load_record, save_record
from simspec.types import MAX_RANK, AcceptanceTrace, require

ACCEPTANCE_FORMAT = "simspec-acceptance/1"

def _trace_stats(traces: Sequence[AcceptanceTrace], depth: int, bins: np.ndarray) -> dict[str, np.ndarray]:
    """Moments of traces: per-depth conditional top-1 rate, the rank-2/3
    shares among misses at depth 1, the spread of per-request top-1 rates,
    and top-1 acceptance per confidence bin."""
    hits = np.zeros(depth)
    seen = np.zeros(depth)
    tail = np.zeros(3)  # misses at depth 1 that were rank 2, rank 3, not ranked
    per_request: dict[int, list[int]] = {}
    conf_hits = np.zeros(len(bins) - 1)
    conf_seen = np.zeros(len(bins) - 1)
    for row in traces:
        for d, rank in enumerate(row.ranks[:depth]):
            seen[d] += 1
            hits[d] += rank == 1
            c = row.conf[d][0]
            k = min(max(int(np.searchsorted(bins, c, side="right")) - 1, 0), len(bins) - 2)
            conf_seen[k] += 1
            conf_hits[k] += rank == 1
            if d == 0:
                per_request.setdefault(row.request, []).append(int(rank == 1))
                if rank != 1:
                    tail[0 if rank == 2 else 1 if rank == 3 else 2] += 1
    rates = np.array([np.mean(v) for v in per_request.values() if len(v) >= 4])
    return {"rate": hits / np.maximum(seen, 1), "seen": seen, "tail": tail / max(tail.sum(), 1),
            "spread": np.array([rates.std() if len(rates) > 1 else 0.0]),
            "calibration": conf_hits / np.maximum(conf_seen, 1), "conf_seen": conf_seen}


def _model_traces(model: AcceptanceModel, requests: int, rounds: int, depth: int,
                  rng_seed: int = 0) -> list[AcceptanceTrace]:
    """Traces the model would record, in the live engine's format (CRN: fixed seed)."""
    rng = np.random.default_rng(rng_seed)
    logits = model.top1_logit + model.request_sigma * rng.standard_normal(requests)
    rows = []
    n = requests * depth
    ones = np.ones(requests)
    draws = model.draws._replace(visual_share=0.0)
    for r in range(rounds):
        normals = rng.standard_normal(normals_per_round(draws, requests, depth))
        conf, ranks, _ = draw_round(logits, ones, depth, 3, draws, normals, rng.random(2 * n))
        for i in range(requests):
            got = []
            for d in range(depth):
                got.append(int(ranks[i, d]) if ranks[i, d] <= 3 else 0)
                if ranks[i, d] != 1:
                    break
            rows.append(AcceptanceTrace(request=i, output_index=0, context=0, ranks=tuple(got),
                                        conf=tuple(tuple(conf[i, d]) for d in range(len(got)))))
    return rows


def _confidence_tail(traces: Sequence[AcceptanceTrace]) -> tuple[float | None, float | None]:
    """Mass and decay of the geometric shape of the drafter's confidences
    beyond its first candidate, from their mean shares of 1 - conf(rank 1)
    at ranks 2 and 3 (what a tree policy branches on). None when the traces
    hold fewer than three confidences a depth."""
    shares = [np.array(c[1:3]) / (1.0 - c[0]) for row in traces for c in row.conf if len(c) >= 3 and c[0] < 1.0]
    if not shares:
        return None, None
    return _geometric_tail(*np.mean(shares, axis=0))


def _geometric_tail(second: float, third: float) -> tuple[float, float]:
    """Mass and decay of the geometric tail (``acceptance.model._tail``) whose
    ranks 2 and 3 hold ``second`` and ``third``."""
    decay = float(np.clip(third / second if second > 0 else 0.5, 0.05, 0.95))
    shape = decay ** np.arange(MAX_RANK - 1)
    return float(np.clip(second / (shape[0] / shape.sum()), 0.0, 1.0)), decay


def fit_acceptance(traces: Sequence[AcceptanceTrace], name: str = "calibrated", depth: int | None = None) -> AcceptanceModel:
    """Fit the rank-based acceptance model to live acceptance traces."""
    require(len(traces) >= 50, f"acceptance traces must hold >= 50 drafted rounds to fit (got {len(traces)})")
    depth = depth or max(1, min(6, max(len(t.ranks) for t in traces)))
    bins = np.array([0.0, 0.3, 0.5, 0.7, 0.85, 0.95, 1.0001])
    live = _trace_stats(traces, depth, bins)
    weight = np.minimum(live["seen"], 2000) / 2000
    misses = 1.0 - live["rate"][0]
    # Tail: P(rank 2 | miss) and P(rank 3 | miss) give mass and decay of the geometric tail.
    tail_mass, tail_decay = _geometric_tail(live["tail"][0], live["tail"][1])
    if misses <= 0:
        tail_mass = 0.6
    conf_mass, conf_decay = _confidence_tail(traces)
    requests = 400

    def model_of(x):
        return AcceptanceModel(name=name, top1_logit=float(x[0]), depth_decay_logit=float(abs(x[1])),
                               request_sigma=float(abs(x[2])), token_sigma=float(abs(x[3])),
                               confidence_sigma=float(abs(x[4])), tail_mass=tail_mass, tail_decay=tail_decay,
                               visual_share=0.0, conf_tail_mass=conf_mass, conf_tail_decay=conf_decay)

    def loss(x):
        sim = _trace_stats(_model_traces(model_of(x), requests, 12, depth), depth, bins)
        err = np.sum(weight * (sim["rate"] - live["rate"]) ** 2)
        err += (sim["spread"][0] - live["spread"][0]) ** 2
        cw = np.minimum(live["conf_seen"], 500) / 500
        err += 0.5 * np.sum(cw * (sim["calibration"] - live["calibration"]) ** 2) / max(cw.sum(), 1)
        return err

    p1 = float(np.clip(live["rate"][0], 0.02, 0.98))
    start = np.array([np.log(p1 / (1 - p1)), 0.1, 0.5, 1.0, 0.5])
    from scipy.optimize import minimize  # only when fitting: simulating needs no scipy.optimize

    best = minimize(loss, start, method="Nelder-Mead", options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-7})
    return model_of(best.x)


def save_acceptance(model: AcceptanceModel, path: str | Path, *, fitted_to: str, source: dict | None = None) -> None:
    """Write ``model``, fitted to traces of the model spec ``fitted_to``'s drafter."""
    save_record({"format": ACCEPTANCE_FORMAT, "model": asdict(model),
                 "source": {**(source or {}), "model": fitted_to}}, path)


def load_acceptance(path: str | Path, model: str | None = None) -> AcceptanceModel:
    """An acceptance model file written by :func:`save_acceptance` (``--acceptance
    PATH``), refused for another ``model`` than its traces came from."""
    record = load_record(path, "acceptance", ACCEPTANCE_FORMAT, lambda r: r)
    source = record.get("source")
    fitted_to = source.get("model") if isinstance(source, dict) else None
    require(isinstance(fitted_to, str), f"acceptance file {path} does not say which model its traces came from "
                                        f"(source.model; written by an older simspec: refit it with `simspec validate`)")
    require(model is None or model == fitted_to, f"acceptance file {path} was fitted to {fitted_to}'s drafter; the "
                                                 f"run is of {model} (choose --model {fitted_to} or a preset)")
    return load_record(path, "acceptance", ACCEPTANCE_FORMAT, lambda r: AcceptanceModel(**_pairs(r["model"])))


def _pairs(fields: dict) -> dict:
    """A model record from JSON: its class levels back as (class, offset) pairs (JSON has lists)."""
    for key in ("class_logit", "class_sigma"):
        pairs = fields.get(key)
        if isinstance(pairs, list):
            fields = {**fields, key: tuple(tuple(p) if isinstance(p, list) else p for p in pairs)}
    if isinstance(fields.get("depth_profile"), list):
        fields = {**fields, "depth_profile": tuple(fields["depth_profile"])}
    return fields
