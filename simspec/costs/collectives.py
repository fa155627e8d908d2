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

**As each engine runs it** (:func:`for_engine`; the ``simspec`` mode keeps
the one path above). vLLM and SGLang reduce a message under a size limit
with their own one-shot / two-shot kernel over NVLink peer-to-peer
buffers, and pass larger ones to NCCL:

- vLLM (``vllm/distributed/device_communicators/custom_all_reduce.py``,
  read in the vllm 0.32.0 wheel): world sizes 2, 4, 6, 8 (and 16);
  ``max_size`` 8 MiB (``8192 * 1024``), capped on Hopper when torch
  symmetric memory is on (``VLLM_ALLREDUCE_USE_SYMM_MEM``, on by default)
  by ``CUSTOM_ALL_REDUCE_MAX_SIZES["9.0"]`` (``all_reduce_utils.py``: 64,
  32 MiB, 512 and 256 KiB at 2, 4, 6, 8 GPUs, so min(8 MiB, those));
  more than two GPUs must be fully NVLink-connected (PCIe GPUs use it at
  2 only); a message must be under the limit (``inp_size < max_size``).
  Under a CUDA graph its buffers are registered at capture; eagerly the
  input is first copied into a registered buffer (the source calls that
  copy small; not priced here). Small-message latency: ``VLLM_CUSTOM_S``.
- SGLang (``sglang/srt/distributed/device_communicators/custom_all_reduce.py``,
  adapted from vLLM's): world sizes 2, 4, 6, 8, ``_MAX_CAR_SIZE`` 8 MiB,
  the same NVLink and size tests. Small-message latency: ``SGLANG_CUSTOM_S``.

The custom kernel costs its latency plus the ring traffic over the link
(the prior's bandwidth term); NCCL above the limit costs the measured
table where one exists, else the prior with NCCL's own small-message
latency ``NCCL_ALPHA_S``. vLLM 0.32 also tries FlashInfer's all-reduce
first where flashinfer is installed and torch symmetric memory above the
custom limit on Hopper; neither is priced apart (the custom and NCCL
terms stand for them).
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simspec.costs.gpus import GPUS, GpuSpec
from simspec.types import InputError, require

PRIOR_ALPHA_S = 10e-6
PRIOR_ETA = 0.75
MIB = 1 << 20
# Small-message latency of each engine's custom all-reduce on H100 with
# 2, 4 and 8 GPUs, from github.com/sgl-project/sglang/pull/2904's table
# (without CUDA graphs): vLLM's kernel 9-10 us, SGLang's 4-6 us.
VLLM_CUSTOM_S = 10e-6
SGLANG_CUSTOM_S = 5e-6
# NCCL's small-message latency where no table is measured: Vidur's H100
# NCCL all-reduce of 2 KiB takes 37-38 us at 4 and 8 GPUs
# (profiles/h100-sxm/collectives/all_reduce.csv, the first rows).
NCCL_ALPHA_S = 37e-6
CUSTOM_WORLD_SIZES = {"vllm": (2, 4, 6, 8, 16), "sglang": (2, 4, 6, 8)}
CUSTOM_MAX_BYTES = 8 * MIB  # vLLM's max_size and SGLang's _MAX_CAR_SIZE
# vLLM's cap on Hopper (compute capability 9.0) with symmetric memory on.
VLLM_HOPPER_MAX_BYTES = {2: 64 * MIB, 4: 32 * MIB, 6: MIB // 2, 8: MIB // 4}
HOPPER = ("h100-sxm", "h200")
NVLINK_BYTES_PER_S = 100e9  # a link faster than this is NVLink (PCIe 5 x16: 32 GB/s a way)
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
    # An engine's custom all-reduce: messages under custom_limit_bytes cost
    # custom_s plus the ring traffic (0: none, every message as above).
    custom_limit_bytes: float = 0.0
    custom_s: float = 0.0
    source: str = ""  # the measured table (<device>/collectives/all_reduce.csv); "": the prior

    def _ring_s(self, nbytes: np.ndarray) -> np.ndarray:
        """The ring's traffic, 2 (N - 1) / N x bytes, over the bandwidth."""
        return 2.0 * (self.workers - 1) / self.workers * nbytes / self.bandwidth

    def seconds(self, nbytes: np.ndarray) -> np.ndarray:
        """Seconds of an all-reduce of each of ``nbytes``: the custom
        kernel under its limit, else NCCL (the table or the prior)."""
        nbytes = np.asarray(nbytes, dtype=float)
        general = self._general(nbytes)
        if self.custom_limit_bytes <= 0:
            return general
        custom = self.custom_s + self._ring_s(nbytes)
        return np.where((nbytes > 0) & (nbytes < self.custom_limit_bytes), custom, general)

    def _general(self, nbytes: np.ndarray) -> np.ndarray:
        """NCCL's seconds: the measured table interpolated, else the prior."""
        prior = self.alpha_s + self._ring_s(nbytes)
        if not self.sizes:
            return np.where(nbytes > 0, prior, 0.0)
        sizes, times = np.log(self.sizes), np.log(self.seconds_at)
        clipped = np.clip(nbytes, self.sizes[0], self.sizes[-1])
        measured = np.exp(np.interp(np.log(np.maximum(clipped, 1.0)), sizes, times))
        beyond = self._ring_s(np.maximum(nbytes - self.sizes[-1], 0.0))
        return np.where(nbytes > 0, measured + beyond, 0.0)


def prior(gpu: GpuSpec, workers: int) -> AllReduce:
    linked = ", ".join(slug for slug, spec in GPUS.items() if spec.link_bytes_per_s)
    require(gpu.link_bytes_per_s > 0, f"device {gpu.slug}: no link bandwidth for a tensor-parallel prior "
                                      f"(datasheet GPUs: {linked})")
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


def all_reduce(gpu: GpuSpec, workers: int, profiles_root: Path, engine: str = "simspec") -> AllReduce:
    """The device's measured all-reduce at ``workers`` GPUs where its
    profiles hold it, else the prior; as engine mode ``engine`` runs it
    (:func:`for_engine`)."""
    return for_engine(_measured_or_prior(gpu, workers, profiles_root), engine, gpu)


def _measured_or_prior(gpu: GpuSpec, workers: int, profiles_root: Path) -> AllReduce:
    base = prior(gpu, workers)
    path = profiles_root / gpu.slug / ALL_REDUCE_FILE
    if not path.is_file():
        return base
    points = read_table(path).get(workers)
    if not points:
        return base
    source = f"{path.parent.parent.name}/{ALL_REDUCE_FILE}"
    return AllReduce(workers=workers, label=f"all-reduce measured ({source})", alpha_s=base.alpha_s,
                     bandwidth=base.bandwidth, sizes=tuple(p[0] for p in points),
                     seconds_at=tuple(p[1] for p in points), source=source)


def custom_limit(engine: str, gpu: GpuSpec, workers: int) -> float:
    """Bytes under which engine ``engine`` reduces with its custom kernel
    at ``workers`` GPUs of ``gpu`` (0: never; module docstring)."""
    if workers not in CUSTOM_WORLD_SIZES.get(engine, ()):
        return 0.0
    if workers > 2 and gpu.link_bytes_per_s < NVLINK_BYTES_PER_S:  # not fully NVLink-connected
        return 0.0
    if engine == "vllm" and gpu.slug in HOPPER:
        return float(min(CUSTOM_MAX_BYTES, VLLM_HOPPER_MAX_BYTES.get(workers, CUSTOM_MAX_BYTES)))
    return float(CUSTOM_MAX_BYTES)


def for_engine(base: AllReduce, engine: str, gpu: GpuSpec) -> AllReduce:
    """``base`` (:func:`all_reduce`) as engine mode ``engine`` runs it: the
    simspec mode unchanged; vLLM and SGLang with their custom kernel under
    its limit and NCCL above (``NCCL_ALPHA_S`` where nothing is measured)."""
    if engine not in CUSTOM_WORLD_SIZES:
        return base
    limit = custom_limit(engine, gpu, base.workers)
    custom_s = VLLM_CUSTOM_S if engine == "vllm" else SGLANG_CUSTOM_S
    if base.sizes:
        nccl = f"NCCL measured ({base.source})"
    else:
        nccl = f"NCCL prior ({NCCL_ALPHA_S * 1e6:.0f} us + ring traffic)"
    if limit > 0:
        label = (f"{engine} custom all-reduce < {_size(limit)} ({custom_s * 1e6:.0f} us + ring traffic), "
                 f"{nccl} above")
    else:
        label = f"{engine}: {nccl} (no custom all-reduce at {base.workers} GPUs of {gpu.slug})"
    alpha = base.alpha_s if base.sizes else NCCL_ALPHA_S
    return AllReduce(workers=base.workers, label=label, alpha_s=alpha, bandwidth=base.bandwidth, sizes=base.sizes,
                     seconds_at=base.seconds_at, custom_limit_bytes=limit, custom_s=custom_s, source=base.source)


def _size(nbytes: float) -> str:
    return f"{nbytes / MIB:g} MiB" if nbytes >= MIB else f"{nbytes / 1024:g} KiB"


__all__ = ["AllReduce", "prior", "for_engine", "custom_limit", "all_reduce", "read_table", "VLLM_CUSTOM_S",
           "SGLANG_CUSTOM_S", "NCCL_ALPHA_S", "PRIOR_ALPHA_S", "PRIOR_ETA", "ALL_REDUCE_FILE", "HEADER"]
