"""Records that cross module lines, and the project's glossary.

Imports: the standard library only (numpy appears in annotations, never at
run time), so every other module can depend on this one.

Glossary
--------
request        one user request: a prompt (text tokens + images) and an
               output length to generate.
visual tokens  the tokens an image becomes after the vision encoder
               (576 per image for LLaVA-1.5); *kept* visual tokens are the
               few (K) the drafter cross-attends to after selection.
step           one iteration of the replica's engine loop: prefill chunks,
               then for the decode batch plan / select / draft / verify /
               accept. One target forward per step.
round          one request's share of a step: a plan, its draft, one
               verification. Every round emits accepted + 1 tokens.
plan           what a policy decides for one request in one round: AR (no
               draft), a linear draft of k tokens, or a tree of draft nodes.
draft tokens   the nodes of a plan (tokens the drafter proposes).
accepted       draft tokens the target confirms (greedy, lossless).
bonus token    the target's own next token after the accepted path; every
               round emits it, so AR is the plan with zero draft tokens.
acceptance length
               emitted tokens per round = accepted + 1 (vLLM's
               ``spec_decode_acceptance_length``).
rank path      a draft node is named by the ranks of its tokens among the
               drafter's candidates along the path from the root: the chain
               of a linear draft is (1, 1, 1, ...). Encoded as an int64
               ``code``: 4 bits per depth, depth 1 in the low bits.

Units are suffixes: ``_s`` seconds (simulated time is seconds everywhere),
``_ms`` milliseconds, ``_tokens`` token counts, ``_bytes`` bytes.
Shape letters: B batch, D draft depth, R candidate ranks, M plan nodes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # annotations only: this module must not import numpy
    import numpy as np

RANK_BITS = 4
"""Bits per depth in a rank-path code."""
MAX_RANK = (1 << RANK_BITS) - 1
"""Largest candidate rank a plan can name (15)."""
MAX_DEPTH = 15
"""Deepest draft node a plan can name (15 x 4 bits fit an int64)."""


class InputError(ValueError):
    """Bad user input. The message is one line that names the field and the
    allowed range; the CLI prints it and exits non-zero."""


def require(ok: bool, message: str) -> None:
    """Raise :class:`InputError` with ``message`` unless ``ok``."""
    if not ok:
        raise InputError(message)


PLAN_AR, PLAN_LINEAR, PLAN_TREE = 0, 1, 2
"""What a round verifies: nothing (AR), a linear draft (the rank-1 chain) or a tree."""
PLAN_KINDS = ("ar", "linear", "tree")
"""The plan kinds' names, by value: the columns of RunLog.step_plans, metric and plot names."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Request:
    """One request of a workload, as it arrives at the replica."""

    id: int
    arrival_s: float
    prompt_tokens: int  # text tokens of the prompt
    image_tokens: tuple[int, ...] = ()  # visual tokens of each image
    output_tokens: int  # tokens to generate (>= 1)

    @property
    def images(self) -> int:
        return len(self.image_tokens)

    @property
    def visual_tokens(self) -> int:
        return sum(self.image_tokens)

    @property
    def context_tokens(self) -> int:
        """Prompt length the target prefills: text + visual tokens."""
        return self.prompt_tokens + self.visual_tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class StepShape:
    """Work in one engine step, the input of a cost model.

    Counts are batch totals; the per-level drafter work is a tuple because
    drafting is sequential (one drafter step per depth).
    """

    forward_tokens: int = 0  # query tokens through the target (prefill + verify)
    kv_read_tokens: int = 0  # KV-cache tokens read by attention (each request's context once)
    attn_pairs: int = 0  # sum over requests of query tokens x context tokens
    attn_requests: int = 0  # sequences attention runs over (prefill chunks + decode requests)
    padded_kv_tokens: int = 0  # attention rows x the longest cached context (a dense, padded cache batch)
    prefill_tokens: int = 0  # of forward_tokens: prefill chunks' (the rest: decode rounds)
    prefill_kv_tokens: int = 0  # of kv_read_tokens: prefill chunks'
    prefill_attn_pairs: int = 0  # of attn_pairs: prefill chunks'
    prefill_requests: int = 0  # of attn_requests: prefill chunks
    verifying: bool = False  # some decode round verifies drafts: the rounds run as verification
    logit_tokens: int = 0  # positions whose logits are computed (LM head)
    vision_tokens: int = 0  # visual tokens produced by the vision encoder this step
    draft_level_tokens: tuple[int, ...] = ()  # drafter tokens at each draft depth
    draft_kept_visual_tokens: int = 0  # kept visual tokens the drafter cross-attends to (batch)
    select_visual_tokens: int = 0  # visual tokens scored by selection (batch)
    select_requests: int = 0  # requests running selection


@dataclass(frozen=True, slots=True, kw_only=True)
class StepPlan:
    """The verification plan of one step: one row per decode request.

    Nodes are rank-path codes (see the glossary); the parent of a node is its
    code with the top depth's bits cleared, so a plan is a tree by
    construction when it is closed under that operation.
    """

    kind: np.ndarray  # [B] int8 plan kind (PLAN_AR, PLAN_LINEAR, PLAN_TREE)
    codes: np.ndarray  # [B, M] int64 rank-path codes of draft nodes, -1 = unused
    num_nodes: np.ndarray  # [B] int draft tokens per request
    draft_steps: np.ndarray  # [B] int drafter steps run (depth drafted)
    draft_width: np.ndarray  # [B] int drafter tokens per depth after the first
    kept_visual_tokens: np.ndarray  # [B] int visual tokens the drafter sees


@dataclass(frozen=True, slots=True, kw_only=True)
class RequestRecord:
    """How one request went, for ``requests.csv``. Times are seconds."""

    id: int
    arrival_s: float
    admitted_s: float  # first scheduled (queueing delay = admitted - arrival)
    first_token_s: float
    finish_s: float
    prompt_tokens: int
    output_tokens: int
    images: int
    visual_tokens: int
    preemptions: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """Everything a run measured: the input of metrics, plots and CSVs.

    Token emissions are chunks: one per request per round, all tokens of a
    chunk sharing the step's end time (as a streaming server sends them).
    """

    policy: str
    requests: tuple[RequestRecord, ...]
    chunk_request: np.ndarray  # [C] int request id of each emitted chunk
    chunk_time_s: np.ndarray  # [C] float emission time
    chunk_tokens: np.ndarray  # [C] int tokens in the chunk
    round_accepted: np.ndarray  # [Rd] int accepted draft tokens of each drafted round
    round_depth: np.ndarray  # [Rd] int planned depth of each drafted round
    round_drafted: np.ndarray  # [Rd] int draft tokens of each drafted round
    step_start_s: np.ndarray  # [S] float
    step_duration_s: np.ndarray  # [S] float
    step_plans: np.ndarray  # [S, 3] int rounds planned as AR / linear / tree
    step_batch: np.ndarray  # [S] int decode batch size
    start_s: float  # first arrival
    end_s: float  # last finish
    rounds_total: int = 0  # verification rounds, drafted or not
    complete: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaView:
    """What a policy may look at when it plans a step: one row per decode
    request, plus the step's other work and the cost model to price plans.

    Callers outside the simulator (the live engine, tests) build it; the
    simulator's compiled step loop hands the same fields to the same
    compiled rule (simspec.policies.rules.Batch).
    """

    context_tokens: np.ndarray  # [B] int tokens in each request's KV cache
    visual_tokens: np.ndarray  # [B] int visual tokens in each request's context
    kept_visual_tokens: np.ndarray  # [B] int visual tokens the drafter cross-attends to
    remaining_tokens: np.ndarray  # [B] int output tokens still to generate (>= 1)
    recent_accepted: np.ndarray  # [B] float moving average of accepted draft tokens per drafted round
    conf: np.ndarray  # [B, D, R] drafter confidence of the rank-r candidate at depth d this round
    prefill_tokens: int  # prefill tokens already in this step
    prefill_attn_pairs: int  # their attention query x key pairs
    prefill_kv_tokens: int  # KV tokens their attention reads
    prefill_requests: int  # prefill chunks in this step (each samples one logit row)
    vision_tokens: int  # visual tokens the vision encoder produces this step
    costs: "CostModel"  # prices candidate steps (simspec.costs)
    true_ranks: np.ndarray | None = None  # [B, D] the target's ranks: only the oracle is shown them
    prefill_max_context: int = 0  # the longest context cached before a prefill chunk of this step

    @property
    def batch(self) -> int:
        return len(self.context_tokens)


if TYPE_CHECKING:
    from simspec.costs.base import CostModel
