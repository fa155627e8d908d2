"""``simspec report``: the plots a person looks at first after a sweep, and a
text summary of the best policy per cell.

Imports: the standard library, numpy, simspec.sweep (the results table),
.config, .experiment, .types; pandas, scipy, matplotlib and
simspec.runfolder (Agg figures, atomic writes) inside the functions that
draw, so ``simspec --help`` stays fast. Implements DESIGN.md "Commands"
(sweep -> report).

From one results table (``simspec sweep --out``) it writes, into a folder:

- ``latency_vs_load.png``: mean and p95 e2el against load (or rate) per
  policy, with 95% t-intervals across seeds as bands; one row of panels per
  combination of the other axes that vary.
- ``speedup_vs_load.png``: baseline (AR) mean e2el over each policy's, paired
  per scenario and seed (common random numbers), with 95% t-intervals.
- ``best_policy.png``: the best policy per cell over two chosen axes
  (``--rows``, ``--cols``), faded and marked "≈" where it is not separable
  from the runner-up: the 95% t-interval of their paired relative
  difference (over seeds and any pooled axes) includes 0, or there is a
  single sample.
- ``plan_mix.png``: share of AR / linear / tree rounds over time in one
  scenario (``--scenario ID``, default the first), re-simulated from the
  config stored in its rows.
- ``summary.txt``: what it prints; the best-policy table as text.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np

from simspec import experiment, sweep as sweeps
from simspec.types import InputError, require

ALIASES = {"rate": "rate_per_s", "burstiness": "cv"}
PLOTS = ("latency_vs_load.png", "speedup_vs_load.png", "best_policy.png", "plan_mix.png")


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportConfig:
    """What to draw (every field is a ``simspec report`` flag)."""

    metric: str = "mean_e2el_ms"  # ranks policies in the heat map and the summary
    baseline: str = "ar"  # speedups are over this policy
    x: str | None = None  # x axis of the line plots; default load, else rate
    rows: str | None = None  # heat-map rows; default the x axis
    cols: str | None = None  # heat-map columns; default the first other varied axis
    scenario: str | None = None  # plan-mix scenario id (a prefix will do); default the first
    where: tuple[tuple[str, str], ...] = ()  # keep only rows with these column values
    confidence: float = 0.95  # of the t-intervals
    max_panels: int = 12  # combinations of the other axes drawn at most

    def __post_init__(self):
        require(0 < self.confidence < 1, f"confidence must be in (0, 1) (got {self.confidence})")
        require(self.max_panels >= 1, f"max_panels must be >= 1 (got {self.max_panels})")


def lower_is_better(metric: str) -> bool:
    return metric.endswith("_ms") or metric in ("preemptions", "duration_s")


def interval(values, confidence: float) -> tuple[float, float]:
    """Mean and half-width of the two-sided t-interval (NaN half-width for
    fewer than two values)."""
    from scipy import stats

    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return math.nan, math.nan
    if v.size < 2:
        return float(v.mean()), math.nan
    t = stats.t.ppf(0.5 + confidence / 2, v.size - 1)
    return float(v.mean()), float(t * v.std(ddof=1) / math.sqrt(v.size))


# --- the table --------------------------------------------------------------------


def load_frame(path, where: tuple[tuple[str, str], ...] = ()):
    """The results table as a DataFrame (filtered by ``where``) and its
    sweep metadata."""
    table = sweeps.read_results(path)
    frame = table.to_pandas()
    for key, value in where:
        column = ALIASES.get(key, key)
        require(column in frame.columns, f"--where {key}: no such column (axes: {', '.join(_dim_names(frame, {}))})")
        if frame[column].dtype.kind in "fi":
            try:
                wanted = float(value)
            except ValueError:
                raise InputError(f"--where {key}={value}: {column} holds numbers") from None
            frame = frame[np.isclose(frame[column].astype(float), wanted, rtol=1e-9, atol=0)]
        else:
            frame = frame[frame[column].astype(str) == value]
        require(len(frame), f"--where {key}={value}: no rows match")
    return frame, sweeps.metadata(table)


def _dim_names(frame, meta: dict) -> list[str]:
    """The axes a table can vary over: load (or, without loads, the rate,
    which a load sets), the other DIMS, the generic axes of the sweep."""
    generic = [a for a in meta.get("axes", []) if a not in sweeps.NAMED_AXES]
    x = "load" if "load" in frame and frame["load"].notna().any() else "rate_per_s"
    return [x, *(d for d in sweeps.DIMS if d not in ("load", "rate_per_s")), *generic]


def varied(frame, meta: dict) -> list[str]:
    """The axes that take more than one value in ``frame``."""
    return [d for d in _dim_names(frame, meta) if d in frame and frame[d].dropna().nunique() > 1]


def _column(frame, name: str | None, flag: str) -> str | None:
    if name is None:
        return None
    column = ALIASES.get(name, name)
    require(column in frame.columns and column not in ("config_toml", "policy", "scenario_id", "seed"),
            f"{flag} {name}: not an axis of this table (axes: {', '.join(sweeps.DIMS)})")
    return column


def _label(value) -> str:
    return f"{value:g}" if isinstance(value, float) else str(value)


def _panels(frame, dims: list[str], limit: int) -> tuple[list[tuple[str, object]], list]:
    """Combinations of ``dims`` present in ``frame``: (title, sub-frame)."""
    if not dims:
        return [("", frame)], []
    groups = [(", ".join(f"{d}={_label(v)}" for d, v in zip(dims, key if isinstance(key, tuple) else (key,))), g)
              for key, g in frame.groupby(dims, sort=True, dropna=False)]
    return groups[:limit], groups[limit:]


def _policies(frame) -> list[str]:
    return list(dict.fromkeys(frame["policy"]))  # table order = the sweep's order


# --- plots ------------------------------------------------------------------------


def _figure(rows: int, cols: int, width: float = 5.0, height: float = 3.4):
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width * cols, 0.6 + height * rows), layout="constrained")
    return fig, fig.subplots(rows, cols, squeeze=False)


def _band(ax, xs, stats, label: str, color) -> None:
    means = np.array([m for m, _ in stats])
    half = np.array([h for _, h in stats])
    ax.plot(xs, means, marker="o", ms=3, label=label, color=color)
    ok = np.isfinite(half)
    if ok.any():
        ax.fill_between(np.asarray(xs)[ok], (means - half)[ok], (means + half)[ok], alpha=0.2, color=color)


def plot_latency(frame, x: str, panels, config: ReportConfig):
    fig, axes = _figure(len(panels), 2)
    colors = _colors(_policies(frame))
    for row, (title, sub) in enumerate(panels):
        for ax, metric in zip(axes[row], ("mean_e2el_ms", "p95_e2el_ms")):
            for policy, group in sub.groupby("policy", sort=False):
                by_x = sorted(group.groupby(x)[metric])
                _band(ax, [k for k, _ in by_x], [interval(v, config.confidence) for _, v in by_x], policy,
                      colors[policy])
            ax.set_yscale("log")
            ax.set_xlabel(x)
            ax.set_ylabel(f"{metric} (ms)")
            ax.set_title(f"{metric.replace('_ms', '')}  {title}".strip(), fontsize="medium", loc="left")
            ax.grid(True, which="both", alpha=0.3)
    axes[0][0].legend(fontsize="small")
    fig.suptitle(f"E2E latency vs {x} ({config.confidence:.0%} t-interval across seeds)")
    return fig


def _paired(sub, metric: str):
    """(scenario, seed) x policy table of ``metric``: the paired units."""
    return sub.pivot_table(index=["scenario_id", "seed"], columns="policy", values=metric, aggfunc="first")


def plot_speedup(frame, x: str, panels, config: ReportConfig):
    fig, axes = _figure(len(panels), 1, width=7.0)
    policies = [p for p in _policies(frame) if p != config.baseline]
    colors = _colors(_policies(frame))
    for ax, (title, sub) in zip(axes[:, 0], panels):
        units = _paired(sub, "mean_e2el_ms")
        xs = sub.drop_duplicates("scenario_id").set_index("scenario_id")[x]
        for policy in policies:
            if policy not in units or config.baseline not in units:
                continue
            speedup = (units[config.baseline] / units[policy]).dropna()
            by_x = sorted(speedup.groupby(xs.reindex(speedup.index.get_level_values(0)).to_numpy()))
            _band(ax, [k for k, _ in by_x], [interval(v, config.confidence) for _, v in by_x], policy, colors[policy])
        ax.axhline(1.0, color="grey", lw=1, ls="--")
        ax.set_xlabel(x)
        ax.set_ylabel(f"speedup over {config.baseline}")
        ax.set_title(title, fontsize="medium", loc="left")
        ax.grid(True, alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize="small")
    fig.suptitle(f"mean e2el of {config.baseline} / mean e2el of the policy "
                 f"({config.confidence:.0%} t-interval across seeds)")
    return fig


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """The verdict of one heat-map cell."""

    best: str
    runner_up: str | None
    margin: float  # mean paired relative difference, runner-up vs best (> 0: best is better)
    separable: bool  # the t-interval of that difference excludes 0
    samples: int  # paired (scenario, seed) units


def best_cell(sub, metric: str, confidence: float) -> Cell:
    units = _paired(sub, metric).dropna()
    require(len(units), f"--metric {metric}: no scenario has a value for every policy")
    means = units.mean()
    order = means.sort_values(ascending=lower_is_better(metric)).index.tolist()
    if len(order) < 2:
        return Cell(best=order[0], runner_up=None, margin=math.nan, separable=True, samples=len(units))
    best, runner = units[order[0]], units[order[1]]
    diff = (runner - best) / best.abs() if lower_is_better(metric) else (best - runner) / runner.abs()
    mean, half = interval(diff.to_numpy(), confidence)
    return Cell(best=order[0], runner_up=order[1], margin=mean,
                separable=bool(np.isfinite(half) and mean - half > 0), samples=len(units))


def best_grid(frame, rows: str, cols: str | None, config: ReportConfig) -> tuple[list, list, dict]:
    """Row values, column values and {(row, col): Cell}."""
    row_values = sorted(frame[rows].dropna().unique())
    col_values = sorted(frame[cols].dropna().unique()) if cols else [None]
    cells = {}
    for r in row_values:
        for c in col_values:
            sub = frame[(frame[rows] == r) & ((frame[cols] == c) if cols else True)]
            if len(sub):
                cells[(r, c)] = best_cell(sub, config.metric, config.confidence)
    return row_values, col_values, cells


def _cell_text(cell: Cell) -> str:
    if cell.runner_up is None:
        return cell.best
    mark = "≈ " if not cell.separable else "next "
    return f"{cell.best} ({mark}{cell.runner_up} {cell.margin:+.0%})"


def plot_best(grid, rows: str, cols: str | None, policies: list[str], config: ReportConfig):
    from matplotlib.patches import Patch

    row_values, col_values, cells = grid
    fig, axes = _figure(1, 1, width=max(5.0, 2.3 * len(col_values) + 2), height=max(2.5, 0.7 * len(row_values)))
    ax = axes[0, 0]
    colors = _colors(policies)
    image = np.ones((len(row_values), len(col_values), 4))
    for (i, r), (j, c) in ((a, b) for a in enumerate(row_values) for b in enumerate(col_values)):
        cell = cells.get((r, c))
        if cell is None:
            continue
        image[i, j] = (*colors[cell.best][:3], 1.0 if cell.separable else 0.35)
        text = cell.best if cell.separable else f"≈ {cell.best}\n{cell.runner_up}"
        if cell.separable and cell.runner_up:
            text += f"\n{cell.margin:+.0%} next"
        ax.text(j, i, text, ha="center", va="center", fontsize="x-small")
    ax.imshow(image, aspect="auto")
    ax.set_yticks(range(len(row_values)), [_label(v) for v in row_values])
    ax.set_xticks(range(len(col_values)), [_label(v) if v is not None else "" for v in col_values])
    ax.set_xticks([j - 0.5 for j in range(1, len(col_values))], minor=True)
    ax.set_yticks([i - 0.5 for i in range(1, len(row_values))], minor=True)
    ax.grid(True, which="minor", color="white", lw=2)
    ax.tick_params(which="minor", length=0)
    ax.set_ylabel(rows)
    ax.set_xlabel(cols or "")
    used = [p for p in policies if any(c.best == p for c in cells.values())]
    ax.legend(handles=[Patch(color=colors[p], label=p) for p in used], loc="upper left",
              bbox_to_anchor=(1.01, 1), fontsize="small")
    arrow = "lower" if lower_is_better(config.metric) else "higher"
    fig.suptitle(f"best policy by {config.metric} ({arrow} is better)\n"
                 f"faded, ≈: not separable from the runner-up", fontsize="medium")
    return fig


def _colors(policies: list[str]) -> dict:
    from matplotlib import colormaps

    cmap = colormaps["tab10" if len(policies) <= 10 else "tab20"]
    return {p: cmap(i % cmap.N) for i, p in enumerate(policies)}


def choose_scenario(frame, scenario: str | None) -> str:
    """The scenario id ``scenario`` starts (default: the table's first)."""
    ids = list(dict.fromkeys(frame["scenario_id"]))
    if scenario is None:
        return ids[0]
    matches = [s for s in ids if s.startswith(scenario)]
    require(len(matches) == 1, f"--scenario {scenario}: " + (f"{len(matches)} scenarios start so" if matches
                                                               else "no such scenario in the table"))
    return matches[0]


def plan_mix(frame, chosen: str):
    """Re-simulate scenario ``chosen`` (first seed) with every policy of its
    rows; returns (Results, policies whose stored mean e2el differs)."""
    rows = frame[frame["scenario_id"] == chosen]
    seed = int(rows["seed"].iloc[0])
    rows = rows[rows["seed"] == seed]
    config = sweeps.config_from_toml(rows["config_toml"].iloc[0])
    config = replace(config, policies=tuple(_policies(rows)), seed=seed)
    results = experiment.run(config)
    stored = dict(zip(rows["policy"], rows["mean_e2el_ms"]))
    return results, [p for p, m in results.metrics.items() if not _same(m["mean_e2el_ms"], stored[p])]


def _same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == b


# --- the summary and the command ------------------------------------------------------


def text_table(grid, rows: str, cols: str | None) -> str:
    row_values, col_values, cells = grid
    header = [f"{rows} \\ {cols}" if cols else rows, *(_label(c) if c is not None else "best" for c in col_values)]
    body = [[_label(r), *(_cell_text(cells[(r, c)]) if (r, c) in cells else "-" for c in col_values)]
            for r in row_values]
    widths = [max(len(line[i]) for line in (header, *body)) for i in range(len(header))]
    lines = ["  ".join(cell.ljust(w) for cell, w in zip(line, widths)).rstrip() for line in (header, *body)]
    return "\n".join([lines[0], "  ".join("-" * w for w in widths), *lines[1:]])


def write_report(path, out_dir, config: ReportConfig = ReportConfig()) -> str:
    """Write every plot and ``summary.txt`` into ``out_dir``; returns the summary."""
    from simspec.files import write_png, write_text
    from simspec.runfolder import _plot_plan_mix, _time_edges

    frame, meta = load_frame(path, config.where)
    dims = varied(frame, meta)
    x = _column(frame, config.x, "--x") or _dim_names(frame, meta)[0]
    require(frame[x].dtype.kind in "fi" and frame[x].notna().any(), f"--x {x}: not a numeric axis of this table")
    rows = _column(frame, config.rows, "--rows") or x
    others = [d for d in dims if d != x]
    cols = _column(frame, config.cols, "--cols") or next((d for d in others if d != rows), None)
    require(cols != rows, f"--rows and --cols must differ (both {rows})")
    require(config.metric in frame.columns, f"--metric {config.metric}: no such metric in the table")
    chosen = choose_scenario(frame, config.scenario)
    policies = _policies(frame)
    folder = Path(out_dir)
    require(not folder.exists() or folder.is_dir(), f"--out {folder} exists and is not a folder")
    folder.mkdir(parents=True, exist_ok=True)

    panels, left_out = _panels(frame, others, config.max_panels)
    seeds = sorted(frame["seed"].unique())
    seed_text = f"seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
    lines = [f"simspec report: {path}: {frame['scenario_id'].nunique()} scenarios x {seed_text}, "
             f"{len(frame)} rows; policies {', '.join(policies)}",
             "varied: " + (" | ".join(f"{d} {'/'.join(_label(v) for v in sorted(frame[d].dropna().unique()))}"
                                      for d in dims) or "nothing")]
    partly = sorted({f"{r.device}/{r.model} ({r.cost_calibration})" for r in frame.itertuples()
                     if r.cost_calibration != "calibrated"})
    if partly:
        lines.append(f"cost models not fully calibrated: {', '.join(partly)}")
    uncalibrated = sorted({f"{r.device}/{r.model}" for r in frame.itertuples() if r.cost_calibration == "uncalibrated"})
    note = f"\nUNCALIBRATED cost model (roofline prior): {', '.join(uncalibrated)}" if uncalibrated else ""
    if left_out:
        lines.append(f"plots show {len(panels)} of {len(panels) + len(left_out)} combinations of "
                     f"{', '.join(others)}; narrow with --where")
    figures = {PLOTS[0]: plot_latency(frame, x, panels, config)}
    if config.baseline in policies and len(policies) > 1:
        figures[PLOTS[1]] = plot_speedup(frame, x, panels, config)
    else:
        lines.append(f"no speedup plot: the baseline {config.baseline!r} is not among the policies (--baseline)")
    grid = best_grid(frame, rows, cols, config)
    figures[PLOTS[2]] = plot_best(grid, rows, cols, policies, config)
    for name, figure in figures.items():
        figure.suptitle(figure.get_suptitle() + note, fontsize="medium")
        write_png(folder / name, figure)
    pooled = [d for d in dims if d not in (rows, cols)]
    lines += ["", f"best policy by {config.metric} ({'lower' if lower_is_better(config.metric) else 'higher'} is "
                  f"better) over {seed_text}"
                  + (f", pooling {', '.join(pooled)}" if pooled else "") + ":",
              text_table(grid, rows, cols),
              f"'next X +N%': the runner-up X is N% worse; '≈ X': not separable from X "
              f"({config.confidence:.0%} t-interval of the paired difference includes 0, or one sample)"]
    results, mismatch = plan_mix(frame, chosen)
    logs = list(results.logs)
    figure = _plot_plan_mix(logs, _time_edges(logs))
    s = results.scenario
    figure.suptitle(f"scenario {chosen}: {s.model.name} on {s.gpu.name}, {s.config.workload.rate_per_s:.3g} req/s, "
                    f"seed {s.config.seed}\ncost model: {s.costs.label} "
                    f"({s.costs.calibration.upper() if s.costs.calibration == 'uncalibrated' else s.costs.calibration})",
                    fontsize="small")
    figure.subplots_adjust(top=1 - 0.75 / figure.get_figheight())  # room for the two-line title (fixed layout)
    write_png(folder / PLOTS[3], figure)
    figures[PLOTS[3]] = figure
    lines.append(f"\nplan mix: scenario {chosen} (seed {s.config.seed}) re-simulated from its stored config")
    if mismatch:
        lines.append(f"warning: re-simulation differs from the stored rows for {', '.join(mismatch)} "
                     f"(table written by another simspec version?)")
    lines.append(f"wrote {folder}/: {', '.join(figures)}, summary.txt")
    summary = "\n".join(lines) + "\n"
    write_text(folder / "summary.txt", summary)
    return summary


