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
- ``staged:stages=1:SPEC;B:SPEC;...``: from decode batch size B on, plan as
  SPEC (any policy above but batch_table and oracle); ``simspec tune`` writes
  one, picking per load the spec that served it best.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numpy as np

from simspec.policies import rules
from simspec.policies.base import Policy, ReplicaView, StepPlan, parse_table
from simspec.types import MAX_DEPTH, MAX_RANK, InputError, checked, field_types


MAX_NODES = 4096
"""Draft tokens a round may verify at most (a tree's budget, marginal's
max_nodes): far beyond any engine's, and a bound on each step's buffers."""


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
    kernel = rules.AR

    def params(self) -> np.ndarray:
        return np.zeros(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Linear(Policy):
    name = "linear"
    kernel = rules.LINEAR
    k: int = 3

    def __post_init__(self):
        _check_depth(self.name, "k", self.k)

    @property
    def max_depth(self) -> int:
        return self.k


@dataclass(frozen=True, slots=True, kw_only=True)
class _Branching(Policy):
    """A policy that drafts trees up to ``depth`` with ``topk`` children a node."""

    depth: int = 6
    topk: int = 10

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)
        _check_topk(self.name, self.topk)

    @property
    def max_depth(self) -> int:
        return self.depth

    @property
    def max_rank(self) -> int:
        return self.topk


@dataclass(frozen=True, slots=True, kw_only=True)
class Tree(_Branching):
    name = "tree"
    kernel = rules.TREE
    budget: int = 60

    def __post_init__(self):
        super(Tree, self).__post_init__()
        _check(1 <= self.budget <= MAX_NODES, self.name, f"budget must be in 1..{MAX_NODES} (got {self.budget})")

    @property
    def max_verify_tokens(self) -> int:
        return 1 + self.budget


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncate(Policy):
    name = "truncate"
    kernel = rules.TRUNCATE
    k_max: int = 8
    threshold: float = 0.1  # the cost rule decides the depth; a low threshold leaves it room (benchmarks/adaptive_vs_fixed.py)

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)
        _check(0.0 < self.threshold < 1.0, self.name, f"threshold must be in (0, 1) (got {self.threshold})")

    @property
    def max_depth(self) -> int:
        return self.k_max


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTable(Policy):
    name = "batch_table"
    kernel = rules.BATCH_TABLE
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

    def params(self) -> np.ndarray:
        return np.array(parse_table(self.table), dtype=float).ravel()


@dataclass(frozen=True, slots=True, kw_only=True)
class Goodput(Policy):
    name = "goodput"
    kernel = rules.GOODPUT
    k_max: int = 8

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)

    @property
    def max_depth(self) -> int:
        return self.k_max  # plans from acceptance history; this round's confidences go unread


@dataclass(frozen=True, slots=True, kw_only=True)
class Marginal(_Branching):
    name = "marginal"
    kernel = rules.MARGINAL
    depth: int = 7
    max_nodes: int = 512

    def __post_init__(self):
        super(Marginal, self).__post_init__()
        _check(1 <= self.max_nodes <= MAX_NODES, self.name, f"max_nodes must be in 1..{MAX_NODES} (got {self.max_nodes})")

    @property
    def max_verify_tokens(self) -> int:
        return 1 + self.max_nodes


@dataclass(frozen=True, slots=True, kw_only=True)
class Oracle(Policy):
    name = "oracle"
    kernel = rules.ORACLE
    needs_truth = True
    depth: int = 8

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)

    @property
    def max_depth(self) -> int:
        return self.depth


STAGE_POLICIES = ("ar", "linear", "tree", "truncate", "goodput", "marginal")
"""Policies a ``staged`` stage may use (each takes at most three parameters)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Staged(Policy):
    """A policy per decode-batch-size range: the load-adaptive schedule
    ``simspec tune`` writes (vLLM's draft length per batch size, generalised
    to any policy). ``stages`` is ``MIN_BATCH:SPEC`` entries joined by ``;``."""

    name = "staged"
    kernel = rules.STAGED
    stages: str = "1:linear:k=3"

    def __post_init__(self):
        self.schedule()

    def schedule(self) -> tuple[tuple[int, Policy], ...]:
        """((min batch, policy), ...) ascending, the first at batch size 1."""
        entries = []
        for part in self.stages.split(";"):
            low, sep, spec = part.strip().partition(":")
            _check(bool(sep) and low.strip().isdigit(), self.name,
                   f"stages look like 1:linear:k=4;16:linear:k=2 (got {part!r})")
            inner = parse(spec)
            _check(inner.name in STAGE_POLICIES, self.name,
                   f"a stage must be one of {', '.join(STAGE_POLICIES)} (got {inner.name!r})")
            entries.append((int(low), inner))
        lows = [low for low, _ in entries]
        _check(lows[0] == 1, self.name, f"stages must start at batch size 1 (got {lows[0]})")
        _check(all(a < b for a, b in zip(lows, lows[1:])), self.name,
               f"stage batch sizes must increase (got {lows})")
        return tuple(entries)

    @property
    def max_depth(self) -> int:
        return max(p.max_depth for _, p in self.schedule())

    @property
    def max_rank(self) -> int:
        return max(p.max_rank for _, p in self.schedule())

    def params(self) -> np.ndarray:
        rows = []
        for low, policy in self.schedule():
            inner = np.zeros(rules.STAGE_WIDTH - 2)
            inner[:len(policy.params())] = policy.params()
            rows.append(np.concatenate([[low, policy.kernel], inner]))
        return np.concatenate(rows).astype(float)


POLICIES: dict[str, type[Policy]] = {
    cls.name: cls for cls in (Ar, Linear, Tree, Truncate, BatchTable, Goodput, Marginal, Oracle, Staged)
}


def _convert(policy: str, field, text: str):
    kind = field.type if isinstance(field.type, type) else {"int": int, "float": float, "str": str}[field.type]
    try:
        return kind(text)
    except ValueError:
        raise InputError(f"policy {policy}: {field.name} must be a{'n' if kind is int else ''} "
                         f"{ {'int': 'integer', 'float': 'number', 'str': 'string'}[kind.__name__]} "
                         f"(got {text!r})") from None


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
        value = _convert(name, known[key], value) if isinstance(value, str) else value
        try:
            kwargs[key] = checked(key, value, field_types(cls)[key])
        except InputError as err:
            raise InputError(f"policy {name}: {err}") from None
    return cls(**kwargs)


def parse(spec: str) -> Policy:
    """``"linear:k=5"`` or ``"tree:depth=6,topk=10"`` -> a policy. A
    ``batch_table`` table or ``staged`` schedule is the rest of the spec:
    ``batch_table:table=1:5,8:3``, ``staged:stages=1:tree:depth=5;16:linear:k=2``."""
    if not isinstance(spec, str):
        raise InputError(f"policy must be a string like 'linear:k=5' (got {spec!r})")
    name, colon, rest = spec.strip().partition(":")
    if colon and not rest.strip():
        raise InputError(f"policy {name}: nothing after ':' (give {name}, or {name}:key=value,...)")
    params: dict[str, object] = {}
    if name in ("batch_table", "staged") and rest:
        key, sep, value = rest.partition("=")
        if not sep:
            example = "table=1:5,8:3" if name == "batch_table" else "stages=1:linear:k=4;16:linear:k=2"
            raise InputError(f"policy {name}: parameters look like {example} (got {rest!r})")
        params[key.strip()] = value.strip()
    elif rest:
        for part in rest.split(","):
            key, sep, value = part.partition("=")
            if not sep or not key.strip():
                raise InputError(f"policy {name}: parameters look like key=value (got {part!r})")
            if key.strip() in params:
                raise InputError(f"policy {name}: parameter {key.strip()!r} is given twice (in {spec.strip()!r})")
            params[key.strip()] = value.strip()
    return make(name, params)


__all__ = ["POLICIES", "Policy", "ReplicaView", "StepPlan", "make", "parse", "Ar", "Linear", "Tree", "Truncate", "BatchTable", "Goodput",
           "Marginal", "Oracle", "Staged", "STAGE_POLICIES"]
