"""Cost models fitted to measured operator profiles.

Imports: numpy, simspec.costs (curves, attention, base, profiles, roofline,
specs). DESIGN.md "Cost model". The curve forms are in simspec.costs.curves,
attention's in simspec.costs.attention; this module renders them into one
cost model.

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

from simspec.costs.attention import (AttentionFit, AttentionTerms, attention_by_kind, attention_terms, fit_attention,
                                    prefill_waves)
from simspec.costs.base import TOKENS, CostModel, frozen_table
from simspec.costs.curves import OpFit, _ape, _split, _terms, fit_curve, fit_line
from simspec.costs.profiles import CALLS_PER_LAYER, LAYER_OPS, Profile
from simspec.costs.roofline import FIXED, roofline
from simspec.costs.gpus import GpuSpec
from simspec.costs.specs import EAGLE_KINDS, ModelSpec
from simspec.types import InputError

MS = 1e-3
GEMM_OPS = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj", "lm_head")
COMPOSED_LAYER = "decoder layer (composed)"  # the OpFit of a whole layer
GEMM_TILE_TOKENS = 64  # on a GPU a GEMM runs whole row tiles: 65 rows cost what 128 do


def tile_for(profile: Profile, op: str) -> int:
    """GEMM_TILE_TOKENS for a GEMM measured on a GPU, else 1."""
    return GEMM_TILE_TOKENS if op in GEMM_OPS and profile.meta.get("kind", "cuda") == "cuda" else 1


# -- attention ----------------------------------------------------------------


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
        found, attention_fits = fit_attention(points, prefill_waves(model.heads, model.kv_heads, gpu.sms))
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
    draft, per_kept, cross_call, cross_row = _drafter(profile, need_prior, fits, model.drafter_kind in EAGLE_KINDS)
    select_launch, per_key, per_key_sq = _select(profile, need_prior, fits)
    measured = tuple(sorted(set(merged)))
    where = ", ".join(sorted({s for s in sources.values()}))
    label = (f"fitted profile: {profiles[0].meta.get('device', gpu.name)} / {model.name} ({where})"
             + (f"; roofline prior for {', '.join(used_prior)}" if used_prior else "")
             + (f"; {', '.join(borrowed)}" if borrowed else "")
             + ("; the prior's fixed costs (engine CPU time, CUDA-graph regimes, speculation rounds; "
                "the round terms fitted to published results)" if prior is not None else ""))
    # Operator profiles time kernels alone: what a GPU engine pays around
    # them (its CPU part, eager launches, a speculation round's fixed costs)
    # is the prior's (simspec.costs.roofline.FixedCosts); a device without a
    # datasheet (a CPU) keeps only the fixed CPU part per step.
    fixed = prior if prior is not None else CostModel(label="", calibrated=False, overhead_s=FIXED.cpu_step_s)
    cost = CostModel(label=label, calibrated=not used_prior, partly_calibrated=bool(used_prior),
                     overhead_s=fixed.overhead_s, overhead_s_per_request=fixed.overhead_s_per_request,
                     draft_s_per_round=fixed.draft_s_per_round,
                     draft_s_per_round_request=fixed.draft_s_per_round_request,
                     graph_piecewise_s=fixed.graph_piecewise_s, graph_eager_s=fixed.graph_eager_s,
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


def _drafter_columns(tokens: np.ndarray, kept: np.ndarray, least: float) -> np.ndarray:
    """What cross-attention adds to a drafter step of ``tokens`` rows each
    reading ``kept`` visual tokens: a call and a cost per row once it
    cross-attends at all (when the grid's least K is 0), and the kept
    tokens read."""
    on = (kept > least).astype(float) if least == 0 else np.zeros_like(kept)
    return np.column_stack([on, tokens * on, tokens * (kept - least)])


def _drafter(profile: Profile, need_prior, fits, eagle: bool):
    """A drafter step: a curve in rows at the grid's least K, plus
    cross-attention terms (:func:`_drafter_columns`) fitted to what the
    other K add. Held out: every fourth distinct rows x (K + 1). A profile
    times simspec's EAGLE-style drafter, so other drafter kinds (not
    ``eagle``) take the prior's."""
    t = profile.tables.get("drafter_step")
    if t is None or not eagle:
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
