"""Roofline prior: step costs from datasheet bandwidth and FLOPs.

Imports: numpy, simspec.costs. Serves where a device has no profile and is
labelled uncalibrated wherever it is shown. Each operator costs the smooth
maximum of its memory time (bytes / achievable bandwidth) and its compute
time (FLOPs / achievable throughput): flat while weights dominate, then a
slope once the batch makes it compute-bound. That knee is what the marginal
policy exploits (DESIGN.md "Cost model").
"""

from __future__ import annotations

from simspec.costs.base import TOKENS, CostModel, blend, frozen_table, uniform_attention
from simspec.costs.specs import GpuSpec, ModelSpec

BANDWIDTH_EFFICIENCY = 0.80  # achievable share of HBM bandwidth for streaming weights / KV
GEMM_EFFICIENCY = 0.55  # achievable share of dense bf16 FLOPs for large GEMMs
ATTENTION_EFFICIENCY = 0.35  # attention kernels reach less of peak than GEMMs
STEP_OVERHEAD_S = 0.8e-3  # scheduler, sampling and launch overhead of one engine step
KERNEL_LAUNCH_S = 0.02e-3  # a small kernel's floor (drafter level, selection)
SELECT_LAYERS = 4  # verifier layers that vote in visual-token selection


def roofline(model: ModelSpec, gpu: GpuSpec) -> CostModel:
    """The datasheet prior for ``model`` on ``gpu`` (uncalibrated)."""
    bw = gpu.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY
    flops = gpu.bf16_flops * GEMM_EFFICIENCY

    def gemm(params: float, tokens=TOKENS):
        return blend(params * model.dtype_bytes / bw, 2.0 * params * tokens / flops)

    head = gemm(model.lm_head_params)
    vision = 0.0 * TOKENS
    if model.multimodal:
        vision = gemm(model.vision_params, TOKENS * model.vision_patches_per_image / model.visual_tokens_per_image)
    return CostModel(
        label=f"roofline prior: {gpu.name} / {model.name}", calibrated=False, overhead_s=STEP_OVERHEAD_S,
        layers_s=frozen_table(model.layers * gemm(model.layer_params)), head_s=frozen_table(head),
        attention=uniform_attention(kv_s=model.kv_bytes_per_token / bw,
                                    pair_s=4.0 * model.layers * model.hidden / (gpu.bf16_flops * ATTENTION_EFFICIENCY)),
        vision_s_table=frozen_table(vision),
        # An EAGLE drafter step: fc + one decoder layer, then the shared LM head.
        draft_s_table=frozen_table(KERNEL_LAUNCH_S + gemm(model.drafter_params) + head),
        draft_s_per_kept=2 * model.hidden * model.dtype_bytes / bw,
        # Selection is memory-bound: each int8 key is read once per voting layer.
        select_launch_s=KERNEL_LAUNCH_S, select_s_per_key=SELECT_LAYERS * model.hidden / bw)
