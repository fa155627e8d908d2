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

import dataclasses
import functools
import math
import types
import typing
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
MAX_IMAGE_SIDE = 16384
"""Pixels a side an image size may give (workloads, traces and the models' image rules)."""


INT64_MAX = (1 << 63) - 1


class InputError(ValueError):
    """Bad user input. The message is one line that names the field and the
    allowed range; the CLI prints it and exits non-zero."""


def require(ok: bool, message: str) -> None:
    """Raise :class:`InputError` with ``message`` unless ``ok``."""
    if not ok:
        raise InputError(message)


@functools.cache
def _hints(cls) -> dict:
    return typing.get_type_hints(cls)


def _allowed(kind) -> tuple:
    """The plain types an annotation allows: ``int | None`` -> (int, NoneType)."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return tuple(t for part in typing.get_args(kind) for t in _allowed(part))
    return (typing.get_origin(kind) or kind,)


_NAMES = {int: "an integer", float: "a number", str: "a string", bool: "true or false", tuple: "a list",
          type(None): "unset"}


def checked(name: str, value, annotation):
    """``value`` if it has the ``annotation``'s type (int, float, str, bool,
    a tuple, or None where allowed; ints become floats where a float is
    wanted), else an InputError naming ``name``. An int is never a bool; a
    float is a finite number; an int fits int64."""
    kinds = _allowed(annotation)
    if any(k not in _NAMES for k in kinds):
        return value  # a record or another type: its own check
    for kind in kinds:
        if kind is type(None):
            ok = value is None
        elif kind is int:
            ok = isinstance(value, int) and not isinstance(value, bool)
            if ok and not -INT64_MAX <= value <= INT64_MAX:
                raise InputError(f"{name} must be an integer below 2^63 (got {value})")
        elif kind is float:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool)
            if ok and not math.isfinite(value):
                raise InputError(f"{name} must be a finite number (got {value})")
            if ok:
                return float(value)  # 6 and 6.0 are one setting, with one TOML
        elif kind is tuple:
            ok = isinstance(value, tuple)
        else:
            ok = isinstance(value, kind)
        if ok:
            return value
    raise InputError(f"{name} must be {' or '.join(_NAMES[k] for k in kinds)} (got {value!r})")


def field_types(cls) -> dict:
    """A dataclass's field annotations, resolved (cached)."""
    return _hints(cls)


def check_types(record) -> None:
    """Refuse a dataclass record whose fields do not have their annotated
    types (:func:`checked`): one InputError naming the field. Records call
    it first in ``__post_init__``, so a TOML ``seed = 1.5`` or ``model =
    ["a"]`` is refused before any range check."""
    hints = _hints(type(record))
    for f in dataclasses.fields(record):
        value = getattr(record, f.name)
        ok = checked(f.name, value, hints[f.name])
        if ok is not value:
            object.__setattr__(record, f.name, ok)


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
    # The first ``prefix_tokens`` tokens of the context (text + visual, as
    # the engine lays it out) are the same as every other request's with this
    # ``prefix_id`` (a system prompt, a repeated image); -1: none shared.
    prefix_id: int = -1
    prefix_tokens: int = 0
    task: str = ""  # its class (simspec.acceptance.classes): what it asks for; "": none

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
    cached_tokens: int = 0  # prompt tokens found in the prefix cache when first scheduled (vLLM's num_cached_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptanceTrace:
    """One drafted round of a live run along the drafter's rank-1 chain:
    what acceptance models are fitted to (``acceptance_traces.jsonl``, one
    :meth:`to_json` object a line)."""

    request: int  # request id
    output_index: int  # index in the request's output of the depth-1 token
    context: int  # tokens in the request's KV cache before the round
    ranks: tuple[int, ...]  # [D] the target token's rank among the drafter's candidates (0: none recorded)
    conf: tuple[tuple[float, ...], ...]  # [D, R] the drafter's confidences at each depth, best first
    policy: str = ""  # the policy that served the round, where known

    def to_json(self) -> dict:
        row = {"policy": self.policy} if self.policy else {}
        return {**row, "request": self.request, "output_index": self.output_index, "context": self.context,
                "ranks": list(self.ranks), "conf": [list(c) for c in self.conf]}

    @classmethod
    def from_json(cls, row: dict) -> "AcceptanceTrace":
        """A trace from :meth:`to_json`'s object; a missing or mistyped field raises InputError."""
        try:
            ranks = tuple(int(r) for r in row["ranks"])
            conf = tuple(tuple(float(c) for c in level) for level in row["conf"])
            require(len(conf) == len(ranks), f"conf has {len(conf)} depths and ranks {len(ranks)}")
            return cls(request=int(row["request"]), output_index=int(row.get("output_index", 0)),
                       context=int(row.get("context", 0)), ranks=ranks, conf=conf, policy=str(row.get("policy", "")))
        except (KeyError, TypeError, ValueError) as err:
            raise InputError(f"acceptance trace {str(row)[:80]}: {err}") from None


class RequestTable(typing.NamedTuple):
    """How every request of a run went, as columns: what ``requests.csv``,
    the metrics and the plots read (a RequestRecord per row, :meth:`records`).
    Times are seconds; NaN where a request never got that far."""

    id: np.ndarray  # [N] int
    arrival_s: np.ndarray  # [N] float
    admitted_s: np.ndarray  # [N] float, first scheduled (queueing delay = admitted - arrival)
    first_token_s: np.ndarray  # [N] float
    finish_s: np.ndarray  # [N] float
    prompt_tokens: np.ndarray  # [N] int
    output_tokens: np.ndarray  # [N] int
    images: np.ndarray  # [N] int
    visual_tokens: np.ndarray  # [N] int
    preemptions: np.ndarray  # [N] int
    cached_tokens: np.ndarray  # [N] int, prompt tokens the prefix cache held when first scheduled

    @classmethod
    def of(cls, records) -> "RequestTable":
        """The table of RequestRecords (numpy's arrays, imported here only when called)."""
        import numpy

        kinds = {"arrival_s": float, "admitted_s": float, "first_token_s": float, "finish_s": float}
        return cls(**{name: numpy.array([getattr(r, name) for r in records], dtype=kinds.get(name, numpy.int64))
                      for name in cls._fields})

    def records(self) -> tuple[RequestRecord, ...]:
        columns = [c.tolist() for c in self]
        return tuple(RequestRecord(**dict(zip(self._fields, row))) for row in zip(*columns))


@dataclass(frozen=True, slots=True, kw_only=True)
class RoundStats:
    """The drafted rounds of a run, counted: what the acceptance metrics need."""

    rounds: int = 0  # drafted rounds
    accepted: int = 0  # accepted draft tokens, all rounds
    drafted: int = 0  # draft tokens, all rounds
    accepted_at_least: tuple[int, ...] = ()  # [j-1] rounds that accepted >= j tokens, j = 1..MAX_DEPTH
    depth_at_least: tuple[int, ...] = ()  # [j-1] rounds that planned depth >= j


@dataclass(frozen=True, slots=True, kw_only=True)
class Gaps:
    """The gaps between consecutive chunks of each request (ITL), pooled:
    every gap, in request order and then time order, while there are at
    most ``simspec.logs.EXACT_GAPS``; beyond, their count in fine log-spaced
    bins (``simspec.logs.GAP_BINS``), their mean and spread."""

    count: int = 0
    exact_s: np.ndarray | None = None  # [G] float every gap, or None when binned
    exact_request: np.ndarray | None = None  # [G] int the row of ``RunLog.table`` each gap is of
    bins: np.ndarray | None = None  # [GAP_BINS] int counts, when binned
    mean_s: float = 0.0
    m2_s2: float = 0.0  # sum of squared deviations from the mean


@dataclass(frozen=True, slots=True, kw_only=True)
class StepStats:
    """A run's engine steps, summed (kept whatever the run's length)."""

    steps: int = 0
    busy_s: float = 0.0  # time the engine ran steps
    plans: tuple[int, int, int] = (0, 0, 0)  # rounds planned AR / linear / tree
    decode_busy_s: float = 0.0  # time of the steps with a decode batch
    batch_busy_s: float = 0.0  # their batch sizes x durations (/ decode_busy_s: the time-weighted mean batch)


@dataclass(frozen=True, slots=True, kw_only=True)
class Timeline:
    """Steps over time in equal bins from 0 (at most a few thousand, the
    width doubling as the run grows): what the over-time plots draw."""

    width_s: float = 1.0
    tokens: np.ndarray | None = None  # [T] tokens emitted in each bin
    plans: np.ndarray | None = None  # [T, 3] rounds planned AR / linear / tree in each bin


@dataclass(frozen=True, slots=True, kw_only=True)
class RunLog:
    """Everything a run measured: the input of metrics, plots and CSVs.

    Token emissions are chunks: one per request per round, all tokens of a
    chunk sharing the step's end time (as a streaming server sends them).
    Memory stays bounded however long the run: per request a row of
    ``table``; steps, rounds and chunk gaps as sums and counts (``steps``,
    ``timeline``, ``rounds``, ``gaps``). The per-step, per-chunk and
    per-round arrays are kept only while a run has at most
    ``simspec.logs.DETAIL_STEPS`` steps and ``DETAIL_EVENTS`` chunks (None
    beyond): golden timelines, tests and small runs' plots read them. The
    per-chunk and per-round ones are None also where a run leaves them out
    (simspec.sim.simulate's ``event_detail``, as ``simspec simulate`` does).
    """

    policy: str
    table: RequestTable
    rounds: RoundStats
    gaps: Gaps
    steps: StepStats
    timeline: Timeline
    start_s: float  # first arrival
    end_s: float  # last finish
    rounds_total: int = 0  # verification rounds, drafted or not
    complete: bool = True
    notes: tuple[str, ...] = field(default_factory=tuple)
    chunk_request: np.ndarray | None = None  # [C] int request id of each emitted chunk
    chunk_time_s: np.ndarray | None = None  # [C] float emission time
    chunk_tokens: np.ndarray | None = None  # [C] int tokens in the chunk
    round_accepted: np.ndarray | None = None  # [Rd] int accepted draft tokens of each drafted round
    round_depth: np.ndarray | None = None  # [Rd] int planned depth of each drafted round
    round_drafted: np.ndarray | None = None  # [Rd] int draft tokens of each drafted round
    step_start_s: np.ndarray | None = None  # [S] float (kept up to simspec.logs.DETAIL_STEPS steps)
    step_duration_s: np.ndarray | None = None  # [S] float
    step_plans: np.ndarray | None = None  # [S, 3] int rounds planned as AR / linear / tree
    step_batch: np.ndarray | None = None  # [S] int decode batch size
    step_tokens: np.ndarray | None = None  # [S] int tokens emitted at the step's end

    @property
    def requests(self) -> tuple[RequestRecord, ...]:
        """One record per request (built from ``table``: for small runs and tests)."""
        return self.table.records()
