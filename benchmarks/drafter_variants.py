"""Live acceptance of each drafter variant (visual context) on the shipped models.

Serves the same requests (no arrival gaps: acceptance does not depend on
timing) with ``linear:k=K`` under every visual context the engine can load,
and prints per variant: the acceptance length (accepted + 1 per round), the
top-1 acceptance at image-grounded answer positions (the answer token that
only the image decides) and at the other positions, and each as a share of
the full-visual drafter's.

    python benchmarks/drafter_variants.py [--requests 120] [--k 4]
"""

from __future__ import annotations

import argparse

import numpy as np
import torch

from simspec import policies
from simspec.costs import affine
from simspec.live import LiveConfig, LiveEngine
from simspec.live.run import live_workload, load_models
from simspec.models.drafter_train import VARIANTS
from simspec.models.task import image_grounded_positions
from simspec.workloads import WorkloadConfig


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--requests", type=int, default=120)
    ap.add_argument("--k", type=int, default=4)
    ap.add_argument("--seed", type=int, default=77)
    args = ap.parse_args()
    torch.set_num_threads(1)
    models = load_models()
    requests, examples = live_workload(WorkloadConfig(arrival="poisson", rate_per_s=1000.0,
                                                      num_requests=args.requests, output_mean_tokens=24,
                                                      output_cv=0.3), args.seed)
    grounded = {r.id: set(image_grounded_positions(e)) for r, e in zip(requests, examples)}
    rows = {}
    for variant in VARIANTS:
        engine = LiveEngine(models.target, models.drafter, policies.parse(f"linear:k={args.k}"), affine(1.0, 0.05),
                            LiveConfig(max_num_seqs=16, drafter_context=variant))
        result = engine.serve(requests, examples, realtime=False)
        hits = {True: [], False: []}
        for t in result.traces:
            for d, rank in enumerate(t["ranks"]):
                hits[t["output_index"] + d in grounded[t["request"]]].append(rank == 1)
        rows[variant] = (float(result.log.round_accepted.mean() + 1), float(np.mean(hits[True])),
                         float(np.mean(hits[False])), len(hits[True]))
    full = rows["full"]
    print(f"linear:k={args.k}, {args.requests} requests (seed {args.seed}); shares are of the full-visual drafter's")
    print(f"{'variant':12s} {'acc. length':>11s} {'share':>6s} {'top-1 grounded':>15s} {'share':>6s} "
          f"{'top-1 other':>12s} {'grounded n':>10s}")
    for variant, (length, g, o, n) in rows.items():
        print(f"{variant:12s} {length:11.3f} {length / full[0]:6.3f} {g:15.3f} {g / full[1]:6.3f} {o:12.3f} {n:10d}")


if __name__ == "__main__":
    main()
