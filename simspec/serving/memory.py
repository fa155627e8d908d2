"""How much of a GPU each engine leaves its KV cache: the memory rules
:meth:`simspec.serving.EngineConfig.kv_budget_tokens` applies under
``memory = "vllm"`` (``"vllm-0.16"`` for vLLM before 0.17) and
``memory = "sglang"``, each from the engine's own
source, its constants from public logs (cited where they are set). The
published rows they are checked against are in
``validation/published/kv_capacity.csv`` (``benchmarks/kv_capacity.py``).

Imports: nothing of simspec's (for type checking only, simspec.costs; an
``engine`` below is a simspec.serving.config.EngineConfig, which imports
this module).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from simspec.costs.gpus import GpuSpec
    from simspec.costs.specs import ModelSpec

GIB = 1024**3
MIB = 1024**2

# ---------------------------------------------------------------- vLLM
# vLLM's memory profile (vllm/v1/worker/gpu_worker.py 0.33 l.700-757): KV =
# total x gpu_memory_utilization - weights - the torch peak of a dummy
# forward step over max_num_batched_tokens and of a dummy sampler run over
# max_num_seqs rows - non-torch memory - the CUDA-graph estimate (profiled
# and subtracted by default since vLLM 0.21).

# What torch reports as a device's total memory (torch.cuda.mem_get_info):
# 79.22 GiB on an H100 80GB (vLLM's memory profile log,
# github.com/vllm-project/vllm/pull/10511; llm-d's H100 logs show 79.18).
# Other GPUs: their nominal GB times the same ratio, an assumption.
TORCH_MEMORY_GIB = {"h100-sxm": 79.22}
TORCH_MEMORY_SHARE = 79.22 / 80
CUDAGRAPH_GIB = 0.36  # "Estimated CUDA graph memory: 0.36 GiB", vLLM 0.27.1 (github.com/gpustack/runner/pull/251)


@dataclass(frozen=True)
class VllmProfile:
    """The constants of one era of vLLM's memory profile.

    - ``non_torch_gib``: non-torch memory (the CUDA context's growth, NCCL
      and custom all-reduce buffers) at tp 1 and from tp 2 on.
    - The profiled torch peak is the larger of two dummy runs (the forward
      step's activations are freed before the sampler runs): the forward
      step, each batched token's MLP and residual activations (2 x one GPU's
      MLP columns + 4 x hidden values, at the model's dtype) times
      ``forward_factor``; and the sampler, ``sampler_bytes`` a logit of
      max_num_seqs x vocab (float32 logits, probabilities, their sort and
      top-k/top-p masks). At vLLM's H100 default of 1024 sequences the
      sampler decides the peak for most vocabularies, and it does not
      shrink with the degree."""

    since: str  # the first vLLM version it describes
    forward_factor: float
    sampler_bytes: float
    non_torch_gib: dict


def _forward_factor(gib: float, tokens: int, mlp: int, hidden: int) -> float:
    return gib * GIB / (tokens * (2 * mlp + 4 * hidden) * 2)


# vLLM's activation peak fell by 60% between 0.16 and 0.17 (Qwen3-14B on an
# H100 at tp 1: 5.64 GiB in 0.15 and 0.16, 2.23 in 0.17 and 0.18;
# github.com/jgchn/llm-d-planner, accuracy/results/version-sweep/run_matrix.md
# at 3c876c8), so its constants come in two eras.
VLLM_PROFILES = {
    # vLLM 0.17 and later (the vllm mode's 0.33): fitted to vLLM 0.19 H100
    # startup logs (jgchn/llm-d-planner at d3121e0,
    # accuracy/results/v0.19.0/logs/): the sampler to Llama-3.1-8B's 1.89 GiB
    # at tp 1 and 1024 sequences, the forward step to CodeLlama-7B's 0.77 GiB
    # (a 32,016-token vocabulary: the forward run decides), non-torch to
    # Llama-3.1-8B's 0.25 GiB at tp 1 and 2.07 at tp 2 (2.06-2.21 at tp 2
    # and 4 in the other logs; tp 8 taken as 4, an assumption).
    "vllm": VllmProfile(since="0.17", forward_factor=_forward_factor(0.77, 8192, 11008, 4096),
                        sampler_bytes=1.89 * GIB / (1024 * 128256), non_torch_gib={1: 0.25, 2: 2.07}),
    # vLLM before 0.17: the forward step fitted to Llama-3-8B's 1.26 GiB at
    # 8192 tokens and 256 sequences (vllm pull 10511's log, where the forward
    # run is the larger), the sampler to Llama-3.1-8B's 4.76 GiB at 1024
    # sequences in vLLM 0.11 on an H100, non-torch 0.13 GiB at tp 1 and
    # 0.54-0.55 at tp 2 in the same 0.11 logs
    # (llm-d/llm-d-benchmark, config_explorer/empirical-vllm-memory-results.md).
    "vllm-0.16": VllmProfile(since="0.6", forward_factor=_forward_factor(1.26, 8192, 14336, 4096),
                             sampler_bytes=4.76 * GIB / (1024 * 128256), non_torch_gib={1: 0.13, 2: 0.55}),
}
VLLM_MEMORY = tuple(VLLM_PROFILES)  # the memory values that follow vLLM's profile


def vllm_usable_bytes(engine: "EngineConfig", gpu: "GpuSpec") -> float:
    """What torch reports as the device's memory, times gpu_memory_utilization."""
    total_gib = TORCH_MEMORY_GIB.get(gpu.slug, gpu.memory_bytes / 1e9 * TORCH_MEMORY_SHARE)
    return total_gib * GIB * engine.gpu_memory_utilization


def vllm_activation_bytes(engine: "EngineConfig", model: "ModelSpec") -> float:
    """The profiled torch peak: the larger of the forward step's and the
    sampler's (``engine.memory``'s era), and a mixture of experts' buffers."""
    profile = VLLM_PROFILES[engine.memory]
    # one GPU's MLP columns under tensor parallelism; a mixture of experts' are in its workspace, below
    mlp = 0 if model.experts else model.mlp_hidden // model.tensor_parallel
    forward = engine.max_num_batched_tokens * (2 * mlp + 4 * model.hidden) * model.dtype_bytes * profile.forward_factor
    sampler = engine.max_num_seqs * model.vocab * profile.sampler_bytes
    return max(forward, sampler) + vllm_moe_workspace_bytes(engine, model)


def vllm_moe_workspace_bytes(engine: "EngineConfig", model: "ModelSpec") -> float:
    """A mixture of experts' fused-MoE buffers, which stay allocated beside
    either run's peak: each batched token's routed copies
    (experts_per_token of them) hold the gate and up projections (2 x one
    GPU's expert columns), their product (1 x) and the expert outputs
    (hidden), at the model's dtype. Checked on vLLM 0.19's logs: Mixtral-8x7B
    at tp 2 (1.21 GiB logged, 1.25 predicted), Qwen3-30B-A3B at tp 1 (2.68,
    2.77), Llama 4 Scout at tp 4 (3.19, 3.15); 0 for a dense model."""
    if not model.experts:
        return 0.0
    columns = model.expert_mlp_hidden // model.tensor_parallel
    return (engine.max_num_batched_tokens * model.experts_per_token * (3 * columns + model.hidden)
            * model.dtype_bytes)


def vllm_reserve_bytes(engine: "EngineConfig", model: "ModelSpec") -> float:
    """Memory besides the weights that vLLM's KV cache cannot have."""
    non_torch = VLLM_PROFILES[engine.memory].non_torch_gib[min(model.tensor_parallel, 2)] * GIB
    graphs = CUDAGRAPH_GIB * GIB if engine.cudagraph_mode != "none" else 0.0
    return vllm_activation_bytes(engine, model) + non_torch + graphs


# ---------------------------------------------------------------- SGLang
# SGLang 0.5.23 sizes its KV pool from mem_fraction_static, which it derives
# from the GPU's memory and its own chunk and CUDA-graph defaults
# (srt/arg_groups/memory_hook.py handle_gpu_memory_settings l.47-349,
# reserve_for_graph_mb l.357-400, adjust_mem_fraction_for_vlm l.417-462), and
# then gives the pool what the weights leave of that share of the memory
# free before they loaded (srt/mem_cache/kv_cache_configurator.py
# _profile_available_bytes, l.2990-3061):
#   KV = free_before_weights x mem_fraction_static - weights - VLM cache.

# The GPU memory SGLang reads (nvidia-smi's memory.total, MiB), as public
# nvidia-smi outputs print it: H100 80GB HBM3 81559, H200 143771, B200
# 183359, L40S and A40 46068, A100 80GB 81920. Other GPUs: their nominal GB
# x 1024 x 81559/81920, an assumption.
NVIDIA_SMI_MIB = {"h100-sxm": 81559, "h200": 143771, "b200": 183359, "l40s": 46068, "a40": 46068,
                  "a100-80gb": 81920}
# Memory in use before the weights load (CUDA context, torch, the process
# group): 79.65 - 78.48 GiB in an SGLang log on an H100 at tp 1 ("Load
# weight begin. avail mem=78.48 GB"; SGLang's "GB" are GiB), an
# assumption at other degrees and GPUs.
STARTUP_GIB = 81559 / 1024 - 78.48
VLM_CACHE_GIB = 100 / 1024  # SGLANG_VLM_CACHE_SIZE_MB, 100 by default (srt/environ.py l.1598), for a multimodal model


def sglang_capacity_mib(gpu: "GpuSpec") -> float:
    """The GPU memory SGLang reads, MiB (nvidia-smi's memory.total)."""
    return NVIDIA_SMI_MIB.get(gpu.slug, gpu.memory_bytes / 1e9 * 1024 * 81559 / 81920)


def sglang_chunk_tokens(capacity_mib: float) -> int:
    """SGLang's default chunked_prefill_size for a GPU of this memory (memory_hook.py l.88-170)."""
    if capacity_mib < 20 * 1024:
        return 2048
    if capacity_mib < 60 * 1024:
        return 4096
    return 8192 if capacity_mib < 160 * 1024 else 16384


def sglang_decode_graph_max_bs(capacity_mib: float, tp: int) -> int:
    """SGLang's default largest captured decode batch (memory_hook.py
    l.88-170): the speculative hook's 48 running requests come after the
    memory rule, so the rule reserves for this, not for 48."""
    if capacity_mib < 20 * 1024:
        return 8
    if capacity_mib < 35 * 1024:
        return 48 if tp < 4 else 160
    if capacity_mib < 60 * 1024:
        return 32 if tp < 4 else 160
    if capacity_mib < 160 * 1024:
        return 256 if tp < 4 else 512
    return 512


def sglang_prefill_graph_sizes(max_tokens: int) -> int:
    """How many prefill token counts SGLang captures up to ``max_tokens``
    (srt/arg_groups/cuda_graph_hook.py generate_prefill_cuda_graph_batch_sizes)."""
    sizes = (list(range(4, 33, 4)) + list(range(48, 257, 16)) + list(range(288, 513, 32))
             + list(range(576, 1025, 64)) + list(range(1280, 4097, 256)) + list(range(4608, max_tokens + 1, 512)))
    return sum(1 for s in sizes if s <= max_tokens)


def sglang_mem_fraction_static(engine: "EngineConfig", model: "ModelSpec", gpu: "GpuSpec") -> float:
    """mem_fraction_static: the engine's own where it sets one, else
    SGLang's rule: (capacity - reserved) / capacity, rounded to 3 places,
    reserved (MiB) = 512 + 1.5 x max(chunk, 2048) + tp/8 x 1024 + 2 x the
    largest decode graph + 8 per captured prefill size (1536 in all under
    latent attention), at least 10 GiB on GPUs over 60 GiB; a multimodal
    model's share scaled down by its vision tower's size
    (adjust_mem_fraction_for_vlm)."""
    if engine.mem_fraction_static is not None:
        return engine.mem_fraction_static
    capacity = sglang_capacity_mib(gpu)
    tp = model.tensor_parallel
    chunk = engine.max_num_batched_tokens
    reserved = 512 + 1.5 * max(chunk, 2048) + tp / 8 * 1024
    if engine.cudagraph_mode != "none":
        reserved += 2 * sglang_decode_graph_max_bs(capacity, tp)
        reserved += 1536 if model.latent else 8 * sglang_prefill_graph_sizes(chunk)
    if capacity > 60 * 1024:
        reserved = max(reserved, 10 * 1024)
    fraction = round((capacity - reserved) / capacity, 3)
    if model.vision_layers:
        complexity = model.vision_layers * model.vision_hidden**2 / (24 * 1024**2)  # against ViT-L/14
        fraction *= 0.95 * max(0.8, min(1.05, 1.0 - 0.1 * (complexity - 1.0)))
    return fraction


def sglang_kv_bytes(model: "ModelSpec", gpu: "GpuSpec", fraction: float) -> float:
    """The bytes SGLang gives its KV pool on one GPU (the draft's layers
    included) at mem_fraction_static ``fraction``."""
    free = (sglang_capacity_mib(gpu) * MIB / GIB - STARTUP_GIB) * GIB
    cache = VLM_CACHE_GIB * GIB if model.vision_layers else 0.0
    return free * fraction - model.weight_bytes - cache


__all__ = ["TORCH_MEMORY_GIB", "CUDAGRAPH_GIB", "VLLM_PROFILES", "VLLM_MEMORY", "VllmProfile", "NVIDIA_SMI_MIB",
           "STARTUP_GIB", "vllm_usable_bytes", "vllm_activation_bytes", "vllm_moe_workspace_bytes", "vllm_reserve_bytes",
           "sglang_capacity_mib",
           "sglang_chunk_tokens", "sglang_decode_graph_max_bs", "sglang_prefill_graph_sizes",
           "sglang_mem_fraction_static", "sglang_kv_bytes"]
