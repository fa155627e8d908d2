"""The stateful routers side by side on one fleet: mean and p99 E2EL and TTFT.

    python benchmarks/routers.py [--replicas N] [--rate-per-replica X] [--requests R] [--policy NAME]

Four replicas of the default scenario (LLaVA-1.5-7B on H100) with linear:k=3 at 16 req/s each by default,
Poisson arrivals, seed 0. A benchmark, not a test: it prints the figures docs/fleets.md quotes.
"""

from __future__ import annotations

import argparse

from simspec import config, experiment, metrics, policies
from simspec.fleet.run import simulate_fleet

ROUTERS = ("random", "least_requests", "least_tokens", "power_of_two", "spec_aware")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=4)
    parser.add_argument("--rate-per-replica", type=float, default=16.0)
    parser.add_argument("--requests", type=int, default=3000)
    parser.add_argument("--policy", default="linear:k=3")
    args = parser.parse_args()
    workload = {"arrival": "poisson", "rate_per_s": args.rate_per_replica * args.replicas,
                "num_requests": args.requests}
    scenario = experiment.resolve(config.build({}, {"workload": workload}))
    c = scenario.config
    print(f"{args.replicas} x {c.device} {c.model}, {args.policy}, {workload['rate_per_s']:g} req/s Poisson, "
          f"{args.requests} requests, seed 0 (ms)")
    print("| router | mean E2EL | p99 E2EL | mean TTFT | p99 TTFT |\n| --- | ---: | ---: | ---: | ---: |")
    for router in ROUTERS:
        run = simulate_fleet(scenario.requests, replicas=args.replicas, router=router,
                             policy=policies.parse(args.policy), label=args.policy, costs=scenario.costs,
                             acceptance=scenario.acceptance, engine=c.engine,
                             kv_budget_tokens=scenario.kv_budget_tokens, seed=0, event_detail=False)
        s = metrics.summarize(run.log)
        print(f"| `{router}` | {s['mean_e2el_ms']:.0f} | {s['p99_e2el_ms']:.0f} | {s['mean_ttft_ms']:.0f} | "
              f"{s['p99_ttft_ms']:.0f} |")


if __name__ == "__main__":
    main()
