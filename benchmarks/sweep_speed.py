"""How fast ``simspec sweep`` runs a grid on this machine's process pool.

A grid of N scenarios (default 200 = 10 loads x 4 devices x 5 multimodal
shares; a smaller N takes as many devices and shares as divide it, keeping
at least two loads) of 2,000-request
simulations, one seed, each scenario serving the policies printed (default
``DEFAULT_POLICIES``: the AR baseline, the usual fixed draft and the
load-adaptive rule; simulate's six, with ``tree`` alone about half the cost,
take about three times as long), plus the AR saturation runs the load axis
needs. The pool start and the saturation runs are fixed costs, so a small
N extrapolates pessimistically.
Prints the total wall time, scenarios per minute and what that rate means
for 200 scenarios. Target: 200 scenarios in under 10 minutes on
the 2-core development machine. With ``--ray-check`` the same grid runs
again on a local Ray and the two tables are compared row by row.

    python benchmarks/sweep_speed.py [--scenarios N] [--policy P ...] [--workers N] [--ray-check]
"""

from __future__ import annotations

import argparse
import resource
import tempfile
import time
from pathlib import Path

from simspec import costs, sweep

TARGET_SCENARIOS, TARGET_S = 200, 600.0
DEFAULT_POLICIES = ("ar", "linear:k=3", "marginal")


def shape(n: int) -> tuple[int, int, int]:
    """(loads, devices, multimodal shares) with product n: as many devices
    and shares as divide n while leaving at least two loads."""
    devices = next(d for d in (4, 3, 2, 1) if n % d == 0 and n // d >= min(2, n))
    shares = next(s for s in (5, 4, 3, 2, 1) if (n // devices) % s == 0 and n // devices // s >= min(2, n // devices))
    return n // devices // shares, devices, shares


def grid(n: int, num_requests: int, policies: list[str]) -> sweep.SweepConfig:
    loads, devices, shares = shape(n)
    axes = {"load": [round(0.2 + 0.75 * i / max(loads - 1, 1), 4) for i in range(loads)],
            "device": list(costs.GPUS)[:devices],
            "multimodal_share": [round(i / max(shares - 1, 1), 4) if shares > 1 else 0.5 for i in range(shares)],
            "policies": policies}
    return sweep.from_values({"workload": {"num_requests": num_requests}}, axis_flags=axes)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scenarios", type=int, default=TARGET_SCENARIOS)
    parser.add_argument("--num-requests", type=int, default=2000)
    parser.add_argument("--policy", action="append", help=f"default: {' '.join(DEFAULT_POLICIES)}")
    parser.add_argument("--workers", type=int, help="default: every core")
    parser.add_argument("--ray-check", action="store_true", help="run again on a local Ray and compare rows")
    args = parser.parse_args()
    policies = args.policy or list(DEFAULT_POLICIES)
    spec = grid(args.scenarios, args.num_requests, policies)
    for line in sweep.describe(spec):
        print(line)
    runner = sweep.Runner(workers=args.workers)
    print(f"each scenario serves: {', '.join(spec.base.policies)}; {runner.processes} local processes")
    with tempfile.TemporaryDirectory() as tmp:
        started, cpu = time.perf_counter(), _cpu_s()
        sweep.run(spec, Path(tmp) / "pool.parquet", runner)
        wall_s, cpu_s = time.perf_counter() - started, _cpu_s() - cpu
        per_min = args.scenarios / wall_s * 60
        target_s = TARGET_SCENARIOS / per_min * 60
        print(f"process pool: {args.scenarios} scenarios in {wall_s:.1f} s = {per_min:.1f} scenarios/min; "
              f"{TARGET_SCENARIOS} scenarios would take {target_s / 60:.1f} min "
              f"(target < {TARGET_S / 60:.0f} min: {'met' if target_s < TARGET_S else 'MISSED'})")
        # CPU time does not grow when other work shares the cores: what the same sweep needs on idle ones.
        idle_s = cpu_s / args.scenarios * TARGET_SCENARIOS / runner.processes
        print(f"CPU time: {cpu_s:.1f} s ({cpu_s / args.scenarios:.2f} s a scenario, pool start and saturation "
              f"included); {TARGET_SCENARIOS} scenarios on {runner.processes} idle cores: about "
              f"{idle_s / 60:.1f} min")
        if args.ray_check:
            started = time.perf_counter()
            sweep.run(spec, Path(tmp) / "ray.parquet", sweep.Runner(workers=args.workers, ray="local"))
            ray_s = time.perf_counter() - started
            same = sweep.same_rows(Path(tmp) / "pool.parquet", Path(tmp) / "ray.parquet")
            print(f"ray local: {ray_s:.1f} s (Ray start included); rows identical to the pool's: {same}")


def _cpu_s() -> float:
    """CPU seconds of this process and its finished children (the pool's workers)."""
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


if __name__ == "__main__":
    main()
