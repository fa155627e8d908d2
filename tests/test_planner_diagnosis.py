"""Decode batches recorded from the default scenario at 12 req/s
(tests/data/planner/recorded_12rps.npz; benchmarks/planner_diagnosis.py
prints the table): ``marginal``'s plan must have at least the predicted
tokens per second of every fixed chain ``linear:k=1..3``, by its own
valuation (the drafter's path confidences) and the simulator's step
formula. A planner that adds one node at a time fails it: on the batch of
55 it planned AR (3,802 tokens/s) where ``linear:k=2`` makes 4,741 by the
same numbers, and on the batch of 19 a 4-deep tree below ``linear:k=2``."""

from __future__ import annotations


import numpy as np
import pytest

from conftest import load_benchmark

from simspec import config as configuration, experiment, policies
from simspec.policies import rules
from test_marginal_planner import conf_value, step_s



@pytest.fixture(scope="module")
def recorded():
    bench = load_benchmark("planner_diagnosis")
    out = []
    for fields in bench.load(bench.RECORDED):
        fields.pop("p1")
        fields["true_ranks"] = np.zeros_like(fields["true_ranks"])
        out.append(rules.Batch(**{k: (v.item() if v.ndim == 0 else v) for k, v in fields.items()}))
    return out


@pytest.fixture(scope="module")
def model():
    return experiment.resolve(configuration.build()).costs


def test_the_recordings_are_the_batches_described(recorded):
    assert [len(b.context_tokens) for b in recorded] == [19, 32, 55]


@pytest.mark.parametrize("index", [0, 1, 2])
def test_marginal_plans_at_least_as_well_as_each_fixed_chain_by_its_own_numbers(recorded, model, index):
    batch = recorded[index]
    b = len(batch.context_tokens)

    def rate(spec):
        policy = policies.parse(spec)
        plan = rules.plan_batch(policy.kernel, policy.params(), batch, model.tables)
        return (b + conf_value(batch, plan)) / step_s(model, batch, plan)

    own = rate("marginal")
    for k in (1, 2, 3):
        assert own >= rate(f"linear:k={k}"), f"B={b}: marginal {own:.0f} tokens/s < linear:k={k}"
