"""The tensor-parallel all-reduce: the prior and the imported measurement
against Vidur's measured NCCL all-reduce.

For each device (H100, A100 DGX) and GPU count (2, 4, 8), prints the median
and 90th-percentile relative error of

- the prior (simspec.costs.collectives: 10 us + ring traffic at 75% of the
  datasheet link), over every measured size;
- the imported table (profiles/<device>/collectives/all_reduce.csv) built
  from every other measured size, on the sizes left out (its
  interpolation, held out);

over message sizes in a decode step's range (``--max-mb``, default 64 MB:
8192 tokens x 8192 hidden x 2 bytes is 128 MB, a 70B model's decode
batches stay below 1 MB).

    python benchmarks/all_reduce.py [--max-mb 64]
"""

from __future__ import annotations

import argparse

import numpy as np

from _shared import shared_file
from simspec import costs
from simspec.costs import collectives
from simspec.profiling.vidur import read_all_reduce


def errors(predicted: np.ndarray, measured: np.ndarray) -> tuple[float, float]:
    rel = np.abs(predicted / measured - 1.0)
    return float(np.median(rel)), float(np.percentile(rel, 90))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-mb", type=float, default=64.0)
    args = parser.parse_args()
    print(f"{'device':10} {'GPUs':>4} {'sizes':>5} {'prior median':>12} {'prior p90':>9} "
          f"{'table median':>12} {'table p90':>9}  (relative error; table: interpolated, every other size held out)")
    for gpu_token in ("h100", "a100"):
        slug, rows = read_all_reduce(shared_file("external_profiles", f"vidur_{gpu_token}_dgx_all_reduce.csv"))
        gpu = costs.gpu_spec(slug)
        for workers in sorted({w for w, _, _ in rows}):
            points = [(b, ms * 1e-3) for w, b, ms in rows if w == workers and b <= args.max_mb * 1e6]
            sizes, seconds = np.array([p[0] for p in points], float), np.array([p[1] for p in points])
            prior = collectives.prior(gpu, workers)
            fit = collectives.AllReduce(workers=workers, label="held out", alpha_s=prior.alpha_s,
                                        bandwidth=prior.bandwidth, sizes=tuple(sizes[::2]),
                                        seconds_at=tuple(seconds[::2]))
            p_med, p_90 = errors(prior.seconds(sizes), seconds)
            t_med, t_90 = errors(fit.seconds(sizes[1::2]), seconds[1::2])
            print(f"{slug:10} {workers:4d} {len(sizes):5d} {p_med:12.1%} {p_90:9.1%} {t_med:12.1%} {t_90:9.1%}")


if __name__ == "__main__":
    main()
