"""Policies as pure functions of a snapshot."""

from __future__ import annotations

import dataclasses
import typing
from dataclasses import replace

import numpy as np
import pytest

from conftest import H100, LLAVA
from simspec import costs, policies, trees
from simspec.policies import rules
from simspec.policies.base import compiled_batch, parse_table
from simspec.policies import ReplicaView
from simspec.types import PLAN_AR, PLAN_LINEAR, PLAN_TREE, InputError


def view(batch=2, *, depth=8, ranks=10, ctx=800, conf=None, truth=None, cost_model="roofline", remaining=100,
         prefill=0, seed=0):
    rng = np.random.default_rng(seed)
    if conf is None:
        top = rng.uniform(0.3, 0.95, (batch, depth))
        conf = np.empty((batch, depth, ranks))
        conf[:, :, 0] = top
        for r in range(1, ranks):
            conf[:, :, r] = np.minimum(conf[:, :, r - 1], (1 - top) * 0.3 * 0.5 ** (r - 1))  # sums below 1
    return ReplicaView(
        context_tokens=np.full(batch, ctx), visual_tokens=np.full(batch, 576), kept_visual_tokens=np.full(batch, 8),
        remaining_tokens=np.full(batch, remaining), recent_accepted=np.full(batch, 2.0), conf=conf,
        prefill_tokens=prefill, prefill_attn_pairs=prefill * prefill // 2, prefill_kv_tokens=prefill,
        prefill_requests=1 if prefill else 0, vision_tokens=0, costs=costs.build(cost_model, LLAVA, H100),
        true_ranks=truth)


def parent_closed(codes: np.ndarray) -> bool:
    held = set(int(c) for c in codes if c > 0)
    for c in held:
        d = trees.depth(c)
        parent = c & ((1 << (4 * (d - 1))) - 1)
        if d > 1 and parent not in held:
            return False
    return True


def test_ar_drafts_nothing():
    plan = policies.parse("ar").plan(view())
    assert plan.num_nodes.tolist() == [0, 0] and plan.kind.tolist() == [PLAN_AR] * 2


@pytest.mark.parametrize("k", [1, 4, 7])
def test_linear_is_the_rank1_chain(k):
    plan = policies.parse(f"linear:k={k}").plan(view(depth=k))
    assert plan.codes.tolist() == [trees.chain_codes(k).tolist()] * 2
    assert plan.draft_steps.tolist() == [k, k] and plan.kind.tolist() == [PLAN_LINEAR] * 2


def test_tree_keeps_budget_nodes_parent_closed_within_topk():
    v = view(batch=3)
    plan = policies.parse("tree:depth=5,topk=4,budget=20").plan(v)
    assert plan.num_nodes.tolist() == [20, 20, 20]
    for row in plan.codes:
        assert parent_closed(row)
        digits = [(int(c) >> (4 * d)) & 15 for c in row if c > 0 for d in range(5)]
        assert max(digits) <= 4
    # EAGLE-2: the kept nodes are the best by path confidence of the expansion.
    codes, values, depths = trees.expand(v.conf, 5, 4)
    best = np.sort(values, axis=1)[:, ::-1][:, :20]
    kept = [sorted(values[i][np.isin(codes[i], plan.codes[i])], reverse=True) for i in range(3)]
    assert np.allclose(kept, best)


def test_a_view_too_shallow_for_the_policy_is_refused():
    with pytest.raises(ValueError, match="view.conf must be"):
        policies.parse("tree:depth=8").plan(view(depth=6))


def test_truncate_cuts_where_path_confidence_falls_below_threshold():
    conf = np.ones((1, 6, 1))
    conf[0, :, 0] = [0.9, 0.9, 0.9, 0.5, 0.9, 0.9]  # path: .9 .81 .729 .36 ...
    spec = "truncate:k_max=6,threshold=0.5"
    # The drafter stops after the level whose path falls under the threshold (it drafted it to see that) ...
    cheap = policies.parse(spec).plan(view(batch=1, depth=6, ranks=1, conf=conf))
    assert cheap.draft_steps.tolist() == [4]
    # ... and verifies it too where a verified token costs less than the 0.36 tokens it is worth,
    assert cheap.num_nodes.tolist() == [4]
    # but not where verifying costs 2 ms a token: the chain is cut at the threshold (a long history
    # of accepted drafts, alpha 0.95, makes drafting the fourth level worth its price).
    dear = policies.parse(spec).plan(replace(view(batch=1, depth=6, ranks=1, conf=conf, cost_model="affine:5,2"),
                                             recent_accepted=np.array([19.0])))
    assert dear.num_nodes.tolist() == [3] and dear.draft_steps.tolist() == [4]


def test_truncate_stops_drafting_where_a_verified_token_costs_more_than_it_brings():
    """The same confident chains (path confidence above the threshold to
    k_max, long histories) are drafted to k_max where a verified token is
    cheap, and cut short where each costs 0.5 ms."""
    def plan(cost_model):
        v = view(batch=32, ranks=1, conf=np.full((32, 8, 1), 0.8), cost_model=cost_model)
        return policies.parse("truncate:threshold=0.01").plan(replace(v, recent_accepted=np.full(32, 19.0)))
    cheap, dear = plan("affine:10,0.001"), plan("affine:10,0.5")
    assert cheap.num_nodes.tolist() == [8] * 32
    assert 0 < dear.draft_steps.max() < 8 and dear.num_nodes.max() == dear.draft_steps.max()


@pytest.mark.parametrize("batch,k", [(1, 5), (7, 5), (8, 3), (40, 0)])
def test_batch_table_picks_k_by_batch_size(batch, k):
    plan = policies.parse("batch_table:table=1:5,8:3,33:0").plan(view(batch=batch))
    assert set(plan.num_nodes.tolist()) == {k}


def test_oracle_drafts_exactly_the_target_path():
    truth = np.array([[1, 2, 1, 0, 1, 1], [1, 1, 1, 1, 1, 1]])
    plan = policies.parse("oracle:depth=6").plan(view(truth=truth))
    first = sorted(int(c) for c in plan.codes[0] if c > 0)
    assert first == trees.path_codes(truth[:1])[0, :3].tolist()
    assert plan.num_nodes[1] == 6


def test_marginal_grows_under_idle_capacity_and_shrinks_when_busy():
    idle = policies.parse("marginal").plan(view(batch=1))
    busy = policies.parse("marginal").plan(view(batch=128, ctx=2000))
    assert idle.kind[0] == PLAN_TREE and idle.num_nodes[0] > 10
    assert busy.num_nodes.mean() < idle.num_nodes[0] / 4
    # Narrower when busy: a wide tree is nearly free to verify at batch 1
    # but not in a compute-bound batch, while a draft step's fixed cost
    # (roofline.FixedCosts.draft_step_s) is shared by the whole batch, so
    # idle plans are wide and shallow, busy ones close to chains.
    width = lambda plan: plan.num_nodes / np.maximum(plan.draft_steps, 1)  # noqa: E731
    assert width(busy).mean() < 1.5 < 10 < width(idle)[0]


def test_marginal_never_drafts_past_the_last_token():
    plan = policies.parse("marginal").plan(view(batch=2, remaining=3))
    assert plan.draft_steps.max() <= 2


@pytest.mark.parametrize("spec", ["ar", "linear", "tree", "truncate", "batch_table", "goodput", "marginal", "oracle"])
def test_plan_is_a_pure_function_of_the_view(spec):
    v = view(batch=3, depth=8, ranks=10, truth=np.ones((3, 8), dtype=np.int64))
    before = v.conf.copy()
    first, second = policies.parse(spec).plan(v), policies.parse(spec).plan(v)
    assert np.array_equal(first.codes, second.codes) and np.array_equal(v.conf, before)


@pytest.mark.parametrize("spec,label", [("linear:k=5", "linear:k=5"), ("tree", "tree:depth=6,topk=10,budget=60"),
                                        ("batch_table:table=1:4,9:2", "batch_table:table=1:4,9:2")])
def test_parse_and_label(spec, label):
    assert policies.parse(spec).label == label


@pytest.mark.parametrize("spec,needle", [("nope", "policy must be one of"), ("linear:q=1", "unknown parameter"),
                                         ("linear:k=x", "k must be an integer"), ("tree:topk=16", "topk"),
                                         ("truncate:threshold=1.5", "threshold"), ("batch_table:table=2:3", "start"),
                                         ("linear:k", "key=value")])
def test_bad_policies_name_the_problem(spec, needle):
    with pytest.raises(InputError, match=needle):
        policies.parse(spec)


def test_parse_table_sorts_and_validates():
    assert parse_table("8:3,1:5") == ((1, 5), (8, 3))
    with pytest.raises(ValueError):
        parse_table("1:x")



# -- the policy boundary: named parameter records ------------------------------------

@pytest.mark.parametrize("kernel", sorted(rules.PARAMS))
def test_each_rule_reads_its_parameter_record_in_the_order_the_policies_write_it(kernel):
    record = rules.PARAMS[kernel]
    vector = np.arange(1.0, len(record._fields) + 1.0) + 0.25  # distinct entries, none an integer
    read = rules.READERS[kernel].py_func(vector)
    assert type(read) is record
    for at, (name, kind) in enumerate(typing.get_type_hints(record).items()):
        assert getattr(read, name) == (vector[at] if kind is float else int(vector[at])), name


@pytest.mark.parametrize("name", sorted(policies.POLICIES))
def test_a_policys_parameter_vector_is_its_fields_in_its_rules_record_order(name):
    policy = policies.POLICIES[name]()
    record = rules.PARAMS.get(policy.kernel)
    if record is None:  # AR (no parameters), batch_table and staged (vectors of their own)
        assert policy.kernel in (rules.AR, rules.BATCH_TABLE, rules.STAGED)
        return
    assert set(record._fields) <= {f.name for f in dataclasses.fields(policy)}, name
    np.testing.assert_array_equal(policy.params(), [getattr(policy, f) for f in record._fields])


def test_the_compiled_batch_is_the_views_fields_by_name():
    v = view(4, prefill=32)
    batch = compiled_batch(v, v.conf, 5)
    for name in rules.Batch._fields:
        if name == "table_key":
            assert batch.table_key == -1
        elif name == "true_ranks":
            assert batch.true_ranks.shape == (4, 5) and not batch.true_ranks.any()
        else:
            np.testing.assert_array_equal(getattr(batch, name), getattr(v, name), err_msg=name)
    assert {f.name for f in dataclasses.fields(v)} - set(rules.Batch._fields) == {"costs"}
