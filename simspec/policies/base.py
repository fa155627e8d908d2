"""What every policy shares: its input (:class:`ReplicaView`, a snapshot of
the replica), its output (:class:`StepPlan`), the Policy interface and the
bridge from a view to the compiled decision rules.

Imports: numpy, simspec.costs.base, simspec.policies.rules. A policy is a
frozen dataclass whose fields are its parameters; ``plan(view)`` is a pure
function of the snapshot, computed by ``rules.plan_batch`` (the same
compiled rule the simulator's step loop calls).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from simspec.costs.base import CostModel
from simspec.policies import rules


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
class Policy(ABC):
    name: ClassVar[str] = ""
    kernel: ClassVar[int] = rules.AR  # which compiled rule decides
    needs_truth: ClassVar[bool] = False  # shown the target's true ranks (oracle only)

    @property
    def max_depth(self) -> int:
        """Draft depth of the confidences (and true ranks) a round needs."""
        return 0

    @property
    def max_rank(self) -> int:
        """Candidate ranks of the confidences a round needs."""
        return 1

    @property
    def max_verify_tokens(self) -> int:
        """Tokens a request verifies in a round at most: 1 + its draft nodes."""
        return 1 + self.max_depth

    @abstractmethod
    def params(self) -> np.ndarray:
        """The parameters as the compiled rule reads them: float64 [P]."""

    @property
    def label(self) -> str:
        """The policy as the CLI names it: ``linear:k=5``."""
        params = ",".join(f"{f.name}={getattr(self, f.name)}" for f in fields(self))
        return f"{self.name}:{params}" if params else self.name

    def plan(self, view: ReplicaView) -> StepPlan:
        """The verification plan of every decode request in this step."""
        b = view.batch
        depth, ranks = max(self.max_depth, 1), self.max_rank
        if self.max_depth == 0:  # plans without confidences
            conf = np.ones((b, 1, 1))
        elif view.conf.ndim != 3 or view.conf.shape[0] != b or view.conf.shape[1] < depth or view.conf.shape[2] < ranks:
            raise ValueError(f"view.conf must be [B={b}, D>={depth}, R>={ranks}] for {self.label} "
                             f"(got {list(view.conf.shape)})")
        else:
            conf = view.conf
        truth = view.true_ranks if view.true_ranks is not None else np.zeros((b, depth), dtype=np.int64)
        batch = rules.Batch(
            _ints(view.context_tokens), _ints(view.visual_tokens), _ints(view.kept_visual_tokens),
            _ints(view.remaining_tokens), np.ascontiguousarray(view.recent_accepted, dtype=np.float64),
            np.ascontiguousarray(conf, dtype=np.float64), _ints(truth), int(view.prefill_tokens),
            int(view.prefill_attn_pairs), int(view.prefill_kv_tokens), int(view.prefill_requests),
            int(view.vision_tokens), int(view.prefill_max_context))
        plan = rules.plan_batch(self.kernel, self.params(), batch, view.costs.tables)
        return StepPlan(kind=plan.kind, codes=plan.codes, num_nodes=plan.num_nodes, draft_steps=plan.draft_steps,
                        draft_width=plan.draft_width,
                        kept_visual_tokens=np.where(plan.draft_steps > 0, view.kept_visual_tokens, 0))


def _ints(values) -> np.ndarray:
    return np.ascontiguousarray(values, dtype=np.int64)


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


__all__ = ["Policy", "ReplicaView", "StepPlan", "parse_table"]
