"""Verification policies: pure functions of a replica snapshot.

Imports: numpy, simspec.types, simspec.trees, simspec.policies.base (never
simpy or torch): the simulator and the live engine call the same objects.
Policies (DESIGN.md "Policies"):

- ``ar``: no speculation.
- ``linear:k=K``: a fixed K-token draft.
- ``tree:depth=D,topk=T,budget=N``: EAGLE-2 dynamic tree.
- ``truncate:k_max=K,threshold=P``: linear draft cut when the drafter's
  cumulative confidence falls under P (a dynamic head).
- ``batch_table:table=1:5,8:3,...``: vLLM-style draft length per batch size.
- ``goodput:k_max=K``: SmartSpec-style; per request the draft length that
  maximises predicted accepted tokens per second, from its acceptance history.
- ``marginal:depth=D,topk=T,max_nodes=N``: the load-adaptive rule (Uni-LaSpec):
  add candidate nodes across all requests, best expected tokens per extra
  second first, while that beats the step's tokens per second.
- ``oracle:depth=D``: knows the target's tokens; an upper bound for reports.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from simspec import trees
from simspec.policies.base import Policy, ar_plan, best_prefix, chain_plan, parse_table, tree_plan
from simspec.types import InputError, MAX_DEPTH, MAX_RANK, ReplicaView, StepPlan


def _check(ok: bool, policy: str, message: str) -> None:
    if not ok:
        raise InputError(f"policy {policy}: {message}")


def _check_depth(policy: str, field: str, value: int) -> None:
    _check(1 <= value <= MAX_DEPTH, policy, f"{field} must be in 1..{MAX_DEPTH} (got {value})")


def _check_topk(policy: str, value: int) -> None:
    _check(1 <= value <= MAX_RANK, policy, f"topk must be in 1..{MAX_RANK} (got {value})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Ar(Policy):
    name = "ar"

    def plan(self, view: ReplicaView) -> StepPlan:
        return ar_plan(view)


@dataclass(frozen=True, slots=True, kw_only=True)
class Linear(Policy):
    name = "linear"
    k: int = 3

    def __post_init__(self):
        _check_depth(self.name, "k", self.k)

    @property
    def max_depth(self) -> int:
        return self.k

    def plan(self, view: ReplicaView) -> StepPlan:
        return chain_plan(view, np.full(view.batch, self.k))


@dataclass(frozen=True, slots=True, kw_only=True)
class Tree(Policy):
    name = "tree"
    depth: int = 6
    topk: int = 10
    budget: int = 60

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)
        _check_topk(self.name, self.topk)
        _check(self.budget >= 1, self.name, f"budget must be >= 1 (got {self.budget})")

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_rank(self) -> int:
        return self.topk

    def plan(self, view: ReplicaView) -> StepPlan:
        codes = trees.eagle_tree(view.conf, self.depth, self.topk, self.budget)
        plan = tree_plan(view, codes, self.topk)
        # EAGLE-2 drafts every level of its expansion, whatever it keeps.
        return _replace_steps(plan, np.full(view.batch, self.depth))


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncate(Policy):
    name = "truncate"
    k_max: int = 8
    threshold: float = 0.4

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)
        _check(0.0 < self.threshold < 1.0, self.name, f"threshold must be in (0, 1) (got {self.threshold})")

    @property
    def max_depth(self) -> int:
        return self.k_max

    def plan(self, view: ReplicaView) -> StepPlan:
        path = np.cumprod(view.conf[:, : self.k_max, 0], axis=1)  # [B, k_max]
        k = (path >= self.threshold).sum(axis=1)  # path confidence only falls, so this is a prefix
        # The drafter ran one step past the cut to see the confidence drop.
        return chain_plan(view, k, np.minimum(k + 1, self.k_max))


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTable(Policy):
    name = "batch_table"
    table: str = "1:5,8:4,16:3,32:2,64:1"

    def __post_init__(self):
        try:
            entries = parse_table(self.table)
        except ValueError as err:
            raise InputError(f"policy {self.name}: {err}") from None
        for _, k in entries:
            _check(0 <= k <= MAX_DEPTH, self.name, f"draft lengths must be in 0..{MAX_DEPTH} (got {k})")

    @property
    def max_depth(self) -> int:
        return max(k for _, k in parse_table(self.table))

    def plan(self, view: ReplicaView) -> StepPlan:
        entries = parse_table(self.table)
        k = next(k for lo, k in reversed(entries) if view.batch >= lo)
        return chain_plan(view, np.full(view.batch, k))


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput(Policy):
    name = "goodput"
    k_max: int = 8

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)

    @property
    def max_depth(self) -> int:
        return self.k_max  # plans from acceptance history; this round's confidences go unread

    def plan(self, view: ReplicaView) -> StepPlan:
        # Predicted per-token acceptance from history: accepted / (accepted + 1)
        # is the geometric estimate when a round ends on its first rejection.
        alpha = view.recent_accepted / (view.recent_accepted + 1.0)
        depth = np.arange(1, self.k_max + 1)
        values = alpha[:, None] ** depth[None, :]  # chance the depth-d token is reached and accepted
        codes = np.broadcast_to(trees.chain_codes(self.k_max), values.shape)
        return best_prefix(view, codes, values, depth, width=1, max_nodes=view.batch * self.k_max)


@dataclass(frozen=True, slots=True, kw_only=True)
class Marginal(Policy):
    name = "marginal"
    depth: int = 8
    topk: int = 4
    max_nodes: int = 512

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)
        _check_topk(self.name, self.topk)
        _check(self.max_nodes >= 1, self.name, f"max_nodes must be >= 1 (got {self.max_nodes})")

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_rank(self) -> int:
        return self.topk

    def plan(self, view: ReplicaView) -> StepPlan:
        codes, values, depths = trees.expand(view.conf, self.depth, self.topk)
        return best_prefix(view, codes, values, depths, width=self.topk, max_nodes=self.max_nodes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Oracle(Policy):
    name = "oracle"
    needs_truth = True
    depth: int = 8

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)

    @property
    def max_depth(self) -> int:
        return self.depth

    def plan(self, view: ReplicaView) -> StepPlan:
        # Draft exactly the target's own path, as deep as it pays.
        codes = trees.path_codes(view.true_ranks[:, : self.depth])
        values = (codes > 0).astype(float)
        depth = np.arange(1, codes.shape[1] + 1)
        return best_prefix(view, codes, values, depth, width=1, max_nodes=view.batch * self.depth)


def _replace_steps(plan: StepPlan, steps: np.ndarray) -> StepPlan:
    return StepPlan(kind=plan.kind, codes=plan.codes, num_nodes=plan.num_nodes, draft_steps=steps,
                    draft_width=plan.draft_width, kept_visual_tokens=plan.kept_visual_tokens)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Ar, Linear, Tree, Truncate, BatchTable, Goodput, Marginal, Oracle)
}


def _convert(policy: str, field, text: str):
    kind = field.type if isinstance(field.type, type) else {"int": int, "float": float, "str": str}[field.type]
    try:
        return kind(text)
    except ValueError:
        raise InputError(f"policy {policy}: {field.name} must be a {kind.__name__} (got {text!r})") from None


def make(name: str, params: dict[str, object] | None = None) -> Policy:
    """A policy from its name and parameters (strings are converted)."""
    if name not in POLICIES:
        raise InputError(f"policy must be one of {', '.join(POLICIES)} (got {name!r})")
    cls = POLICIES[name]
    known = {f.name: f for f in fields(cls)}
    kwargs = {}
    for key, value in (params or {}).items():
        if key not in known:
            allowed = ", ".join(known) or "none"
            raise InputError(f"policy {name}: unknown parameter {key!r} (allowed: {allowed})")
        kwargs[key] = _convert(name, known[key], value) if isinstance(value, str) else value
    return cls(**kwargs)


def parse(spec: str) -> Policy:
    """``"linear:k=5"`` or ``"tree:depth=6,topk=10"`` -> a policy. A
    ``batch_table`` table is the rest of the spec: ``batch_table:table=1:5,8:3``."""
    name, _, rest = spec.strip().partition(":")
    params: dict[str, object] = {}
    if name == "batch_table" and rest:
        key, sep, value = rest.partition("=")
        if not sep:
            raise InputError(f"policy batch_table: parameters look like table=1:5,8:3 (got {rest!r})")
        params[key.strip()] = value.strip()
    elif rest:
        for part in rest.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise InputError(f"policy {name}: parameters look like key=value (got {part!r})")
            params[key.strip()] = value.strip()
    return make(name, params)


__all__ = ["POLICIES", "Policy", "make", "parse", "Ar", "Linear", "Tree", "Truncate", "BatchTable", "Goodput",
           "Marginal", "Oracle"]
