"""``simspec report``: the plots and best-policy summary of a sweep table (simspec.report)."""

from __future__ import annotations

import argparse
from pathlib import Path

from simspec.report import ReportConfig, write_report
from simspec.types import require


def cmd_report(args: argparse.Namespace) -> int:
    where = []
    for item in args.where or ():
        key, sep, value = item.partition("=")
        require(bool(sep and key and value), f"--where must be KEY=VALUE (got {item!r})")
        where.append((key.strip(), value.strip()))
    config = ReportConfig(metric=args.metric, baseline=args.baseline, x=args.x, rows=args.rows, cols=args.cols,
                          scenario=args.scenario, where=tuple(where))
    out = args.out or str(Path(args.results).with_suffix("")) + "_report"
    print(write_report(args.results, out, config), end="")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register the ``report`` subcommand."""
    d = ReportConfig()
    p = sub.add_parser("report", help="plots and a best-policy summary of a sweep's results table",
                       description="Plots (latency and speedup vs load, best policy per cell, plan mix over time) "
                                   "and a text summary of a `simspec sweep` results table.")
    p.add_argument("results", metavar="RESULTS.parquet", help="the table `simspec sweep --out` wrote")
    p.add_argument("--out", metavar="DIR", help="folder for the PNGs and summary.txt (default: RESULTS_report/)")
    p.add_argument("--metric", default=d.metric, help=f"ranks the policies (default: {d.metric})")
    p.add_argument("--baseline", default=d.baseline, help=f"speedups are over this policy (default: {d.baseline})")
    p.add_argument("--x", help="x axis of the line plots (default: load, else rate)")
    p.add_argument("--rows", help="heat-map rows, an axis (default: the x axis)")
    p.add_argument("--cols", help="heat-map columns, an axis (default: the first other axis that varies)")
    p.add_argument("--scenario", metavar="ID", help="scenario of the plan-mix plot (default: the first)")
    p.add_argument("--where", action="append", metavar="AXIS=VALUE", help="keep only these rows (repeat)")
    p.set_defaults(handler=cmd_report)
