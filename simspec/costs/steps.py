"""Cost models fitted to measured live engine steps (``--cost-model steps:FILE``).

Imports: numpy, scipy (least squares, nnls), simspec.files, simspec.types,
simspec.costs.base (no torch: the simulator loads what this module writes).

Each live step records the simulator's step shape and its wall time; a
non-negative least-squares fit (of relative error) of the cost model's own
terms (per-step overhead, per target token, per logit row, per attention
pair, per sequence in the forward, the vision encoder, per drafter level
and row, per kept visual token, selection) gives a :class:`CostModel` the
simulator prices steps with. Steps the engine ran straight after sitting
idle are left out of it: they cost more the longer it idled (on the
development machine a step after half a second idle takes 5-10x its usual
time), and the cost model's wake term (``wake_s``, ``wake_tau_s``) is fitted
to what they and the step after each cost beyond the fit
(``wake_next_share``: the step after's share).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Sequence

import numpy as np

from simspec.costs.base import TABLE_TOKENS, CostModel, frozen_table, uniform_attention
from simspec.files import load_record, save_record
from simspec.types import require

COST_FORMAT = "simspec-step-costs/1"

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
    from scipy.optimize import nnls  # only when fitting: a stored cost model needs no scipy

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
    from scipy.optimize import least_squares  # only when fitting: a stored cost model needs no scipy

    scale = max(float(np.median(idle_s)), 1e-3)

    def residual(theta):
        return theta[0] * -np.expm1(-idle_s / (theta[1] * scale)) - extra_s

    fit = least_squares(residual, [max(float(np.mean(extra_s)), 0.0) * 2 + 1e-6, 1.0],
                        bounds=([0.0, 1e-2], [np.inf, 1e2]), x_scale="jac")
    return float(fit.x[0]), float(fit.x[1] * scale)


@dataclass(frozen=True, slots=True, kw_only=True)
class WakeFit:
    """The wake cost fitted to the steps after idle spells (CostModel.wake_*)."""

    wake_s: float = 0.0
    wake_tau_s: float = 1.0
    wake_next_share: float = 0.0
    steps: int = 0  # steps after an idle spell it was fitted to


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCostFit:
    """A step-cost fit: its coefficients and how well it prices the steps
    (``step_costs.json``: :meth:`to_json`)."""

    label: str
    model: str  # the model spec name the live engine served
    device: str  # the device slug it ran on (as profiles/ names it)
    coefficients_s: dict[str, float]  # FEATURES -> seconds
    wake: WakeFit
    steps: int  # step records fitted
    median_abs_pct_error: float  # per step, %
    p95_abs_pct_error: float
    total_time_error_pct: float  # predicted / measured total time - 1, %

    def cost_model(self, scale: float | None = None) -> CostModel:
        """The simulator's cost model of the fit; with ``scale``, every term
        (the wake cost too) times it, and the label says so."""
        label = self.label if scale is None else f"{self.label} x{scale:.3f}"
        scale = 1.0 if scale is None else scale
        return cost_model_from({k: float(c) * scale for k, c in self.coefficients_s.items()}, label,
                               WakeFit(wake_s=self.wake.wake_s * scale, wake_tau_s=self.wake.wake_tau_s,
                                       wake_next_share=self.wake.wake_next_share, steps=self.wake.steps))

    def to_json(self) -> dict:
        return {"format": COST_FORMAT, "label": self.label, "model": self.model, "device": self.device,
                "coefficients_s": dict(self.coefficients_s),
                "wake": asdict(self.wake), "steps": self.steps, "median_abs_pct_error": self.median_abs_pct_error,
                "p95_abs_pct_error": self.p95_abs_pct_error, "total_time_error_pct": self.total_time_error_pct}

    @classmethod
    def from_json(cls, record: dict) -> "StepCostFit":
        wake = record.get("wake", {})
        return cls(label=str(record["label"]), model=record["model"], device=record["device"],
                   coefficients_s={k: float(c) for k, c in record["coefficients_s"].items() if k in FEATURES},
                   wake=WakeFit(wake_s=float(wake.get("wake_s", 0.0)), wake_tau_s=float(wake.get("wake_tau_s", 1.0)),
                                wake_next_share=float(wake.get("wake_next_share", 0.0)),
                                steps=int(wake.get("steps", 0))),
                   steps=int(record.get("steps", 0)),
                   median_abs_pct_error=float(record.get("median_abs_pct_error", float("nan"))),
                   p95_abs_pct_error=float(record.get("p95_abs_pct_error", float("nan"))),
                   total_time_error_pct=float(record.get("total_time_error_pct", float("nan"))))


def fit_step_costs(steps: Sequence, label: str, *, model: str, device: str) -> tuple[CostModel, StepCostFit]:
    """Fit the cost model's terms to live step records. Where steps also
    record how long drafting (``draft_s``) and the target's part
    (``target_s``) took, each part is fitted on its own terms and the rest
    of the step is the per-step overhead; that keeps correlated terms (more
    requests: more target tokens *and* more drafter rows) apart. Otherwise
    the whole step is fitted at once. Steps after an idle spell (and the
    one after each) are fitted apart, as the wake cost (module docstring).
    Returns the model and the fit."""
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
    wake_s, wake_tau_s = fit_wake(idle_s[idle], first + after)
    total = first.sum() + after.sum()
    share = float(np.clip(after.sum() / total, 0.0, 1.0)) if wake_s > 0 and total > 0 else 0.0
    wake = WakeFit(wake_s=wake_s, wake_tau_s=wake_tau_s, wake_next_share=share, steps=int(idle.sum()))
    c = dict(zip(FEATURES, coef.tolist()))
    cost = cost_model_from(c, label, wake)
    woke_first, woke_after = cost.wake_split_s(idle_s[idle])
    predicted[idle] += woke_first
    predicted[following] += woke_after[has_after]
    error = np.abs(predicted - durations) / durations
    return cost, StepCostFit(label=label, model=model, device=device, coefficients_s=c, wake=wake, steps=len(steps),
                              median_abs_pct_error=float(np.median(error) * 100),
                              p95_abs_pct_error=float(np.percentile(error, 95) * 100),
                              total_time_error_pct=float((predicted.sum() / durations.sum() - 1) * 100))


def cost_model_from(c: dict, label: str, wake: WakeFit = WakeFit()) -> CostModel:
    """The simulator's cost model of fitted coefficients ``c`` (FEATURES,
    seconds) and wake cost."""
    tokens = np.arange(TABLE_TOKENS, dtype=float)
    return CostModel(
        label=label, calibrated=True, overhead_s=c["overhead"], wake_s=float(wake.wake_s),
        wake_tau_s=float(wake.wake_tau_s), wake_next_share=float(wake.wake_next_share),
        layers_s=frozen_table(c["target_token"] * tokens), head_s=frozen_table(c["logit_row"] * tokens),
        attention=uniform_attention(pair_s=c["attn_pair"], request_s=c["attn_request"]),
        kv_s_per_padded_token=c.get("attn_padded_kv", 0.0),
        vision_s_table=frozen_table(np.where(tokens > 0, c["vision_call"] + c["vision_token"] * tokens, 0.0)),
        draft_s_table=frozen_table(np.where(tokens > 0, c["draft_level"] + c["draft_row"] * tokens, 0.0)),
        draft_s_per_kept=c["draft_kept"], select_launch_s=c["select_call"], select_s_per_key=c["select_key"])


def save_step_costs(fit: StepCostFit, path: str | Path) -> None:
    save_record(fit.to_json(), path)


def load_step_costs(path: str | Path, *, model: str | None = None, device: str | None = None) -> CostModel:
    """A cost model file written by :func:`save_step_costs` (``--cost-model
    steps:PATH``), refused for another ``model`` or ``device`` than it was fitted on."""
    record = load_record(path, "step-cost", COST_FORMAT, lambda r: r)
    for key in ("model", "device"):
        require(isinstance(record.get(key), str), f"step-cost file {path} does not say which {key} it was fitted "
                                                  f"on (written by an older simspec: refit it with `simspec validate`)")
    fit = load_record(path, "step-cost", COST_FORMAT, StepCostFit.from_json)
    for what, want, have in (("model", model, fit.model), ("device", device, fit.device)):
        require(want is None or want == have, f"step-cost file {path} was fitted to {have} ({what}); the run "
                                              f"asks for {want} (choose --{what} {have})")
    return fit.cost_model()


# --- engine steps known only by their totals (a vLLM server's iteration log) --------------------------

ITERATION_FEATURES = ("overhead", "target_token", "attn_request")
"""The terms :func:`fit_iteration_costs` fits; the other FEATURES are 0 in its model."""


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOutError:
    """How a fit prices steps it was not fitted to: every ``every``-th step
    held out, relative error |predicted / measured - 1| in %."""

    every: int
    fitted_steps: int
    held_out_steps: int
    median_pct: float
    p90_pct: float
    max_pct: float


def fit_iteration_costs(tokens: np.ndarray, requests: np.ndarray, elapsed_s: np.ndarray, label: str, *,
                        model: str, device: str, hold_out_every: int = 5
                        ) -> tuple[CostModel, StepCostFit, HeldOutError]:
    """Fit the per-step, per-target-token and per-sequence terms
    (:data:`ITERATION_FEATURES`) to S engine steps known only by their
    totals: ``tokens`` [S] query tokens through the target (prefill chunks +
    decode rounds with their draft tokens), ``requests`` [S] sequences in the
    step, ``elapsed_s`` [S] its time. Non-negative least squares of relative
    error, as :func:`fit_step_costs`, on all steps but every
    ``hold_out_every``-th (the 0-based indices ``hold_out_every - 1``,
    ``2 * hold_out_every - 1``, ...), which give the held-out error.

    Relative error fits each step's shape, but it sits below the mean of
    steps whose times have a right tail (a slow step now and then: on the
    2-core development machine the fit of a quiet run priced its own
    calibration steps 3-4% short in total), and every latency the
    simulator reports is a sum of step costs. So the fitted terms are then
    scaled together until they price the fitted steps' total time exactly.

    What such totals cannot tell apart is left to these three terms: the
    attention's per-context cost (no context lengths: it is in the
    per-token and per-sequence terms at the contexts the steps had), the LM
    head (one logit row per decode token and per prefill request: in the
    per-token term), and a drafter's cost (in the terms it grows with)."""
    tokens, requests, elapsed_s = (np.asarray(a, dtype=float) for a in (tokens, requests, elapsed_s))
    require(len(tokens) == len(requests) == len(elapsed_s), "tokens, requests and elapsed_s must have one entry a step")
    require(hold_out_every >= 2, f"hold_out_every must be >= 2 (got {hold_out_every})")
    held = np.arange(len(elapsed_s)) % hold_out_every == hold_out_every - 1
    require((~held).sum() >= 10 and held.sum() >= 3,
            f"the fit needs >= 10 steps to fit and >= 3 held out (got {(~held).sum()} and {held.sum()} of "
            f"{len(elapsed_s)} steps, every {hold_out_every}th held out)")
    require(bool(np.all(elapsed_s > 0)), "every step's elapsed time must be > 0")
    x = np.stack([np.ones_like(tokens), tokens, requests], axis=1)
    coef = _nnls_relative(x[~held], elapsed_s[~held])
    coef *= elapsed_s[~held].sum() / (x[~held] @ coef).sum()  # the level: unbiased for sums (docstring)
    c = dict.fromkeys(FEATURES, 0.0) | dict(zip(ITERATION_FEATURES, coef.tolist()))
    error = np.abs(x @ coef - elapsed_s) / elapsed_s * 100
    fitted, test = error[~held], error[held]
    cost = cost_model_from(c, label)
    fit = StepCostFit(label=label, model=model, device=device, coefficients_s=c, wake=WakeFit(),
                      steps=int((~held).sum()), median_abs_pct_error=float(np.median(fitted)),
                      p95_abs_pct_error=float(np.percentile(fitted, 95)),
                      total_time_error_pct=float(((x @ coef)[~held].sum() / elapsed_s[~held].sum() - 1) * 100))
    return cost, fit, HeldOutError(every=hold_out_every, fitted_steps=int((~held).sum()),
                                   held_out_steps=int(held.sum()), median_pct=float(np.median(test)),
                                   p90_pct=float(np.percentile(test, 90)), max_pct=float(test.max()))
