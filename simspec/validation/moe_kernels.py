"""Fused MoE kernel times engines published against the roofline prior's
price of the same call: the rows of ``validation/published/moe_kernels.csv``
(``benchmarks/moe_kernels.py`` prints them; ``tests/test_moe_kernels.py``
holds them to the prior).

Each row is one call of an engine's fused MoE (vLLM's
``benchmarks/kernels/benchmark_moe.py``, SGLang's
``tuning_fused_moe_triton.py``: routing, alignment, the two grouped GEMMs,
activation and weighted sum, timed as CUDA-graph replays) over ``tokens``
tokens, for one GPU's shard of a model's experts. The prior prices it as
the touched experts' weights streamed or their FLOPs
(simspec.costs.roofline.expert_call) plus the call's floor and the MLP
kernels' nodes the floor leaves to the layer (FixedCosts.moe_call_s,
moe_call_nodes).

Imports: csv (stdlib), simspec.costs.
"""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path

from simspec.costs import gpu_spec
from simspec.costs.roofline import FIXED, FixedCosts, expert_call, gemm_flops, weight_bandwidth
from simspec.costs.specs import ModelSpec

TABLE = Path(__file__).resolve().parents[2] / "validation" / "published" / "moe_kernels.csv"


@dataclass(frozen=True)
class Check:
    """One published kernel time and the prior's (microseconds)."""

    id: str
    gpu: str
    model: str
    experts: int
    tokens: int
    measured_us: float
    predicted_us: float

    @property
    def error(self) -> float:
        return self.predicted_us / self.measured_us - 1


def experts_of(row: dict) -> ModelSpec:
    """The row's experts as a one-layer spec (only the expert fields price the call)."""
    hidden, width, tp = int(row["hidden"]), int(row["expert_mlp_hidden"]), int(row["tp"])
    heads = hidden // 128
    return ModelSpec(name=row["model"], layers=1, hidden=hidden, heads=heads, kv_heads=heads, mlp_hidden=width,
                     vocab=1, max_context_tokens=2, visual_tokens_per_image=0, experts=int(row["experts"]),
                     experts_per_token=int(row["experts_per_token"]), expert_mlp_hidden=width,
                     weight_dtype_bytes=int(row["weight_bytes"]), tensor_parallel=tp)


def predicted_us(row: dict, fixed: FixedCosts = FIXED) -> float:
    """The prior's price of the row's fused call, in microseconds."""
    model, gpu = experts_of(row), gpu_spec(row["gpu"])
    flops = gemm_flops(gpu, model.weight_bytes_per_param)
    call = expert_call(model, weight_bandwidth(gpu), flops, float(row["tokens"]), fixed.moe_call_s)
    return 1e6 * (float(call) + fixed.moe_call_nodes * fixed.graph_node_s)


def checks(path: Path = TABLE, fixed: FixedCosts = FIXED) -> list[Check]:
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    return [Check(r["id"], r["gpu"], r["model"], int(r["experts"]), int(r["tokens"]), float(r["kernel_us"]),
                  predicted_us(r, fixed)) for r in rows]
