"""Calibration from live runs: an acceptance model fitted to acceptance
traces, and a cost model fitted to measured engine steps.

Imports: numpy, scipy, simspec.acceptance, simspec.costs, simspec.types (no
torch: the simulator loads what this module writes).

**Acceptance.** A trace row is one drafted round: the target token's rank
among the drafter's candidates at each depth along the rank-1 chain (0: not
among them), while the chain is the target's path, and the drafter's
confidences. The rank-based model (simspec.acceptance) is fitted by
simulated moments with common random numbers: per-depth conditional top-1
rates, the spread of per-request top-1 rates, the rank tail, and the
calibration of confidence against acceptance. The drafter's visual context
is the one the traces were recorded with, so ``visual_share`` is 0: the
model already holds that context's acceptance.

**Costs.** Each live step records the simulator's step shape and its wall
time; a non-negative least-squares fit (of relative error) of the cost model's own terms
(per-step overhead, per target token, per logit row, per attention pair,
per sequence in the forward,
the vision encoder, per drafter level and row, per kept visual token,
selection) gives a :class:`CostModel` the simulator prices steps with.
Steps the engine ran straight after sitting idle are left out of it: they
cost more the longer it idled (on the development machine a step after
half a second idle takes 5-10x its usual time), and the cost model's wake
term (``wake_s``, ``wake_tau_s``) is fitted to what they and the step after
each cost beyond the fit (``wake_next_share``: the step after's share).
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Sequence

import numpy as np
from scipy.optimize import least_squares, minimize, nnls

from simspec.acceptance import AcceptanceModel, draw_round
from simspec.files import write_text
from simspec.costs.base import TABLE_TOKENS, CostModel, frozen_table, uniform_attention
from simspec.types import MAX_RANK, InputError, require

ACCEPTANCE_FORMAT = "simspec-acceptance/1"
COST_FORMAT = "simspec-step-costs/1"


# -- acceptance -----------------------------------------------------------------

def _trace_stats(traces: Sequence[dict], depth: int, bins: np.ndarray) -> dict[str, np.ndarray]:
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
        for d, rank in enumerate(row["ranks"][:depth]):
            seen[d] += 1
            hits[d] += rank == 1
            c = row["conf"][d][0]
            k = min(max(int(np.searchsorted(bins, c, side="right")) - 1, 0), len(bins) - 2)
            conf_seen[k] += 1
            conf_hits[k] += rank == 1
            if d == 0:
                per_request.setdefault(row["request"], []).append(int(rank == 1))
                if rank != 1:
                    tail[0 if rank == 2 else 1 if rank == 3 else 2] += 1
    rates = np.array([np.mean(v) for v in per_request.values() if len(v) >= 4])
    return {"rate": hits / np.maximum(seen, 1), "seen": seen, "tail": tail / max(tail.sum(), 1),
            "spread": np.array([rates.std() if len(rates) > 1 else 0.0]),
            "calibration": conf_hits / np.maximum(conf_seen, 1), "conf_seen": conf_seen}


def _model_traces(model: AcceptanceModel, requests: int, rounds: int, depth: int, rng_seed: int = 0) -> list[dict]:
    """Traces the model would record, in the live engine's format (CRN: fixed seed)."""
    rng = np.random.default_rng(rng_seed)
    logits = model.top1_logit + model.request_sigma * rng.standard_normal(requests)
    rows = []
    n = requests * depth
    ones = np.ones(requests)
    for r in range(rounds):
        conf, ranks, _ = draw_round(logits, ones, depth, 3, model.depth_decay_logit, model.token_sigma,
                                    model.confidence_sigma, 0.0, model.tail, model.conf_tail, rng.standard_normal(2 * n),
                                    rng.random(2 * n))
        for i in range(requests):
            got = []
            for d in range(depth):
                got.append(int(ranks[i, d]) if ranks[i, d] <= 3 else 0)
                if ranks[i, d] != 1:
                    break
            rows.append({"request": i, "ranks": got, "conf": [list(conf[i, d]) for d in range(len(got))]})
    return rows


def _confidence_tail(traces: Sequence[dict]) -> tuple[float | None, float | None]:
    """Mass and decay of the geometric shape of the drafter's confidences
    beyond its first candidate, from their mean shares of 1 - conf(rank 1)
    at ranks 2 and 3 (what a tree policy branches on). None when the traces
    hold fewer than three confidences a depth."""
    shares = [np.array(c[1:3]) / (1.0 - c[0]) for row in traces for c in row["conf"] if len(c) >= 3 and c[0] < 1.0]
    if not shares:
        return None, None
    return _geometric_tail(*np.mean(shares, axis=0))


def _geometric_tail(second: float, third: float) -> tuple[float, float]:
    """Mass and decay of the geometric tail (``acceptance._tail``) whose
    ranks 2 and 3 hold ``second`` and ``third``."""
    decay = float(np.clip(third / second if second > 0 else 0.5, 0.05, 0.95))
    shape = decay ** np.arange(MAX_RANK - 1)
    return float(np.clip(second / (shape[0] / shape.sum()), 0.0, 1.0)), decay


def fit_acceptance(traces: Sequence[dict], name: str = "calibrated", depth: int | None = None) -> AcceptanceModel:
    """Fit the rank-based acceptance model to live acceptance traces."""
    require(len(traces) >= 50, f"acceptance traces must hold >= 50 drafted rounds to fit (got {len(traces)})")
    depth = depth or max(1, min(6, max(len(t["ranks"]) for t in traces)))
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
    best = minimize(loss, start, method="Nelder-Mead", options={"maxiter": 400, "xatol": 1e-3, "fatol": 1e-7})
    return model_of(best.x)


def _save(record: dict, path: str | Path) -> None:
    write_text(path, json.dumps(record, indent=2) + "\n")


def _load(path: str | Path, what: str, expected: str, build):
    """Read a file :func:`_save` wrote and ``build`` its object; errors name the file."""
    path = Path(path)
    require(path.is_file(), f"{what} file {path} does not exist")
    try:
        record = json.loads(path.read_text())
        require(record.get("format") == expected,
                f"{what} file {path} has format {record.get('format')!r}, expected {expected!r}")
        return build(record)
    except InputError:
        raise
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"{what} file {path} is corrupt: {error}") from None


def save_acceptance(model: AcceptanceModel, path: str | Path, source: dict | None = None) -> None:
    _save({"format": ACCEPTANCE_FORMAT, "model": asdict(model), "source": source or {}}, path)


def load_acceptance(path: str | Path) -> AcceptanceModel:
    """An acceptance model file written by :func:`save_acceptance` (``--acceptance PATH``)."""
    return _load(path, "acceptance", ACCEPTANCE_FORMAT, lambda record: AcceptanceModel(**record["model"]))


# -- step costs -------------------------------------------------------------------

FEATURES = ("overhead", "target_token", "logit_row", "attn_pair", "attn_request", "attn_padded_kv", "vision_call",
            "vision_token", "draft_level", "draft_row", "draft_kept", "select_call", "select_key")


def step_features(step) -> np.ndarray:
    """The cost model's terms for one step record (any object with the StepShape fields)."""
    levels = list(step.draft_level_tokens)
    return np.array([1.0, step.forward_tokens, step.logit_tokens, step.attn_pairs, step.attn_requests,
                     step.padded_kv_tokens, float(step.vision_tokens > 0),
                     step.vision_tokens, len(levels), sum(levels), len(levels) * step.draft_kept_visual_tokens,
                     float(step.select_requests > 0), step.select_visual_tokens], dtype=float)


TARGET_FEATURES = ("target_token", "logit_row", "attn_pair", "attn_request", "attn_padded_kv", "vision_call", "vision_token")
DRAFT_FEATURES = ("draft_level", "draft_row", "draft_kept", "select_call", "select_key")


def _nnls_relative(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative least squares of relative error (short steps weigh as much as long ones)."""
    keep = y > 0
    coef, _ = nnls(x[keep] / y[keep, None], np.ones(int(keep.sum())))
    return coef


WAKE_MIN_STEPS = 5  # steps after an idle spell needed to fit the wake cost


def _after_idle(steps: Sequence) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Each step's idle spell before it (``idle_s``, 0 if not recorded),
    the mask of steps run straight after one, and that of the step
    following each in the same run."""
    idle_s = np.array([getattr(s, "idle_s", 0.0) for s in steps])
    idle = idle_s > 0
    starts = np.array([s.start_s for s in steps])
    following = np.zeros(len(steps), dtype=bool)
    following[1:] = idle[:-1] & ~idle[1:] & (starts[1:] > starts[:-1])
    return idle_s, idle, following


def fit_wake(idle_s: np.ndarray, extra_s: np.ndarray) -> tuple[float, float]:
    """(wake_s, wake_tau_s) of ``extra = wake_s * (1 - exp(-idle / tau))``,
    least squares, from steps after idle spells and what they cost beyond the
    rest of the fit; (0, 1) when fewer than WAKE_MIN_STEPS."""
    if len(idle_s) < WAKE_MIN_STEPS:
        return 0.0, 1.0
    scale = max(float(np.median(idle_s)), 1e-3)

    def residual(theta):
        return theta[0] * -np.expm1(-idle_s / (theta[1] * scale)) - extra_s

    fit = least_squares(residual, [max(float(np.mean(extra_s)), 0.0) * 2 + 1e-6, 1.0],
                        bounds=([0.0, 1e-2], [np.inf, 1e2]), x_scale="jac")
    return float(fit.x[0]), float(fit.x[1] * scale)


def fit_step_costs(steps: Sequence, label: str) -> tuple[CostModel, dict]:
    """Fit the cost model's terms to live step records. Where steps also
    record how long drafting (``draft_s``) and the target's part
    (``target_s``) took, each part is fitted on its own terms and the rest
    of the step is the per-step overhead; that keeps correlated terms (more
    requests: more target tokens *and* more drafter rows) apart. Otherwise
    the whole step is fitted at once. Steps after an idle spell (and the
    one after each) are fitted apart, as the wake cost (module docstring).
    Returns the model and a report."""
    require(len(steps) >= 30, f"step records must hold >= 30 steps to fit (got {len(steps)})")
    idle_s, idle, following = _after_idle(steps)
    warm = ~idle & ~following
    require(warm.sum() >= 30, f"step records must hold >= 30 steps not right after an idle spell (got {warm.sum()})")
    everything = np.array([step_features(s) for s in steps])
    durations = np.array([s.duration_s for s in steps])
    x, y = everything[warm], durations[warm]
    index = {name: i for i, name in enumerate(FEATURES)}
    parts = np.array([[getattr(s, "draft_s", 0.0), getattr(s, "target_s", 0.0)] for s, w in zip(steps, warm) if w])
    if parts.sum() > 0:
        coef = np.zeros(len(FEATURES))
        t_cols = [index["overhead"]] + [index[n] for n in TARGET_FEATURES]  # with the forward's fixed cost
        coef[t_cols] = _nnls_relative(x[:, t_cols], parts[:, 1])
        drafted = parts[:, 0] > 0
        d_cols = [index[n] for n in DRAFT_FEATURES]
        if drafted.sum() >= 10:
            coef[d_cols] = _nnls_relative(x[drafted][:, d_cols], parts[drafted, 0])
        coef[index["overhead"]] += max(float(np.median(y - x @ coef)), 0.0)  # scheduling, outside both parts
    else:
        coef = _nnls_relative(x, y)
    predicted = everything @ coef
    extra = durations - predicted  # what each step cost beyond the fit
    has_after = np.roll(following, -1)[idle]  # of the spells: those with a step after in the same run
    first, after = extra[idle], np.roll(extra * following, -1)[idle]  # what each spell's two steps cost beyond
    wake = dict(zip(("wake_s", "wake_tau_s"), fit_wake(idle_s[idle], first + after)))
    total = first.sum() + after.sum()
    wake["wake_next_share"] = float(np.clip(after.sum() / total, 0.0, 1.0)) if wake["wake_s"] > 0 and total > 0 else 0.0
    c = dict(zip(FEATURES, coef.tolist()))
    model = cost_model_from(c, label, wake)
    woke_first, woke_after = model.wake_split_s(idle_s[idle])
    predicted[idle] += woke_first
    predicted[following] += woke_after[has_after]
    error = np.abs(predicted - durations) / durations
    report = {"format": COST_FORMAT, "label": label, "coefficients_s": c, "wake": {**wake, "steps": int(idle.sum())},
              "steps": len(steps), "median_abs_pct_error": float(np.median(error) * 100),
              "p95_abs_pct_error": float(np.percentile(error, 95) * 100),
              "total_time_error_pct": float((predicted.sum() / durations.sum() - 1) * 100)}
    return model, report


def cost_model_from(c: dict, label: str, wake: dict | None = None) -> CostModel:
    """The simulator's cost model of fitted coefficients ``c`` (FEATURES,
    seconds) and wake cost ``{"wake_s", "wake_tau_s", "wake_next_share"}``
    (none if omitted)."""
    tokens = np.arange(TABLE_TOKENS, dtype=float)
    wake = wake or {}
    return CostModel(
        label=label, calibrated=True, overhead_s=c["overhead"],
        wake_s=float(wake.get("wake_s", 0.0)), wake_tau_s=float(wake.get("wake_tau_s", 1.0)),
        wake_next_share=float(wake.get("wake_next_share", 0.0)),
        layers_s=frozen_table(c["target_token"] * tokens), head_s=frozen_table(c["logit_row"] * tokens),
        attention=uniform_attention(pair_s=c["attn_pair"], request_s=c["attn_request"]),
        kv_s_per_padded_token=c.get("attn_padded_kv", 0.0),
        vision_s_table=frozen_table(np.where(tokens > 0, c["vision_call"] + c["vision_token"] * tokens, 0.0)),
        draft_s_table=frozen_table(np.where(tokens > 0, c["draft_level"] + c["draft_row"] * tokens, 0.0)),
        draft_s_per_kept=c["draft_kept"], select_launch_s=c["select_call"], select_s_per_key=c["select_key"])


def save_step_costs(report: dict, path: str | Path) -> None:
    _save(report, path)


def load_step_costs(path: str | Path) -> CostModel:
    """A cost model file written by :func:`save_step_costs` (``--cost-model steps:PATH``)."""
    return _load(path, "step-cost", COST_FORMAT, lambda record: cost_model_from(
        {k: float(c) for k, c in record["coefficients_s"].items() if k in FEATURES}, record["label"],
        record.get("wake")))
