"""How much faster than real time the simulator replays a real trace.

Replays the whole Azure LLM 2023 conversation trace (19,366 requests, one
hour; shared/data/traces) on the default scenario (LLaVA-1.5-7B, H100
roofline prior, half the requests with one image) with each policy, on one
core, and prints simulated seconds per wall second and simulated requests
per wall second. Targets (issue 21): >= 1,000x real time for marginal, tree
and truncate, >= 3,000x for ar and linear.

    python benchmarks/sim_speed.py [--trace PATH] [--policy NAME ...]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one core, as the target says

from simspec import config as configuration, policies  # noqa: E402
from simspec.experiment import resolve  # noqa: E402
from simspec.sim import simulate  # noqa: E402

from _shared import shared_file  # noqa: E402

TRACE = ("traces", "azure_llm_2023_conv.csv")  # in the shared data


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="the trace to replay (default: the shared data's Azure conversation trace)")
    parser.add_argument("--policy", action="append")
    args = parser.parse_args()
    args.trace = args.trace or str(shared_file(*TRACE))
    cfg = configuration.from_flags({"trace": args.trace})
    scenario = resolve(cfg)
    requests = scenario.requests
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    # Warm the compiled kernels (their first call compiles or loads a cache).
    for spec in args.policy or configuration.DEFAULT_POLICIES:
        simulate(requests[:20], policy=policies.parse(spec), costs=scenario.costs, acceptance=scenario.acceptance,
                 engine=cfg.engine, kv_budget_tokens=scenario.kv_budget_tokens, seed=cfg.seed)
    print(f"trace: {args.trace} ({len(requests)} requests over {span_s:.0f} s)")
    print(f"{'policy':14s} {'simulated s':>12s} {'wall s':>8s} {'x real time':>12s} {'requests/wall s':>16s} "
          f"{'steps/wall s':>13s}")
    for spec in args.policy or configuration.DEFAULT_POLICIES:
        started = time.perf_counter()
        log = simulate(requests, policy=policies.parse(spec), costs=scenario.costs, acceptance=scenario.acceptance,
                       engine=cfg.engine, kv_budget_tokens=scenario.kv_budget_tokens, seed=cfg.seed)
        wall_s = time.perf_counter() - started
        simulated_s = log.end_s - log.start_s
        print(f"{spec:14s} {simulated_s:12.0f} {wall_s:8.2f} {simulated_s / wall_s:12.0f} "
              f"{len(requests) / wall_s:16.0f} {log.steps.steps / wall_s:13.0f}")


if __name__ == "__main__":
    main()
