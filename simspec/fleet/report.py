"""Each replica of a fleet's run, measured: the per-replica table a run
folder writes (``replicas.csv``), the lines ``simspec simulate`` prints,
and the fleet's plots (``fleet_load.png``: requests in each replica over
time; ``fleet_latency_cdf.png``: E2E latency by replica group).

Imports: numpy, matplotlib (Agg canvas, when a plot is drawn),
simspec.metrics, simspec.fleet.run.
"""

from __future__ import annotations

import csv
import io
from typing import TYPE_CHECKING, Sequence

import numpy as np

from simspec import metrics
from simspec.fleet.run import FleetRun

if TYPE_CHECKING:
    from matplotlib.figure import Figure

COLUMNS = ("policy", "replica", "requests", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms",
           "p99_e2el_ms", "request_throughput", "gpu_busy_fraction", "group", "served")
METRICS = COLUMNS[3:10]
ALL = "all"
"""The group name of a fleet of identical replicas."""
TIME_POINTS = 200
"""Points of the load plot's time axis."""


def replica_rows(runs: dict[str, FleetRun], *, groups: Sequence[str] | None = None,
                 served: dict[str, Sequence[str]] | None = None, empty_as_zero: bool = False) -> list[dict]:
    """One row per run and replica (a replica that got no request: its
    count, no latencies); ``groups``: each replica's group name (None: one
    group); ``served``: per run, the policy each replica served (None: the run's)."""
    rows = []
    for policy, run in runs.items():
        names = groups or [ALL] * len(run.replicas)
        own = (served or {}).get(policy) or [policy] * len(run.replicas)
        for i, log in enumerate(run.replicas):
            row = {"policy": policy, "group": names[i], "replica": i, "served": own[i], "requests": run.served(i)}
            if log is not None:
                m = metrics.summarize(log, empty_as_zero=empty_as_zero)
                row.update({key: m[key] for key in METRICS})
            rows.append(row)
    return rows


def csv_text(rows: list[dict]) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
    return out.getvalue()


def describe(rows: list[dict], replicas: int, router: str) -> str:
    """A line per policy (and group, in a fleet of groups): how the requests
    and the mean E2EL spread over the replicas."""
    lines = [f"fleet: {replicas} replicas behind {router}; per replica:"]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        for group in dict.fromkeys(r["group"] for r in rows if r["policy"] == policy):
            mine = [r for r in rows if r["policy"] == policy and r["group"] == group]
            e2el = [r["mean_e2el_ms"] for r in mine if "mean_e2el_ms" in r]
            counts = [r["requests"] for r in mine]
            name = policy if group == ALL else f"{policy} | {group} x{len(mine)}"
            if mine[0]["served"] != policy:
                name += f" (serving {mine[0]['served']})"
            lines.append(f"  {name}: requests {min(counts)}-{max(counts)}, mean E2EL "
                         f"{min(e2el):.1f}-{max(e2el):.1f} ms" if e2el else f"  {name}: no requests served")
    return "\n".join(lines)


def _in_system(run: FleetRun, times: np.ndarray) -> list[np.ndarray]:
    """Each replica's requests arrived and not finished at each of ``times``."""
    out = []
    for log in run.replicas:
        if log is None:
            out.append(np.zeros(len(times)))
            continue
        arrival = np.sort(np.asarray(log.table.arrival_s, dtype=float))
        finish = np.asarray(log.table.finish_s, dtype=float)
        finish = np.sort(finish[np.isfinite(finish)])
        out.append(np.searchsorted(arrival, times, side="right") - np.searchsorted(finish, times, side="right"))
    return out


def _time_axis(runs: dict[str, FleetRun]) -> np.ndarray:
    logs = [log for run in runs.values() for log in run.replicas if log is not None]
    start = min((float(np.min(log.table.arrival_s)) for log in logs), default=0.0)
    ends = [float(np.nanmax(log.table.finish_s)) for log in logs if np.isfinite(log.table.finish_s).any()]
    end = max(ends, default=start + 1.0)
    return np.linspace(start, max(end, start + 1e-3), TIME_POINTS)


def _colors(groups: Sequence[str]) -> dict[str, str]:
    return {g: f"C{k % 10}" for k, g in enumerate(dict.fromkeys(groups))}


def plot_load(runs: dict[str, FleetRun], groups: Sequence[str] | None = None) -> "Figure":
    """A panel per policy: each replica's requests in the system (queued or running) over time, coloured by group."""
    from matplotlib.figure import Figure  # only when a run folder is drawn

    height = 0.6 + 1.8 * len(runs)
    fig = Figure(figsize=(8, height))
    fig.subplots_adjust(left=0.1, right=0.98, bottom=0.45 / height, top=1 - 0.3 / height, hspace=0.35)  # FIXED_LAYOUT
    axes = fig.subplots(len(runs), 1, sharex=True, squeeze=False)[:, 0]
    times = _time_axis(runs)
    for ax, (policy, run) in zip(axes, runs.items()):
        names = groups or [ALL] * len(run.replicas)
        colors = _colors(names)
        labelled = set()
        for name, load in zip(names, _in_system(run, times)):
            ax.plot(times, load, color=colors[name], linewidth=0.9, alpha=0.8,
                    label=None if name in labelled else name)
            labelled.add(name)
        ax.set_ylabel("requests in replica")
        ax.set_ylim(bottom=0)
        ax.set_title(policy, fontsize="medium", loc="left")
        ax.grid(True, alpha=0.3)
        if len(colors) > 1:
            ax.legend(loc="upper right", fontsize="small")
    axes[-1].set_xlabel("time (s)")
    return fig


def plot_latency_by_group(runs: dict[str, FleetRun], groups: Sequence[str] | None = None) -> "Figure":
    """A panel per policy: the E2E latency CDF of each replica group's requests."""
    from matplotlib.figure import Figure  # only when a run folder is drawn
    from matplotlib.ticker import LogFormatter

    width = 0.6 + 4.2 * len(runs)
    fig = Figure(figsize=(width, 4))
    fig.subplots_adjust(left=0.75 / width, right=1 - 0.15 / width, bottom=0.125, top=0.9, wspace=0.25)  # FIXED_LAYOUT
    axes = fig.subplots(1, len(runs), squeeze=False)[0]
    for ax, (policy, run) in zip(axes, runs.items()):
        names = groups or [ALL] * len(run.replicas)
        colors = _colors(names)
        for group in colors:
            e2el = [np.asarray(log.table.finish_s, float) - np.asarray(log.table.arrival_s, float)
                    for name, log in zip(names, run.replicas) if name == group and log is not None]
            x = np.sort(np.concatenate(e2el) * 1e3) if e2el else np.zeros(0)
            x = x[np.isfinite(x) & (x > 0)]
            if x.size:
                ax.step(x, np.arange(1, x.size + 1) / x.size, where="post", color=colors[group],
                        label=f"{group} ({x.size} requests)")
        ax.set_xscale("log")
        ax.xaxis.set_major_formatter(LogFormatter())  # PLAIN_LOG_LABELS (simspec.runfolder)
        ax.xaxis.set_minor_formatter(LogFormatter(labelOnlyBase=False))
        ax.set_xlabel("E2E latency (ms)")
        ax.set_ylim(0, 1.02)
        ax.set_title(policy, fontsize="medium", loc="left")
        ax.grid(True, which="both", alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(loc="lower right", fontsize="small")
    axes[0].set_ylabel("fraction of requests")
    return fig


__all__ = ["replica_rows", "csv_text", "describe", "plot_load", "plot_latency_by_group", "COLUMNS"]
