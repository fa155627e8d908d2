"""Attention fitted per kind of call (prefill, decode, tree verification) in
the cost model's own form (simspec.costs.base).

Imports: numpy, scipy (least squares), simspec.costs.base,
simspec.costs.curves (held-out splits), simspec.costs.profiles.

Each kind is c + blend(kv x alpha, pairs x beta x W) + requests x rho +
queries x gamma, all coefficients >= 0, with a cache knee on kv and on
pairs, and for prefill a wave quantisation W of its thread blocks
(:func:`prefill_waves`, costs.base.wave_factor; otherwise 1), where
Akaike's criterion says they pay. Held out: every fourth distinct pair count
of each kind (costs.curves._split); :func:`judge` scores any cost model's
attention (a fit's, the roofline prior's) on the same points.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simspec.costs.base import (A_FLOOR, A_KV, A_KV_KNEE, A_KV_OVER, A_PAIR, A_PAIR_KNEE, A_PAIR_OVER, A_QUERY,
                                A_REQUEST, A_WAVE_SHARE, A_WAVE_TOKENS, ATTENTION_KINDS, BLEND_P, DECODE, PREFILL,
                                VERIFY, attention_row, attention_table, wave_factor)
from simspec.costs.curves import OpFit, _ape, _split, _terms
from simspec.costs.profiles import Profile

MS = 1e-3


ATTENTION_OPS = ("attn_prefill", "attn_decode", "attn_tree_verify")  # indexed by kind (costs.base PREFILL ...)


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
NO_WAVE = (0.0, 0.0)  # (wave_tokens, wave_share) of a fit without wave quantisation


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
    wave_tokens: float = 0.0  # query tokens per thread block (0: no wave quantisation; costs.base.wave_factor)
    wave_share: float = 0.0  # thread blocks per query tile / SMs

    def __call__(self, a: AttentionTerms) -> np.ndarray:
        memory = a.kv * self.kv_ms + np.maximum(a.kv - self.kv_knee, 0.0) * self.kv_over_ms
        compute = ((a.pairs * self.pair_ms + np.maximum(a.pairs - self.pair_knee, 0.0) * self.pair_over_ms)
                   * wave_factor(a.queries, self.wave_tokens, self.wave_share))
        return (self.floor_ms + (memory ** BLEND_P + compute ** BLEND_P) ** (1.0 / BLEND_P)
                + a.requests * self.request_ms + a.queries * self.query_ms)

    @classmethod
    def from_row(cls, row: np.ndarray, scale: float) -> "AttentionFit":
        """The inverse of :meth:`row`: a costs.base coefficient row (seconds
        for the whole model) as ms per layer, ``scale`` being ms per layer to s."""
        knee = lambda k: NO_KNEE if k == 0 else float(k)  # noqa: E731 (row() writes no knee as 0)
        return cls(floor_ms=row[A_FLOOR] / scale, kv_ms=row[A_KV] / scale, pair_ms=row[A_PAIR] / scale,
                   request_ms=row[A_REQUEST] / scale, query_ms=row[A_QUERY] / scale,
                   kv_over_ms=row[A_KV_OVER] / scale, kv_knee=knee(row[A_KV_KNEE]),
                   pair_over_ms=row[A_PAIR_OVER] / scale, pair_knee=knee(row[A_PAIR_KNEE]),
                   wave_tokens=float(row[A_WAVE_TOKENS]), wave_share=float(row[A_WAVE_SHARE]))

    def row(self, scale: float) -> np.ndarray:
        """costs.base's coefficient row, times ``scale`` (ms per layer to s per model)."""
        knee = lambda k: 0.0 if k == NO_KNEE else k  # noqa: E731 (no extra cost: any knee prices the same)
        return attention_row(kv_s=self.kv_ms * scale, pair_s=self.pair_ms * scale, request_s=self.request_ms * scale,
                             query_s=self.query_ms * scale, floor_s=self.floor_ms * scale,
                             kv_over_s=self.kv_over_ms * scale, kv_knee=knee(self.kv_knee),
                             pair_over_s=self.pair_over_ms * scale, pair_knee=knee(self.pair_knee),
                             wave_tokens=self.wave_tokens, wave_share=self.wave_share)  # shapes, not times


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


def _fit_with_knees(a: AttentionTerms, kv_knee: float, pair_knee: float, move_knees: bool = False,
                    wave: tuple[float, float] = NO_WAVE) -> tuple[float, AttentionFit]:
    """Least squares in log time with the knees fixed (or, with
    ``move_knees``, starting from them and free within the measured sizes)
    and the thread blocks' ``wave`` shape (wave_tokens, wave_share);
    (sum of squares, fit). Starts from the additive form's non-negative
    least squares (memory plus compute instead of their smooth maximum)."""
    from scipy import optimize  # only when fitting: a stored cost model needs no scipy

    # Terms in AttentionFit's order: floor, kv, pair, request, query, kv over, pair over.
    waves = wave_factor(a.queries, *wave)
    columns = np.column_stack([np.ones_like(a.kv), a.kv, a.pairs * waves, a.requests, a.queries,
                               np.maximum(a.kv - kv_knee, 0.0), np.maximum(a.pairs - pair_knee, 0.0) * waves])
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
                            pair_over_ms=float(full[6]), pair_knee=float(pair), wave_tokens=wave[0],
                            wave_share=wave[1])

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


def _fit_attention(a: AttentionTerms, waves: tuple[tuple[float, float], ...] = ()) -> AttentionFit:
    """One kind's fit: the knees (none, or one at a quantile of the
    measured sizes, for memory and for compute) and the thread blocks' wave
    shape (none, or one of ``waves``: :func:`prefill_waves`) chosen by
    Akaike's criterion on log time, so a knee must pay for its two
    parameters and a wave shape for one (residuals below 0.01% count as
    0.01%: timing precision)."""
    best = None
    n = len(a.ms)
    pair_knees = [NO_KNEE] if _pairs_are_kv(a) else _knees(a.pairs)
    for wave in (NO_WAVE, *waves):
        for kv_knee in _knees(a.kv):
            for pair_knee in pair_knees:
                ss, fit = _fit_with_knees(a, kv_knee, pair_knee, wave=wave)
                params = 5 + 2 * (kv_knee != NO_KNEE) + 2 * (pair_knee != NO_KNEE) + (wave != NO_WAVE)
                score = n * np.log(max(ss / n, PRECISION ** 2)) + 2 * params
                if best is None or score < best[0]:
                    best = (score, fit, ss, kv_knee, pair_knee, wave)
    _, fit, ss, kv_knee, pair_knee, wave = best
    if kv_knee != NO_KNEE or pair_knee != NO_KNEE:  # the knees between the candidates
        moved_ss, moved = _fit_with_knees(a, kv_knee, pair_knee, move_knees=True, wave=wave)
        if moved_ss < ss:
            return moved
    return fit


def split(a: AttentionTerms, kind: int) -> tuple[AttentionTerms, np.ndarray]:
    """One kind's points and the mask of those held out of its fit."""
    rows = a[a.which == kind]
    return rows, _split(rows.pairs)


def fit_attention(a: AttentionTerms, waves: tuple[tuple[float, float], ...] = ()
                  ) -> tuple[dict[int, AttentionFit], list[OpFit]]:
    """A fit for each kind of attention among a profile's points (keyed
    by ATTENTION_OPS index: prefill, decode, tree verification), and its
    held-out error; prefill may take one of the wave shapes ``waves``
    (:func:`prefill_waves`), chosen on the points it is fitted to."""
    found, fits = {}, []
    for k in np.unique(a.which):
        rows, held = split(a, int(k))
        shapes = waves if int(k) == PREFILL else ()
        errors = (_ape(_fit_attention(rows[~held], shapes)(rows[held]), rows.ms[held]) if held.any()
                  else np.zeros(0))
        found[int(k)] = _fit_attention(rows, shapes)
        form = "attention" + (" + cache knee" if _has_knee(found[int(k)]) else "")
        fits.append(OpFit(ATTENTION_OPS[k], form + (" + waves" if found[int(k)].wave_tokens > 0 else ""),
                          len(rows.ms), errors))
    return found, fits


# Query rows per thread block that FlashAttention-2's and FlashInfer's
# prefill kernels tile by (kBlockM 64 or 128 in flash-attention's
# kernel_traits; FlashInfer's CTA_TILE_Q 64 or 128, chosen by the query
# length and head dim).
WAVE_TILES = (64, 128)


def prefill_waves(heads: int, kv_heads: int, sms: int) -> tuple[tuple[float, float], ...]:
    """Candidate wave shapes (wave_tokens, wave_share: costs.base.wave_factor)
    of a prefill kernel: a thread block per tile of query rows and head,
    the rows one query head's (FlashAttention-2: a block per query head)
    or, under grouped-query attention, the query heads of a group packed
    into the tile (FlashInfer: a block per KV head, heads / kv_heads query
    rows per token). None where the SM count is unknown."""
    if sms <= 0:
        return ()
    group = heads // kv_heads
    shapes = [(float(tile), heads / sms) for tile in WAVE_TILES]
    if group > 1:
        shapes += [(tile / group, kv_heads / sms) for tile in WAVE_TILES]
    return tuple(shapes)


def judge(a: AttentionTerms, table: np.ndarray, layers: int, label: str) -> list[OpFit]:
    """How a cost model's attention (``table``: costs.base's [3, 11]
    coefficients, whole model) predicts each kind's held-out points, per
    layer; ``label`` names the model in each OpFit's kind."""
    fits = []
    for k in np.unique(a.which):
        rows, held = split(a, int(k))
        model = AttentionFit.from_row(table[int(k)], MS * layers)
        fits.append(OpFit(ATTENTION_OPS[k], label, len(rows.ms), _ape(model(rows[held]), rows.ms[held])))
    return fits


def _has_knee(fit: AttentionFit) -> bool:
    return fit.kv_knee != NO_KNEE or fit.pair_knee != NO_KNEE


def attention_by_kind(found: dict[int, AttentionFit], layers: int) -> tuple[np.ndarray, list[str]]:
    """[3, 11] coefficients (costs.base) from the kinds measured; a kind not
    measured takes the nearest measured one (verification <-> decode,
    prefill <- decode), named in the second value. Verification borrowed
    from decode also takes prefill's pair terms where prefill is measured:
    a verifying kernel reads each sequence's keys once as decode does, and
    computes its several query rows' pairs as prefill does
    (simspec.costs.roofline says why)."""
    borrow = {PREFILL: (DECODE, VERIFY), DECODE: (VERIFY, PREFILL), VERIFY: (DECODE, PREFILL)}
    rows, notes = [], []
    for kind in (PREFILL, DECODE, VERIFY):
        source = kind if kind in found else next(k for k in borrow[kind] if k in found)
        fit = found[source]
        if kind == VERIFY and source == DECODE and PREFILL in found:
            pairs = found[PREFILL]
            fit = replace(fit, pair_ms=pairs.pair_ms, pair_over_ms=pairs.pair_over_ms, pair_knee=pairs.pair_knee)
            notes.append("verify attention priced as decode plus prefill's pair compute")
        elif source != kind:
            notes.append(f"{ATTENTION_KINDS[kind]} attention priced as {ATTENTION_KINDS[source]}")
        rows.append(fit.row(MS * layers))
    return attention_table(*rows), notes
