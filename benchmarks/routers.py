"""The stateful routers side by side on one fleet: mean and p99 E2EL and TTFT.

    python benchmarks/routers.py [--replicas N] [--rate-per-replica X] [--requests R] [--policy NAME]
                                 [--fleet FILE.toml --rate X] [--seeds S]

Four replicas of the default scenario (LLaVA-1.5-7B on H100) with linear:k=3 at 16 req/s each by default,
Poisson arrivals, seed 0; or the groups of a fleet file (``--fleet``, at ``--rate`` for the whole fleet).
With ``--seeds S`` each figure is the mean over seeds 0..S-1, and the last column is each router's mean
E2EL against least_requests', paired by seed (mean and standard error of the per-seed ratios).
A benchmark, not a test: it prints the figures docs/fleets.md quotes.
"""

from __future__ import annotations

import argparse

import numpy as np

from simspec import config, experiment
from simspec.fleet import groups

ROUTERS = ("random", "least_requests", "least_tokens", "power_of_two", "spec_aware")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rate-per-replica", type=float, default=16.0)
    parser.add_argument("--fleet", metavar="FILE.toml", help="a fleet file's groups instead of --replicas")
    parser.add_argument("--rate", type=float, help="with --fleet: the fleet's request rate")
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--policy", default="linear:k=3")
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()
    if args.fleet:
        fleet = groups.load(args.fleet)["fleet"]
        rate = args.rate or 16.0 * sum(g.replicas for g in fleet)
        shape, where = {"fleet": fleet}, groups.describe(fleet)
    else:
        rate = args.rate_per_replica * args.replicas
        shape, where = {"replicas": args.replicas}, f"{args.replicas} x the default scenario's replica"
    workload = {"arrival": "poisson", "rate_per_s": rate, "num_requests": args.requests}
    print(f"{where}; {args.policy}, {rate:g} req/s Poisson, {args.requests} requests, seeds 0..{args.seeds - 1} (ms)")
    figures = {}
    for router in ROUTERS:
        rows = []
        for seed in range(args.seeds):
            cfg = config.build({}, {**shape, "router": router, "seed": seed, "policies": [args.policy],
                                    "workload": workload})
            m = experiment.run(cfg, event_detail=False).metrics[args.policy]
            rows.append([m["mean_e2el_ms"], m["p99_e2el_ms"], m["mean_ttft_ms"], m["p99_ttft_ms"]])
        figures[router] = np.array(rows)
    print("| router | mean E2EL | p99 E2EL | mean TTFT | p99 TTFT | mean E2EL / least_requests' |\n"
          "| --- | ---: | ---: | ---: | ---: | ---: |")
    for router, rows in figures.items():
        ratio = rows[:, 0] / figures["least_requests"][:, 0]
        error = ratio.std(ddof=1) / np.sqrt(len(ratio)) if len(ratio) > 1 else 0.0
        mean = rows.mean(axis=0)
        print(f"| `{router}` | {mean[0]:.0f} | {mean[1]:.0f} | {mean[2]:.0f} | {mean[3]:.0f} | "
              f"{ratio.mean():.3f} +- {error:.3f} |")


if __name__ == "__main__":
    main()
