"""GPU datasheets: what the roofline prior, the collectives and the memory
check read of a device.

Imports: the standard library and simspec.types.
"""

from __future__ import annotations

from dataclasses import dataclass

from simspec.types import InputError

_GB = 1e9


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Datasheet numbers of one accelerator (dense, no sparsity)."""

    name: str
    slug: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    # Streaming multiprocessors (CUDA cores / cores per SM on the datasheet): the attention kernels' blocks
    # per sequence and head spread over them (simspec.costs.roofline); 0 for a device known only from its profiles.
    sms: int = 0
    # One GPU's link to the others, each direction, bytes/s: what a tensor-parallel all-reduce's bandwidth
    # term divides by (simspec.costs.collectives); 0 when unknown.
    link_bytes_per_s: float = 0.0
    # Dense FP8 tensor throughput, FLOP/s (0: none, or unknown): what a model with one-byte weights computes
    # its GEMMs at (simspec.costs.roofline).
    fp8_flops: float = 0.0



# SMs: H100 SXM5 and H200 132 (16,896 CUDA cores), A100 108 (6,912), L40S 142 (18,176), A40 84 (10,752);
# NVIDIA's H100 and A100 architecture whitepapers and the L40S and A40 datasheets. Links: NVLink 900 GB/s
# per GPU on H100 SXM and H200 (the H100 and H200 datasheets; 450 GB/s each way), 600 GB/s on A100 SXM
# (the A100 datasheet; 300 each way); L40S and A40 talk over PCIe Gen4 x16, 64 GB/s bidirectional on their
# datasheets (32 each way; A40's NVLink bridge joins pairs only). Dense FP8 tensor throughput: H100 SXM and
# H200 1,979 TFLOPS (3,958 with sparsity on their datasheets), L40S 733 (1,466 with sparsity); A100 and A40
# have none. B200 (HGX B200, 1,000 W): 1.44 TB HBM3e for 8 GPUs (180 GB each; nvidia-smi shows 179 GB,
# docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview), 8 TB/s, dense BF16 2.25 and
# FP8 4.5 PFLOPS (4.5 and 9 with sparsity; NVIDIA's HGX B200 figures as tabulated at
# glennklockwood.com/garden/processors/B200), NVLink 5 at 1.8 TB/s per GPU (900 GB/s each way), 148 SMs
# (74 enabled on each of its two dies: Chips and Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling").
GPUS: dict[str, GpuSpec] = {
    spec.slug: spec
    for spec in (
        GpuSpec(name="NVIDIA H100 80GB HBM3 (SXM)", slug="h100-sxm", memory_bytes=80 * _GB,
                hbm_bytes_per_s=3.35e12, bf16_flops=989e12, sms=132, link_bytes_per_s=450e9, fp8_flops=1979e12),
        GpuSpec(name="NVIDIA H200 141GB HBM3e", slug="h200", memory_bytes=141 * _GB,
                hbm_bytes_per_s=4.8e12, bf16_flops=989e12, sms=132, link_bytes_per_s=450e9, fp8_flops=1979e12),
        GpuSpec(name="NVIDIA A100 80GB (SXM)", slug="a100-80gb", memory_bytes=80 * _GB,
                hbm_bytes_per_s=2.039e12, bf16_flops=312e12, sms=108, link_bytes_per_s=300e9),
        GpuSpec(name="NVIDIA L40S 48GB", slug="l40s", memory_bytes=48 * _GB,
                hbm_bytes_per_s=0.864e12, bf16_flops=362e12, sms=142, link_bytes_per_s=32e9, fp8_flops=733e12),
        # NVIDIA A40 product brief (PB-09976-001_v04, January 2021) and datasheet: 48 GB GDDR6 with ECC,
        # 696 GB/s; BF16 / FP16 tensor 149.7 TFLOPS dense (299.4 with sparsity), as tabulated at
        # https://hmc-tech.com/gpu/nvidia-a100-vs-nvidia-a40 (84 SMs, 6 MB L2). Vidur's A40 profiles.
        GpuSpec(name="NVIDIA A40", slug="a40", memory_bytes=48 * _GB,
                hbm_bytes_per_s=0.696e12, bf16_flops=149.7e12, sms=84, link_bytes_per_s=32e9),
        GpuSpec(name="NVIDIA B200 180GB HBM3e (HGX)", slug="b200", memory_bytes=180 * _GB,
                hbm_bytes_per_s=8.0e12, bf16_flops=2250e12, sms=148, link_bytes_per_s=900e9, fp8_flops=4500e12),
    )
}



def _lookup(table: dict, key: str, field: str):
    folded = {k.lower(): v for k, v in table.items()}
    if key.lower() not in folded:
        raise InputError(f"{field} must be one of {', '.join(table)} (got {key!r})")
    return folded[key.lower()]


def gpu_spec(slug: str) -> GpuSpec:
    return _lookup(GPUS, slug, "device")
