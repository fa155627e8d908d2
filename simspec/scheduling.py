"""The scheduler and the acceptance estimate: one copy, shared by the
simulator's replica and the live engine.

Imports: numpy, simspec.compiled (numba), simspec.acceptance.context and
simspec.types (never simpy or torch). DESIGN.md "The serving model".

**Engine knobs** (:class:`EngineConfig`): what the replica's engine loop is
configured with, named as vLLM names them.

**Scheduling** (:class:`Scheduler`), each step, as vLLM's scheduler:

1. admit waiting requests FCFS while ``max_num_seqs`` and the KV budget
   allow (a request needs its prompt and one more token);
2. reserve KV for the decode batch, preempting the newest request (its cache
   freed, recomputed later with the tokens it emitted, never dropped) until
   every decode request can grow by ``reserve_tokens``;
3. schedule prefill chunks FCFS in the token budget the decode rounds leave
   (each round counts 1 + its last round's draft tokens, as vLLM counts
   spec tokens);
4. price the chunks (:meth:`Scheduler.prefill`): causal attention pairs,
   KV read, vision-encoder tokens of requests starting their prefill.

The scheduler keeps, per request, the tokens in its KV cache, the tokens it
must prefill, its last round's draft tokens and its emitted tokens, as
arrays the compiled step loop reads and writes in place, and its queues as
arrays too (:class:`Queues`). Each rule is a compiled function over them
(``admit``, ``decode_batch``, ``in_budget``, ``budget_left``,
``prefill_chunks``, ``prefill_cost``, ``complete_prefill``, ``retire``):
the Scheduler's methods call them, and so does the simulator's compiled
serving loop (simspec.sim.serve), which runs many steps' decisions in one
call. Prefix caching (admission and the KV reservation) and vLLM's encoder
budget (chunking and pricing) extend them in Python, in the Scheduler.

**Acceptance estimate** (:class:`Estimate`): each request's moving average
of accepted draft tokens per drafted round, and the replica-wide one a newly
admitted request starts from, updated after every round by the compiled
:func:`after_round` (policies such as goodput and marginal read them).
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, NamedTuple

import numpy as np

from simspec.acceptance.context import DraftContext
from simspec.compiled import jit
from simspec.types import check_types, require

if TYPE_CHECKING:
    from simspec.costs.specs import GpuSpec, ModelSpec

GIB = 1024**3
MAX_NUM_SEQS = 65536  # running requests per replica at most (vLLM's default is 256)
MAX_BATCHED_TOKENS = 1 << 24  # tokens per step at most
MAX_KV_TOKENS = 1 << 40
ENGINE_KINDS = ("simspec", "vllm", "sglang")  # simspec.engines.KINDS
GRAPH_MODES = ("none", "piecewise", "full_and_piecewise")
MEMORY_MODELS = ("datasheet", "vllm")

# What torch reports as a device's total memory (torch.cuda.mem_get_info),
# which vLLM multiplies by gpu_memory_utilization: an H100 80GB shows 79.22
# GiB (vLLM's memory profile log, github.com/vllm-project/vllm/pull/10511).
# Other GPUs: their nominal GiB times the same ratio, an assumption.
TORCH_MEMORY_GIB = {"h100-sxm": 79.22}
TORCH_MEMORY_SHARE = 79.22 / 80
# vLLM's memory profile (vllm/v1/worker/gpu_worker.py 0.33 l.700-757):
# KV = total x utilisation - weights - non-torch memory - the activation
# peak of a dummy step over max_num_batched_tokens - the CUDA-graph
# estimate (profiled by default since vLLM 0.21).
NON_TORCH_GIB = 0.16  # H100, 11B model: github.com/vllm-project/vllm/pull/12126 (log)
CUDAGRAPH_GIB = 0.36  # "Estimated CUDA graph memory: 0.36 GiB", vLLM 0.27.1 (github.com/gpustack/runner/pull/251)
# The activation peak: each batched token's MLP and residual activations
# (2 x mlp_hidden + 4 x hidden values) times ACTIVATION_FACTOR, plus the
# sampler's float32 logits for max_num_seqs rows; the factor is fitted to
# one measurement, Llama-3-8B's 1.26 GiB at 8192 tokens and 256 sequences
# (vLLM pull 10511's log), so it is an estimate for other shapes.
ACTIVATION_FACTOR = 1.655


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The serving engine's knobs (vLLM names where vLLM has them)."""

    max_num_seqs: int = 128  # requests in the running batch
    max_num_batched_tokens: int = 8192  # prefill-chunk token budget per step
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + activations + KV cache
    activation_reserve_gib: float = 2.0  # memory kept for activations and CUDA graphs (memory = datasheet)
    # "datasheet": the datasheet's memory x utilisation - weights -
    # activation_reserve_gib; "vllm": as vLLM sizes its KV cache (the memory
    # torch reports, the profiled activation peak, non-torch and CUDA-graph
    # memory: TORCH_MEMORY_GIB ... ACTIVATION_FACTOR above).
    memory: str = "datasheet"
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
    drafter_kv_layers: int = 0  # decoder layers of the drafter whose KV shares the cache (an EAGLE head: 1)
    frontend_s_per_request: float = 0.0
    frontend_s_per_text_token: float = 0.0
    frontend_s_per_image: float = 0.0

    def __post_init__(self):
        check_types(self)
        require(self.kind in ENGINE_KINDS, f"kind must be one of {', '.join(ENGINE_KINDS)} (got {self.kind!r})")
        for name in ("frontend_s_per_request", "frontend_s_per_text_token", "frontend_s_per_image"):
            value = getattr(self, name)
            require(0 <= value <= 10, f"{name} must be in [0, 10] seconds (got {value})")
        require(1 <= self.block_size <= 1024, f"block_size must be in 1..1024 (got {self.block_size})")
        require(0 <= self.drafter_kv_layers <= 16, f"drafter_kv_layers must be in 0..16 (got {self.drafter_kv_layers})")
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
        free = self.usable_bytes(gpu) - model.weight_bytes - self.reserve_bytes(model)
        per_token = model.kv_bytes_per_token * (model.layers + self.drafter_kv_layers) / model.layers
        tokens = int(free // per_token)
        require(tokens > 0, f"model {model.name} does not fit on {gpu.name} at gpu_memory_utilization "
                            f"{self.gpu_memory_utilization} (weights {model.weight_bytes / GIB:.1f} GiB)")
        return tokens

    def usable_bytes(self, gpu: "GpuSpec") -> float:
        """The device memory times gpu_memory_utilization: the datasheet's,
        or what torch reports (memory = vllm)."""
        if self.memory == "datasheet":
            return gpu.memory_bytes * self.gpu_memory_utilization
        total_gib = TORCH_MEMORY_GIB.get(gpu.slug, gpu.memory_bytes / 1e9 * TORCH_MEMORY_SHARE)
        return total_gib * GIB * self.gpu_memory_utilization

    def reserve_bytes(self, model: "ModelSpec") -> float:
        """Memory besides weights that the KV cache cannot have."""
        if self.memory == "datasheet":
            return self.activation_reserve_gib * GIB
        per_token = (2 * model.mlp_hidden + 4 * model.hidden) * model.dtype_bytes * ACTIVATION_FACTOR
        logits = self.max_num_seqs * model.vocab * 4
        graphs = CUDAGRAPH_GIB * GIB if self.cudagraph_mode != "none" else 0.0
        return self.max_num_batched_tokens * per_token + logits + NON_TORCH_GIB * GIB + graphs


class Prefill(NamedTuple):
    """The prefill chunks of one step, as the cost model prices them (zeros when none)."""

    tokens: int  # prompt tokens run this step
    attn_pairs: int  # causal query x key pairs: each new token sees the cache and the chunk before it
    kv_tokens: int  # KV tokens attention reads (cache + chunk)
    requests: int  # chunks
    vision_tokens: int  # visual tokens of the requests starting their prefill (the vision encoder runs)
    max_context: int  # the longest context cached before a chunk


NO_PREFILL = Prefill(0, 0, 0, 0, 0, 0)


# -- the rules, compiled -------------------------------------------------------------
#
# Steps 1-4 as compiled functions over arrays: the Scheduler below calls
# them, and so does the simulator's compiled serving loop (simspec.sim.serve),
# so each rule has one copy. Admission and the KV reservation here know no
# prefix cache, and chunking and pricing encode a request's images when its
# prefill starts; the Scheduler extends those rules in Python where prefixes
# are cached or vLLM's encoder budget decides. The queues are arrays:
# ``waiting`` a ring (a preempted request goes back to its head), ``running``
# in admission order.


class Queues(NamedTuple):
    """The waiting and running requests, updated in place."""

    waiting: np.ndarray  # [N] int ring of request ids, FCFS from counts[WAIT_HEAD]
    running: np.ndarray  # [S] int request ids in admission order (S = max_num_seqs)
    counts: np.ndarray  # [3] int: WAIT_HEAD, WAIT_LEN, RUN_LEN


WAIT_HEAD, WAIT_LEN, RUN_LEN = range(3)


def new_queues(n: int, max_num_seqs: int) -> Queues:
    return Queues(np.zeros(max(n, 1), np.int64), np.zeros(max_num_seqs, np.int64), np.zeros(3, np.int64))


class Tokens(NamedTuple):
    """The Scheduler's per-request token counts (its fields of the same names), updated in place."""

    context: np.ndarray  # [N] int prompt tokens, text + visual
    visual: np.ndarray  # [N] int visual tokens
    output: np.ndarray  # [N] int tokens to generate
    cache: np.ndarray  # [N] int tokens in the KV cache
    target: np.ndarray  # [N] int tokens to prefill
    drafted: np.ndarray  # [N] int draft tokens of the last round
    emitted: np.ndarray  # [N] int tokens generated so far
    hit: np.ndarray  # [N] int prefix-cache hit at the latest admission (0 without prefix caching)
    shared: np.ndarray  # [N] int tokens of the cache held in a shared prefix entry (0 without prefix caching)


class Limits(NamedTuple):
    max_num_seqs: int
    max_num_batched_tokens: int
    kv_budget: int  # tokens
    reserve: int  # tokens a decode request may grow by in one step
    block_size: int  # tokens


@jit
def blocks(tokens: int, block_size: int) -> int:
    """``tokens`` rounded up to whole KV blocks."""
    return tokens if block_size == 1 else -(-tokens // block_size) * block_size


@jit
def arrive(q: Queues, i: int) -> None:
    q.waiting[(q.counts[WAIT_HEAD] + q.counts[WAIT_LEN]) % len(q.waiting)] = i
    q.counts[WAIT_LEN] += 1


@jit
def held(tok: Tokens, lim: Limits, i: int) -> int:
    """KV tokens request ``i`` holds or will once prefilled, in whole blocks,
    besides the shared prefix blocks it uses (counted once, by the PrefixCache)."""
    return blocks(max(tok.cache[i], tok.target[i]) - tok.shared[i], lim.block_size)


@jit
def kv_used(q: Queues, tok: Tokens, lim: Limits) -> int:
    """KV tokens the running requests hold (:func:`held`)."""
    used = 0
    for j in range(q.counts[RUN_LEN]):
        used += held(tok, lim, q.running[j])
    return used


@jit
def admit(q: Queues, tok: Tokens, lim: Limits, budgeted: bool, token_budget: int, admitted: np.ndarray) -> int:
    """Step 1: admit waiting requests FCFS while max_num_seqs and the KV
    budget allow (each needs its prompt and one more token); ``budgeted``
    (vLLM's rule), only while ``token_budget`` less the running requests'
    prefill left has room. Writes them to ``admitted``; returns how many."""
    used = kv_used(q, tok, lim)
    left = token_budget
    if budgeted:
        for j in range(q.counts[RUN_LEN]):
            i = q.running[j]
            left -= max(tok.target[i] - tok.cache[i], 0)
    count = 0
    while q.counts[WAIT_LEN] > 0 and q.counts[RUN_LEN] < lim.max_num_seqs and (not budgeted or left > 0):
        i = q.waiting[q.counts[WAIT_HEAD]]
        need = blocks(tok.target[i] + 1, lim.block_size)
        if used + need > lim.kv_budget:
            break
        q.counts[WAIT_HEAD] = (q.counts[WAIT_HEAD] + 1) % len(q.waiting)
        q.counts[WAIT_LEN] -= 1
        q.running[q.counts[RUN_LEN]] = i
        q.counts[RUN_LEN] += 1
        admitted[count] = i
        count += 1
        used += need
        if budgeted:
            left -= tok.target[i]
    return count


@jit
def preempt(q: Queues, tok: Tokens, i: int) -> None:
    """Free request ``i``'s KV cache; it waits at the queue's head and will
    prefill its prompt and the tokens it already emitted again."""
    tok.target[i] = tok.context[i] + tok.emitted[i]
    tok.cache[i] = 0
    tok.drafted[i] = 0
    head = q.counts[WAIT_HEAD]
    q.counts[WAIT_HEAD] = head - 1 if head > 0 else len(q.waiting) - 1
    q.waiting[q.counts[WAIT_HEAD]] = i
    q.counts[WAIT_LEN] += 1


@jit
def decode_batch(q: Queues, tok: Tokens, lim: Limits, decode: np.ndarray, preempted: np.ndarray,
                 requeued: np.ndarray) -> tuple[int, int, int]:
    """Step 2 (Scheduler.decode_batch): preempt the newest running request
    until every decoding one can grow by ``reserve``. Writes the decode
    batch, the preempted requests and those sent back before any prefill
    (never started: not a preemption); returns their counts."""
    npre = nreq = 0
    while True:
        r = q.counts[RUN_LEN]
        need = 0
        decoding = 0
        for j in range(r):
            i = q.running[j]
            need += held(tok, lim, i)
            if tok.cache[i] >= tok.target[i]:
                decoding += 1
        if need + decoding * lim.reserve <= lim.kv_budget or r == 1:
            nd = 0
            for j in range(r):
                i = q.running[j]
                if tok.cache[i] >= tok.target[i]:
                    decode[nd] = i
                    nd += 1
            return nd, npre, nreq
        i = q.running[r - 1]
        q.counts[RUN_LEN] -= 1
        if tok.cache[i] > tok.hit[i]:
            preempted[npre] = i
            npre += 1
        else:
            requeued[nreq] = i
            nreq += 1
        preempt(q, tok, i)


@jit
def in_budget(tok: Tokens, lim: Limits, decode: np.ndarray, nd: int) -> int:
    """vLLM's rule: decode requests take 1 + their draft tokens from the
    step's token budget in order; how many of ``decode[:nd]`` it holds (the
    rest skip the step)."""
    total = 0
    for j in range(nd):
        total += 1 + tok.drafted[decode[j]]
        if total > lim.max_num_batched_tokens:
            return j
    return nd


@jit
def budget_left(tok: Tokens, lim: Limits, decode: np.ndarray, nd: int) -> int:
    """Tokens of the step's budget ``decode[:nd]``'s rounds leave for prefill chunks."""
    left = lim.max_num_batched_tokens
    for j in range(nd):
        left -= 1 + tok.drafted[decode[j]]
    return left


@jit
def prefill_chunks(q: Queues, tok: Tokens, lim: Limits, decode: np.ndarray, nd: int, chunk_ids: np.ndarray,
                   takes: np.ndarray) -> int:
    """Step 3: (request, tokens) chunks FCFS in the budget ``decode[:nd]``'s
    rounds leave, written to ``chunk_ids`` and ``takes``; returns how many."""
    budget = budget_left(tok, lim, decode, nd)
    count = 0
    if budget <= 0:
        return count
    for j in range(q.counts[RUN_LEN]):
        i = q.running[j]
        if tok.target[i] > tok.cache[i]:  # prompt left, in admission order
            if budget <= 0:
                break
            take = min(tok.target[i] - tok.cache[i], budget)
            chunk_ids[count] = i
            takes[count] = take
            count += 1
            budget -= take
    return count


@jit
def prefill_cost(tok: Tokens, chunk_ids: np.ndarray, takes: np.ndarray, count: int) -> "Prefill":
    """Step 4: what the chunks cost the step's forward; a request's images
    are encoded when its prefill starts."""
    tokens = pairs = kv = vision = longest = 0
    for c in range(count):
        i, take = chunk_ids[c], takes[c]
        done = tok.cache[i]
        longest = max(longest, done)
        tokens += take
        kv += done + take
        pairs += take * done + take * (take + 1) // 2  # causal: each new token sees those before it
        if done == tok.hit[i]:  # the prefill starts (after any prefix-cache hit, images first)
            vision += tok.visual[i] - min(tok.hit[i], tok.visual[i])
    return Prefill(tokens, pairs, kv, count, vision, longest)


@jit
def complete_prefill(tok: Tokens, chunk_ids: np.ndarray, takes: np.ndarray, count: int, first: np.ndarray) -> int:
    """After the step: the chunks are in the cache; those whose prefill
    completed sampled their next token (written to ``first``; returns how many)."""
    done = 0
    for c in range(count):
        i = chunk_ids[c]
        tok.cache[i] += takes[c]
        if tok.cache[i] >= tok.target[i]:
            tok.emitted[i] += 1
            first[done] = i
            done += 1
    return done


@jit
def retire(q: Queues, tok: Tokens, done: np.ndarray) -> int:
    """The running requests that have emitted their output, removed
    (written to ``done`` in admission order; returns how many)."""
    count = kept = 0
    for j in range(q.counts[RUN_LEN]):
        i = q.running[j]
        if tok.emitted[i] >= tok.output[i]:
            done[count] = i
            count += 1
        else:
            q.running[kept] = i
            kept += 1
    q.counts[RUN_LEN] = kept
    return count


class Scheduler:
    """Admission, preemption and chunking over requests ``0..N-1`` (module docstring).

    ``context``, ``visual`` and ``output`` are each request's prompt tokens
    (text + visual), visual tokens and output tokens; ``reserve_tokens`` is
    what a decode request may grow by in one step (1 + the deepest draft).
    """

    def __init__(self, *, context: np.ndarray, visual: np.ndarray, output: np.ndarray, max_num_seqs: int,
                 max_num_batched_tokens: int, kv_budget_tokens: int, reserve_tokens: int,
                 images: list[tuple[int, ...]] | None = None, block_size: int = 1,
                 prefixes: tuple[np.ndarray, np.ndarray] | None = None):
        """``images`` (each request's visual tokens per image, at the
        prompt's start in order): given, the vision encoder runs under
        vLLM's per-step encoder budget, max(max_num_batched_tokens, the
        largest image) (vllm/v1/core/encoder_cache_manager.py 0.33
        l.373-378): an image is encoded in the step whose chunk reaches it,
        and a chunk stops short of an image the budget cannot take
        (vllm/v1/core/sched/scheduler.py l.2018-2210). Without, a request's
        images are all encoded in the step its prefill starts.

        ``prefixes`` (each request's prefix_id and prefix_tokens, as
        Request has them): given, the engine caches prefixes (PrefixCache):
        a request admitted while its prefix's blocks are cached starts with
        them computed, and holds only the rest."""
        n = len(context)
        self.prefixes = PrefixCache(*prefixes, block_size) if prefixes is not None else None
        self.shared = np.zeros(n, np.int64)  # [N] tokens of the cache held in a shared prefix entry
        self.cached_tokens = np.zeros(n, np.int64)  # [N] prefix-cache hit when first scheduled
        self.hit = np.zeros(n, np.int64)  # [N] prefix-cache hit at the request's latest admission
        self.block_size = block_size  # KV is held in blocks of this many tokens (vLLM: 16)
        self.images = images
        if images is not None:
            largest = max((t for imgs in images for t in imgs), default=0)
            self.encoder_budget = max(max_num_batched_tokens, largest)
        self.context = np.asarray(context, dtype=np.int64)  # [N] prompt tokens, text + visual
        self.visual = np.asarray(visual, dtype=np.int64)  # [N] visual tokens
        self.output = np.asarray(output, dtype=np.int64)  # [N] tokens to generate
        self.cache = np.zeros(n, np.int64)  # [N] tokens in the KV cache
        self.target = self.context.copy()  # [N] tokens to prefill: the prompt, + what was emitted on recompute
        self.drafted = np.zeros(n, np.int64)  # [N] draft tokens of the request's last round
        self.emitted = np.zeros(n, np.int64)  # [N] tokens generated so far
        self.max_num_seqs, self.max_num_batched_tokens = max_num_seqs, max_num_batched_tokens
        self.kv_budget, self.reserve = kv_budget_tokens, reserve_tokens
        # The compiled rules' view of the same state (the rules section above).
        seqs = max(1, min(max_num_seqs, n))
        self.queues = new_queues(n, seqs)
        self.tokens = Tokens(self.context, self.visual, self.output, self.cache, self.target, self.drafted,
                             self.emitted, self.hit, self.shared)
        self.limits = Limits(int(max_num_seqs), int(max_num_batched_tokens), int(kv_budget_tokens),
                             int(reserve_tokens), int(block_size))
        self._lists = [np.zeros(seqs, np.int64) for _ in range(4)]  # the rules' outputs

    def check_fits(self) -> None:
        """Refuse a workload with a request the KV budget can never hold."""
        need = self.context + self.output + self.reserve
        worst = int(np.argmax(need)) if len(need) else 0
        require(not len(need) or need[worst] <= self.kv_budget,
                f"kv_cache_tokens {self.kv_budget} cannot hold request {worst} "
                f"({int(need[worst]) if len(need) else 0} tokens with its output); raise kv_cache_tokens")

    @property
    def running(self) -> list[int]:
        """The running requests in admission order (the newest is preempted first)."""
        return self._running().tolist()

    @property
    def waiting(self) -> list[int]:
        """The waiting requests, first come first."""
        q = self.queues
        head, length = int(q.counts[WAIT_HEAD]), int(q.counts[WAIT_LEN])
        return [int(q.waiting[(head + k) % len(q.waiting)]) for k in range(length)]

    def _running(self) -> np.ndarray:
        return self.queues.running[:self.queues.counts[RUN_LEN]]

    @property
    def idle(self) -> bool:
        return not self.queues.counts[RUN_LEN] and not self.queues.counts[WAIT_LEN]

    def arrive(self, i: int) -> None:
        arrive(self.queues, i)

    def held(self, ids: np.ndarray) -> np.ndarray:
        """KV tokens each request holds or will once prefilled, in whole
        blocks, besides the shared prefix blocks it uses (counted once, in
        :meth:`kv_used`); the compiled :func:`held`, over an array."""
        return self._blocks(np.maximum(self.cache[ids], self.target[ids]) - self.shared[ids])

    def _blocks(self, tokens):
        """``tokens`` (an int or an array) rounded up to whole KV blocks (:func:`blocks`)."""
        b = self.block_size
        return tokens if b == 1 else -(-tokens // b) * b

    @property
    def shared_in_use(self) -> int:
        """KV tokens of cached prefixes some running request uses (held once)."""
        return self.prefixes.in_use if self.prefixes is not None else 0

    def kv_used(self) -> int:
        return kv_used(self.queues, self.tokens, self.limits) + self.shared_in_use

    def admit(self, token_budget: int | None = None) -> list[int]:
        """Step 1: the requests admitted now, in order. With
        ``token_budget`` (vLLM's rule: a waiting request is admitted only
        when its first chunk is scheduled), only while the budget left by
        the running requests' rounds and prefills has room."""
        if self.prefixes is None:
            out = self._lists[0]
            return out[:admit(self.queues, self.tokens, self.limits, token_budget is not None, token_budget or 0,
                              out)].tolist()
        return self._admit_cached(token_budget)

    def _admit_cached(self, token_budget: int | None) -> list[int]:
        """:func:`admit` where prefixes are cached: a request admitted while
        its prefix's blocks are cached starts with them (the hit) and needs
        only the rest, plus the entry's room if no running request used it."""
        used, admitted = self.kv_used(), []
        left = None
        if token_budget is not None:
            ids = self._running()
            left = token_budget - int(np.maximum(self.target[ids] - self.cache[ids], 0).sum()) if len(ids) else token_budget
        q, counts = self.queues, self.queues.counts
        while counts[WAIT_LEN] and counts[RUN_LEN] < self.max_num_seqs and (left is None or left > 0):
            i = int(q.waiting[counts[WAIT_HEAD]])
            hit, extra = self.prefixes.lookup(i, int(self.target[i]))
            need = self._blocks(int(self.target[i]) + 1 - hit) + extra
            if used + need > self.kv_budget:
                break
            counts[WAIT_HEAD] = (counts[WAIT_HEAD] + 1) % len(q.waiting)
            counts[WAIT_LEN] -= 1
            q.running[counts[RUN_LEN]] = i
            counts[RUN_LEN] += 1
            admitted.append(i)
            used += need
            if hit:
                self.prefixes.use(i)
                self.cache[i] = self.shared[i] = hit
            self.hit[i] = hit
            if not self.prefixes.seen[i]:
                self.prefixes.seen[i] = True
                self.cached_tokens[i] = hit
            if left is not None:
                left -= int(self.target[i]) - hit
        self.prefixes.evict(self.kv_budget - used)
        return admitted

    def decode_batch(self) -> tuple[np.ndarray, list[int], list[int]]:
        """Step 2: the decode batch (running requests past their prefill, in
        admission order) after preempting until its step fits; the requests
        preempted (their KV cache dropped); and those sent back to the queue
        before any of their prompt ran (admitted, never started: not a
        preemption)."""
        if self.prefixes is None:
            decode, preempted, requeued = self._lists[:3]
            nd, npre, nreq = decode_batch(self.queues, self.tokens, self.limits, decode, preempted, requeued)
            return decode[:nd].copy(), preempted[:npre].tolist(), requeued[:nreq].tolist()
        preempted, requeued = [], []
        while True:  # :func:`decode_batch`, with the shared prefixes' blocks counted once
            ids = self._running()
            decoding = self.cache[ids] >= self.target[ids]
            need = int(self.held(ids).sum() + decoding.sum() * self.reserve) + self.shared_in_use
            if need <= self.kv_budget or len(ids) == 1:
                self.prefixes.evict(self.kv_budget - need)
                return ids[decoding].copy(), preempted, requeued
            i = int(ids[-1])
            self.queues.counts[RUN_LEN] -= 1
            (preempted if self.cache[i] > self.hit[i] else requeued).append(i)
            preempt(self.queues, self.tokens, i)
            self._release(i)

    def in_budget(self, decode: np.ndarray) -> np.ndarray:
        """vLLM's rule: running requests take 1 + their draft tokens from the
        step's token budget in order; those it cannot hold skip the step."""
        decode = np.asarray(decode, dtype=np.int64)
        return decode[:in_budget(self.tokens, self.limits, decode, len(decode))]

    def round_tokens(self, decode: np.ndarray) -> np.ndarray:
        """Tokens each decoding request's round takes from the step's budget: 1 + its draft tokens."""
        return 1 + self.drafted[decode]

    def budget_left(self, decode: np.ndarray) -> int:
        """Tokens of the step's budget ``decode``'s rounds leave for prefill chunks."""
        decode = np.asarray(decode, dtype=np.int64)
        return int(budget_left(self.tokens, self.limits, decode, len(decode)))

    def prefill_chunks(self, decode: np.ndarray) -> list[tuple[int, int]]:
        """Step 3: (request, tokens) chunks FCFS in the budget ``decode``'s rounds leave."""
        decode = np.asarray(decode, dtype=np.int64)
        if self.images is None:
            ids, takes = self._lists[:2]
            count = prefill_chunks(self.queues, self.tokens, self.limits, decode, len(decode), ids, takes)
            return list(zip(ids[:count].tolist(), takes[:count].tolist()))
        budget = self.budget_left(decode)
        chunks = []
        if budget <= 0 or not self.queues.counts[RUN_LEN]:
            return chunks
        encoder_left = self.encoder_budget
        ids = self._running()
        for i in ids[self.target[ids] > self.cache[ids]].tolist():  # those with prompt left, in admission order
            if budget <= 0:
                break
            take = min(int(self.target[i] - self.cache[i]), budget)
            take, encoder_left = self._encode(i, take, encoder_left)
            if take <= 0:  # stopped at an image the encoder budget cannot take: the next request may run
                continue
            chunks.append((i, take))
            budget -= take
        return chunks

    def _release(self, i: int) -> None:
        """Request ``i`` no longer uses its shared prefix's blocks (they stay cached, evictable)."""
        if self.shared[i]:
            self.prefixes.release(i)
            self.shared[i] = 0

    def _images_reached(self, i: int, take: int) -> Iterator[tuple[int, int]]:
        """(start, tokens) of request ``i``'s images that a chunk of ``take``
        tokens from its cache starts: those the chunk encodes. An image
        before the cache was encoded by an earlier chunk (a chunk never ends
        inside an image it did not encode), and a preempted request, its
        cache dropped, encodes its images again."""
        done, start = int(self.cache[i]), 0
        for tokens in self.images[i]:
            if done <= start < done + take:
                yield start, tokens
            start += tokens

    def _encode(self, i: int, take: int, encoder_left: int) -> tuple[int, int]:
        """The chunk of request ``i`` once its images are encoded, and the
        encoder budget left: cut before the first image it cannot take."""
        for start, tokens in self._images_reached(i, take):
            if tokens > encoder_left:
                return start - int(self.cache[i]), encoder_left
            encoder_left -= tokens
        return take, encoder_left

    def _chunk_arrays(self, chunks: list[tuple[int, int]]) -> tuple[np.ndarray, np.ndarray]:
        ids, takes = self._lists[:2]
        for c, (i, take) in enumerate(chunks):
            ids[c], takes[c] = i, take
        return ids, takes

    def prefill(self, chunks: list[tuple[int, int]]) -> Prefill:
        """Step 4: what ``chunks`` cost the step's forward."""
        if self.images is None:
            return Prefill(*(int(v) for v in prefill_cost(self.tokens, *self._chunk_arrays(chunks), len(chunks))))
        tokens = pairs = kv = vision = longest = 0
        for i, take in chunks:  # :func:`prefill_cost`, each chunk encoding the images it reaches
            done = int(self.cache[i])
            longest = max(longest, done)
            tokens += take
            kv += done + take
            pairs += take * done + take * (take + 1) // 2  # causal: each new token sees those before it
            vision += sum(tokens for _, tokens in self._images_reached(i, take))
        return Prefill(tokens, pairs, kv, len(chunks), vision, longest)

    def complete_prefill(self, chunks: list[tuple[int, int]]) -> list[int]:
        """After the step: the chunks are in the cache; the requests whose
        prefill completed sampled their next token (returned, in order)."""
        first = self._lists[2]
        count = complete_prefill(self.tokens, *self._chunk_arrays(chunks), len(chunks), first)
        if self.prefixes is not None:
            for i, _ in chunks:
                if not self.shared[i]:
                    self.shared[i] = self.prefixes.store(i, int(self.cache[i]))
        return first[:count].tolist()

    def retire(self) -> list[int]:
        """The running requests that have emitted their output, removed."""
        out = self._lists[0]
        done = out[:retire(self.queues, self.tokens, out)].tolist()
        for i in done:
            self._release(i)
        return done


class PrefixCache:
    """Shared prefixes' KV blocks, as vLLM V1's automatic prefix caching
    keeps them (vllm/v1/core/kv_cache_manager.py, block_pool.py 0.33): a
    prefix's full blocks are cached once a request has computed them; a
    request admitted later with the same prefix starts with them computed
    (at most prompt - 1 tokens, as vLLM recomputes the last one,
    kv_cache_manager.py l.296-302) and shares them; blocks no request uses
    stay cached but are free, evicted least recently used first when the
    cache needs their room. A prefix is one entry (its blocks come and go
    together, as every user of a prefix holds all of them)."""

    def __init__(self, prefix_id: np.ndarray, prefix_tokens: np.ndarray, block_size: int):
        self.block_size = block_size
        self.prefix_id = np.asarray(prefix_id, dtype=np.int64)  # [N] -1: nothing shared
        self.blocks = np.asarray(prefix_tokens, dtype=np.int64) // block_size * block_size  # [N] full blocks' tokens
        self.entries: OrderedDict[int, list[int]] = OrderedDict()  # prefix -> [tokens, users], LRU first
        self.in_use = 0  # tokens of entries some request uses
        self.free = 0  # tokens of cached entries no request uses (evictable)
        self.seen = np.zeros(len(self.prefix_id), dtype=bool)  # [N] first scheduled already

    def lookup(self, i: int, target: int) -> tuple[int, int]:
        """(tokens request ``i`` finds cached, tokens of room the hit takes
        from free memory: an evictable entry becoming used)."""
        entry = self.entries.get(int(self.prefix_id[i]))
        if entry is None:
            return 0, 0
        hit = min(entry[0], (target - 1) // self.block_size * self.block_size)
        return (hit, entry[0] if entry[1] == 0 else 0) if hit > 0 else (0, 0)

    def use(self, i: int) -> None:
        entry = self.entries[int(self.prefix_id[i])]
        if entry[1] == 0:
            self.free -= entry[0]
            self.in_use += entry[0]
        entry[1] += 1
        self.entries.move_to_end(int(self.prefix_id[i]))

    def store(self, i: int, cached: int) -> int:
        """After request ``i``'s chunk: its prefix blocks become a cache
        entry once computed, if none holds them yet. Returns the tokens ``i``
        now shares (0: none)."""
        p, tokens = int(self.prefix_id[i]), int(self.blocks[i])
        if p < 0 or tokens == 0 or cached < tokens or p in self.entries:
            return 0
        self.entries[p] = [tokens, 1]
        self.in_use += tokens
        return tokens

    def release(self, i: int) -> None:
        p = int(self.prefix_id[i])
        entry = self.entries[p]
        entry[1] -= 1
        if entry[1] == 0:
            self.in_use -= entry[0]
            self.free += entry[0]
            self.entries.move_to_end(p)  # freed blocks join the free queue's tail: evicted last

    def evict(self, room: int) -> None:
        """Drop unused entries, least recently used first, until the cached
        free ones fit in ``room`` tokens of free memory."""
        for p in [p for p, (_, users) in self.entries.items() if users == 0]:
            if self.free <= room:
                break
            self.free -= self.entries.pop(p)[0]


# -- the acceptance estimate ---------------------------------------------------------

RECENT_WEIGHT = 0.3  # weight of the newest round in a request's moving average of accepted tokens
POPULATION_WEIGHT = 0.05  # ... and in the replica-wide average a newly admitted request starts from
# A round a request does not draft tells nothing of its acceptance; its
# estimate relaxes toward the replica-wide one by this much a round, so a
# request that stopped drafting under load drafts again when it pays
# (without it, one unlucky start leaves a request at AR for good).
RELAX_WEIGHT = 0.1
MAX_PRIOR_ACCEPTED = 15.0


def prior_accepted(top1: float) -> float:
    """Accepted tokens per round a request is expected to have before it has
    any history: the geometric p / (1 - p) of top-1 acceptance ``top1``."""
    return float(min(top1 / (1.0 - top1), MAX_PRIOR_ACCEPTED))


@jit
def censored_accepted(accepted: int, depth: int, estimate: float) -> float:
    """A round's accepted tokens as evidence of how many the drafter would
    have had accepted with no depth limit: a round that accepted every level
    it verified says "at least ``depth``", and with geometric acceptance the
    expected count beyond is the current ``estimate`` (memoryless)."""
    return accepted + estimate if accepted >= depth else float(accepted)


@jit
def after_round(recent: np.ndarray, population: np.ndarray, i: int, drafted: int, accepted: int, depth: int) -> None:
    """Update request ``i``'s estimate (and the replica-wide one, ``population[0]``)
    after a round that verified ``drafted`` draft tokens ``depth`` deep and
    accepted ``accepted``; a round without drafts relaxes it toward the replica's."""
    if drafted > 0:
        recent[i] = (1.0 - RECENT_WEIGHT) * recent[i] + RECENT_WEIGHT * censored_accepted(accepted, depth, recent[i])
        seen = censored_accepted(accepted, depth, population[0])
        population[0] = (1.0 - POPULATION_WEIGHT) * population[0] + POPULATION_WEIGHT * seen
    else:  # no draft, no evidence: the estimate drifts back to the replica's
        recent[i] = (1.0 - RELAX_WEIGHT) * recent[i] + RELAX_WEIGHT * population[0]


class Estimate:
    """Each request's moving average of accepted draft tokens per drafted
    round (``recent[N]``) and the replica-wide one (``population[1]``)."""

    def __init__(self, n: int, top1: float):
        self.recent = np.ones(n)
        self.population = np.array([prior_accepted(top1)])

    def start(self, i: int) -> None:
        """A newly admitted request's history starts as the replica's."""
        self.recent[i] = self.population[0]

    def after_round(self, i: int, drafted: int, accepted: int, depth: int) -> None:
        after_round(self.recent, self.population, i, drafted, accepted, depth)


__all__ = ["EngineConfig", "Scheduler", "Prefill", "NO_PREFILL", "Estimate", "after_round", "censored_accepted",
           "prior_accepted", "RECENT_WEIGHT", "POPULATION_WEIGHT", "RELAX_WEIGHT", "Queues", "Tokens", "Limits",
           "new_queues", "admit", "decode_batch", "in_budget", "budget_left", "prefill_chunks", "prefill_cost",
           "complete_prefill", "retire", "kv_used", "arrive"]
