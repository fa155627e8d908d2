"""Mean and p95 end-to-end latency per policy across load levels.

Finds the AR saturation rate of the default scenario (LLaVA-1.5-7B, H100
roofline prior, Gamma CV 2 arrivals, half the requests with one image),
then simulates every default policy at 1%..95% of it and prints a table of
mean / p95 e2el (ms) and acceptance length, with the marginal policy's
latency relative to AR. Targets: ``marginal`` is never worse than
``ar`` in mean e2el, and at the lowest load its acceptance length is at
least that of ``tree``.

    python benchmarks/load_sweep.py [--requests N] [--seed S] [--cost-model auto|roofline] [--al-seeds K]

With ``--al-seeds K`` it also compares tree and marginal acceptance length
at the lowest load over K seeds (2,000 requests each): the mean difference
and its standard error.
"""

from __future__ import annotations

import argparse

import numpy as np

from simspec import config as configuration, experiment

LOADS = (0.01, 0.1, 0.3, 0.5, 0.75, 0.95)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cost-model", default="auto")
    parser.add_argument("--al-seeds", type=int, default=0)
    args = parser.parse_args()
    base = configuration.build(flag_values={"seed": args.seed, "cost_model": args.cost_model})
    saturation = experiment.saturation_rate(base)
    print(f"AR saturation rate: {saturation:.2f} req/s ({experiment.cost_model_line(experiment.resolve(base), width=None)})")
    policies = base.policies
    print(f"{'load':>5s} {'req/s':>6s}  " + "  ".join(f"{p:>22s}" for p in policies) + "  marginal/ar")
    print(f"{'':>13s}" + "  ".join(f"{'mean / p95 ms (AL)':>22s}" for _ in policies))
    for load in LOADS:
        cfg = configuration.build(flag_values={"seed": args.seed, "cost_model": args.cost_model, "workload": {
            "rate_per_s": load * saturation, "num_requests": args.requests}})
        m = experiment.run(cfg).metrics
        cells = [f"{m[p]['mean_e2el_ms']:7.0f} /{m[p]['p95_e2el_ms']:7.0f} ({m[p]['spec_decode_acceptance_length']:.2f})"
                 for p in policies]
        ratio = m["marginal"]["mean_e2el_ms"] / m["ar"]["mean_e2el_ms"]
        print(f"{load:5.0%} {load * saturation:6.2f}  " + "  ".join(f"{c:>22s}" for c in cells) + f"  {ratio:10.2f}")
    if args.al_seeds:
        diffs = []
        for seed in range(args.al_seeds):
            cfg = configuration.build(flag_values={"seed": seed, "cost_model": args.cost_model, "policies": [
                "tree", "marginal"], "workload": {"rate_per_s": LOADS[0] * saturation, "num_requests": 2000}})
            m = experiment.run(cfg).metrics
            diffs.append(m["marginal"]["spec_decode_acceptance_length"] - m["tree"]["spec_decode_acceptance_length"])
        diffs = np.array(diffs)
        print(f"acceptance length at {LOADS[0]:.0%} load, marginal - tree over {len(diffs)} seeds: "
              f"{diffs.mean():+.3f} +- {diffs.std(ddof=1) / np.sqrt(len(diffs)):.3f} (standard error)")


if __name__ == "__main__":
    main()
