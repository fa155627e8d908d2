"""Linear layers at tensor parallelism: the shape law (simspec.costs.shapes)
fitted on a device's small Vidur shapes, judged on its big ones.

Prints, per device (H100: fitted on Llama-2-7B and CodeLlama-34B, judged on
Llama-2-70B and Qwen-72B; A100: fitted on Llama-2-7B, judged on
Llama-3-70B), operator group (attention projections, MLP projections),
held-out model and tensor-parallel degree (1, 2, 4, 8), the median relative
error of the law and of the datasheet roofline's GEMM (simspec.costs.roofline:
weights over 80% of the HBM bandwidth, smoothly maxed with FLOPs at 55% of
the dense bf16 peak) on the same points, and their ratio.

    python benchmarks/tp_linear_shapes.py [--profiles DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

from simspec.costs import profiles, shapes
from simspec.costs.base import blend
from simspec.costs.roofline import BANDWIDTH_EFFICIENCY, GEMM_EFFICIENCY
from simspec.costs.catalog import MODELS
from simspec.costs.gpus import GPUS


def roofline_errors(device: str, points: shapes.Points) -> np.ndarray:
    """The datasheet prior's GEMM (no launch term) against the measured medians."""
    gpu = GPUS[device]
    memory = 2.0 * points.k * points.n / (gpu.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY)
    compute = 2.0 * points.tokens * points.k * points.n / (gpu.bf16_flops * GEMM_EFFICIENCY)
    return np.abs(blend(memory, compute) / points.seconds - 1.0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--profiles", type=Path, default=None, help="profiles folder (default: the repository's)")
    root = parser.parse_args().profiles or profiles.default_root()
    checks = shapes.held_out_check(root)
    print(shapes.table(checks))
    print("\nagainst the datasheet roofline's GEMM on the same points")
    print(f"{'device':<10} {'group':<10} {'model':<14} {'tp':>2} {'law':>6} {'roofline':>8} {'roofline/law':>12}")
    for check in checks:
        for name in shapes.HELD_OUT[check.device][1]:
            points = shapes.read_points(root / check.device / name, MODELS[name], check.group)
            law, prior = shapes.relative_errors(check.law, points), roofline_errors(check.device, points)
            for tp in shapes.DEGREES:
                mine = points.tp == tp
                a, b = float(np.median(law[mine])), float(np.median(prior[mine]))
                print(f"{check.device:<10} {check.group:<10} {name:<14} {tp:>2} {a:>6.1%} {b:>8.1%} {b / a:>12.1f}")


if __name__ == "__main__":
    main()
