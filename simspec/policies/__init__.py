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

from simspec.policies import kernels
from simspec.policies.base import Policy, parse_table
from simspec.types import MAX_DEPTH, MAX_RANK, InputError


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
    kernel = kernels.AR

    def params(self) -> np.ndarray:
        return np.zeros(1)


@dataclass(frozen=True, slots=True, kw_only=True)
class Linear(Policy):
    name = "linear"
    kernel = kernels.LINEAR
    k: int = 3

    def __post_init__(self):
        _check_depth(self.name, "k", self.k)

    @property
    def max_depth(self) -> int:
        return self.k

    def params(self) -> np.ndarray:
        return np.array([self.k], dtype=float)


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
    kernel = kernels.TREE
    budget: int = 60

    def __post_init__(self):
        super(Tree, self).__post_init__()
        _check(self.budget >= 1, self.name, f"budget must be >= 1 (got {self.budget})")

    def params(self) -> np.ndarray:
        return np.array([self.depth, self.topk, self.budget], dtype=float)


@dataclass(frozen=True, slots=True, kw_only=True)
class Truncate(Policy):
    name = "truncate"
    kernel = kernels.TRUNCATE
    k_max: int = 8
    threshold: float = 0.4

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)
        _check(0.0 < self.threshold < 1.0, self.name, f"threshold must be in (0, 1) (got {self.threshold})")

    @property
    def max_depth(self) -> int:
        return self.k_max

    def params(self) -> np.ndarray:
        return np.array([self.k_max, self.threshold], dtype=float)


@dataclass(frozen=True, slots=True, kw_only=True)
class BatchTable(Policy):
    name = "batch_table"
    kernel = kernels.BATCH_TABLE
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
    kernel = kernels.GOODPUT
    k_max: int = 8

    def __post_init__(self):
        _check_depth(self.name, "k_max", self.k_max)

    @property
    def max_depth(self) -> int:
        return self.k_max  # plans from acceptance history; this round's confidences go unread

    def params(self) -> np.ndarray:
        return np.array([self.k_max], dtype=float)


@dataclass(frozen=True, slots=True, kw_only=True)
class Marginal(_Branching):
    name = "marginal"
    kernel = kernels.MARGINAL
    depth: int = 7
    max_nodes: int = 512

    def __post_init__(self):
        super(Marginal, self).__post_init__()
        _check(self.max_nodes >= 1, self.name, f"max_nodes must be >= 1 (got {self.max_nodes})")

    def params(self) -> np.ndarray:
        return np.array([self.depth, self.topk, self.max_nodes], dtype=float)


@dataclass(frozen=True, slots=True, kw_only=True)
class Oracle(Policy):
    name = "oracle"
    kernel = kernels.ORACLE
    needs_truth = True
    depth: int = 8

    def __post_init__(self):
        _check_depth(self.name, "depth", self.depth)

    @property
    def max_depth(self) -> int:
        return self.depth

    def params(self) -> np.ndarray:
        return np.array([self.depth], dtype=float)


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
