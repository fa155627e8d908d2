"""Run folders: where a run (simulated or live, several policies) leaves its
results, and the text table the CLI prints.

Imports: the standard library, numpy, matplotlib (Agg canvas, never pyplot),
simspec.types and simspec.metrics.

A run folder holds ``config.toml`` (the resolved config), ``metrics.json``
({policy: {metric: value}}, NaN as null), ``requests.csv`` (one row per
request per policy), three plots (``latency_cdf.png``, ``plan_mix.png``,
``throughput.png``) and, written last, ``MARKER``: the run's meta, with
``"complete": true`` and the list of its files. The folder is built beside
its name and moved into place whole, so an interrupted or failed run leaves
the old folder or none, never a folder that looks finished. Plots are drawn on
``matplotlib.figure.Figure`` with the Agg canvas rather than through pyplot,
so writing a run is headless and leaves the caller's pyplot backend alone.
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from simspec import __version__, metrics
from simspec.metrics import acceptance_by_depth, per_position_acceptance
from simspec.files import check_writable, dump_json, staged_folder, write_atomic, write_png, write_text
from simspec.types import PLAN_KINDS, RunLog, require

if TYPE_CHECKING:
    from matplotlib.figure import Figure

MARKER = "simspec-run.json"
"""A file that marks a folder as a simspec run folder; holds the run's meta."""

CSV_COLUMNS = (
    "id", "policy", "arrival_s", "admitted_s", "first_token_s", "finish_s",
    "prompt_tokens", "output_tokens", "images", "visual_tokens", "preemptions", "cached_tokens",
)  # fmt: skip
CSV_FIELDS = tuple(c for c in CSV_COLUMNS if c != "policy")  # RequestTable's columns, in the CSV's order
TIME_BINS = 60
"""Time bins of the plan-mix and throughput plots."""
# FIXED_LAYOUT: the plots' margins are set by hand (subplots_adjust), not by
# matplotlib's constrained layout, which draws every figure twice to measure
# its text (~0.1 s a plot, a third of a run folder's drawing).


@dataclass(frozen=True, slots=True, kw_only=True)
class RunMeta:
    """What ``MARKER`` says of a run, derived from its results
    (``experiment.Results.meta``, :meth:`of_live`); fields a kind of run
    has no value for are left out of the file."""

    kind: str  # "simulate" or "live"
    seed: int
    policies: tuple[str, ...]
    simspec_version: str = __version__
    model: str | None = None  # simulate: the scenario's
    device: str | None = None
    cost_model: str | None = None  # its label
    calibrated: bool | None = None
    calibration: str | None = None  # calibrated, partly calibrated or uncalibrated
    acceptance: str | None = None
    kv_budget_tokens: int | None = None
    clipped_requests: int | None = None  # requests cut to the model's context
    engine: str | None = None  # simulate: the engine mode (simspec.serving.modes) ...
    engine_version: str | None = None  # ... and the version of that engine whose behaviour it follows
    drafter_context: str | None = None  # live
    all_served: bool | None = None  # live: every policy served every request (not interrupted)
    notes: tuple[str, ...] | None = None  # live: what each policy's log noted

    @classmethod
    def of_live(cls, logs: list[RunLog], *, seed: int, policies: list[str], drafter_context: str) -> "RunMeta":
        return cls(kind="live", seed=seed, policies=tuple(policies), drafter_context=drafter_context,
                   all_served=len(logs) == len(policies) and all(log.complete for log in logs),
                   notes=tuple(f"{log.policy}: {note}" for log in logs for note in log.notes))

    def to_json(self) -> dict:
        return {f.name: getattr(self, f.name) for f in fields(self) if getattr(self, f.name) is not None}


def check_target(path) -> str | None:
    """Refuse ``path`` as a run folder unless it is new, empty, or a run
    folder (has ``MARKER``), and unless files can be made beside it; creates
    nothing there, so a run that fails later leaves no trace. Returns the
    line to print when an existing run folder will be replaced (None when
    not). Raises :class:`simspec.types.InputError`, so ``--out`` never
    clobbers a folder the user keeps other things in."""
    folder = Path(path)
    if folder.exists() or folder.is_symlink():
        require(
            folder.is_dir() and not folder.is_symlink() and ((folder / MARKER).is_file() or not any(folder.iterdir())),
            f"--out {path} exists and is not a simspec run folder (no {MARKER}); choose a new folder",
        )
    parent = folder.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    require(parent.is_dir(), f"--out {path}: {parent} is a file, not a folder")
    check_writable(parent, f"--out {path}")
    if not (folder / MARKER).is_file():
        return None
    state = "complete" if _marker(folder).get("complete") is True else "incomplete: it lacks some files"
    return f"replacing the run folder {path} ({state})"


def _marker(folder: Path) -> dict:
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError, RecursionError):
        return {}
    return marker if isinstance(marker, dict) else {}


def is_complete(path) -> bool:
    """Whether ``path`` is a finished run folder: its marker says so and
    every file it lists is there."""
    folder = Path(path)
    marker = _marker(folder)
    files = marker.get("files")
    return (marker.get("complete") is True and isinstance(files, list)
            and all(isinstance(f, str) and (folder / f).is_file() for f in files))


def write_run(
    path,
    *,
    logs: list[RunLog],
    metrics: dict[str, dict[str, float]],
    config_toml: str,
    meta: RunMeta,
    extra: dict[str, Callable[[Path], None]] | None = None,
) -> None:
    """Write every file of a run folder (see the module docstring), and
    ``extra``'s (name -> a function writing that file's path).

    The folder is built beside ``path`` and moved into place whole, the
    marker (``meta`` with ``"complete": true`` and the list of files)
    written last, so ``path`` ends up the old folder, none, or the complete
    new one. ``metrics`` is {policy: summarize(log)}; ``metrics.json`` adds
    each log's per-position lists (``metrics.summarize_full``'s
    ``spec_decode_per_position_acceptance_rates``, as ``vllm bench serve``
    writes it, and ``draft_acceptance_by_depth``). Identical inputs give
    byte-identical JSON, CSV and TOML.
    """
    if not logs:
        raise ValueError("write_run needs at least one RunLog")
    check_target(path)
    lists = {log.policy: {"spec_decode_per_position_acceptance_rates": per_position_acceptance(log),
                          "draft_acceptance_by_depth": acceptance_by_depth(log)} for log in logs}
    table = {policy: {**row, **lists.get(policy, {})} for policy, row in metrics.items()}
    with staged_folder(path) as folder:
        write_text(folder / "config.toml", config_toml)
        write_text(folder / "metrics.json", dump_json(table))
        write_requests_csv(logs, folder / "requests.csv")
        edges = _time_edges(logs)
        write_png(folder / "latency_cdf.png", _plot_latency_cdf(logs))
        write_png(folder / "plan_mix.png", _plot_plan_mix(logs, edges))
        write_png(folder / "throughput.png", _plot_throughput(logs, edges))
        for name, write in (extra or {}).items():
            write(folder / name)
        files = sorted(p.name for p in folder.iterdir())
        write_text(folder / MARKER, dump_json({**meta.to_json(), "complete": True, "files": files}))


def write_requests_csv(log: RunLog | list[RunLog], path) -> None:
    """Write the ``requests.csv`` rows of one log or several to ``path``
    (atomically): one row per request per policy, sorted by id within a
    policy, floats as ``%.9f`` so identical logs give identical bytes."""
    logs = [log] if isinstance(log, RunLog) else list(log)
    write_atomic(Path(path), lambda f: _requests_csv(logs, f))


def format_table(metrics: dict[str, dict[str, float]], columns: list[str],
                 headers: dict[str, str] | None = None) -> str:
    """A fixed-width text table: a header, a rule, then one row per policy
    (``headers`` renames columns; a metric's name by default).

    A metric missing for one policy shows as ``-``; a column no policy has
    raises :class:`simspec.types.InputError` (it is usually a typo).
    """
    known = set().union(*(m.keys() for m in metrics.values()))
    unknown = [c for c in columns if c not in known]
    require(
        not metrics or not unknown,
        f"unknown metric column(s) {', '.join(unknown)}; choose from {', '.join(sorted(known))}",
    )
    header = ["policy", *((headers or {}).get(c, c) for c in columns)]
    rows = [[policy, *(_cell(m.get(c)) for c in columns)] for policy, m in metrics.items()]
    widths = [max(len(row[i]) for row in (header, *rows)) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        first = cells[0].ljust(widths[0])
        rest = (cell.rjust(w) for cell, w in zip(cells[1:], widths[1:]))
        return "  ".join((first, *rest)).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(row) for row in rows)])


COMPACT_COLUMNS = {  # metric -> its header in the main job's table
    "mean_ttft_ms": "mean TTFT", "p99_ttft_ms": "p99 TTFT", "mean_tpot_ms": "mean TPOT",
    "mean_e2el_ms": "mean E2EL", "p95_e2el_ms": "p95 E2EL", "p99_e2el_ms": "p99 E2EL",
    "output_throughput": "out tok/s", "spec_decode_acceptance_length": "accept len",
}
VS = "e2el_vs_baseline"  # the compact table's last column: mean E2EL over the baseline's


def best_policy(metrics: dict[str, dict[str, float]]) -> str | None:
    """The policy of lowest mean E2EL (None if none has one)."""
    finite = {p: m["mean_e2el_ms"] for p, m in metrics.items() if math.isfinite(m.get("mean_e2el_ms", math.nan))}
    return min(finite, key=finite.get) if finite else None


def compact_table(metrics: dict[str, dict[str, float]], baseline: str = "ar") -> str:
    """The main job's table: the columns a serving engineer reads first
    (COMPACT_COLUMNS, latencies in ms), mean E2EL relative to ``baseline``,
    and the best policy marked ``*``."""
    best = best_policy(metrics)
    base = metrics.get(baseline, {}).get("mean_e2el_ms", math.nan)
    rows = {}
    for policy, m in metrics.items():
        row = {c: m.get(c) for c in COMPACT_COLUMNS}
        if math.isfinite(base) and base > 0:
            row[VS] = f"{m.get('mean_e2el_ms', math.nan) / base:.2f}x"
        rows[f"{policy} *" if policy == best else policy] = row
    columns = [*COMPACT_COLUMNS, *([VS] if math.isfinite(base) and base > 0 else [])]
    return format_table(rows, columns, {**COMPACT_COLUMNS, VS: f"E2EL vs {baseline}"})


def verdict(metrics: dict[str, dict[str, float]], baseline: str = "ar") -> str:
    """One line: the best policy at this load and how it compares with ``baseline``."""
    best = best_policy(metrics)
    if best is None:
        return "no policy completed a request"
    mine = metrics[best]["mean_e2el_ms"]
    base = metrics.get(baseline, {}).get("mean_e2el_ms", math.nan)
    if best == baseline:
        others = {p: m["mean_e2el_ms"] for p, m in metrics.items() if p != best and math.isfinite(m["mean_e2el_ms"])}
        if not others:
            return f"at this load the best policy is {best} (mean E2EL {mine:.1f} ms)"
        runner = min(others, key=others.get)
        return (f"at this load the best policy is {best}: speculation does not pay (the next best, {runner}, "
                f"has {others[runner] / mine:.2f}x its mean E2EL)")
    if not (math.isfinite(base) and mine > 0):
        return f"at this load the best policy is {best} (mean E2EL {mine:.1f} ms)"
    return f"at this load the best policy is {best}: {base / mine:.2f}x lower mean E2EL than {baseline}"


def _cell(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, str):
        return value
    if isinstance(value, (list, tuple)):
        return "/".join(_cell(v) for v in value)
    if isinstance(value, (bool, np.bool_)):
        return str(bool(value))
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    value = float(value)
    if not math.isfinite(value):
        return "nan" if math.isnan(value) else str(value)
    return f"{value:.2f}" if value == 0 or abs(value) >= 1 else f"{value:.4f}"


# --- files ------------------------------------------------------------------


CSV_BLOCK = 1 << 16  # rows formatted at a time: the file is streamed, never built whole


def _requests_csv(logs: list[RunLog], f) -> None:
    text = io.TextIOWrapper(f, encoding="utf-8", newline="")
    writer = csv.writer(text, lineterminator="\n")
    writer.writerow(CSV_COLUMNS)
    for log in logs:
        t = log.table
        order = np.argsort(t.id, kind="stable")
        for start in range(0, len(order), CSV_BLOCK):
            rows = order[start:start + CSV_BLOCK]
            columns = [getattr(t, name)[rows].tolist() for name in CSV_FIELDS]
            writer.writerows(
                (i, log.policy, f"{a:.9f}", f"{q:.9f}", f"{ft:.9f}", f"{fin:.9f}", *counts)
                for i, a, q, ft, fin, *counts in zip(*columns))
    text.flush()
    text.detach()


# --- plots ------------------------------------------------------------------


def _latencies_ms(log: RunLog) -> dict[str, np.ndarray]:
    """Per completed request: ttft and e2el in ms (definitions in metrics)."""
    times = {name: np.asarray(getattr(log.table, name), dtype=float)
             for name in ("arrival_s", "first_token_s", "finish_s")}
    done = np.isfinite(times["first_token_s"]) & np.isfinite(times["finish_s"])
    arrival_s = times["arrival_s"][done]
    return {
        "ttft": (times["first_token_s"][done] - arrival_s) * 1e3,
        "e2el": (times["finish_s"][done] - arrival_s) * 1e3,
    }


def _plot_latency_cdf(logs: list[RunLog]) -> "Figure":
    from matplotlib.figure import Figure  # only when a run folder is drawn
    from matplotlib.ticker import LogFormatter

    fig = Figure(figsize=(10, 4))
    fig.subplots_adjust(left=0.065, right=0.985, bottom=0.125, top=0.92, wspace=0.2)  # FIXED_LAYOUT
    panels = fig.subplots(1, 2, squeeze=False)[0]
    latencies = [_latencies_ms(log) for log in logs]
    for ax, (name, label) in zip(panels, (("ttft", "TTFT"), ("e2el", "E2E latency"))):
        for log, lat in zip(logs, latencies):
            x = np.sort(lat[name][lat[name] > 0])  # log-x: drop zero latencies
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", label=log.policy)
        ax.set_xscale("log")
        # PLAIN_LOG_LABELS: 100, 1000, 1e+04 rather than matplotlib's 10^2
        # in mathtext, whose parser is built on first use (~0.2 s a process)
        ax.xaxis.set_major_formatter(LogFormatter())
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        ax.set_xlabel(f"{label} (ms)")
        ax.set_ylabel("fraction of requests")
        ax.set_ylim(0, 1.02)
        ax.set_title(f"{label} CDF")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right")
    return fig


def _time_edges(logs: list[RunLog]) -> np.ndarray:
    """[TIME_BINS + 1] bin edges shared by all policies, so panels line up."""
    start_s = min(log.start_s for log in logs)
    end_s = max(log.end_s for log in logs)
    if not (math.isfinite(start_s) and math.isfinite(end_s) and end_s > start_s):
        start_s, end_s = 0.0, 1.0
    return np.linspace(start_s, end_s, TIME_BINS + 1)


def _plot_plan_mix(logs: list[RunLog], edges: np.ndarray) -> "Figure":
    from matplotlib.figure import Figure  # only when a run folder is drawn

    height = 0.6 + 1.6 * len(logs)
    fig = Figure(figsize=(8, height))
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.45 / height, top=1 - 0.3 / height, hspace=0.3)  # FIXED_LAYOUT
    axes = fig.subplots(len(logs), 1, sharex=True, squeeze=False)[:, 0]
    centers = (edges[:-1] + edges[1:]) / 2
    for ax, log in zip(axes, logs):
        ax.stackplot(centers, metrics.plan_mix(log, edges), labels=PLAN_KINDS, alpha=0.85, step="mid")
        ax.set_ylim(0, 1)
        ax.set_ylabel("share of rounds")
        ax.set_title(log.policy, fontsize="medium", loc="left")
    axes[0].legend(loc="upper right", ncols=3, fontsize="small")
    axes[-1].set_xlabel("time (s)")
    return fig


def _plot_throughput(logs: list[RunLog], edges: np.ndarray) -> "Figure":
    from matplotlib.figure import Figure  # only when a run folder is drawn

    fig = Figure(figsize=(8, 4))
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.125, top=0.92)  # FIXED_LAYOUT
    ax = fig.subplots()
    centers = (edges[:-1] + edges[1:]) / 2
    for log in logs:
        ax.plot(centers, metrics.tokens_per_s(log, edges), label=log.policy)
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s")
    ax.set_ylim(bottom=0)
    ax.set_title("Output throughput")
    ax.grid(True, alpha=0.3)
    ax.legend(loc="upper right")
    return fig
