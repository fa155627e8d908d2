"""Engine modes: which real serving engine a simulation follows.

Imports: simspec.policies, simspec.costs (the device datasheets),
simspec.serving (EngineConfig's field names, the engines' memory rules) and simspec.types.

``[engine] kind`` (flag ``--engine``) picks a preset of explicit
:class:`~simspec.serving.EngineConfig` fields, each named as the engine
names it; a config file or flag still sets any one of them:

- ``simspec``: the engine simspec's live engine implements, with every
  Uni-LaSpec / SpecVLM feature (per-request, per-round plans, trees,
  selection, cross-attention). The default; no graph or overlap terms.
- ``vllm``: vLLM V1 as version 0.33.0 sets itself up for an API server
  (facts from its source, cited by file and line in docs/engines.md):
  async scheduling on (off on the CPU backend), CUDA graphs
  FULL_AND_PIECEWISE up to 512 tokens, max_num_seqs / max_num_batched_tokens
  1024 / 8192 on H100 and H200 (256 / 2048 on other GPUs; 128 / 2048 on a
  CPU), the EAGLE drafter's first pass over every scheduled token, prefill
  chunks included, prefill chunks mixed with decodes, and vLLM's scheduling
  order (``scheduler = "vllm"``). It runs ``ar``, ``linear:k=K`` and
  ``batch_table`` (``num_speculative_tokens_per_batch_size``, keyed as vLLM
  keys it: by the previous step's scheduled requests) only: vLLM 0.33 has
  no draft trees and one draft length for every request of a step.
- ``sglang``: SGLang 0.5.23's defaults: a prefill batch is not mixed with
  decodes (a step that prefills stalls every decode), the overlap scheduler
  on, 48 running requests with EAGLE, prefill chunks by the GPU's memory
  (8192 tokens on H100/H200), its KV pool by ``mem_fraction_static``, and one
  static draft shape per server (``linear:k=K`` or ``tree``), or
  ``batch_table`` as ``--speculative-adaptive`` with one step count per
  batch-size tier (its acceptance-driven moves between several are not
  modelled).
"""

from __future__ import annotations

from simspec import policies
from simspec.costs import GPUS
from simspec.serving import memory
from simspec.serving.config import ENGINE_KINDS as KINDS
from simspec.types import InputError

VERSIONS = {"simspec": None, "vllm": "0.33.0", "sglang": "0.5.23"}
"""The engine version whose behaviour a mode follows."""

RUNS = {  # policy families each engine can serve
    "simspec": None,  # all of them
    "vllm": ("ar", "linear", "batch_table"),  # batch_table: num_speculative_tokens_per_batch_size
    # batch_table on SGLang: --speculative-adaptive with one candidate step
    # count per batch-size tier (what `simspec export --format sglang`
    # writes), so each tier's EMA has nothing to move between
    # (srt/speculative/adaptive_spec_params.py 0.5.23 l.153-275). SGLang
    # keys a tier by this step's decode batch padded to a captured batch
    # size (l.342-360); simspec keys it by the unpadded decode batch, which
    # differs only where padding crosses a tier's key. Several candidates
    # per tier (the EMA itself) are not modelled.
    "sglang": ("ar", "linear", "tree", "batch_table"),
}
DEFAULT_POLICIES = {"vllm": ("ar", "linear:k=3", "linear:k=5"), "sglang": ("ar", "linear:k=3", "linear:k=5", "tree")}
"""The policies compared when a config names none (simspec: config.DEFAULT_POLICIES)."""

BIG_GPU_BYTES = 70 * 2**30  # vLLM's ">= 70 GiB, not A100" tier (vllm/engine/arg_utils.py 0.33, l.2983-2996)


def preset(kind: str, device: str, tp: int = 1) -> dict:
    """The EngineConfig fields engine ``kind`` sets by default on ``device``
    (a device slug; one without a datasheet gets the engine's smaller-GPU
    defaults) at tensor-parallel degree ``tp``. vLLM's GPU batch defaults
    do not depend on the degree (vllm/engine/arg_utils.py 0.32
    get_batch_defaults: by device memory and name only); its CPU defaults
    are per rank, so they scale with it."""
    device = device.lower()
    gpu = GPUS.get(device)
    memory_bytes = gpu.memory_bytes if gpu else None
    if kind not in KINDS:
        raise InputError(f"engine kind must be one of {', '.join(KINDS)} (got {kind!r})")
    if kind == "simspec":
        return {"kind": kind}
    cpu = device.startswith("cpu")
    if kind == "vllm":
        if cpu:  # vllm/engine/arg_utils.py l.3029-3037; async off: vllm/platforms/cpu.py l.347-348
            seqs, tokens = 128 * tp, 2048 * tp
        elif memory_bytes is not None and memory_bytes >= BIG_GPU_BYTES and "a100" not in device:
            seqs, tokens = 1024, 8192
        else:  # arg_utils.py l.2997-3006
            seqs, tokens = 256, 2048
        return {"kind": kind, "max_num_seqs": seqs, "max_num_batched_tokens": tokens, "async_scheduling": not cpu,
                "cudagraph_mode": "none" if cpu else "full_and_piecewise", "max_cudagraph_capture_size": 512,
                "mixed_prefill": True, "drafter_over_prefill": True, "drafter_context": "full", "scheduler": "vllm",
                "encoder_budget": "vllm", "block_size": 16, "drafter_kv_layers": -1, "memory": "vllm",
                "prefix_caching": True}  # vllm/engine/arg_utils.py l.3075-3076: on for generative models
    # SGLang 0.5.23: chunked_prefill_size by the GPU's memory, 8192 on H100/H200, 4096 on L40S/A40, 16384
    # on B200 (srt/arg_groups/memory_hook.py l.88-170; 8192 where no datasheet says), max_running_requests
    # 48 with EAGLE (srt/arg_groups/speculative_hook.py l.1086-1094), its KV pool sized by
    # mem_fraction_static (simspec.serving.memory), the drafter's layers in the pool's cell
    # (srt/model_executor/pool_configurator.py l.255-310: an EAGLE head's or MTP module's)
    chunk = memory.sglang_chunk_tokens(memory.sglang_capacity_mib(gpu)) if gpu and not cpu else 8192
    return {"kind": kind, "max_num_seqs": 48, "max_num_batched_tokens": chunk, "async_scheduling": not cpu,
            "cudagraph_mode": "none" if cpu else "full_and_piecewise", "cudagraph_buckets": "batch",
            "mixed_prefill": False,
            "drafter_over_prefill": True, "drafter_context": "full", "memory": "sglang", "drafter_kv_layers": -1,
            "prefix_caching": True}  # RadixAttention on: disable_radix_cache = False (srt/arg_groups/fields/memory.py l.64-70)


def check_policy(kind: str, spec: str) -> None:
    """Refuse a policy spec that is malformed or that the engine cannot run, in one line."""
    family = policies.parse(spec).name
    allowed = RUNS.get(kind)
    if allowed is not None and family not in allowed:
        why = ("vLLM 0.33 has no draft trees and drafts one length for every request of a step"
               if kind == "vllm" else "SGLang drafts one static chain or tree per server, or one per batch-size tier")
        raise InputError(f"policy {spec}: engine {kind} cannot run it ({why}; it runs "
                         f"{', '.join(allowed)}); simulate it with --engine simspec")


DRAFT_TP = {  # what each engine accepts as the drafter's degree at target degree tp
    "simspec": lambda tp: (1, tp),
    # vllm/config/speculative.py (0.32) _verify_and_get_draft_tp accepts 1 or the
    # target's degree, but V1 runs EAGLE heads on the target's group and its
    # draft-model proposer refuses any other (vllm/v1/spec_decode/draft_model.py
    # _raise_if_draft_tp_mismatch).
    "vllm": lambda tp: (tp,),
    "sglang": lambda tp: (tp,),  # the draft worker shares the target's tp group
}


def check_draft_tp(kind: str, tp: int, draft_tp: int | None) -> None:
    """Refuse a drafter degree engine ``kind`` cannot run with a target at ``tp``, in one line."""
    if draft_tp is None:
        return
    allowed = DRAFT_TP.get(kind, DRAFT_TP["simspec"])(tp)
    if draft_tp not in allowed:
        what = " or ".join(str(n) for n in sorted(set(allowed)))
        raise InputError(f"draft_tp must be {what} with engine {kind} at tp {tp} (got {draft_tp})")


def describe(engine) -> str:
    """One line for the run header: the mode and what it assumes."""
    follows = f" {VERSIONS[engine.kind]}" if VERSIONS.get(engine.kind) else ""
    overlap = "async" if engine.async_scheduling else "no overlap"
    graphs = ("no CUDA graphs" if engine.cudagraph_mode == "none"
              else f"{engine.cudagraph_mode} graphs <= {engine.max_cudagraph_capture_size} tok")
    mixed = "mixed prefill" if engine.mixed_prefill else "lone prefill"
    return (f"engine: {engine.kind}{follows} | {overlap} | {graphs} | {mixed} | {engine.max_num_seqs} seqs, "
            f"{engine.max_num_batched_tokens} tok/step")


__all__ = ["KINDS", "VERSIONS", "RUNS", "DEFAULT_POLICIES", "DRAFT_TP", "preset", "check_policy", "check_draft_tp",
           "describe"]
