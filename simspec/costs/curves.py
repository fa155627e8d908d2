"""Monotone curves of time against one size, fitted to profiled points and
judged on held-out ones.

Imports: numpy, scipy (least squares, isotonic regression, PCHIP).

Every operator that depends on a token count gets a curve that is monotone
in it: either a *roofline* form, c + (a^p + (b x)^p)^(1/p) (flat while
weights stream, then a compute slope), or a *monotone* interpolant
(isotonic regression, then PCHIP through the result), whichever predicts
held-out points better. Held-out error: the points are sorted by size and
every fourth (never the ends) is held out; the curve is fitted on the rest
and judged on those, then refitted on all points.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


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
        from scipy import interpolate  # only when fitting: a stored cost model needs no scipy

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
    from scipy import optimize  # only when fitting: a stored cost model needs no scipy

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
    from scipy import optimize  # only when fitting: a stored cost model needs no scipy

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


def _line(x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """Non-negative intercept and slope."""
    from scipy import optimize  # only when fitting: a stored cost model needs no scipy

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


def _terms(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Non-negative coefficients of the columns of ``x``, least squares in relative error."""
    from scipy import optimize  # only when fitting: a stored cost model needs no scipy

    return optimize.lsq_linear(x / y[:, None], np.ones(len(y)), bounds=(0, np.inf)).x
