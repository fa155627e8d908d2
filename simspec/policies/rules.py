"""The policies' decision rules, compiled: one code path for every caller.

Imports: numpy, numba, simspec.trees, simspec.costs.base (compiled cost
functions), simspec.policies.pricing, .adaptive and .chains. ``Policy.plan(view)``
(the live engine, tests) and the simulator's compiled step loop both call
:func:`plan_batch`, so a policy decides the same way wherever it runs. A
policy is named by a small integer (``AR`` ... ``STAGED``) and its
parameters by a float64 vector, because compiled code dispatches on plain
values; each rule's record (``TreeParams`` ...) names that vector's entries. The fixed rules are here; the load-adaptive ones (goodput,
truncate, marginal) are in simspec.policies.adaptive, and how both price a
step in simspec.policies.pricing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec import trees
from simspec.compiled import jit
from simspec.costs.base import CostTables
from simspec.policies.adaptive import _marginal
from simspec.policies.chains import _goodput, _truncate
from simspec.policies.pricing import (Batch, Plan, Pricing, Verifying, _chain, _packed, _plan_of, _pricing,
                                      _step_s, _verified_s, _verify_s, _verifying)

AR, LINEAR, TREE, TRUNCATE, BATCH_TABLE, GOODPUT, MARGINAL, ORACLE, STAGED = range(9)
STAGE_WIDTH = 5  # a staged policy's parameters: (min batch, rule, p0, p1, p2) per stage, ascending

@jit
def _best_prefix(batch: Batch, costs: CostTables, values: np.ndarray, codes: np.ndarray, depths: np.ndarray,
                 width: int, max_nodes: int) -> Plan:
    """Candidates of every request, best value first across the batch
    (parents before children, since a child's value never exceeds its
    parent's); each prefix of that order is a plan, and the step keeps the
    prefix with the most expected tokens per second. That is the greedy
    "add while extra tokens per extra second beat the step's tokens per
    second" rule taken to its best stopping point, so the drafter's fixed
    cost per depth does not stop it a node too early.

    Nodes worth less than (tokens per second without drafting) x (the
    cheapest extra token's cost) are skipped before sorting: with a forward
    cost convex in tokens they can never raise the step's tokens per second.
    """
    b = len(batch.context_tokens)
    p = _pricing(batch, costs, width)
    # The first draft also turns the rounds into verification: the cheaper
    # of that step and the next is the least any node can cost.
    slope = min(_step_s(costs, p, 1, 0, 0) - _step_s(costs, p, 0, 0, 0),
                _step_s(costs, p, 2, 0, 0) - _step_s(costs, p, 1, 0, 0))
    rows, chosen, value, depth = trees.ranked_candidates(values, codes, depths, batch.remaining_tokens,
                                                         p.rate0 * max(slope, 0.0), max_nodes)
    gain, pairs, deepest, best, take = float(b), 0, 0, p.rate0, 0
    for t in range(len(rows)):
        gain += value[t]
        pairs += batch.context_tokens[rows[t]]
        deepest = max(deepest, depth[t])
        rate = gain / _step_s(costs, p, t + 1, pairs, deepest)
        if rate > best:
            best, take = rate, t + 1
    return _packed(rows[:take], chosen[:take], b, width)


# -- the policies -------------------------------------------------------------

@jit
def _linear(batch: Batch, k: int) -> Plan:
    ks = np.full(len(batch.context_tokens), k, dtype=np.int64)
    return _chain(batch, ks, ks)


@jit
def _tree(batch: Batch, depth: int, topk: int, budget: int) -> Plan:
    codes, num, deepest, kind = trees.pack_full_rows(trees.eagle_tree(batch.conf, depth, topk, budget))
    plan = _plan_of(codes, num, deepest, kind, topk)
    plan.draft_steps[:] = depth  # EAGLE-2 drafts every level of its expansion
    return plan


@jit
def _batch_table(batch: Batch, table: np.ndarray) -> Plan:
    b = len(batch.context_tokens) if batch.table_key < 0 else batch.table_key
    k = 0
    for e in range(0, len(table), 2):  # (min batch, k) pairs, ascending
        if b >= table[e]:
            k = int(table[e + 1])
    return _linear(batch, k)



@jit
def _oracle(batch: Batch, costs: CostTables, depth: int) -> Plan:
    # Draft exactly the target's own path, as deep as it pays.
    b = len(batch.context_tokens)
    reached = np.zeros((b, depth))
    codes = np.full((b, depth), -1, dtype=np.int64)
    depths = np.empty((b, depth), dtype=np.int64)
    for i in range(b):
        code = np.int64(0)
        for d in range(depth):
            depths[i, d] = d + 1
            r = batch.true_ranks[i, d]
            if r == 0:
                break
            code = trees.child(code, r)
            codes[i, d] = code
            reached[i, d] = 1.0
    return _best_prefix(batch, costs, reached, codes, depths, 1, b * depth)


# -- each rule's parameters, by name ---------------------------------------------
#
# A policy's parameters reach compiled code as one float64 vector (a staged
# policy packs several rules' into one). Each rule's record below names the
# vector's entries in order: the policy objects build the vector from the
# record's fields (Policy.params), and each rule reads it back through its
# record's reader, so the order is written once, here.

class LinearParams(NamedTuple):
    k: int  # draft tokens


class TreeParams(NamedTuple):
    depth: int
    topk: int
    budget: int  # draft nodes at most


class TruncateParams(NamedTuple):
    k_max: int
    threshold: float  # path confidence under which a chain is cut


class GoodputParams(NamedTuple):
    k_max: int


class MarginalParams(NamedTuple):
    depth: int
    topk: int
    max_nodes: int


class OracleParams(NamedTuple):
    depth: int


PARAMS = {LINEAR: LinearParams, TREE: TreeParams, TRUNCATE: TruncateParams, GOODPUT: GoodputParams,
          MARGINAL: MarginalParams, ORACLE: OracleParams}
"""Each rule's parameter record (AR has none; BATCH_TABLE's vector is its
(min batch, k) pairs; STAGED's is STAGE_WIDTH entries a stage)."""


@jit
def _linear_params(v: np.ndarray) -> LinearParams:
    return LinearParams(int(v[0]))


@jit
def _tree_params(v: np.ndarray) -> TreeParams:
    return TreeParams(int(v[0]), int(v[1]), int(v[2]))


@jit
def _truncate_params(v: np.ndarray) -> TruncateParams:
    return TruncateParams(int(v[0]), v[1])


@jit
def _goodput_params(v: np.ndarray) -> GoodputParams:
    return GoodputParams(int(v[0]))


@jit
def _marginal_params(v: np.ndarray) -> MarginalParams:
    return MarginalParams(int(v[0]), int(v[1]), int(v[2]))


@jit
def _oracle_params(v: np.ndarray) -> OracleParams:
    return OracleParams(int(v[0]))


READERS = {LINEAR: _linear_params, TREE: _tree_params, TRUNCATE: _truncate_params, GOODPUT: _goodput_params,
           MARGINAL: _marginal_params, ORACLE: _oracle_params}
"""Each record's compiled reader (tests check each reads its record's fields in order)."""


@jit
def plan_batch(policy: int, params: np.ndarray, batch: Batch, costs: CostTables) -> Plan:
    """Plan every decode request of a step with the policy named by
    ``policy`` (AR ... STAGED) and its parameter vector. A staged policy
    runs the stage whose minimum batch size the decode batch reaches,
    resolved here rather than in a function of its own: each call level
    counts a reference for every array of the batch and the cost tables."""
    if policy == STAGED:
        b = len(batch.context_tokens)
        at = 0
        for e in range(0, len(params), STAGE_WIDTH):
            if b >= params[e]:
                at = e
        policy, params = int(params[at + 1]), params[at + 2:at + STAGE_WIDTH]
    if policy == LINEAR:
        return _linear(batch, _linear_params(params).k)
    if policy == TREE:
        tree = _tree_params(params)
        return _tree(batch, tree.depth, tree.topk, tree.budget)
    if policy == TRUNCATE:
        truncate = _truncate_params(params)
        return _truncate(batch, costs, truncate.k_max, truncate.threshold)
    if policy == BATCH_TABLE:
        return _batch_table(batch, params)
    if policy == GOODPUT:
        return _goodput(batch, costs, _goodput_params(params).k_max)
    if policy == MARGINAL:
        marginal = _marginal_params(params)
        return _marginal(batch, costs, marginal.depth, marginal.topk, marginal.max_nodes)
    if policy == ORACLE:
        return _oracle(batch, costs, _oracle_params(params).depth)
    return _linear(batch, 0)  # AR: no drafts


__all__ = ["PARAMS", "READERS", "LinearParams", "TreeParams", "TruncateParams", "GoodputParams", "MarginalParams",
           "OracleParams", "AR", "LINEAR", "TREE", "TRUNCATE", "BATCH_TABLE", "GOODPUT", "MARGINAL", "ORACLE", "STAGED", "STAGE_WIDTH",
           "Batch", "Plan", "Pricing", "Verifying", "plan_batch", "_pricing", "_step_s", "_verified_s", "_verify_s",
           "_verifying", "_chain", "_packed", "_plan_of"]
