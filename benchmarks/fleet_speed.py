"""A fleet's simulation cost per request against one replica's.

Serves N x R requests at N x the rate on N replicas (``--replicas N``,
behind ``--router``, round_robin by default) and R requests at the rate on one, the default scenario
otherwise, each policy in this process after an untimed warm-up (both
sizes: the fleet's compiled routing loop is its own code), and prints
wall seconds per thousand requests and their ratio (target: a fleet
within 1.5x of one replica's cost per request). ``--repeats N`` times
each N times, one replica and the fleet in turn, and keeps the fastest
of each: one run's time moves by a third on a shared machine.
``--prefixes P`` gives the prompts P shared system prompts of 1,024
tokens, prefix caching on (for ``prefix_affinity``). ``--frontend``
gives the engine frontend costs (2 ms a request, 2 us a prompt token, 15
ms an image: the size of what a vLLM calibration fits), which the
router's loop keeps for each replica. The last line is
the process's peak resident memory (the fleet's runs are the largest).

    python benchmarks/fleet_speed.py [--replicas N] [--router NAME] [--requests R] [--rate X] [--policy NAME ...]
                                     [--repeats N] [--prefixes P] [--frontend]
"""

from __future__ import annotations

import argparse
import resource
import time

from simspec import config, experiment


FRONTEND = {"frontend_s_per_request": 0.002, "frontend_s_per_text_token": 2e-6, "frontend_s_per_image": 0.015}


def timed(replicas: int, requests: int, rate: float, policy: str, router: str = "round_robin",
          prefixes: int = 0, frontend: bool = False) -> float:
    workload = {"num_requests": requests * replicas, "rate_per_s": rate * replicas}
    fields = {"replicas": replicas, "router": router, "policies": [policy], "workload": workload,
              "engine": dict(FRONTEND) if frontend else {}}
    if prefixes:
        workload.update(shared_prefix_tokens=1024, shared_prefixes=prefixes)
        fields["engine"]["prefix_caching"] = True
    cfg = config.build({}, fields)
    started = time.perf_counter()
    experiment.run(cfg, event_detail=False)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=16)
    parser.add_argument("--requests", type=int, default=2000, help="requests per replica")
    parser.add_argument("--rate", type=float, default=6.0, help="requests/s per replica")
    parser.add_argument("--router", default="round_robin")
    parser.add_argument("--policy", action="append", default=None)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--prefixes", type=int, default=0)
    parser.add_argument("--frontend", action="store_true", help="engines with frontend costs")
    args = parser.parse_args()
    for policy in args.policy or ["ar", "linear:k=3", "marginal"]:
        timed(1, 50, args.rate, policy, prefixes=args.prefixes, frontend=args.frontend)  # warm-up: loads or compiles
        timed(args.replicas, 50, args.rate, policy, args.router, args.prefixes, args.frontend)
        ones, fleets = [], []
        for _ in range(args.repeats):
            ones.append(timed(1, args.requests, args.rate, policy, prefixes=args.prefixes, frontend=args.frontend))
            fleets.append(timed(args.replicas, args.requests, args.rate, policy, args.router, args.prefixes,
                                args.frontend))
        one = min(ones) / args.requests * 1e3
        fleet = min(fleets) / (args.requests * args.replicas) * 1e3
        print(f"{policy:12s} {args.router} one replica {one:7.2f} s / 1k req   {args.replicas} replicas {fleet:7.2f} s / 1k req   "
              f"ratio {fleet / one:5.2f}")
    peak_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # kB on Linux
    print(f"peak memory {peak_mb:,.0f} MB")


if __name__ == "__main__":
    main()
