"""Cost models fitted to measured operator profiles.

Imports: numpy, scipy (least squares, isotonic regression, PCHIP), pandas,
simspec.costs. DESIGN.md "Cost model".

Every operator that depends on a token count gets a curve that is monotone
in it: either a *roofline* form, c + (a^p + (b x)^p)^(1/p) (flat while
weights stream, then a compute slope), or a *monotone* interpolant
(isotonic regression, then PCHIP through the result), whichever predicts
held-out points better. Attention is fitted per kind of call (prefill,
decode, tree verification: each its own table and often its own kernel)
in the cost model's own form (costs.base), c + blend(kv x alpha, pairs x
beta) + requests x rho + queries x gamma, all coefficients >= 0, with a
cache knee on kv and on pairs where Akaike's criterion says it pays. A
drafter step is a curve in rows at the grid's least K plus what
cross-attention adds (a call and a cost per row once it cross-attends, and
each kept token read); selection is a launch, each key, and each request's
keys squared (caches overflowing on a CPU). The fits are rendered into a
:class:`CostModel`'s tables; operators a profile lacks come from the
roofline prior, and the label says which.

Held-out error: the points of each operator are sorted by size and every
fourth (never the ends) is held out; the curve is fitted on the rest and
judged on those. The shipped model is then refitted on all points.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import interpolate, optimize

from simspec.costs.base import (ATTENTION_KINDS, BLEND_P, DECODE, PREFILL, TOKENS, VERIFY, CostModel, attention_row,
                                attention_table, frozen_table)
from simspec.costs.profiles import CALLS_PER_LAYER, LAYER_OPS, Profile
from simspec.costs.roofline import STEP_OVERHEAD_S, roofline
from simspec.costs.specs import GpuSpec, ModelSpec
from simspec.types import InputError

MS = 1e-3
ATTENTION_OPS = ("attn_prefill", "attn_decode", "attn_tree_verify")  # indexed by kind (costs.base PREFILL ...)
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head")
COMPOSED_LAYER = "decoder layer (composed)"  # the OpFit of a whole layer
GEMM_TILE_TOKENS = 64  # on a GPU a GEMM runs whole row tiles: 65 rows cost what 128 do


@dataclass(frozen=True, slots=True)
class Curve:
    """A monotone fit of time (ms) against one size."""

    kind: str  # "roofline" or "monotone"
    params: tuple[float, ...]  # roofline: (c, a, b, p)
    xs: np.ndarray  # monotone: knots
    ys: np.ndarray
    tile: int = 1  # sizes above one tile are padded to whole tiles (GEMM row tiles on a GPU)

    def __call__(self, x) -> np.ndarray:
        x = pad(x, self.tile)
        if self.kind == "roofline":
            c, a, b, p = self.params
            return c + (a**p + (b * x) ** p) ** (1.0 / p)
        inside = np.clip(x, self.xs[0], self.xs[-1])
        y = interpolate.PchipInterpolator(self.xs, self.ys)(inside)
        if len(self.xs) > 1:  # compute-bound past the last point: keep the last slope
            slope = max((self.ys[-1] - self.ys[-2]) / (self.xs[-1] - self.xs[-2]), 0.0)
            y = y + slope * np.maximum(x - self.xs[-1], 0.0)
        return y


def pad(x, tile: int) -> np.ndarray:
    """Sizes above one tile rounded up to whole tiles (monotone, so curves of it stay monotone)."""
    x = np.asarray(x, dtype=float)
    return x if tile <= 1 else np.where(x > tile, np.ceil(x / tile) * tile, x)


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


def fit_curve(x, y, op: str = "", tile: int = 1) -> tuple[Curve, OpFit]:
    """The better of the two curve forms on held-out points, refitted on
    all; with ``tile`` > 1 both forms are fitted against padded sizes."""
    x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    held = _split(x)

    def form(k, xs, ys):
        curve = (_fit_roofline, _fit_monotone)[k](pad(xs, tile), ys)
        return Curve(curve.kind, curve.params, curve.xs, curve.ys, tile)

    if held.any():
        errors = [_ape(form(k, x[~held], y[~held])(x[held]), y[held]) for k in (0, 1)]
        choice = int(np.argmin([np.median(e) for e in errors]))
        heldout = errors[choice]
    else:
        choice, heldout = 1, np.zeros(0)
    curve = form(choice, x, y)
    kind = curve.kind + (f", tile {tile}" if tile > 1 else "")
    return curve, OpFit(op, kind, len(x), heldout)


def tile_for(profile: Profile, op: str) -> int:
    """GEMM_TILE_TOKENS for a GEMM measured on a GPU, else 1."""
    return GEMM_TILE_TOKENS if op in GEMM_OPS and profile.meta.get("kind", "cuda") == "cuda" else 1


# -- attention ----------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class AttentionTerms:
    """Every attention row of a profile in the simulator's terms: each
    request's context read once, each query token paired with its context
    (and, in prefill and trees, its predecessors), one sequence per request
    or prefill chunk."""

    kv: np.ndarray  # [N] context tokens read
    pairs: np.ndarray  # [N] query x key pairs
    requests: np.ndarray  # [N] sequences attended
    queries: np.ndarray  # [N] query tokens
    ms: np.ndarray  # [N] measured, per layer
    which: np.ndarray  # [N] index into ATTENTION_OPS, which is the kind (costs.base PREFILL ...)

    def __getitem__(self, rows) -> "AttentionTerms":
        return AttentionTerms(self.kv[rows], self.pairs[rows], self.requests[rows], self.queries[rows],
                              self.ms[rows], self.which[rows])


NO_KNEE = np.inf


@dataclass(frozen=True, slots=True)
class AttentionFit:
    """One kind's call, ms per layer (costs.base's form): floor +
    blend(memory, compute) + requests x request_ms + queries x query_ms, with
    memory = kv x kv_ms + (kv - kv_knee)+ x kv_over_ms and compute = pairs x
    pair_ms + (pairs - pair_knee)+ x pair_over_ms. A knee is where what the
    call touches outgrows a cache; ``NO_KNEE`` where none is fitted."""

    floor_ms: float
    kv_ms: float
    pair_ms: float
    request_ms: float
    query_ms: float
    kv_over_ms: float = 0.0
    kv_knee: float = NO_KNEE
    pair_over_ms: float = 0.0
    pair_knee: float = NO_KNEE

    def __call__(self, a: AttentionTerms) -> np.ndarray:
        memory = a.kv * self.kv_ms + np.maximum(a.kv - self.kv_knee, 0.0) * self.kv_over_ms
        compute = a.pairs * self.pair_ms + np.maximum(a.pairs - self.pair_knee, 0.0) * self.pair_over_ms
        return (self.floor_ms + (memory ** BLEND_P + compute ** BLEND_P) ** (1.0 / BLEND_P)
                + a.requests * self.request_ms + a.queries * self.query_ms)

    def row(self, scale: float) -> np.ndarray:
        """costs.base's coefficient row, times ``scale`` (ms per layer to s per model)."""
        knee = lambda k: 0.0 if k == NO_KNEE else k  # noqa: E731 (no extra cost: any knee prices the same)
        return attention_row(kv_s=self.kv_ms * scale, pair_s=self.pair_ms * scale, request_s=self.request_ms * scale,
                             query_s=self.query_ms * scale, floor_s=self.floor_ms * scale,
                             kv_over_s=self.kv_over_ms * scale, kv_knee=knee(self.kv_knee),
                             pair_over_s=self.pair_over_ms * scale, pair_knee=knee(self.pair_knee))


def attention_terms(profile: Profile) -> AttentionTerms | None:
    parts = []
    for k, op in enumerate(ATTENTION_OPS):
        t = profile.tables.get(op)
        if t is None:
            continue
        ctx = t["context_tokens"].to_numpy(float)
        if op == "attn_decode":
            b = t["batch"].to_numpy(float)
            kv, pairs, requests, queries = b * ctx, b * ctx, b, b
        elif op == "attn_prefill":
            q = t["tokens"].to_numpy(float)
            kv, pairs, requests, queries = ctx + q, q * ctx + q * (q + 1) / 2, np.ones_like(q), q
        else:
            b, q = t["batch"].to_numpy(float), t["query_tokens"].to_numpy(float)
            kv, pairs, requests, queries = b * ctx, b * q * ctx + b * q * (q + 1) / 2, b, b * q
        parts.append((kv, pairs, requests, queries, t["median_ms"].to_numpy(float), np.full(len(t), k)))
    if not parts:
        return None
    return AttentionTerms(*(np.concatenate(column) for column in zip(*parts)))


KNEE_CANDIDATES = 5  # knees tried per term, at quantiles of the measured sizes
PRECISION = 1e-4  # relative: residuals below it are timing noise to the knee choice


def _knees(sizes: np.ndarray) -> list[float]:
    inner = np.quantile(np.unique(sizes), np.linspace(0.15, 0.85, KNEE_CANDIDATES), method="nearest")
    return [NO_KNEE, *np.unique(inner).tolist()]


def _fit_with_knees(a: AttentionTerms, kv_knee: float, pair_knee: float,
                    move_knees: bool = False) -> tuple[float, AttentionFit]:
    """Least squares in log time with the knees fixed (or, with
    ``move_knees``, starting from them and free within the measured sizes);
    (sum of squares, fit). Starts from the additive form's non-negative
    least squares (memory plus compute instead of their smooth maximum)."""
    # Terms in AttentionFit's order: floor, kv, pair, request, query, kv over, pair over.
    columns = np.column_stack([np.ones_like(a.kv), a.kv, a.pairs, a.requests, a.queries,
                               np.maximum(a.kv - kv_knee, 0.0), np.maximum(a.pairs - pair_knee, 0.0)])
    # A table that cannot tell two terms apart keeps the first: one
    # sequence per prefill call (the floor); one query per decode request,
    # reading its context once (kv, memory-bound; no pair knee is tried).
    pairs = not _pairs_are_kv(a)
    free = np.array([True, True, pairs, bool(np.any(a.requests != 1)), bool(np.any(a.queries != a.requests)),
                     kv_knee != NO_KNEE, pairs and pair_knee != NO_KNEE])

    moving = [move_knees and free[5], move_knees and free[6]]  # the kv and pair knees, as fitted parameters
    knees = [(k, sizes) for (k, sizes), on in zip(((kv_knee, a.kv), (pair_knee, a.pairs)), moving) if on]
    n = int(free.sum())

    def fit_of(theta) -> AttentionFit:
        full = np.zeros(len(free))
        full[free] = theta[:n]
        moved = iter(np.exp(theta[n:]))
        kv = next(moved) if moving[0] else kv_knee
        pair = next(moved) if moving[1] else pair_knee
        return AttentionFit(*(float(v) for v in full[:5]), kv_over_ms=float(full[5]), kv_knee=float(kv),
                            pair_over_ms=float(full[6]), pair_knee=float(pair))

    def residual(theta):
        return np.log(np.maximum(fit_of(theta)(a), 1e-300) / a.ms)

    # Two starts (the form is not convex): the additive form's solution,
    # and each term alone explaining the median point.
    used = columns[:, free]
    additive = _terms(used, a.ms)
    alone = np.array([np.median(a.ms[c > 0] / c[c > 0]) / 2 if np.any(c > 0) else 0.0 for c in used.T])
    lower, upper = np.zeros(n), np.full(n, np.inf)
    if knees:  # log knees, within the measured sizes
        lower = np.concatenate([lower, [np.log(s.min()) for _, s in knees]])
        upper = np.concatenate([upper, [np.log(s.max()) for _, s in knees]])
    best = None
    for start in (additive, alone):
        start = np.concatenate([np.maximum(start, 1e-12 * a.ms.min()), [np.log(k) for k, _ in knees]])
        fit = optimize.least_squares(residual, start, bounds=(lower, upper), x_scale="jac")
        if best is None or fit.cost < best.cost:
            best = fit
    return float(np.sum(best.fun ** 2)), fit_of(best.x)


def _pairs_are_kv(a: AttentionTerms) -> bool:
    return bool(np.array_equal(a.pairs, a.kv))


def _fit_attention(a: AttentionTerms) -> AttentionFit:
    """One kind's fit: the knees (none, or one at a quantile of the
    measured sizes, for memory and for compute) chosen by Akaike's
    criterion on log time, so a knee must pay for its two parameters
    (residuals below 0.01% count as 0.01%: timing precision)."""
    best = None
    n = len(a.ms)
    pair_knees = [NO_KNEE] if _pairs_are_kv(a) else _knees(a.pairs)
    for kv_knee in _knees(a.kv):
        for pair_knee in pair_knees:
            ss, fit = _fit_with_knees(a, kv_knee, pair_knee)
            params = 5 + 2 * (kv_knee != NO_KNEE) + 2 * (pair_knee != NO_KNEE)
            score = n * np.log(max(ss / n, PRECISION ** 2)) + 2 * params
            if best is None or score < best[0]:
                best = (score, fit, ss, kv_knee, pair_knee)
    _, fit, ss, kv_knee, pair_knee = best
    if kv_knee != NO_KNEE or pair_knee != NO_KNEE:  # the knees between the candidates
        moved_ss, moved = _fit_with_knees(a, kv_knee, pair_knee, move_knees=True)
        if moved_ss < ss:
            return moved
    return fit


def fit_attention(a: AttentionTerms) -> tuple[dict[int, AttentionFit], list[OpFit]]:
    """A fit for each kind of attention among a profile's points (keyed
    by ATTENTION_OPS index: prefill, decode, tree verification), and its
    held-out error."""
    found, fits = {}, []
    for k in np.unique(a.which):
        rows = a[a.which == k]
        held = _split(rows.pairs)
        errors = _ape(_fit_attention(rows[~held])(rows[held]), rows.ms[held]) if held.any() else np.zeros(0)
        found[int(k)] = _fit_attention(rows)
        fits.append(OpFit(ATTENTION_OPS[k], "attention" + (" + cache knee" if _has_knee(found[int(k)]) else ""),
                          len(rows.ms), errors))
    return found, fits


def _has_knee(fit: AttentionFit) -> bool:
    return fit.kv_knee != NO_KNEE or fit.pair_knee != NO_KNEE


def attention_by_kind(found: dict[int, AttentionFit], layers: int) -> tuple[np.ndarray, list[str]]:
    """[3, 9] coefficients (costs.base) from the kinds measured; a kind not
    measured takes the nearest measured one (verification <-> decode,
    prefill <- decode), named in the second value."""
    borrow = {PREFILL: (DECODE, VERIFY), DECODE: (VERIFY, PREFILL), VERIFY: (DECODE, PREFILL)}
    rows, notes = [], []
    for kind in (PREFILL, DECODE, VERIFY):
        source = kind if kind in found else next(k for k in borrow[kind] if k in found)
        if source != kind:
            notes.append(f"{ATTENTION_KINDS[kind]} attention priced as {ATTENTION_KINDS[source]}")
        rows.append(found[source].row(MS * layers))
    return attention_table(*rows), notes


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
    attention: dict = field(default_factory=dict)  # kind -> AttentionFit, for the kinds measured
    attention_points: AttentionTerms | None = None  # what they were fitted to


def _layer_curves(profile: Profile):
    curves, fits = {}, []
    for op in LAYER_OPS:
        t = profile.tables.get(op)
        if t is not None:
            curves[op], fit = fit_curve(t["tokens"], t["median_ms"], op, tile_for(profile, op))
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
        curve, _ = fit_curve(t["tokens"][train], t["median_ms"][train], tile=tile_for(profile, op))
        predicted += CALLS_PER_LAYER[op] * curve(held)
        measured += CALLS_PER_LAYER[op] * times.loc[held].to_numpy()
    return OpFit(COMPOSED_LAYER, "sum", len(tokens), _ape(predicted, measured))


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
        per_layer = sum(curves[op](TOKENS) * CALLS_PER_LAYER[op] for op in LAYER_OPS) * MS
    else:
        per_layer = None
    points = attention_terms(profile)
    borrowed: list[str] = []
    found: dict[int, AttentionFit] = {}
    if points is not None:
        found, attention_fits = fit_attention(points)
        fits.extend(attention_fits)
        by_kind, borrowed = attention_by_kind(found, model.layers)
    else:
        by_kind = need_prior("attention").attention
    layers = per_layer * model.layers if per_layer is not None else need_prior("decoder layers").layers_s

    def table(op: str, x_column: str, piece: str, fallback):
        t = profile.tables.get(op)
        if t is None:
            return getattr(need_prior(piece), fallback)
        curve, fit = fit_curve(t[x_column], t["median_ms"], op, tile_for(profile, op))
        fits.append(fit)
        return curve(TOKENS) * MS

    head = table("lm_head", "tokens", "LM head", "head_s")
    vision = _vision_table(profile, model, need_prior, fits)
    draft, per_kept, cross_call, cross_row = _drafter(profile, need_prior, fits)
    select_launch, per_key, per_key_sq = _select(profile, need_prior, fits)
    measured = tuple(sorted(set(merged)))
    where = ", ".join(sorted({s for s in sources.values()}))
    label = (f"fitted profile: {profiles[0].meta.get('device', gpu.name)} / {model.name} ({where})"
             + (f"; roofline prior for {', '.join(used_prior)}" if used_prior else "")
             + (f"; {', '.join(borrowed)}" if borrowed else ""))
    cost = CostModel(label=label, calibrated=not used_prior, partly_calibrated=bool(used_prior),
                     overhead_s=STEP_OVERHEAD_S,
                     layers_s=frozen_table(layers), head_s=frozen_table(head), attention=by_kind,
                     vision_s_table=frozen_table(vision), draft_s_table=frozen_table(draft),
                     draft_s_per_kept=per_kept, draft_s_cross_call=cross_call, draft_s_cross_row=cross_row,
                     select_launch_s=select_launch, select_s_per_key=per_key, select_s_per_key_sq=per_key_sq)
    return Fitted(cost_model=cost, fits=tuple(fits), layer=composed, measured=measured, prior=tuple(used_prior),
                  attention=found, attention_points=points)


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


def _terms(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients of the columns of ``x``, least squares in relative error."""
    return optimize.lsq_linear(x / y[:, None], np.ones(len(y)), bounds=(0, np.inf)).x


def _drafter_columns(tokens: np.ndarray, kept: np.ndarray, least: float) -> np.ndarray:
    """What cross-attention adds to a drafter step of ``tokens`` rows each
    reading ``kept`` visual tokens: a call and a cost per row once it
    cross-attends at all (when the grid's least K is 0), and the kept
    tokens read."""
    on = (kept > least).astype(float) if least == 0 else np.zeros_like(kept)
    return np.column_stack([on, tokens * on, tokens * (kept - least)])


def _drafter(profile: Profile, need_prior, fits):
    """A drafter step: a curve in rows at the grid's least K, plus
    cross-attention terms (:func:`_drafter_columns`) fitted to what the
    other K add. Held out: every fourth distinct rows x (K + 1)."""
    t = profile.tables.get("drafter_step")
    if t is None:
        base = need_prior("drafter")
        return base.draft_s_table, base.draft_s_per_kept, base.draft_s_cross_call, base.draft_s_cross_row
    tokens, kept = t["tokens"].to_numpy(float), t["kept_tokens"].to_numpy(float)
    y, least = t["median_ms"].to_numpy(float), float(kept.min())

    def fit(rows):
        at_least = rows & (kept == least)
        curve, _ = fit_curve(tokens[at_least], y[at_least])
        extra = rows & (kept > least)
        coef = (_terms(_drafter_columns(tokens[extra], kept[extra], least), y[extra] - curve(tokens[extra]))
                if extra.any() else np.zeros(3))
        return curve, coef

    def predict(curve, coef, rows):
        return curve(tokens[rows]) + _drafter_columns(tokens[rows], kept[rows], least) @ coef

    held = _split(tokens * (kept + 1))
    errors = np.zeros(0)
    if held.any() and (~held & (kept == least)).sum() >= 2:
        errors = _ape(predict(*fit(~held), held), y[held])
    curve, (call, row, per_kept) = fit(np.ones(len(y), dtype=bool))
    fits.append(OpFit("drafter_step", "curve + cross-attention", len(y), errors))
    return curve(TOKENS) * MS, per_kept * MS, call * MS, row * MS


def _select_columns(requests: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """Selection: a launch, each key scored, and each request's keys squared
    (a CPU's caches overflow as one request's keys grow)."""
    return np.column_stack([np.ones_like(keys), keys, keys**2 / requests])


def _select(profile: Profile, need_prior, fits) -> tuple[float, float, float]:
    t = profile.tables.get("select")
    if t is None:
        base = need_prior("selection")
        return base.select_launch_s, base.select_s_per_key, base.select_s_per_key_sq
    requests = t["requests"].to_numpy(float)
    keys = requests * t["visual_tokens"].to_numpy(float)
    y = t["median_ms"].to_numpy(float)
    x = _select_columns(requests, keys)
    held = _split(keys)
    errors = _ape(x[held] @ _terms(x[~held], y[~held]), y[held]) if held.any() else np.zeros(0)
    fits.append(OpFit("select", "linear + squared", len(y), errors))
    launch, per_key, per_key_sq = _terms(x, y)
    return launch * MS, per_key * MS, per_key_sq * MS
