"""What every policy shares: its input (:class:`ReplicaView`, a snapshot of
the replica), its output (:class:`StepPlan`), the Policy interface and the
bridge from a view to the compiled decision rules.

Imports: numpy, simspec.costs.base, simspec.policies.rules. A policy is a
frozen dataclass whose fields are its parameters; ``plan(view)`` is a pure
function of the snapshot, computed by ``rules.plan_batch`` (the same
compiled rule the simulator's step loop calls).
"""

from __future__ import annotations

from abc import ABC
from dataclasses import dataclass, fields
from typing import ClassVar

import numpy as np

from simspec.costs.base import CostModel
from simspec.policies import rules


@dataclass(frozen=True, slots=True, kw_only=True)
class ReplicaView:
    """What a policy may look at when it plans a step: one row per decode
    request, plus the step's other work and the cost model to price plans.

    Callers outside the simulator (the live engine, tests) build it, and
    :func:`compiled_batch` turns it into the compiled rules' record
    (simspec.policies.pricing.Batch, the same fields by name); the
    simulator's compiled step loop builds that record itself.
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


StepPlan = rules.Plan
"""The verification plan of one step, one row per decode request: the
compiled rule's own record (simspec.policies.pricing.Plan). Nodes are
rank-path codes (see the glossary); the parent of a node is its code with
the top depth's bits cleared, so a plan is a tree by construction when it
is closed under that operation."""


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

    def params(self) -> np.ndarray:
        """The parameters as the compiled rule reads them: float64 [P], the
        fields of the rule's record (rules.PARAMS) in its order."""
        record = rules.PARAMS.get(self.kernel)
        if record is None:
            return np.zeros(1)  # AR: none
        return np.array([getattr(self, name) for name in record._fields], dtype=float)

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
        return rules.plan_batch(self.kernel, self.params(), compiled_batch(view, conf, depth), view.costs.tables)


def compiled_batch(view: ReplicaView, conf: np.ndarray, depth: int) -> rules.Batch:
    """The view as the compiled rules read it (rules.Batch, the same fields
    by name), with the confidences ``conf`` the policy reads; the target's
    true ranks are zeros ``depth`` deep unless the view carries them."""
    truth = view.true_ranks if view.true_ranks is not None else np.zeros((view.batch, depth), dtype=np.int64)
    given = {"conf": np.ascontiguousarray(conf, dtype=np.float64), "true_ranks": _ints(truth),
             "recent_accepted": np.ascontiguousarray(view.recent_accepted, dtype=np.float64)}
    for name in rules.Batch._fields:
        if name not in given and name != "table_key":
            value = getattr(view, name)
            given[name] = _ints(value) if isinstance(value, np.ndarray) else int(value)
    return rules.Batch(**given)


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


__all__ = ["Policy", "ReplicaView", "StepPlan", "compiled_batch", "parse_table"]
