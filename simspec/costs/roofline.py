"""Roofline prior: step costs from datasheet bandwidth and FLOPs.

Imports: numpy, simspec.costs. Serves where a device has no profile and is
labelled uncalibrated wherever it is shown. Each operator costs the smooth
maximum of its memory time (bytes / achievable bandwidth) and its compute
time (FLOPs / achievable throughput): flat while weights dominate, then a
slope once the batch makes it compute-bound. That knee is what the marginal
policy exploits (DESIGN.md "Cost model").

Attention (:func:`attention_prior`) is the roofline of the keys it reads
and the query x key pairs it computes, plus the fixed costs a real
attention kernel pays besides them, per layer and per kind of call
(prefill chunks, decode rounds, verification): a floor per call (the
kernel's launch and one thread block's latency: seconds, whatever the
GPU), a cost per sequence (a thread block per sequence and KV head, the
blocks spread over the GPU's SMs) and, in prefill, a cost per query token
(per query token and head, spread over the SMs). They were fitted to
Vidur's A100 Llama-2-7B attention profile (FlashAttention-2,
profiles/a100-80gb/Llama-2-7B) on three quarters of its points and judged
on the rest, on Vidur's A40 profile and on its A100 Llama-3-8B one
(FlashInfer, grouped-query attention): docs/profiling.md.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.costs.base import ATTENTION_KINDS, TOKENS, CostModel, attention_row, attention_table, blend, frozen_table
from simspec.costs.specs import GpuSpec, ModelSpec
from simspec.types import require

BANDWIDTH_EFFICIENCY = 0.80  # achievable share of HBM bandwidth for streaming weights (KV: below)
GEMM_EFFICIENCY = 0.55  # achievable share of dense bf16 FLOPs for large GEMMs
ATTENTION_EFFICIENCY = 0.35  # attention kernels reach less of peak than GEMMs
STEP_OVERHEAD_S = 0.8e-3  # scheduler, sampling and launch overhead of one engine step
KERNEL_LAUNCH_S = 0.02e-3  # a small kernel's floor (drafter level, selection)
SELECT_LAYERS = 4  # verifier layers that vote in visual-token selection

# Attention's memory side: the share of HBM bandwidth a decode kernel streams
# keys and values at once the batch fills the GPU. Fitted (with the decode
# terms below) to Vidur's A100 Llama-2-7B decode attention: at batch 128 and
# 3520 tokens of context it reads 7.4 GB per layer in 3.70 ms, 98% of the
# datasheet's 2.04 TB/s; the A40 profile reaches 94% (9.25 ms for 6.0 GB).
ATTENTION_BANDWIDTH_EFFICIENCY = 0.95


@dataclass(frozen=True, slots=True, kw_only=True)
class AttentionFixed:
    """What one kind of attention call costs per layer besides reading keys
    and computing pairs (module docstring), in seconds."""

    floor_s: float  # per call: launch + one thread block's latency, the same on every GPU
    sequence_block_s: float  # per sequence x KV head: one thread block's work, spread over the SMs
    query_block_s: float  # per query token x query head, spread over the SMs


# Fitted to Vidur's A100 Llama-2-7B attention profile (FlashAttention-2 through
# flash_attn_with_kvcache, paged KV in 16-token blocks; kernel times): the
# decode points held out every fourth size (costs.curves._split) fix the
# floor (9.2 us: a batch of one over 32 cached tokens takes 9 us) and the
# per-sequence block (3.4 us x 32 heads / 108 SMs = 1.0 us a sequence: 86
# sequences of 32 tokens take 128 us, though they read 45 MB, 23 us of
# bandwidth); the prefill points then fix the per-query block (0.54 us x 32
# heads / 108 SMs = 0.16 us a query token), with the same floor and
# per-sequence block (a chunk is one sequence). Decode has one query per
# sequence, so its per-query cost is in the per-sequence one. Verification
# is priced as decode: the kernels that verify drafts (FlashAttention's
# varlen call in vLLM, FlashInfer's prefill kernel with a tree mask in
# SGLang, simspec's tree attention) run one thread block per sequence and
# head over that sequence's cached keys, the several query rows of a draft
# sharing the block's tile, so they pay decode's floor, per-sequence cost
# and key reads, plus the pairs' compute (the roofline's pair term), and no
# per-query cost of their own until a tree outgrows a tile.
ATTENTION_FIXED = {
    "prefill": AttentionFixed(floor_s=9.2e-6, sequence_block_s=3.4e-6, query_block_s=0.54e-6),
    "decode": AttentionFixed(floor_s=9.2e-6, sequence_block_s=3.4e-6, query_block_s=0.0),
    "verify": AttentionFixed(floor_s=9.2e-6, sequence_block_s=3.4e-6, query_block_s=0.0),
}


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
        attention=attention_prior(model, gpu),
        vision_s_table=frozen_table(vision),
        # An EAGLE drafter step: fc + one decoder layer, then the shared LM head.
        draft_s_table=frozen_table(KERNEL_LAUNCH_S + gemm(model.drafter_params) + head),
        draft_s_per_kept=2 * model.hidden * model.dtype_bytes / bw,
        # Selection is memory-bound: each int8 key is read once per voting layer.
        select_launch_s=KERNEL_LAUNCH_S, select_s_per_key=SELECT_LAYERS * model.hidden / bw)


def attention_prior(model: ModelSpec, gpu: GpuSpec, fixed: dict[str, AttentionFixed] = ATTENTION_FIXED,
                    bandwidth_efficiency: float = ATTENTION_BANDWIDTH_EFFICIENCY) -> np.ndarray:
    """[3, 9] attention coefficients (costs.base) of the datasheet prior:
    per kind, the roofline of keys read and pairs computed plus its
    ``fixed`` costs, every layer (other ``fixed`` and efficiency: to refit them)."""
    require(gpu.sms > 0, f"device {gpu.slug}: the roofline prior's attention needs the GPU's SM count (got {gpu.sms})")
    kv_s = model.kv_bytes_per_token / (gpu.hbm_bytes_per_s * bandwidth_efficiency)
    pair_s = 4.0 * model.layers * model.hidden / (gpu.bf16_flops * ATTENTION_EFFICIENCY)  # QK^T and PV: 2 x 2 flops

    def row(kind: AttentionFixed) -> np.ndarray:
        return attention_row(kv_s=kv_s, pair_s=pair_s, floor_s=model.layers * kind.floor_s,
                             request_s=model.layers * kind.sequence_block_s * model.kv_heads / gpu.sms,
                             query_s=model.layers * kind.query_block_s * model.heads / gpu.sms)

    return attention_table(*(row(fixed[kind]) for kind in ATTENTION_KINDS))
