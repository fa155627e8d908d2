"""How long `simspec plan` takes over a few hundred candidates for an hour
of the Azure conversation trace, against Vidur-Search's published ~1
CPU-hour per search (microsoft/vidur, the Vidur paper: "about one hour of
CPU").

    python benchmarks/plan_speed.py [--trace PATH] [--growth 9] [--jobs 2]

Prints the candidates searched (and how many do not fit or cannot meet the
SLOs), the wall time, the simulated requests per second of wall time, and
the ratio to one CPU-hour. A benchmark, not a test: the figures depend on
the machine.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from simspec import plan as planning
from simspec.config import SimConfig
from simspec.workloads import WorkloadConfig

TRACE = Path(__file__).resolve().parents[2] / "shared" / "data" / "traces" / "azure_llm_2023_conv.csv"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trace", default=str(TRACE))
    ap.add_argument("--model", default="Llama-3.3-70B")
    ap.add_argument("--growth", type=float, default=9.0, help="the trace's ~5.6 req/s times this (default 9: ~50)")
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--policies", default="ar,linear:k=2,linear:k=3")
    ap.add_argument("--max-num-seqs", default="64,128,256")
    args = ap.parse_args()
    base = SimConfig(model=args.model, workload=WorkloadConfig(arrival="trace", trace_path=args.trace,
                                                               num_requests=None, multimodal_share=0.0))
    pc = planning.PlanConfig(devices=tuple(planning.PRICES), tps=(1, 2, 4, 8), policies=tuple(args.policies.split(",")),
                             batch_limits=tuple(int(x) for x in args.max_num_seqs.split(",")),
                             slos=(planning.parse_slo("p99_ttft_ms=2000"), planning.parse_slo("p99_tpot_ms=50")),
                             growth=args.growth, jobs=args.jobs)
    started = time.perf_counter()
    p = planning.plan(base, pc, progress=True)
    wall = time.perf_counter() - started
    print(f"{len(p.rows)} candidates ({p.unfit} do not fit, {p.pruned} cannot meet the SLOs) for "
          f"{p.target_per_s:.3g} req/s of {Path(args.trace).name} x{args.growth:g}, {args.jobs} processes")
    print(planning.verdict(p))
    print(f"wall {wall:.0f} s; {p.simulated_requests:,} simulated requests, {p.simulated_requests / wall:,.0f} per s; "
          f"{3600 / wall:.1f}x faster than Vidur-Search's ~1 CPU-hour")


if __name__ == "__main__":
    main()
