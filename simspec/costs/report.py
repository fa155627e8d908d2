"""``simspec costs report``: how well fitted cost models predict their
profiles (held-out error per operator and for the composed decoder layer),
and measured-vs-fitted curves as a PNG. With a second profile of the same
device and model (``--repeat``), each operator's run-to-run difference too:
the floor below which no fit's held-out error can be judged. Where the
profile measures attention and the device has a datasheet, the roofline
prior's attention (datasheet plus its fixed terms, simspec.costs.roofline)
is judged on the same held-out points, so the two can be compared.

Imports: numpy, matplotlib (Agg canvas), simspec.costs.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from simspec.costs import attention, curves, fitted, profiles
from simspec.costs.roofline import roofline
from simspec.costs.catalog import MODELS
from simspec.costs.gpus import GpuSpec
from simspec.costs.specs import ModelSpec
from simspec.types import InputError

X_COLUMN = {"lm_head": "tokens", "drafter_step": "tokens", "vision_encoder": "images",
            "int8_quantize": "visual_tokens", **{op: "tokens" for op in profiles.LAYER_OPS}}


def fit_for(device: GpuSpec, model: ModelSpec, root: Path | None = None) -> tuple[list[profiles.Profile], fitted.Fitted]:
    found = profiles.find(device.slug, model, root)
    if not found:
        raise InputError(f"device {device.slug}: no profile of {model.name} or of a model with its layer shapes "
                         f"under {root or profiles.default_root()}")
    return found, fitted.fit_profiles(found, model, device)


def load_repeat(path: Path, device: GpuSpec, model: ModelSpec) -> profiles.Profile:
    """The repeat profile ``--repeat`` names: a profile folder (with
    meta.json), or a profiles folder holding ``<device>/<model>/``. It
    must be of the same device and of a model with the same layers."""
    if (path / "meta.json").is_file():
        repeat = profiles.load(path)
    else:
        found = profiles.find(device.slug, model, path)
        if not found:
            raise InputError(f"--repeat {path}: no profile of {model.name} on {device.slug} (expected "
                             f"{path}/meta.json or {path}/{device.slug}/{model.name}/meta.json)")
        repeat = found[0]
    if repeat.device_slug != device.slug:
        raise InputError(f"--repeat {path}: a profile of device {repeat.device_slug}, not {device.slug}")
    spec = MODELS.get(repeat.model)
    if repeat.model != model.name and (spec is None or not profiles.same_layers(spec, model)):
        raise InputError(f"--repeat {path}: a profile of {repeat.model}, whose layers are not {model.name}'s")
    return repeat


def _per_point(table: pd.DataFrame) -> pd.Series:
    """Median ms by grid point (a point measured twice in one table: their mean)."""
    return table.groupby(list(table.columns.drop("median_ms")))["median_ms"].mean()


def repeat_differences(found: list[profiles.Profile], repeat: profiles.Profile) -> dict[str, np.ndarray]:
    """Run-to-run difference of each operator, |repeat - first| / first at
    every grid point both profiles measured (``found``: the first profile
    holding the operator, as the fit takes it), and of the composed decoder
    layer at the token counts every layer piece measured in both. A fit
    whose held-out error is near this is at the timing's noise floor."""
    first = {}
    for profile in found:
        for op, t in profile.tables.items():
            first.setdefault(op, _per_point(t))
    out, both = {}, {}
    for op, again in repeat.tables.items():
        if op not in first:
            continue
        a, b = first[op].align(_per_point(again), join="inner")
        if len(a):
            out[op] = np.abs(b.to_numpy() - a.to_numpy()) / a.to_numpy()
            both[op] = (a, b)
    if all(op in both for op in profiles.LAYER_OPS):
        tokens = sorted(set.intersection(*(set(both[op][0].index) for op in profiles.LAYER_OPS)))
        if tokens:
            a, b = (sum(n * both[op][k].loc[tokens].to_numpy() for op, n in profiles.CALLS_PER_LAYER.items())
                    for k in (0, 1))
            out[fitted.COMPOSED_LAYER] = np.abs(b - a) / a
    return out


def prior_attention(result: fitted.Fitted, model: ModelSpec, device: GpuSpec) -> list[curves.OpFit]:
    """The roofline prior's attention judged on the held-out points of each
    measured kind (none without measured attention or a datasheet)."""
    if result.attention_points is None or device.hbm_bytes_per_s <= 0 or device.bf16_flops <= 0:
        return []
    return attention.judge(result.attention_points, roofline(model, device).attention, model.layers, "roofline prior")


def _pct(v: float) -> str:
    return "-" if math.isnan(v) else f"{100 * v:.1f}%"


def table(result: fitted.Fitted, repeat: dict[str, np.ndarray] | None = None,
          prior: list[curves.OpFit] = ()) -> str:
    """Held-out error per operator and for the composed layer, then the
    prior's on the same points (:func:`prior_attention`); with ``repeat``
    (:func:`repeat_differences`), the run-to-run difference too."""
    rows = [("operator", "points", "fit", "held-out median APE", "held-out p95 APE")]
    if repeat is not None:
        rows[0] += ("repeat median diff", "repeat p95 diff")
    for fit in (*result.fits, *([result.layer] if result.layer else []), *prior):
        row = (fit.op, str(fit.points), fit.kind, _pct(fit.median_ape), _pct(fit.p95_ape))
        if repeat is not None:
            diff = repeat.get(fit.op, np.zeros(0))
            row += ((_pct(float(np.median(diff))), _pct(float(np.percentile(diff, 95)))) if len(diff)
                    else ("-", "-"))
        rows.append(row)
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))) for r in rows]
    lines.insert(1, "  ".join("-" * w for w in widths))
    if result.prior:
        lines.append(f"roofline prior (not measured): {', '.join(result.prior)}")
    return "\n".join(lines)


def figure(found: list[profiles.Profile], result: fitted.Fitted) -> Figure:
    ops = [op for op in X_COLUMN if any(op in p.tables for p in found)]
    terms = result.attention_points
    kinds = sorted(result.attention)
    cols = 3
    rows = max(1, math.ceil((len(ops) + len(kinds)) / cols))
    fig = Figure(figsize=(4 * cols, 3 * rows), layout="constrained")
    for k, kind in enumerate(kinds):
        _attention_panel(fig.add_subplot(rows, cols, len(ops) + k + 1), terms[terms.which == kind],
                         result.attention[kind], attention.ATTENTION_OPS[kind])
    for k, op in enumerate(ops):
        ax = fig.add_subplot(rows, cols, k + 1)
        profile = next(p for p in found if op in p.tables)
        t = profile.tables[op]
        x = t[X_COLUMN[op]].to_numpy(float)
        y = t["median_ms"].to_numpy(float)
        if op == "drafter_step":  # the cost model's drafter step at each K against its points
            _drafter_panel(ax, t, result)
            continue
        curve = curves.fit_curve(x, y, tile=fitted.tile_for(profile, op))[0] if X_COLUMN[op] == "tokens" else None
        ax.plot(x, y, "o", ms=3, label="measured")
        if curve is not None:
            grid = np.geomspace(max(x.min(), 1), x.max(), 200)
            ax.plot(grid, curve(grid), "-", label=f"fit ({curve.kind})")
            ax.set_xscale("log")
        ax.set_title(op, fontsize=9)
        ax.set_xlabel(X_COLUMN[op])
        ax.set_ylabel("ms")
        ax.legend(fontsize=7)
    return fig


def _attention_panel(ax, terms: attention.AttentionTerms, fit: attention.AttentionFit, op: str) -> None:
    """Fitted against measured, every grid point (on the line: exact)."""
    predicted = fit(terms)
    ax.loglog(terms.ms, predicted, "o", ms=3, label="grid points")
    span = [min(terms.ms.min(), predicted.min()), max(terms.ms.max(), predicted.max())]
    ax.plot(span, span, "-", lw=1, label="fitted = measured")
    ax.set_title(f"{op} (attention fit)", fontsize=9)
    ax.set_xlabel("measured ms")
    ax.set_ylabel("fitted ms")
    ax.legend(fontsize=7)


def _drafter_panel(ax, t, result: fitted.Fitted) -> None:
    for k, rows in t.groupby("kept_tokens"):
        tokens = rows["tokens"].to_numpy(int)
        line = ax.plot(tokens, rows["median_ms"], "o", ms=3, label=f"K={k} measured")[0]
        grid = np.unique(np.geomspace(max(tokens.min(), 1), tokens.max(), 50).astype(int))
        model = [1e3 * result.cost_model.draft_level_s(int(n), int(n) * int(k)) for n in grid]
        ax.plot(grid, model, "-", color=line.get_color(), lw=1)
    ax.set_xscale("log")
    ax.set_title("drafter_step (lines: the fitted model)", fontsize=9)
    ax.set_xlabel("tokens")
    ax.set_ylabel("ms")
    ax.legend(fontsize=6)
