"""The cost model: seconds for each piece of an engine step, as tables.

Imports: numpy and simspec.types. Every cost model is one shape: per-token
tables for what depends on a token count alone (the target's decoder
layers, the LM head, the vision encoder, a drafter step) and coefficients
for attention, whose cost depends on the context it reads:

    forward(T, L, K, work) = layers[T] + head[L] + blend(sum_k mem_k, sum_k compute_k)
                             + sum_k (floor_k + R_k * request_k + Q_k * query_k) + K * padded_s
    mem_k     = kv_k * kv_s_k + max(kv_k - kv_knee_k, 0) * kv_over_k
    compute_k = (P_k * pair_s_k + max(P_k - pair_knee_k, 0) * pair_over_k) * W_k(Q_k)

with T query tokens, L logit rows, and for each kind k of attention call
(prefill chunks; the decode requests' rounds, or their verification when
any of them verifies drafts, as SGLang runs a batch in its decode or its
target-verify mode) kv_k context tokens read, P_k query x key pairs, R_k
sequences and Q_k query tokens, W_k the wave quantisation of the call's
thread blocks (:func:`wave_factor`; 1 where a model has no such term); ``blend`` is the smooth maximum of memory
and compute time. The per-sequence and per-query terms are what a kernel
spends on each sequence and each query row besides reading keys and
computing scores (setup, softmax rows), the floor what a call costs at
all; the knees are where the data a call touches outgrows a cache, past
which each token or pair costs the extra ``*_over`` (a CPU's last-level
cache, a GPU's L2). Closed forms and live-step fits
give every kind the same coefficients and leave floors, knees and the
per-sequence and per-query terms 0 where they do not measure them; then
the kinds price exactly as one call (the roofline prior has a floor,
per-sequence and per-query terms per kind: simspec.costs.roofline). K is the step's
attention rows times its longest cached context: an engine that gathers
the batch's caches into one dense, padded tensor each step (simspec's live
engine) pays for every slot of it; paged attention does not, and profiles
and priors leave ``padded_s`` 0. Roofline
priors, closed forms and (later) fitted profiles all render to this form,
so the simulator and planners price any of them by table lookups, also
inside compiled loops (``CostTables``, ``Forward``, ``Step``).

One cost is not a step's shape but what came before it: the first step
after the engine sat idle for ``g`` seconds costs ``wake_s * (1 -
exp(-g / wake_tau_s))`` more, of which the step after pays the share
``wake_next_share`` (what the first step did not touch: the drafter's
weights after a prefill) (caches, TLBs and page tables gone cold; a
GPU's clocks ramping up from idle). Only fits to live engine steps measure
it; elsewhere it is 0.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.types import StepShape, require

TABLE_TOKENS = 1 << 15  # token counts tabulated; beyond, the last slope extrapolates
BLEND_P = 4  # p of the p-norm that blends memory-bound and compute-bound time


def blend(memory_s, compute_s):
    """Smooth, monotone max of memory-bound and compute-bound time."""
    return (memory_s**BLEND_P + compute_s**BLEND_P) ** (1.0 / BLEND_P)


@jit
def blend_root(total: float) -> float:
    """``total ** (1 / BLEND_P)`` in compiled pricing, BLEND_P being 4: two
    square roots, within an ulp of the power (each square root is correctly
    rounded) at a fraction of its cost; the adaptive rules price a step's
    blend at every node they weigh."""
    return np.sqrt(np.sqrt(total))


def lookup(table: np.ndarray, tokens):
    """table[tokens] for an int or int array, extrapolating past the end."""
    last = len(table) - 1
    if isinstance(tokens, (int, np.integer)):
        if tokens <= last:
            return float(table[tokens])
        return float(table[last] + (tokens - last) * (table[last] - table[last - 1]))
    tokens = np.asarray(tokens, dtype=np.int64)
    inside = np.minimum(tokens, last)
    return table[inside] + (tokens - inside) * (table[last] - table[last - 1])


def frozen_table(values) -> np.ndarray:
    table = np.ascontiguousarray(np.broadcast_to(np.asarray(values, dtype=float), (TABLE_TOKENS,)))
    table.flags.writeable = False
    return table


ZERO_TABLE = frozen_table(0.0)
TOKENS = np.arange(TABLE_TOKENS, dtype=float)

PREFILL, DECODE, VERIFY = 0, 1, 2  # kinds of attention call: rows of CostModel.attention
ATTENTION_KINDS = ("prefill", "decode", "verify")
# Columns of CostModel.attention (whole model, every layer; knees in tokens / pairs).
A_FLOOR, A_KV, A_KV_OVER, A_KV_KNEE, A_PAIR, A_PAIR_OVER, A_PAIR_KNEE, A_REQUEST, A_QUERY, A_WAVE_TOKENS, \
    A_WAVE_SHARE = range(11)
ATTENTION_TERMS = ("floor_s", "kv_s", "kv_over_s", "kv_knee", "pair_s", "pair_over_s", "pair_knee", "request_s",
                   "query_s", "wave_tokens", "wave_share")


def attention_row(kv_s=0.0, pair_s=0.0, request_s=0.0, query_s=0.0, floor_s=0.0, kv_over_s=0.0, kv_knee=0.0,
                  pair_over_s=0.0, pair_knee=0.0, wave_tokens=0.0, wave_share=0.0) -> np.ndarray:
    """One kind's coefficients in the column order of ``ATTENTION_TERMS``
    (``wave_tokens`` 0: no wave quantisation, :func:`wave_factor`)."""
    return np.array([floor_s, kv_s, kv_over_s, kv_knee, pair_s, pair_over_s, pair_knee, request_s, query_s,
                     wave_tokens, wave_share])


def attention_table(prefill: np.ndarray, decode: np.ndarray, verify: np.ndarray) -> np.ndarray:
    """[3, 11] read-only: a CostModel's ``attention`` from one row per kind."""
    table = np.ascontiguousarray(np.stack([prefill, decode, verify]), dtype=float)
    table.flags.writeable = False
    return table


def uniform_attention(**terms) -> np.ndarray:
    """Every kind priced alike (``attention_row``'s terms): one call's form."""
    row = attention_row(**terms)
    return attention_table(row, row, row)


ZERO_ATTENTION = uniform_attention()


class LocalAttention(NamedTuple):
    """Layers that attend only within their query's chunk of the sequence
    (Llama 4's chunked attention: a query at position p sees positions
    p // chunk x chunk .. p), a ``share`` of the model's layers; the others
    attend to the whole context. The attention coefficients price every
    layer alike, so a step's keys read and query x key pairs enter them as
    the layers' mean (:func:`attended_context`, :func:`attended_span`):
    exact where attention is linear in them, the mean's where a fit has a
    cache knee."""

    chunk: int  # tokens a chunk; 0: every layer attends to the whole context
    share: float  # of the layers


NO_LOCAL = LocalAttention(0, 0.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class CostModel:
    """Seconds for the pieces of an engine step (module docstring)."""

    label: str  # shown with every result, e.g. "roofline prior: H100 / LLaVA-1.5-7B"
    calibrated: bool  # True only for models fitted to measurements of this device
    partly_calibrated: bool = False  # some pieces measured, the rest from the roofline prior
    overhead_s: float = 0.0  # fixed per step (scheduling, sampling, launches): the engine's CPU part
    overhead_s_per_request: float = 0.0  # ... and per sequence the step runs (input preparation, output processing)
    # Tables, [TABLE_TOKENS]: all decoder layers by query tokens T; the LM head by logit rows.
    layers_s: np.ndarray = field(default_factory=lambda: ZERO_TABLE, repr=False, compare=False)
    head_s: np.ndarray = field(default_factory=lambda: ZERO_TABLE, repr=False, compare=False)
    # [3, 11] attention by kind (rows PREFILL, DECODE, VERIFY; columns ATTENTION_TERMS; module docstring)
    attention: np.ndarray = field(default_factory=lambda: ZERO_ATTENTION, repr=False, compare=False)
    kv_s_per_padded_token: float = 0.0  # one slot of a dense, padded cache batch (module docstring); 0: paged
    # Tables, [TABLE_TOKENS]: the vision encoder by visual tokens; one drafter step by its tokens.
    vision_s_table: np.ndarray = field(default_factory=lambda: ZERO_TABLE, repr=False, compare=False)
    draft_s_table: np.ndarray = field(default_factory=lambda: ZERO_TABLE, repr=False, compare=False)
    draft_s_per_kept: float = 0.0  # a drafter step reading one kept visual token
    draft_s_per_round: float = 0.0  # a step that drafts at all: fixed (proposer set-up, rejection sampling)
    draft_s_per_round_request: float = 0.0  # ... and per request that drafts in it
    draft_s_cross_call: float = 0.0  # a drafter step that cross-attends (kept tokens > 0): fixed
    draft_s_cross_row: float = 0.0  # ... and per draft row
    select_launch_s: float = 0.0  # visual-token selection: fixed per step that selects
    select_s_per_key: float = 0.0  # ... per visual key scored
    select_s_per_key_sq: float = 0.0  # ... per request, per its visual keys squared (caches overflowing)
    # An engine with CUDA graphs (EngineConfig.cudagraph_mode) pays these on
    # top of a step replayed as a full graph: attention launched eagerly
    # between graph pieces, or the whole step launched eagerly (above the
    # largest captured size). 0 where the model has no measurement of them.
    graph_piecewise_s: float = 0.0
    graph_eager_s: float = 0.0
    wake_s: float = 0.0  # the first step after a long idle spell costs this much more (module docstring)
    wake_tau_s: float = 1.0  # ... reached as 1 - exp(-idle / wake_tau_s)
    wake_next_share: float = 0.0  # ... of which the step after pays this share
    local: LocalAttention = NO_LOCAL  # layers attending within chunks (the model's: costs.build sets it)

    def __post_init__(self):
        require(self.wake_s >= 0, f"wake_s must be >= 0 seconds (got {self.wake_s})")
        require(self.graph_piecewise_s >= 0 and self.graph_eager_s >= 0,
                f"graph_piecewise_s and graph_eager_s must be >= 0 seconds (got {self.graph_piecewise_s}, "
                f"{self.graph_eager_s})")
        require(self.wake_tau_s > 0, f"wake_tau_s must be > 0 seconds (got {self.wake_tau_s})")
        require(0 <= self.wake_next_share <= 1, f"wake_next_share must be in [0, 1] (got {self.wake_next_share})")

    def wake_cost_s(self, idle_s):
        """Extra seconds for the first step after ``idle_s`` seconds (a
        float or an array) with nothing to run and the step after it, together."""
        if np.ndim(idle_s) == 0:
            return wake_cost(self.wake, float(idle_s))
        return self.wake_s * -np.expm1(-np.maximum(idle_s, 0.0) / self.wake_tau_s)

    def wake_split_s(self, idle_s):
        """:meth:`wake_cost_s` as (the first step's part, the step after's)."""
        if np.ndim(idle_s) == 0:
            return wake_split(self.wake, float(idle_s))
        total = self.wake_cost_s(idle_s)
        return total * (1.0 - self.wake_next_share), total * self.wake_next_share

    @property
    def wake(self) -> "WakeTerms":
        """The wake cost's terms, for compiled loops (:func:`wake_split`)."""
        return WakeTerms(self.wake_s, self.wake_tau_s, self.wake_next_share)

    def forward_s(self, tokens, kv_read_tokens, attn_pairs, logit_tokens, requests=0, padded_kv_tokens=0, *,
                  prefill=(0, 0, 0, 0), verifying=False):
        """One target forward over ``tokens`` query tokens of ``requests``
        sequences; ``prefill`` = (tokens, kv, pairs, requests) is the part of
        those totals that prefill chunks are, the rest are decode rounds, or
        verification when ``verifying``. The compiled :func:`forward_cost`,
        element by element over array arguments."""
        out = _forward_each(self.tables, tokens, kv_read_tokens, attn_pairs, logit_tokens, requests,
                            padded_kv_tokens, *prefill, verifying)
        return float(out) if np.ndim(out) == 0 else out

    def vision_s(self, vision_tokens):
        """Vision encoder producing ``vision_tokens`` visual tokens."""
        return lookup(self.vision_s_table, vision_tokens)

    def draft_level_s(self, tokens, kept_visual_tokens):
        """One drafter step over ``tokens`` draft positions of the batch."""
        cross = (self.draft_s_cross_call + tokens * self.draft_s_cross_row) * (kept_visual_tokens > 0)
        return lookup(self.draft_s_table, tokens) + cross + kept_visual_tokens * self.draft_s_per_kept

    def select_s(self, requests, visual_tokens):
        """Visual-token selection for ``requests`` requests over ``visual_tokens`` keys."""
        squared = visual_tokens**2 / requests * self.select_s_per_key_sq if requests > 0 else 0.0
        return self.select_launch_s * (requests > 0) + visual_tokens * self.select_s_per_key + squared

    @property
    def calibration(self) -> str:
        """``calibrated``, ``partly calibrated`` or ``uncalibrated``, as every result shows it."""
        return "calibrated" if self.calibrated else "partly calibrated" if self.partly_calibrated else "uncalibrated"

    @property
    def tables(self) -> "CostTables":
        """The model as compiled loops read it."""
        return CostTables(self.overhead_s, self.layers_s, self.head_s, self.attention, self.kv_s_per_padded_token,
                          self.vision_s_table, self.draft_s_table, self.draft_s_per_kept, self.draft_s_cross_call,
                          self.draft_s_cross_row, self.select_launch_s, self.select_s_per_key, self.select_s_per_key_sq,
                          self.overhead_s_per_request, self.draft_s_per_round, self.draft_s_per_round_request,
                          self.local)

    def step_s(self, shape: StepShape) -> float:
        """Seconds for one engine step (the simulator's own formula)."""
        forward = Forward(shape.forward_tokens, shape.kv_read_tokens, shape.attn_pairs, shape.logit_tokens,
                          shape.attn_requests, shape.padded_kv_tokens, shape.prefill_tokens, shape.prefill_kv_tokens,
                          shape.prefill_attn_pairs, shape.prefill_requests, shape.verifying)
        return step_cost(self.tables, Step(forward, shape.vision_tokens,
                                           np.asarray(shape.draft_level_tokens, dtype=np.int64),
                                           shape.draft_kept_visual_tokens, shape.select_requests,
                                           shape.select_visual_tokens))

    def marginal_token_s(self, shape: StepShape, context_tokens: int = 0) -> float:
        """Extra seconds for one more verified token (of a request with
        ``context_tokens`` of context) in a step of this shape: near zero in
        the memory-bound region, the compute slope beyond the knee."""
        t, kv, pairs, logits = shape.forward_tokens, shape.kv_read_tokens, shape.attn_pairs, shape.logit_tokens
        r, padded = shape.attn_requests, shape.padded_kv_tokens
        prefill = (shape.prefill_tokens, shape.prefill_kv_tokens, shape.prefill_attn_pairs, shape.prefill_requests)
        return float(self.forward_s(t + 1, kv, pairs + context_tokens, logits + 1, r, padded, prefill=prefill,
                                    verifying=True)
                     - self.forward_s(t, kv, pairs, logits, r, padded, prefill=prefill, verifying=True))


class CostTables(NamedTuple):
    """A CostModel's numbers, for compiled loops (same fields, same units)."""

    overhead_s: float
    layers_s: np.ndarray
    head_s: np.ndarray
    attn: np.ndarray  # [3, 11] CostModel.attention
    kv_s_per_padded: float
    vision_s: np.ndarray
    draft_s: np.ndarray
    draft_s_per_kept: float
    draft_cross_call: float
    draft_cross_row: float
    select_launch_s: float
    select_s_per_key: float
    select_s_per_key_sq: float
    overhead_per_request: float
    draft_round_s: float
    draft_round_request_s: float
    local: LocalAttention


class WakeTerms(NamedTuple):
    """CostModel's wake cost (module docstring), for compiled loops."""

    wake_s: float
    tau_s: float
    next_share: float


@jit
def wake_cost(w: WakeTerms, idle_s: float) -> float:
    """CostModel.wake_cost_s for one idle spell of ``idle_s`` seconds."""
    return w.wake_s * -np.expm1(-max(idle_s, 0.0) / w.tau_s)


@jit
def wake_split(w: WakeTerms, idle_s: float) -> tuple[float, float]:
    """CostModel.wake_split_s for one idle spell: (the first step's part, the step after's)."""
    total = wake_cost(w, idle_s)
    return total * (1.0 - w.next_share), total * w.next_share


@jit
def cpu_s(t: CostTables, requests: int) -> float:
    """The engine's CPU part of a step over ``requests`` sequences."""
    return t.overhead_s + requests * t.overhead_per_request


@jit
def table_at(table: np.ndarray, tokens: int) -> float:
    """table[tokens], extrapolating past the end with the last slope.

    Every read comes before the one branch: numba then drops the
    reference count it takes on the table (a pair of atomic calls per call
    otherwise, and the planners call this in their innermost loops)."""
    last = len(table) - 1
    inside = table[min(tokens, last)]
    past = table[last] + (tokens - last) * (table[last] - table[last - 1])
    return inside if tokens <= last else past


def wave_factor(queries, wave_tokens, wave_share):
    """Wave quantisation of a call's thread blocks: ceil(B / SMs) / (B / SMs)
    with B / SMs = ceil(queries / wave_tokens) x wave_share (a block per
    ``wave_tokens`` query tokens, ``wave_share`` = blocks per query tile /
    SMs), so a last, partial wave costs a whole one; 1 under one wave (the
    kernel then splits keys across blocks to fill the GPU) and where
    ``wave_tokens`` is 0 (no such term). NumPy, on floats and arrays; the
    compiled :func:`attention_parts` computes the same."""
    waves = np.ceil(queries / np.maximum(wave_tokens, 1.0)) * wave_share
    return np.where((wave_tokens > 0) & (waves > 1.0), np.ceil(waves) / np.maximum(waves, 1.0), 1.0)


class Attention(NamedTuple):
    """One kind's row of CostModel.attention (ATTENTION_TERMS, same units)
    as plain numbers: a compiled loop that prices many calls of one kind
    binds it once and passes no array (numba counts a reference for every
    array a call receives, an atomic operation at each call)."""

    floor_s: float
    kv_s: float
    kv_over_s: float
    kv_knee: float
    pair_s: float
    pair_over_s: float
    pair_knee: float
    request_s: float
    query_s: float
    wave_tokens: float
    wave_share: float


@jit
def attention_kind(a: np.ndarray, kind: int) -> Attention:
    """Row ``kind`` of CostModel.attention ``a`` [3, 11]."""
    return Attention(a[kind, A_FLOOR], a[kind, A_KV], a[kind, A_KV_OVER], a[kind, A_KV_KNEE], a[kind, A_PAIR],
                     a[kind, A_PAIR_OVER], a[kind, A_PAIR_KNEE], a[kind, A_REQUEST], a[kind, A_QUERY],
                     a[kind, A_WAVE_TOKENS], a[kind, A_WAVE_SHARE])


@jit
def attention_parts(a: np.ndarray, kind: int, kv: int, pairs: int, requests: int, queries: int):
    """(memory s, compute s, linear s) of one kind's attention call (module docstring)."""
    return call_parts(attention_kind(a, kind), kv, pairs, requests, queries)


@jit
def call_parts(t: Attention, kv: int, pairs: int, requests: int, queries: int):
    """:func:`attention_parts` of a call priced by the row ``t``."""
    memory = kv * t.kv_s + max(kv - t.kv_knee, 0.0) * t.kv_over_s
    compute = pairs * t.pair_s + max(pairs - t.pair_knee, 0.0) * t.pair_over_s
    if t.wave_tokens > 0 and queries > 0:
        waves = np.ceil(queries / t.wave_tokens) * t.wave_share
        if waves > 1.0:
            compute *= np.ceil(waves) / waves
    linear = requests * t.request_s + queries * t.query_s
    if queries > 0:
        linear += t.floor_s
    return memory, compute, linear


@jit
def attended_context(a: LocalAttention, context: int) -> int:
    """Keys a decode query after ``context`` cached tokens attends to, the
    layers' mean (:class:`LocalAttention`): a chunked layer skips the
    chunks before its query's, context // chunk x chunk tokens. Rounded to
    a token; ``context`` itself without chunked layers."""
    if a.chunk == 0:
        return context
    return context - int(a.share * (context // a.chunk * a.chunk) + 0.5)


@jit
def causal_pairs(start: int, end: int) -> int:
    """Query x key pairs of the queries at positions start..end - 1 of one
    sequence, each seeing every position up to its own."""
    n = end - start
    return n * start + n * (n + 1) // 2


@jit
def _chunked_pairs(end: int, chunk: int) -> int:
    """:func:`causal_pairs` (0, end) when each query sees only its own chunk."""
    whole, part = end // chunk, end % chunk
    return whole * (chunk * (chunk + 1) // 2) + part * (part + 1) // 2


@jit
def attended_span(a: LocalAttention, done: int, take: int) -> tuple[int, int]:
    """(keys read, query x key pairs) of a prefill chunk of ``take`` tokens
    after ``done`` cached ones, the layers' mean: a full layer reads the
    cache and the chunk, each query paired with every position up to its
    own; a chunked layer reads from the first query's chunk on, each query
    paired within its own chunk. Rounded to a token and a pair."""
    kv, pairs = done + take, causal_pairs(done, done + take)
    if a.chunk == 0:
        return kv, pairs
    local_kv = done % a.chunk + take
    local_pairs = _chunked_pairs(done + take, a.chunk) - _chunked_pairs(done, a.chunk)
    return kv - int(a.share * (kv - local_kv) + 0.5), pairs - int(a.share * (pairs - local_pairs) + 0.5)


class Forward(NamedTuple):
    """One target forward, for compiled code: totals over the batch, of
    which the ``prefill_*`` part is prefill chunks and the rest decode
    rounds (priced as verification when ``verifying``)."""

    tokens: int  # query tokens
    kv_tokens: int  # KV tokens attention reads
    pairs: int  # query x key pairs
    logits: int  # logit rows (LM head)
    requests: int  # sequences attended
    padded: int  # attention rows x the longest cached context
    prefill_tokens: int
    prefill_kv: int
    prefill_pairs: int
    prefill_requests: int
    verifying: bool


class Step(NamedTuple):
    """One engine step, for compiled code: its forward, the vision encoder,
    the drafter's calls and selection."""

    forward: Forward
    vision_tokens: int  # visual tokens the vision encoder produces
    level_tokens: np.ndarray  # [calls] int rows of each drafter call
    kept: int  # kept visual tokens the drafter cross-attends to (batch)
    select_requests: int  # requests running selection
    select_keys: int  # visual keys they score


@jit
def forward_cost(t: CostTables, f: Forward) -> float:
    """Seconds of a target forward (module docstring)."""
    m1, c1, l1 = attention_parts(t.attn, PREFILL, f.prefill_kv, f.prefill_pairs, f.prefill_requests,
                                 f.prefill_tokens)
    m2, c2, l2 = attention_parts(t.attn, VERIFY if f.verifying else DECODE, f.kv_tokens - f.prefill_kv,
                                 f.pairs - f.prefill_pairs, f.requests - f.prefill_requests,
                                 f.tokens - f.prefill_tokens)
    memory, compute = m1 + m2, c1 + c2
    attention = blend_root(memory ** BLEND_P + compute ** BLEND_P) + l1 + l2 + f.padded * t.kv_s_per_padded
    return table_at(t.layers_s, f.tokens) + table_at(t.head_s, f.logits) + attention


def _forward_one(t: CostTables, *fields) -> float:
    return forward_cost(t, Forward(*fields))


_forward_each = np.vectorize(_forward_one, otypes=[float], excluded={0})


@jit
def draft_cost(t: CostTables, tokens: int, kept: int) -> float:
    cross = t.draft_cross_call + tokens * t.draft_cross_row if kept > 0 else 0.0
    return table_at(t.draft_s, tokens) + cross + kept * t.draft_s_per_kept


@jit
def select_cost(t: CostTables, requests: int, keys: int) -> float:
    return select_s(t.select_launch_s, t.select_s_per_key, t.select_s_per_key_sq, requests, keys)


@jit
def select_s(launch_s: float, per_key_s: float, per_key_sq_s: float, requests: int, keys: int) -> float:
    """:func:`select_cost` from its three numbers (for loops that keep them apart from the tables)."""
    if requests <= 0:
        return keys * per_key_s
    return launch_s + keys * per_key_s + keys * keys / requests * per_key_sq_s


@jit
def step_cost(t: CostTables, s: Step) -> float:
    """Seconds for one engine step: overhead + vision + forward + drafting + selection."""
    total = cpu_s(t, s.forward.requests) + forward_cost(t, s.forward)
    if s.vision_tokens > 0:
        total += table_at(t.vision_s, s.vision_tokens)
    if len(s.level_tokens) > 0:
        total += t.draft_round_s + (s.forward.requests - s.forward.prefill_requests) * t.draft_round_request_s
    for level in range(len(s.level_tokens)):
        total += draft_cost(t, s.level_tokens[level], s.kept)
    return total + select_cost(t, s.select_requests, s.select_keys)
