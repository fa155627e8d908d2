"""The serving engine's knobs and its GPU memory: :class:`EngineConfig`,
named as vLLM names them, and how much KV cache a GPU holds under them.
One copy, shared by the simulator's replica and the live engine.

Imports: simspec.acceptance.context (the drafter's context names), simspec.serving.memory (the
engines' memory rules), simspec.types (and, for type checking only, simspec.costs.specs).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from simspec.acceptance.context import DraftContext
from simspec.serving import memory
from simspec.types import check_types, require

if TYPE_CHECKING:
    from simspec.costs.gpus import GpuSpec
    from simspec.costs.specs import ModelSpec

GIB = 1024**3
MAX_NUM_SEQS = 65536  # running requests per replica at most (vLLM's default is 256)
MAX_BATCHED_TOKENS = 1 << 24  # tokens per step at most
MAX_BLOCK_SIZE = 1024  # tokens per KV cache block at most
MAX_KV_TOKENS = 1 << 40
ENGINE_KINDS = ("simspec", "vllm", "sglang")  # simspec.engines.KINDS
GRAPH_MODES = ("none", "piecewise", "full_and_piecewise")
MEMORY_MODELS = ("datasheet", "vllm", "vllm-0.16", "sglang")  # simspec.serving.memory




@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The serving engine's knobs (vLLM names where vLLM has them)."""

    max_num_seqs: int = 128  # requests in the running batch
    max_num_batched_tokens: int = 8192  # prefill-chunk token budget per step
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + activations + KV cache
    activation_reserve_gib: float = 2.0  # memory kept for activations and CUDA graphs (memory = datasheet)
    # "datasheet": the datasheet's memory x utilisation - weights -
    # activation_reserve_gib; "vllm": as vLLM 0.17 and later size their KV
    # cache (the memory torch reports, the profiled activation peak,
    # non-torch and CUDA-graph memory), "vllm-0.16" as vLLM before 0.17
    # (a larger sampler peak, less non-torch memory); "sglang": as SGLang does (mem_fraction_static of the memory
    # free before the weights, less the weights): simspec.serving.memory.
    memory: str = "datasheet"
    # SGLang's --mem-fraction-static (memory = sglang): None, SGLang's own
    # rule from the GPU's memory, the chunk and its CUDA-graph defaults.
    mem_fraction_static: float | None = None
    # Requests whose prompts start alike (Request.prefix_id) reuse the KV
    # blocks of the shared prefix while they stay cached: vLLM V1's
    # automatic prefix caching (on by default), an LRU of freed blocks.
    prefix_caching: bool = False
    kv_cache_tokens: int | None = None  # override the KV budget derived from memory
    drafter_context: str = "selected:8"  # what of the image the drafter sees: full, none, selected:K, pooled:K
    # How the drafter's calls are made: "level" (EAGLE-2 engines: one call per
    # tree level over all its nodes) or "chain" (simspec's live engine: the
    # rank-1 chain level by level, planning in between, then the tree's
    # off-chain parents depth by depth).
    drafting: str = "level"
    # The engine mode (simspec.engines) and the fields its preset sets.
    kind: str = "simspec"  # simspec, vllm or sglang
    async_scheduling: bool = False  # CPU work overlaps the GPU step: a step costs max(GPU, CPU), not GPU + CPU
    cudagraph_mode: str = "none"  # none, piecewise or full_and_piecewise (vLLM's names)
    max_cudagraph_capture_size: int = 512  # tokens; larger steps run eagerly
    # "tokens": vLLM's captured token counts; "batch": SGLang's captured
    # batch sizes times the tokens each request verifies, and prefill graphs
    # up to the chunk size (simspec.sim.replica.capture_sizes)
    cudagraph_buckets: str = "tokens"
    mixed_prefill: bool = True  # prefill chunks share a step with decodes (SGLang's default: no)
    drafter_over_prefill: bool = False  # the drafter's first pass also runs over the step's prefill tokens
    # "vllm": running requests are scheduled first, within the token budget
    # (those it cannot hold skip the step); waiting ones are admitted only in
    # a step that preempted none, and only while their first chunk fits.
    # "simspec": admit first (KV permitting), then every decode runs.
    scheduler: str = "simspec"
    # The frontend (tokenization, image preprocessing) before a request
    # reaches the engine's queue: a text worker and an image worker, each
    # serving requests in arrival order, as vLLM's renderer runs them
    # (vllm/renderers/base.py 0.33 l.139-148: one tokenizer worker, a
    # separate single-worker executor for multimodal preprocessing). No
    # engine publishes these costs: 0 unless calibrated (`vllm bench
    # mm-processor` measures the image part).
    # "vllm": the vision encoder runs per image, in the step whose chunk
    # reaches it, under vLLM's per-step encoder budget (Scheduler); "none":
    # a request's images are encoded in the step its prefill starts.
    encoder_budget: str = "none"
    block_size: int = 1  # KV cache block, tokens (vLLM's default: 16)
    # Decoder layers of the drafter whose KV shares the cache, each of the
    # target's shape (an EAGLE head: 1); -1: the drafter's own layers, as
    # vLLM and SGLang size them (ModelSpec.drafter_kv_bytes_per_token: an
    # EAGLE head's or MTP module's layers, a draft model's own cache, none
    # for prompt lookup or Medusa).
    drafter_kv_layers: int = 0
    frontend_s_per_request: float = 0.0
    frontend_s_per_text_token: float = 0.0
    frontend_s_per_image: float = 0.0

    def __post_init__(self):
        check_types(self)
        require(self.kind in ENGINE_KINDS, f"kind must be one of {', '.join(ENGINE_KINDS)} (got {self.kind!r})")
        for name in ("frontend_s_per_request", "frontend_s_per_text_token", "frontend_s_per_image"):
            value = getattr(self, name)
            require(0 <= value <= 10, f"{name} must be in [0, 10] seconds (got {value})")
        require(1 <= self.block_size <= MAX_BLOCK_SIZE,
                f"block_size must be in 1..{MAX_BLOCK_SIZE} (got {self.block_size})")
        require(-1 <= self.drafter_kv_layers <= 16,
                f"drafter_kv_layers must be -1 (the drafter's own) or in 0..16 (got {self.drafter_kv_layers})")
        require(self.cudagraph_buckets in ("tokens", "batch"),
                f"cudagraph_buckets must be one of tokens, batch (got {self.cudagraph_buckets!r})")
        require(self.encoder_budget in ("none", "vllm"),
                f"encoder_budget must be one of none, vllm (got {self.encoder_budget!r})")
        require(self.memory in MEMORY_MODELS,
                f"memory must be one of {', '.join(MEMORY_MODELS)} (got {self.memory!r})")
        require(self.scheduler in ("simspec", "vllm"),
                f"scheduler must be one of simspec, vllm (got {self.scheduler!r})")
        require(self.cudagraph_mode in GRAPH_MODES,
                f"cudagraph_mode must be one of {', '.join(GRAPH_MODES)} (got {self.cudagraph_mode!r})")
        require(1 <= self.max_cudagraph_capture_size <= 1 << 16,
                f"max_cudagraph_capture_size must be in 1..65536 (got {self.max_cudagraph_capture_size})")
        require(1 <= self.max_num_seqs <= MAX_NUM_SEQS,
                f"max_num_seqs must be in 1..{MAX_NUM_SEQS} (got {self.max_num_seqs})")
        require(16 <= self.max_num_batched_tokens <= MAX_BATCHED_TOKENS,
                f"max_num_batched_tokens must be in 16..{MAX_BATCHED_TOKENS} (got {self.max_num_batched_tokens})")
        require(0.0 < self.gpu_memory_utilization <= 1.0,
                f"gpu_memory_utilization must be in (0, 1] (got {self.gpu_memory_utilization})")
        require(self.mem_fraction_static is None or 0.0 < self.mem_fraction_static <= 1.0,
                f"mem_fraction_static must be in (0, 1] (got {self.mem_fraction_static})")
        require(self.activation_reserve_gib >= 0,
                f"activation_reserve_gib must be >= 0 (got {self.activation_reserve_gib})")
        require(self.kv_cache_tokens is None or 1 <= self.kv_cache_tokens <= MAX_KV_TOKENS,
                f"kv_cache_tokens must be in 1..{MAX_KV_TOKENS} (got {self.kv_cache_tokens})")
        DraftContext.parse(self.drafter_context)
        require(self.drafting in ("level", "chain"), f"drafting must be 'level' or 'chain' (got {self.drafting!r})")

    def kv_budget_tokens(self, model: "ModelSpec", gpu: "GpuSpec") -> int:
        """Tokens the KV cache holds: GPU memory minus weights and activations."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        require(gpu.memory_bytes > 0, f"device {gpu.slug} has no memory size (a host CPU without a profile): "
                                      f"give --kv-cache-tokens")
        if self.memory == "sglang":
            fraction = memory.sglang_mem_fraction_static(self, model, gpu)
            usable = memory.sglang_capacity_mib(gpu) * memory.MIB * fraction
            free = memory.sglang_kv_bytes(model, gpu, fraction)
            share = f"mem_fraction_static {fraction}"
        else:
            usable = self.usable_bytes(gpu)
            free = usable - model.weight_bytes - self.reserve_bytes(model)
            share = f"gpu_memory_utilization {self.gpu_memory_utilization}"
        if self.drafter_kv_layers < 0:
            per_token = model.kv_bytes_per_token + model.drafter_kv_bytes_per_token
        else:
            per_token = model.kv_bytes_per_token * (model.layers + self.drafter_kv_layers) / model.layers
        tokens = int(free // per_token)
        tp = model.tensor_parallel
        hint = _fit_hint(model, usable)
        require(tokens > 0, f"model {model.name} at tp {tp} does not fit on {gpu.name} at {share}: weights "
                            f"{model.weight_bytes / 1e9:.1f} GB a GPU, {usable / 1e9:.1f} GB usable{hint}")
        return tokens

    def usable_bytes(self, gpu: "GpuSpec") -> float:
        """The device memory times gpu_memory_utilization: the datasheet's,
        or what torch reports (vllm). SGLang's share depends on the model
        too (simspec.serving.memory.sglang_mem_fraction_static)."""
        if self.memory in memory.VLLM_MEMORY:
            return memory.vllm_usable_bytes(self, gpu)
        return gpu.memory_bytes * self.gpu_memory_utilization

    def reserve_bytes(self, model: "ModelSpec") -> float:
        """Memory besides weights that the KV cache cannot have (datasheet and vllm)."""
        if self.memory in memory.VLLM_MEMORY:
            return memory.vllm_reserve_bytes(self, model)
        return self.activation_reserve_gib * GIB


def _fit_hint(model: "ModelSpec", usable: float) -> str:
    """What to try when a model's weights leave no KV cache: the least
    higher tensor-parallel degree whose share of the weights (this
    degree's weights x tp / N, the replicated parts ignored) fits in
    ``usable``, or, where not even a node's 8 GPUs hold it, a GPU with more
    memory; nothing when the weights take under half the memory."""
    tp = model.tensor_parallel
    if model.weight_bytes <= usable / 2:
        return ""
    more = [n for n in (2, 4, 8) if n > tp]
    fits = [n for n in more if model.weight_bytes * tp / n < usable]
    if fits:
        return f"; try --tp {fits[0]} or more"
    if not more:
        return "; tp 8 is one node's most: try a device with more memory (--device)"
    return (f"; even tp 8 leaves about {model.weight_bytes * tp / 8 / 1e9:.1f} GB of weights a GPU: try a device "
            f"with more memory (--device)")


__all__ = ["EngineConfig", "GIB", "MAX_NUM_SEQS", "MAX_BATCHED_TOKENS", "MAX_BLOCK_SIZE", "MAX_KV_TOKENS", "ENGINE_KINDS",
           "GRAPH_MODES", "MEMORY_MODELS"]
