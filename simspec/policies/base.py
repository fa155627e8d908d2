"""What every policy shares: plan assembly and pricing of candidate steps.

Imports: numpy, simspec.types, simspec.trees (the cost model arrives inside
the view). A policy is a frozen dataclass whose fields are its parameters and
whose ``plan(view)`` is a pure function of the snapshot.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

import numba
import numpy as np

from simspec import trees
from simspec.costs.base import BLEND_P, StepPrice
from simspec.types import PlanKind, ReplicaView, StepPlan, RANK_BITS

CHAIN = np.concatenate([[0], trees.chain_codes(15)])  # CHAIN[d]: code of the rank-1 chain node at depth d


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy(ABC):
    name: ClassVar[str] = ""
    needs_truth: ClassVar[bool] = False  # shown the target's true ranks (oracle only)

    @property
    def max_depth(self) -> int:
        """Draft depth of the confidences the view must carry."""
        return 0

    @property
    def max_rank(self) -> int:
        """Candidate ranks of the confidences the view must carry."""
        return 1

    @abstractmethod
    def plan(self, view: ReplicaView) -> StepPlan:
        """The verification plan of every decode request in this step."""

    @property
    def label(self) -> str:
        """The policy as the CLI names it: ``linear:k=5``."""
        params = ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{self.name}:{params}" if params else self.name


def ar_plan(view: ReplicaView) -> StepPlan:
    b = view.batch
    zeros = np.zeros(b, dtype=np.int64)
    return StepPlan(kind=np.zeros(b, dtype=np.int8), codes=np.empty((b, 0), dtype=np.int64), num_nodes=zeros,
                    draft_steps=zeros, draft_width=zeros, kept_visual_tokens=zeros)


def chain_plan(view: ReplicaView, k: np.ndarray, draft_steps: np.ndarray | None = None) -> StepPlan:
    """Linear drafts of ``k[i]`` tokens; the drafter runs ``draft_steps[i]``
    steps (default k: a truncated draft may have looked one further)."""
    b = view.batch
    k = np.broadcast_to(np.asarray(k, dtype=np.int64), (b,))
    width = int(k.max(initial=0))
    columns = np.arange(1, width + 1)
    codes = np.where(columns[None, :] <= k[:, None], CHAIN[1:width + 1][None, :], -1)
    steps = k if draft_steps is None else np.broadcast_to(np.asarray(draft_steps, dtype=np.int64), (b,))
    drafting = steps > 0
    return StepPlan(kind=np.where(k > 0, PlanKind.LINEAR, PlanKind.AR).astype(np.int8), codes=codes,
                    num_nodes=k.copy(), draft_steps=steps.copy(), draft_width=drafting.astype(np.int64),
                    kept_visual_tokens=np.where(drafting, view.kept_visual_tokens, 0))


def tree_plan(view: ReplicaView, codes: np.ndarray, width: int) -> StepPlan:
    """A plan from parent-closed node sets, -1 padded: [B, M] codes.
    Rows that form a rank-1 chain are linear; empty rows are AR."""
    valid = codes > 0
    rows = np.nonzero(valid)[0]
    return _packed_plan(view, rows, codes[valid], width)


def _packed_plan(view: ReplicaView, rows: np.ndarray, codes: np.ndarray, width: int) -> StepPlan:
    plan_codes, num, depth, kind = trees.pack_rows(rows, codes, view.batch)
    drafting = num > 0
    return StepPlan(kind=kind, codes=plan_codes, num_nodes=num, draft_steps=depth,
                    draft_width=np.where(kind == PlanKind.TREE, width, drafting.astype(np.int64)),
                    kept_visual_tokens=np.where(drafting, view.kept_visual_tokens, 0))


def step_price(view: ReplicaView, draft_width: int) -> StepPrice:
    """The view's step priced as a function of the draft tokens added to it.

    A step costs overhead + vision encoder + one target forward (prefill
    chunks + 1 + draft tokens per decode request) + drafter steps + visual
    selection when anything is drafted. Drafting prices every decode
    request's levels: one token at depth 1, ``draft_width`` after.
    """
    costs = view.costs
    ctx = int(view.context_tokens.sum())
    selecting = (view.kept_visual_tokens > 0) & (view.kept_visual_tokens < view.visual_tokens)
    select = costs.select_s(int(selecting.sum()), int(view.visual_tokens[selecting].sum()))
    kept = int(view.kept_visual_tokens.sum())
    first = costs.draft_level_s(view.batch, kept)
    later = costs.draft_level_s(view.batch * draft_width, kept)
    draft_s = np.zeros(trees.MAX_DEPTH + 1)
    draft_s[1:] = select + first + later * np.arange(trees.MAX_DEPTH)
    return StepPrice(fixed_s=costs.overhead_s + costs.vision_s(view.vision_tokens),
                     tokens0=view.prefill_tokens + view.batch, logits0=view.prefill_requests + view.batch,
                     kv_tokens=view.prefill_kv_tokens + ctx, pairs0=view.prefill_attn_pairs + ctx,
                     kv_s_per_token=costs.kv_s_per_token, attn_s_per_pair=costs.attn_s_per_pair,
                     layers_s=costs.layers_s, head_s=costs.head_s, draft_s=draft_s)


@numba.njit(cache=True, nogil=True)
def _lookup(table, tokens):
    last = len(table) - 1
    if tokens <= last:
        return table[tokens]
    return table[last] + (tokens - last) * (table[last] - table[last - 1])


@numba.njit(cache=True, nogil=True)
def _price(price, n, pairs, depth):
    attention = ((price.kv_tokens * price.kv_s_per_token) ** BLEND_P
                 + ((price.pairs0 + pairs) * price.attn_s_per_pair) ** BLEND_P) ** (1.0 / BLEND_P)
    return (price.fixed_s + _lookup(price.layers_s, price.tokens0 + n) + _lookup(price.head_s, price.logits0 + n)
            + attention + price.draft_s[depth])


@numba.njit(cache=True, nogil=True)
def _best_prefix(values, codes, depths, remaining, ctx, max_nodes, price):
    b = len(remaining)
    base = b / _price(price, 0, 0, 0)
    slope = _price(price, 1, 0, 0) - _price(price, 0, 0, 0)
    rows, chosen, value, depth = trees.ranked_candidates(values, codes, depths, remaining, base * max(slope, 0.0),
                                                         max_nodes)
    gain, pairs, deepest, best, take = float(b), 0, 0, base, 0
    for t in range(len(rows)):
        gain += value[t]
        pairs += ctx[rows[t]]
        deepest = max(deepest, depth[t])
        rate = gain / _price(price, t + 1, pairs, deepest)
        if rate > best:
            best, take = rate, t + 1
    return rows[:take], chosen[:take]


def best_prefix(view: ReplicaView, codes: np.ndarray, values: np.ndarray, depths: np.ndarray, *,
                width: int, max_nodes: int) -> StepPlan:
    """The load-adaptive rule over candidate nodes of every request.

    codes, values: [B, M] candidate nodes and their expected accepted tokens
    (path confidence); depths: [M] or [B, M]. Candidates are taken best value
    first across the whole batch (parents before children, since a child's
    value never exceeds its parent's); each prefix of that order is a plan.
    The step keeps the prefix with the most expected tokens per second: the
    greedy "add while the extra tokens per extra second beat the step's
    tokens per second" rule, taken to its best stopping point so that the
    drafter's fixed cost per depth does not stop it one node too early.

    Nodes worth less than (tokens per second without drafting) x (the
    cheapest extra token's cost) are skipped before sorting: with forward
    cost convex in tokens they can never raise the step's tokens per second.
    """
    b, m = codes.shape
    depths = np.ascontiguousarray(np.broadcast_to(depths, (b, m)))
    rows, chosen = _best_prefix(np.ascontiguousarray(values), np.ascontiguousarray(codes), depths,
                                view.remaining_tokens, view.context_tokens, max_nodes, step_price(view, width))
    return _packed_plan(view, rows, chosen, width)


def parse_table(text: str) -> tuple[tuple[int, int], ...]:
    """``"1:5,8:3"`` -> ((1, 5), (8, 3)): from batch size 1 draft 5, from 8 draft 3."""
    entries = []
    for part in text.split(","):
        lo, sep, k = part.partition(":")
        if not (sep and lo.strip().isdigit() and k.strip().isdigit()):
            raise ValueError(f"table entries look like MIN_BATCH:K (got {part!r})")
        entries.append((int(lo), int(k)))
    entries.sort()
    if not entries or entries[0][0] > 1:
        raise ValueError(f"table must start at batch size 1 (got {text!r})")
    return tuple(entries)


__all__ = ["Policy", "step_price", "ar_plan", "chain_plan", "tree_plan", "best_prefix", "parse_table", "CHAIN",
           "RANK_BITS"]
