"""What a tensor-parallel all-reduce costs: measured where a device's
profiles hold all-reduce timings, else a prior.

Imports: numpy, the standard library, simspec.costs.specs, simspec.types.
DESIGN.md "Cost models".

A decoder layer sharded over N GPUs ends its attention and its MLP with an
all-reduce of the step's tokens x hidden activations, so a step pays 2 x
layers of them (and the vision tower 2 a layer of its own; the LM head's
logits are gathered, priced as an all-reduce of half their bytes, which
moves as many).

**The prior**: ``t = alpha + 2 (N - 1) / N x bytes / (eta x B)``, the ring
all-reduce's traffic over one GPU's link bandwidth ``B`` each way
(GpuSpec.link_bytes_per_s: 450 GB/s on H100 SXM, 300 on A100 SXM), with

- ``alpha`` = 10 us, a small message's latency through vLLM's custom
  all-reduce on H100 (9-10 us at 2, 4 and 8 GPUs without CUDA graphs,
  github.com/sgl-project/sglang/pull/2904's table; SGLang's own kernel
  there takes 4-6 us, NCCL's ring far more: Vidur's H100 measurement shows
  37 us at 4 and 8 GPUs);
- ``eta`` = 0.75 of the link reached, an assumption (no source states it),
  checked against Vidur's measured NCCL all-reduce by
  ``python benchmarks/all_reduce.py``.

**Measured**: ``profiles/<device>/collectives/all_reduce.csv`` (``simspec
profile-gpu --import-vidur`` writes it from Vidur's
``vidur_<gpu>_dgx_all_reduce.csv``): per GPU count, the median time of each
message size, interpolated in log-log between sizes and extended by the
prior's slope beyond them.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simspec.costs.specs import GpuSpec
from simspec.types import InputError, require

PRIOR_ALPHA_S = 10e-6
PRIOR_ETA = 0.75
ALL_REDUCE_FILE = Path("collectives") / "all_reduce.csv"
HEADER = ("workers", "bytes", "median_ms")


@dataclass(frozen=True, slots=True)
class AllReduce:
    """Seconds of one all-reduce over ``workers`` GPUs, by message bytes."""

    workers: int
    label: str  # where the figures come from, for the calibration line
    alpha_s: float
    bandwidth: float  # bytes/s the bandwidth term divides by (eta x B)
    sizes: tuple[float, ...] = ()  # measured message bytes, ascending (empty: the prior alone)
    seconds_at: tuple[float, ...] = ()

    def seconds(self, nbytes: np.ndarray) -> np.ndarray:
        nbytes = np.asarray(nbytes, dtype=float)
        traffic = 2.0 * (self.workers - 1) / self.workers * nbytes
        prior = self.alpha_s + traffic / self.bandwidth
        if not self.sizes:
            return np.where(nbytes > 0, prior, 0.0)
        sizes, times = np.log(self.sizes), np.log(self.seconds_at)
        clipped = np.clip(nbytes, self.sizes[0], self.sizes[-1])
        measured = np.exp(np.interp(np.log(np.maximum(clipped, 1.0)), sizes, times))
        beyond = np.maximum(nbytes - self.sizes[-1], 0.0) * 2.0 * (self.workers - 1) / self.workers / self.bandwidth
        return np.where(nbytes > 0, measured + beyond, 0.0)


def prior(gpu: GpuSpec, workers: int) -> AllReduce:
    require(gpu.link_bytes_per_s > 0, f"device {gpu.slug}: no link bandwidth for a tensor-parallel prior "
                                      f"(datasheet GPUs: h100-sxm, h200, a100-80gb, l40s, a40)")
    return AllReduce(workers=workers, label=f"all-reduce prior ({PRIOR_ALPHA_S * 1e6:.0f} us + ring traffic at "
                                            f"{PRIOR_ETA:.0%} of {gpu.link_bytes_per_s / 1e9:.0f} GB/s)",
                     alpha_s=PRIOR_ALPHA_S, bandwidth=PRIOR_ETA * gpu.link_bytes_per_s)


def read_table(path: Path) -> dict[int, list[tuple[float, float]]]:
    """workers -> [(bytes, seconds)] of an ``all_reduce.csv``, sizes ascending."""
    out: dict[int, list[tuple[float, float]]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        require(tuple(reader.fieldnames or ()) == HEADER, f"{path}: header must be {','.join(HEADER)}")
        for line, row in enumerate(reader, start=2):
            try:
                workers, nbytes, ms = int(row["workers"]), float(row["bytes"]), float(row["median_ms"])
            except (TypeError, ValueError):
                raise InputError(f"{path} line {line}: workers, bytes and median_ms must be numbers") from None
            require(workers >= 2 and nbytes > 0 and ms > 0, f"{path} line {line}: workers >= 2, bytes > 0 and "
                                                             f"median_ms > 0 (got {workers}, {nbytes}, {ms})")
            out.setdefault(workers, []).append((nbytes, ms * 1e-3))
    return {n: sorted(points) for n, points in out.items()}


def all_reduce(gpu: GpuSpec, workers: int, profiles_root: Path) -> AllReduce:
    """The device's measured all-reduce at ``workers`` GPUs where its
    profiles hold it, else the prior."""
    base = prior(gpu, workers)
    path = profiles_root / gpu.slug / ALL_REDUCE_FILE
    if not path.is_file():
        return base
    points = read_table(path).get(workers)
    if not points:
        return base
    return AllReduce(workers=workers, label=f"all-reduce measured ({path.parent.parent.name}/{ALL_REDUCE_FILE})",
                     alpha_s=base.alpha_s, bandwidth=base.bandwidth, sizes=tuple(p[0] for p in points),
                     seconds_at=tuple(p[1] for p in points))


__all__ = ["AllReduce", "prior", "all_reduce", "read_table", "PRIOR_ALPHA_S", "PRIOR_ETA", "ALL_REDUCE_FILE",
           "HEADER"]
