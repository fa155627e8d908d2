"""Cost models fitted to measured operator profiles.

Imports: numpy, scipy (least squares, isotonic regression, PCHIP), pandas,
simspec.costs. DESIGN.md "Cost model".

Every operator that depends on a token count gets a curve that is monotone
in it: either a *roofline* form, c + (a^p + (b x)^p)^(1/p) (flat while
weights stream, then a compute slope), or a *monotone* interpolant
(isotonic regression, then PCHIP through the result), whichever predicts
held-out points better. Attention is fitted once over every attention table
in the cost model's own form, c + blend(kv x alpha, pairs x beta). The
fits are rendered into a :class:`CostModel`'s tables; operators a profile
lacks come from the roofline prior, and the label says which.

Held-out error: the points of each operator are sorted by size and every
fourth (never the ends) is held out; the curve is fitted on the rest and
judged on those. The shipped model is then refitted on all points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy import interpolate, optimize

from simspec.costs.base import BLEND_P, TOKENS, CostModel, frozen_table
from simspec.costs.profiles import LAYER_OPS, Profile
from simspec.costs.roofline import STEP_OVERHEAD_S, roofline
from simspec.costs.specs import GpuSpec, ModelSpec
from simspec.types import InputError

MS = 1e-3
ATTENTION_OPS = ("attn_decode", "attn_prefill", "attn_tree_verify")


@dataclass(frozen=True, slots=True)
class Curve:
    """A monotone fit of time (ms) against one size."""

    kind: str  # "roofline" or "monotone"
    params: tuple[float, ...]  # roofline: (c, a, b, p)
    xs: np.ndarray  # monotone: knots
    ys: np.ndarray

    def __call__(self, x) -> np.ndarray:
        x = np.asarray(x, dtype=float)
        if self.kind == "roofline":
            c, a, b, p = self.params
            return c + (a**p + (b * x) ** p) ** (1.0 / p)
        inside = np.clip(x, self.xs[0], self.xs[-1])
        y = interpolate.PchipInterpolator(self.xs, self.ys)(inside)
        if len(self.xs) > 1:  # compute-bound past the last point: keep the last slope
            slope = max((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]), 0.0)
            y = y + slope * np.maximum(x - self.xs[-1], 0.0)
        return y


def _unique_mean(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    xs, inverse = np.unique(x, return_inverse=True)
    return xs, np.bincount(inverse, weights=y) / np.bincount(inverse)


def _fit_roofline(x: np.ndarray, y: np.ndarray) -> Curve:
    best = None
    for p in (2.0, 4.0, 8.0):
        start = np.array([0.1 * y.min(), 0.9 * y.min(), max(y.max() / x.max(), 1e-9)])

        def residual(theta):
            c, a, b = theta
            return np.log((c + (a**p + (b * x) ** p) ** (1.0 / p)) / y)

        fit = optimize.least_squares(residual, start, bounds=([0, 0, 0], [np.inf, np.inf, np.inf]))
        if best is None or fit.cost < best[0]:
            best = (fit.cost, Curve("roofline", (*fit.x, p), np.zeros(0), np.zeros(0)))
    return best[1]


def _fit_monotone(x: np.ndarray, y: np.ndarray) -> Curve:
    xs, ys = _unique_mean(x, y)
    ys = optimize.isotonic_regression(ys).x
    return Curve("monotone", (), xs, ys)


def _split(x: np.ndarray) -> np.ndarray:
    """Held-out mask: every fourth distinct size, never the smallest or largest."""
    sizes = np.unique(x)
    held = sizes[2:-1:4] if len(sizes) >= 6 else sizes[:0]
    return np.isin(x, held)


def _ape(predicted: np.ndarray, measured: np.ndarray) -> np.ndarray:
    return np.abs(predicted - measured) / measured


@dataclass(frozen=True, slots=True)
class OpFit:
    """One operator: its final curve and how well it predicted held-out points."""

    op: str
    kind: str
    points: int
    heldout: np.ndarray  # absolute percentage errors on held-out points

    @property
    def median_ape(self) -> float:
        return float(np.median(self.heldout)) if len(self.heldout) else float("nan")

    @property
    def p95_ape(self) -> float:
        return float(np.percentile(self.heldout, 95)) if len(self.heldout) else float("nan")


def fit_curve(x, y, op: str = "") -> tuple[Curve, OpFit]:
    """The better of the two curve forms on held-out points, refitted on all."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    held = _split(x)
    forms = (_fit_roofline, _fit_monotone)
    if held.any():
        errors = [_ape(form(x[~held], y[~held])(x[held]), y[held]) for form in forms]
        choice = int(np.argmin([np.median(e) for e in errors]))
        heldout = errors[choice]
    else:
        choice, heldout = 1, np.zeros(0)
    curve = forms[choice](x, y)
    return curve, OpFit(op, curve.kind, len(x), heldout)


# -- attention ----------------------------------------------------------------

def _attention_terms(profile: Profile) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """(KV tokens read, query x key pairs, ms, table index) of every
    attention row, in the simulator's terms: each request's context read
    once, each query token paired with its context (and, in prefill and
    trees, its predecessors)."""
    kv, pairs, ms, which = [], [], [], []
    for k, op in enumerate(ATTENTION_OPS):
        t = profile.tables.get(op)
        if t is None:
            continue
        ctx = t["context_tokens"].to_numpy(float)
        if op == "attn_decode":
            b = t["batch"].to_numpy(float)
            kv.append(b * ctx), pairs.append(b * ctx)
        elif op == "attn_prefill":
            q = t["tokens"].to_numpy(float)
            kv.append(ctx + q), pairs.append(q * ctx + q * (q + 1) / 2)
        else:
            b, q = t["batch"].to_numpy(float), t["query_tokens"].to_numpy(float)
            kv.append(b * ctx), pairs.append(b * q * ctx + b * q * (q + 1) / 2)
        ms.append(t["median_ms"].to_numpy(float))
        which.append(np.full(len(t), k))
    if not ms:
        return None, None, None, None
    return np.concatenate(kv), np.concatenate(pairs), np.concatenate(ms), np.concatenate(which)


def _attention_s(theta, kv, pairs):
    c, alpha, beta = theta
    return c + ((kv * alpha) ** BLEND_P + (pairs * beta) ** BLEND_P) ** (1.0 / BLEND_P)


def _fit_attention(kv, pairs, ms, which) -> tuple[float, float, float]:
    """(c, alpha, beta): ms = c + blend(kv * alpha, pairs * beta), per layer;
    each attention table weighs the same however many points it has."""
    weight = 1.0 / np.sqrt(np.bincount(which)[which])

    def residual(theta):
        return weight * np.log(_attention_s(theta, kv, pairs) / ms)

    start = [0.5 * ms.min(), np.median(ms / kv), np.median(ms / pairs)]
    fit = optimize.least_squares(residual, start, bounds=([0, 0, 0], [np.inf, np.inf, np.inf]))
    return tuple(float(v) for v in fit.x)


def fit_attention(profile: Profile) -> tuple[tuple[float, float, float], list[OpFit]] | None:
    """The joint attention fit, and its held-out error on each table."""
    kv, pairs, ms, which = _attention_terms(profile)
    if ms is None:
        return None
    held = np.zeros(len(ms), dtype=bool)
    for k in np.unique(which):
        rows = which == k
        held[rows] = _split(pairs[rows])
    theta = _fit_attention(kv[~held], pairs[~held], ms[~held], which[~held])
    errors = _ape(_attention_s(theta, kv, pairs), ms)
    fits = [OpFit(f"{ATTENTION_OPS[k]} (attention fit)", "blend", int((which == k).sum()),
                  errors[held & (which == k)]) for k in np.unique(which)]
    return _fit_attention(kv, pairs, ms, which), fits


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Non-negative intercept and slope."""
    fit = optimize.lsq_linear(np.column_stack([np.ones_like(x), x]), y, bounds=(0, np.inf))
    return float(fit.x[0]), float(fit.x[1])


def fit_line(x, y, op: str) -> tuple[tuple[float, float], OpFit]:
    """An affine fit (launch + per unit), judged on held-out points like a curve."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    held = _split(x)
    errors = np.zeros(0)
    if held.any():
        a, b = _line(x[~held], y[~held])
        errors = _ape(a + b * x[held], y[held])
    return _line(x, y), OpFit(op, "linear", len(x), errors)


# -- the cost model ------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Fitted:
    cost_model: CostModel
    fits: tuple[OpFit, ...]
    layer: OpFit | None  # the composed decoder layer (sum of its linear pieces) on held-out sizes
    measured: tuple[str, ...]
    prior: tuple[str, ...]  # pieces taken from the roofline prior


def _layer_curves(profile: Profile):
    curves, fits = {}, []
    for op in LAYER_OPS:
        t = profile.tables.get(op)
        if t is not None:
            curves[op], fit = fit_curve(t["tokens"], t["median_ms"], op)
            fits.append(fit)
    return curves, fits


def _composed_layer(profile: Profile, curves: dict) -> OpFit | None:
    """Error of the whole layer (its pieces summed; ``add`` twice) at
    held-out token counts every piece measured, each piece fitted without
    those counts."""
    tables = [profile.tables[op] for op in curves]
    common = set(tables[0]["tokens"])
    for t in tables[1:]:
        common &= set(t["tokens"])
    tokens = np.array(sorted(common), dtype=float)
    held = tokens[_split(tokens)]
    if not len(held):
        return None
    predicted = np.zeros(len(held))
    measured = np.zeros(len(held))
    for op, t in zip(curves, tables):
        times = t.groupby("tokens")["median_ms"].mean()
        train = ~np.isin(t["tokens"].to_numpy(float), held)
        curve, _ = fit_curve(t["tokens"][train], t["median_ms"][train])
        weight = 2 if op == "add" else 1
        predicted += weight * curve(held)
        measured += weight * times.loc[held].to_numpy()
    return OpFit("decoder layer (composed)", "sum", len(tokens), _ape(predicted, measured))


def fit_profiles(profiles: list[Profile], model: ModelSpec, gpu: GpuSpec) -> Fitted:
    """A cost model for ``model`` on ``gpu`` from its profiles (the first
    that has an operator wins) and the roofline prior for the rest."""
    merged: dict = {}
    sources: dict[str, str] = {}
    for profile in profiles:
        for op, table in profile.tables.items():
            if op not in merged:
                merged[op] = table
                sources[op] = profile.meta.get("source", "measured")
    profile = Profile(folder=profiles[0].folder, meta=profiles[0].meta, tables=merged)
    has_prior = gpu.hbm_bytes_per_s > 0 and gpu.bf16_flops > 0
    prior = roofline(model, gpu) if has_prior else None
    curves, fits = _layer_curves(profile)
    composed = _composed_layer(profile, curves) if len(curves) == len(LAYER_OPS) else None
    used_prior: list[str] = []

    def need_prior(piece: str):
        if prior is None:
            raise InputError(f"device {gpu.slug}: profile lacks {piece} and the device has no datasheet numbers "
                             f"for a prior; profile it with `simspec profile-gpu`")
        used_prior.append(piece)
        return prior

    if len(curves) == len(LAYER_OPS):
        per_layer = sum(curves[op](TOKENS) * (2 if op == "add" else 1) for op in LAYER_OPS) * MS
    else:
        per_layer = None
    attention = fit_attention(profile)
    if attention is not None:
        (c, alpha, beta), attention_fits = attention
        fits.extend(attention_fits)
        kv_s, pair_s, attn_floor = alpha * MS * model.layers, beta * MS * model.layers, c * MS * model.layers
    else:
        base = need_prior("attention")
        kv_s, pair_s, attn_floor = base.kv_s_per_token, base.attn_s_per_pair, 0.0
    if per_layer is not None:
        layers = per_layer * model.layers + attn_floor * (TOKENS > 0)
    else:
        layers = need_prior("decoder layers").layers_s + attn_floor * (TOKENS > 0)

    def table(op: str, x_column: str, piece: str, fallback):
        t = profile.tables.get(op)
        if t is None:
            return getattr(need_prior(piece), fallback)
        curve, fit = fit_curve(t[x_column], t["median_ms"], op)
        fits.append(fit)
        return curve(TOKENS) * MS

    head = table("lm_head", "tokens", "LM head", "head_s")
    vision = _vision_table(profile, model, need_prior, fits)
    draft, per_kept = _drafter(profile, need_prior, fits)
    select_launch, per_key = _select(profile, need_prior, fits)
    measured = tuple(sorted(set(merged)))
    where = ", ".join(sorted({s for s in sources.values()}))
    label = (f"fitted profile: {profiles[0].meta.get('device', gpu.name)} / {model.name} ({where})"
             + (f"; roofline prior for {', '.join(used_prior)}" if used_prior else ""))
    cost = CostModel(label=label, calibrated=not used_prior, partly_calibrated=bool(used_prior),
                     overhead_s=STEP_OVERHEAD_S,
                     layers_s=frozen_table(layers), head_s=frozen_table(head), kv_s_per_token=kv_s,
                     attn_s_per_pair=pair_s, vision_s_table=frozen_table(vision), draft_s_table=frozen_table(draft),
                     draft_s_per_kept=per_kept, select_launch_s=select_launch, select_s_per_key=per_key)
    return Fitted(cost_model=cost, fits=tuple(fits), layer=composed, measured=measured, prior=tuple(used_prior))


def _vision_table(profile: Profile, model: ModelSpec, need_prior, fits) -> np.ndarray:
    if not model.multimodal:
        return 0.0 * TOKENS
    t = profile.tables.get("vision_encoder")
    if t is None:
        vision = need_prior("vision encoder").vision_s_table.copy()
    else:
        (a, b), fit = fit_line(t["images"], t["median_ms"], "vision_encoder")
        fits.append(fit)
        vision = np.where(TOKENS > 0, (a + b * TOKENS / model.visual_tokens_per_image) * MS, 0.0)
    quant = profile.tables.get("int8_quantize")
    if quant is not None:  # the int8 visual-key cache is written with the encoder's output
        (a, b), fit = fit_line(quant["visual_tokens"], quant["median_ms"], "int8_quantize")
        fits.append(fit)
        vision = vision + np.where(TOKENS > 0, (a + b * TOKENS) * MS, 0.0)
    return vision


def _drafter(profile: Profile, need_prior, fits) -> tuple[np.ndarray, float]:
    t = profile.tables.get("drafter_step")
    if t is None:
        base = need_prior("drafter")
        return base.draft_s_table, base.draft_s_per_kept
    least = t[t["kept_tokens"] == t["kept_tokens"].min()]
    curve, fit = fit_curve(least["tokens"], least["median_ms"], "drafter_step")
    fits.append(fit)
    extra = t["median_ms"].to_numpy(float) - curve(t["tokens"].to_numpy(float))
    kept = (t["tokens"] * (t["kept_tokens"] - t["kept_tokens"].min())).to_numpy(float)
    use = kept > 0
    per_kept = max(float(np.sum(extra[use] * kept[use]) / np.sum(kept[use] ** 2)), 0.0) if use.any() else 0.0
    return curve(TOKENS) * MS, per_kept * MS


def _select(profile: Profile, need_prior, fits) -> tuple[float, float]:
    t = profile.tables.get("select")
    if t is None:
        base = need_prior("selection")
        return base.select_launch_s, base.select_s_per_key
    (a, b), fit = fit_line(t["requests"] * t["visual_tokens"], t["median_ms"], "select")
    fits.append(fit)
    return a * MS, b * MS
