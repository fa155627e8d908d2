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

Fixed costs (:class:`FixedCosts`, each a named term with its unit and
source): the kernels a decoder layer, the LM head and the sampler launch,
priced per kernel as a replayed CUDA graph's node, with the graph regimes'
extra (``graph_piecewise_s``: attention launched eagerly between graph
pieces; ``graph_eager_s``: every kernel launched eagerly) for engines
with CUDA graphs (simspec.serving.modes); the sampler's pass over the
vocabulary per logit row; the engine's CPU time per step and per sequence
(overlapped with the GPU under async scheduling); and a speculation
round's fixed costs, which are what real engines pay beyond the drafter's
arithmetic: a fixed cost per draft step, per drafted round and per request
of a drafted round. The last three were fitted to the ``fit`` rows of the
published measurements (validation/published/, ``python
benchmarks/published.py --fit``), never to the held-out rows. What a
drafter call and a drafted round cost besides them depends on what drafts
(:func:`drafting`): an EAGLE head, a separate draft model, Medusa heads or
an n-gram lookup.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.costs.base import ATTENTION_KINDS, TOKENS, CostModel, attention_row, attention_table, blend, frozen_table
from simspec.costs import collectives
from simspec.costs.collectives import AllReduce
from simspec.costs.gpus import GpuSpec
from simspec.costs.specs import DRAFT_MODEL, EAGLE3_DRAFT_VOCAB, EAGLE_KINDS, MTP, ModelSpec
from simspec.types import require

BANDWIDTH_EFFICIENCY = 0.80  # achievable share of HBM bandwidth for streaming weights (KV: below)
GEMM_EFFICIENCY = 0.55  # achievable share of dense bf16 FLOPs for large GEMMs
ATTENTION_EFFICIENCY = 0.35  # attention kernels reach less of peak than GEMMs
KERNEL_LAUNCH_S = 0.02e-3  # a small kernel's floor (selection)
SELECT_LAYERS = 4  # verifier layers that vote in visual-token selection


@dataclass(frozen=True, slots=True, kw_only=True)
class FixedCosts:
    """What an engine step pays besides moving weights, keys and FLOPs."""

    # Kernels: a replayed CUDA graph's node (the GPU's gap between kernels)
    # and an eager launch (the CPU's launch path), seconds per kernel. An
    # assumption of the order NVIDIA's CUDA-graphs post shows (launch
    # overheads of a few microseconds that graphs cut to about one;
    # developer.nvidia.com/blog/cuda-graphs), not measured here.
    graph_node_s: float = 1.0e-6
    launch_s: float = 4.0e-6
    # Kernels per decoder layer as vLLM runs a Llama layer: fused
    # residual-add RMSNorm, QKV GEMM, rotary, KV-cache write, attention,
    # O GEMM, fused residual-add RMSNorm, gate-up GEMM, SiLU-and-mul, down
    # GEMM (vllm/model_executor/models/llama.py); 2 of them (cache write,
    # attention) run eagerly between a piecewise graph's pieces.
    kernels_per_layer: int = 10
    attention_kernels_per_layer: int = 2
    # The final norm and LM head GEMM, and the sampler's kernels (logits
    # processing, softmax / argmax, gathering); per logit row the sampler
    # reads and writes the float32 logits a few times.
    head_kernels: int = 2
    sampler_kernels: int = 6
    sampler_passes: int = 3
    # The engine's CPU part of a step: scheduling, input preparation and
    # output processing, fixed and per running sequence (the prior's former
    # fixed 0.8 ms kept as the fixed part). With async scheduling it
    # overlaps the GPU part (simspec.sim.steps.engine_step_s).
    cpu_step_s: float = 0.8e-3
    cpu_per_request_s: float = 0.0
    # One draft step's kernels: fc, a decoder layer, the head's norm, GEMM
    # and top-k (EAGLE heads).
    draft_kernels: int = 14
    # A separate draft model's step: kernels_per_layer for each of its
    # decoder layers (a Llama layer, as the target's) plus its embedding
    # gather, final norm, LM head GEMM and argmax.
    draft_model_kernels: int = 4
    # One Medusa head: its residual block's linear, SiLU and add, its LM
    # head GEMM and the top-k over its logits (Medusa's medusa_model.py
    # ResBlock and generate_candidates).
    medusa_head_kernels: int = 5
    # An n-gram (prompt-lookup) proposal, per request of a drafted round: a
    # lookup over the request's token ids on the CPU (vLLM's NgramProposer)
    # or a few small tensor ops (Spec-Bench's PLD); no source measures it,
    # so 0 until measured, like cpu_per_request_s.
    ngram_lookup_s: float = 0.0
    # A sparse layer's fused MoE call (routing, the tokens' alignment to
    # experts, the two grouped GEMMs, the activation and the weighted sum)
    # costs a floor beyond the weights it streams: its GEMMs are a few
    # thin tiles per expert, latency-bound. Kernel times of the fused call
    # from engines' own tuning benchmarks (benchmark_moe.py, CUDA-graph
    # replays) less this module's roofline of the touched experts' bytes
    # and FLOPs, at 1-8 tokens: 26-29 us on an H100 (Qwen3-30B-A3B FP8,
    # github.com/vllm-project/vllm/pull/24700, the PR's defaults), 28-30 us
    # on a B200 (Qwen3-Omni-30B-A3B BF16, vllm-project/vllm/pull/31448),
    # 27-35 us on an H200 (Qwen3-235B-A22B FP8 at tp 8,
    # sgl-project/sglang/pull/11730) and 26.5 us on an H100 (Qwen3-Next-80B
    # FP8 at tp 4, vllm-project/vllm/pull/44830): median 27.8 us, less the
    # moe_call_nodes MLP kernels a layer's kernels_per_layer already
    # counts. Mixtral's eight large experts (the same H100 PR) stream at
    # nearer 90% of the bandwidth than BANDWIDTH_EFFICIENCY's 80%, so there
    # the roofline alone is within 11% and the floor makes it 10-16% dear
    # (validation/published/moe_kernels.csv; benchmarks/moe_kernels.py
    # prints each point against the prior).
    moe_call_s: float = 25e-6
    moe_call_nodes: int = 3  # the MLP's kernels (gate-up, activation, down) that the fused call replaces
    # Fitted to the published rows' fit split (module docstring; 22 rows,
    # `python benchmarks/published.py --fit`, 2026-12-02, each row's AR and
    # speculative runs with the CPU overlap of the engine version it
    # measured): a draft step's fixed cost beyond its kernels' arithmetic
    # (the proposer's per-step input and attention-metadata preparation:
    # vLLM's time per token at batch 1 rises 0.7-1.0 ms per extra draft
    # token, github.com/vllm-project/vllm/issues/20780, where the head's
    # weights take 0.3-0.6 ms), a drafted round's (rejection sampling, the
    # proposer's set-up: the fit finds almost none) and one per request of
    # a drafted round (SGLang's EAGLE speedups fall to about 1 at batch 64,
    # EAGLE-3 paper Table 3: a cost that grows with the batch beyond the
    # arithmetic; the fit puts it at 73 us a request, which no source
    # measures directly).
    draft_step_s: float = 748e-6
    draft_round_s: float = 0.9e-6
    draft_round_request_s: float = 73e-6


FIXED = FixedCosts()

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


def roofline(model: ModelSpec, gpu: GpuSpec, fixed: FixedCosts | None = None,
             all_reduce: AllReduce | None = None, linear=None) -> CostModel:
    """The datasheet prior for ``model`` on ``gpu`` (uncalibrated), with the
    fixed costs ``fixed`` (default: this module's :data:`FIXED`, read at the
    call, which benchmarks/published.py --fit varies to refit its terms).
    Sharded over ``model.tensor_parallel`` GPUs, every figure is one GPU's
    (ModelSpec), and each sharded layer ends in two all-reduces of its
    tokens' activations (``all_reduce``: simspec.costs.collectives; default
    its prior). ``linear``: (attention, MLP) shape laws fitted to this
    device's measured GEMMs (simspec.costs.shapes), which then price a dense
    model's four linear layers in place of the datasheet GEMM."""
    fixed = fixed if fixed is not None else FIXED
    tp = model.tensor_parallel
    if tp > 1 and all_reduce is None:
        all_reduce = collectives.prior(gpu, tp)
    bw = weight_bandwidth(gpu)
    flops = gemm_flops(gpu, model.weight_bytes_per_param)
    node, eager_extra = fixed.graph_node_s, fixed.launch_s - fixed.graph_node_s

    def gemm(params: float, tokens=TOKENS, dtype_bytes: int = model.weight_bytes_per_param):
        return blend(params * dtype_bytes / bw, 2.0 * params * tokens / gemm_flops(gpu, dtype_bytes))

    def reduced(rows, width: int, layers: int = 1):
        """``layers`` x 2 all-reduces of ``rows`` x ``width`` activations, and their kernels (none at tp 1)."""
        if tp == 1:
            return 0.0 * rows
        return layers * (2 * all_reduce.seconds(rows * width * model.dtype_bytes) + 2 * node)

    def gathered(rows, vocab: int):
        """The logits' gather to the sampling GPU: as an all-reduce of half their bytes (none at tp 1)."""
        return 0.0 * rows if tp == 1 else all_reduce.seconds(rows * vocab * model.dtype_bytes / 2) + node

    sampler = (fixed.sampler_kernels * node
               + TOKENS * model.vocab * 4 * fixed.sampler_passes / bw)
    head = (gemm(model.lm_head_params, dtype_bytes=model.dtype_bytes) + fixed.head_kernels * node + sampler
            + gathered(TOKENS, model.vocab))
    vision = 0.0 * TOKENS
    if model.multimodal:
        patches = TOKENS * model.vision_patches_per_image / model.visual_tokens_per_image
        vision = (gemm(model.vision_params, patches, model.dtype_bytes)
                  + reduced(patches, model.vision_hidden, model.vision_layers))
    # A drafter at the target's degree is sharded and pays its all-reduces;
    # one on a single GPU computes the whole draft there and pays none.
    draft_step, draft_round_s, draft_round_request_s = drafting(model.drafter_whole, gpu, fixed, gemm)
    if model.draft_degree == tp:
        draft_step = draft_step + _drafter_comm(model, reduced, gathered)
    drafter_on = f", drafter at tp {model.draft_degree}" if model.draft_degree != tp else ""
    sharded = f"; tensor parallel {tp}{drafter_on}: {all_reduce.label}" if tp > 1 else ""
    measured = (f"; linear layers: the shape law fitted to {linear[0].source}" if linear is not None else "")
    return CostModel(
        label=f"roofline prior: {gpu.name} / {model.name} (speculation-round costs fitted to published "
              f"results{sharded}{measured})",
        calibrated=False, partly_calibrated=linear is not None, overhead_s=fixed.cpu_step_s,
        overhead_s_per_request=fixed.cpu_per_request_s,
        layers_s=frozen_table((_layers(model, gemm, bw, flops, fixed.kernels_per_layer * node, fixed.moe_call_s)
                               if linear is None
                               else _measured_layers(model, linear, fixed.kernels_per_layer * node))
                              + reduced(TOKENS, model.hidden, model.layers)),
        head_s=frozen_table(head), attention=attention_prior(model, gpu),
        vision_s_table=frozen_table(vision),
        draft_s_table=frozen_table(draft_step),
        draft_s_per_kept=2 * model.hidden * model.dtype_bytes / bw,
        draft_s_per_round=draft_round_s, draft_s_per_round_request=draft_round_request_s,
        graph_piecewise_s=model.layers * fixed.attention_kernels_per_layer * eager_extra,
        graph_eager_s=(model.layers * fixed.kernels_per_layer + fixed.head_kernels + fixed.sampler_kernels)
        * eager_extra,
        # Selection is memory-bound: each int8 key is read once per voting layer.
        select_launch_s=KERNEL_LAUNCH_S, select_s_per_key=SELECT_LAYERS * model.hidden / bw)


def weight_bandwidth(gpu: GpuSpec) -> float:
    """Bytes a second the prior streams weights (and logits) at: BANDWIDTH_EFFICIENCY of the datasheet's HBM."""
    return gpu.hbm_bytes_per_s * BANDWIDTH_EFFICIENCY


def gemm_flops(gpu: GpuSpec, weight_bytes: int) -> float:
    """Achievable GEMM FLOP/s for weights of ``weight_bytes`` bytes: the
    device's dense FP8 throughput for one-byte weights where it has FP8
    tensor cores (GpuSpec.fp8_flops), else its BF16 throughput."""
    peak = gpu.fp8_flops if weight_bytes == 1 and gpu.fp8_flops else gpu.bf16_flops
    return peak * GEMM_EFFICIENCY


def _layers(model: ModelSpec, gemm, bw: float, flops: float, kernels_s: float, moe_call_s: float) -> np.ndarray:
    """The decoder layers' GEMMs and kernels by the step's tokens. A dense layer reads
    its weights once a step; a sparse (mixture-of-experts) layer reads its
    attention, shared MLP and router once, and the weights of the experts
    the step's tokens touch (ModelSpec.experts_touched: more of them the
    more tokens a step verifies), each token computing through
    experts_per_token of them (the experts' GEMMs grouped in one fused
    call, as vLLM's and SGLang's fused MoE run them, with the call's floor
    ``moe_call_s`` beyond the MLP kernels' nodes the layer already counts)."""
    if not model.sparse_layers:
        return model.layers * (gemm(model.layer_params) + kernels_s)
    dense = model.layers - model.sparse_layers
    sparse = sparse_layer(model, gemm, bw, flops, TOKENS, moe_call_s) + kernels_s
    return dense * (gemm(model.layer_params) + kernels_s) + model.sparse_layers * sparse


def _measured_layers(model: ModelSpec, linear, kernels_s: float) -> np.ndarray:
    """A dense model's decoder layers with their four GEMMs from the device's shape laws (one GPU's shard)."""
    attention, mlp = linear
    return model.layers * (attention.layer_seconds("attention", model, TOKENS)
                           + mlp.layer_seconds("mlp", model, TOKENS) + kernels_s)


def sparse_layer(model: ModelSpec, gemm, bw: float, flops: float, tokens, call_s: float) -> np.ndarray:
    """One sparse layer's GEMMs over ``tokens`` rows: what every token runs
    (attention, the shared MLP, the router) read once, and the touched
    experts' weights read once, each token computing through
    experts_per_token of them (:func:`_layers`), plus the fused MoE call's
    floor ``call_s`` (FixedCosts.moe_call_s)."""
    return gemm(model.sparse_always_params, tokens) + expert_call(model, bw, flops, tokens, call_s)


def expert_call(model: ModelSpec, bw: float, flops: float, tokens, call_s: float) -> np.ndarray:
    """The fused MoE call of one sparse layer over ``tokens`` rows: the
    touched experts' weights streamed once or their FLOPs (the smooth
    maximum), plus its floor ``call_s``."""
    touched = model.experts_touched(tokens) * model.expert_params * model.weight_bytes_per_param / bw
    compute = 2.0 * tokens * model.experts_per_token * model.expert_params / flops
    return blend(touched, compute) + call_s


def _drafter_comm(model: ModelSpec, reduced, gathered) -> np.ndarray:
    """A drafter call's all-reduces and logits gather, by its rows, when it
    runs sharded at the target's degree (vLLM runs EAGLE heads and draft
    models on the target's tensor-parallel group): an EAGLE head's layer, a
    draft model's layers; Medusa's heads and n-grams none."""
    kind = model.drafter_kind
    if kind in EAGLE_KINDS:
        vocab = min(model.vocab, EAGLE3_DRAFT_VOCAB) if kind == "eagle3" else model.vocab
        return reduced(TOKENS, model.hidden) + gathered(TOKENS, vocab)
    if kind == DRAFT_MODEL:
        draft = model.draft_model
        return reduced(TOKENS, draft.hidden, draft.layers) + gathered(TOKENS, draft.vocab)
    if kind == MTP:
        return reduced(TOKENS, model.hidden, model.mtp_layers) + gathered(TOKENS, model.vocab)
    return 0.0 * TOKENS


def drafting(model: ModelSpec, gpu: GpuSpec, fixed: FixedCosts, gemm) -> tuple[np.ndarray, float, float]:
    """(one drafter call's seconds by its rows, a drafted round's fixed
    seconds, and per request) for ``model.drafter``: the simulator runs one
    drafter call per draft level, the first over the tokens accepted since
    the request last drafted.

    - EAGLE heads: the head's weights and kernels, and ``draft_step_s``, each call.
    - A draft model (``draft-model:NAME``): its decoder layers and LM head
      (at its own dtype), its kernels (``kernels_per_layer`` a layer plus
      ``draft_model_kernels``), its attention's floor per layer and
      prefill's per-query cost per row (:data:`ATTENTION_FIXED`; its key
      reads are left out: a call's table knows its rows, not their
      context, and a 68M model's keys are a few MB), and ``draft_step_s``,
      each call.
    - Medusa: all heads run in one pass a round over the target's last
      hidden state; a K-deep draft is priced as K calls of one head each
      (the same weights read), and the proposer's ``draft_step_s`` once a
      round, not per call.
    - n-gram: no GPU work; ``ngram_lookup_s`` per request a round.
    - MTP (DeepSeek-V3's own module): its projection over [embedding,
      hidden], its decoder layer priced as the target's (a sparse layer
      reads the experts its rows touch), the target's LM head, an EAGLE
      head's kernels and ``draft_step_s``, each call (vLLM runs it through
      the EAGLE proposer, one call a draft token).

    ``gemm(params, tokens, dtype_bytes)`` is the roofline of a GEMM."""
    node, kind = fixed.graph_node_s, model.drafter_kind
    arithmetic = gemm(model.drafter_params) + gemm(model.drafter_head_params)
    if kind == "ngram":
        return 0.0 * TOKENS, fixed.draft_round_s, fixed.draft_round_request_s + fixed.ngram_lookup_s
    if kind == "medusa":
        return (arithmetic + fixed.medusa_head_kernels * node, fixed.draft_round_s + fixed.draft_step_s,
                fixed.draft_round_request_s)
    if kind == DRAFT_MODEL:
        draft = model.draft_model
        weights = (gemm(model.drafter_params, dtype_bytes=draft.dtype_bytes)
                   + gemm(model.drafter_head_params, dtype_bytes=draft.dtype_bytes))
        prefill = ATTENTION_FIXED["prefill"]
        attention = draft.layers * (prefill.floor_s + TOKENS * prefill.query_block_s * draft.heads / gpu.sms)
        kernels = draft.layers * fixed.kernels_per_layer + fixed.draft_model_kernels
        return (weights + attention + kernels * node + fixed.draft_step_s, fixed.draft_round_s,
                fixed.draft_round_request_s)
    if kind == MTP:
        bw = weight_bandwidth(gpu)
        if model.experts:
            layer = sparse_layer(model, gemm, bw, gemm_flops(gpu, model.weight_bytes_per_param), TOKENS,
                                 fixed.moe_call_s)
        else:
            layer = gemm(model.layer_params)
        arithmetic = (gemm(model.mtp_projection_params) + model.mtp_layers * layer
                      + gemm(model.drafter_head_params, dtype_bytes=model.dtype_bytes))
    return (arithmetic + fixed.draft_kernels * node + fixed.draft_step_s, fixed.draft_round_s,
            fixed.draft_round_request_s)


def attention_prior(model: ModelSpec, gpu: GpuSpec, fixed: dict[str, AttentionFixed] = ATTENTION_FIXED,
                    bandwidth_efficiency: float = ATTENTION_BANDWIDTH_EFFICIENCY) -> np.ndarray:
    """[3, 11] attention coefficients (costs.base) of the datasheet prior:
    per kind, the roofline of keys read and pairs computed plus its
    ``fixed`` costs, every layer (other ``fixed`` and efficiency: to refit them)."""
    require(gpu.sms > 0, f"device {gpu.slug}: the roofline prior's attention needs the GPU's SM count (got {gpu.sms})")
    kv_s = model.kv_bytes_per_token / (gpu.hbm_bytes_per_s * bandwidth_efficiency)
    pair_s = 4.0 * model.layers * model.q_dim / (gpu.bf16_flops * ATTENTION_EFFICIENCY)  # QK^T and PV: 2 x 2 flops
    pairs = {kind: pair_s for kind in ATTENTION_KINDS}
    if model.latent:
        pairs = _latent_pairs(model, gpu)

    def row(name: str) -> np.ndarray:  # one GPU's heads
        kind = fixed[name]
        return attention_row(kv_s=kv_s, pair_s=pairs[name], floor_s=model.layers * kind.floor_s,
                             request_s=model.layers * kind.sequence_block_s * model.kv_heads_per_gpu / gpu.sms,
                             query_s=model.layers * kind.query_block_s * model.heads_per_gpu / gpu.sms)

    return attention_table(*(row(name) for name in ATTENTION_KINDS))


def _latent_pairs(model: ModelSpec, gpu: GpuSpec) -> dict[str, float]:
    """Seconds per query x key pair of latent attention, by kind. Decode and
    verification run the absorbed form (vLLM's MLA backends: the query
    folded through kv_b's key half, each head scoring over the cached
    latent and rotary key, kv_lora_rank + qk_rope_head_dim wide, and summing
    values over the latent, kv_lora_rank wide); prefill the expanded form
    (keys qk_nope + qk_rope wide, values v_head_dim wide, per head). The
    expansion of the cached latent through kv_b in prefill is left out."""
    rate = gpu.bf16_flops * ATTENTION_EFFICIENCY
    absorbed = 2.0 * model.layers * model.heads_per_gpu * (2 * model.kv_lora_rank + model.qk_rope_head_dim) / rate
    expanded = (2.0 * model.layers * model.heads_per_gpu
                * (model.qk_nope_head_dim + model.qk_rope_head_dim + model.v_head_dim) / rate)
    return {"prefill": expanded, "decode": absorbed, "verify": absorbed}
