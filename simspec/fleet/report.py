"""Each replica of a fleet's run, measured: the per-replica table a run
folder writes (``replicas.csv``) and the line ``simspec simulate`` prints.

Imports: simspec.metrics, simspec.fleet.run.
"""

from __future__ import annotations

import csv
import io

from simspec import metrics
from simspec.fleet.run import FleetRun

COLUMNS = ("policy", "replica", "requests", "mean_ttft_ms", "p99_ttft_ms", "mean_tpot_ms", "mean_e2el_ms",
           "p99_e2el_ms", "request_throughput", "gpu_busy_fraction")


def replica_rows(runs: dict[str, FleetRun], *, empty_as_zero: bool = False) -> list[dict]:
    """One row per policy and replica (a replica that got no request: its count, no latencies)."""
    rows = []
    for policy, run in runs.items():
        for i, log in enumerate(run.replicas):
            row = {"policy": policy, "replica": i, "requests": int((run.assignment == i).sum())}
            if log is not None:
                m = metrics.summarize(log, empty_as_zero=empty_as_zero)
                row.update({key: m[key] for key in COLUMNS[3:]})
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
    """A line per policy: how the requests and the mean E2EL spread over the replicas."""
    lines = [f"fleet: {replicas} replicas behind {router}; per replica:"]
    for policy in dict.fromkeys(r["policy"] for r in rows):
        mine = [r for r in rows if r["policy"] == policy]
        e2el = [r["mean_e2el_ms"] for r in mine if "mean_e2el_ms" in r]
        counts = [r["requests"] for r in mine]
        lines.append(f"  {policy}: requests {min(counts)}-{max(counts)}, mean E2EL "
                     f"{min(e2el):.1f}-{max(e2el):.1f} ms" if e2el else f"  {policy}: no requests served")
    return "\n".join(lines)


__all__ = ["replica_rows", "csv_text", "describe", "COLUMNS"]
