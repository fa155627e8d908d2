"""The serving model: golden timelines, closed forms, invariants."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace

import numpy as np
import pytest

from conftest import H100, LLAVA, per_request_tokens, requests_at, run
from simspec import acceptance, costs, policies
from simspec.sim import EngineConfig
from simspec.types import InputError


def _times(log):
    return [(r.id, round(r.first_token_s, 9), round(r.finish_s, 9), r.output_tokens) for r in log.requests]


def test_golden_timeline_ar_constant_cost():
    # Worked by hand, 10 ms a step whatever it holds:
    #  0-10 ms  prefill A              -> A's first token at 10 ms
    # 10-20 ms  decode A (B arrives at 15 ms, joins at the next step)
    # 20-30 ms  decode A + prefill B   -> A's 3rd token: A done at 30; B's first token at 30
    # 30-40 ms  decode B               -> B's 2nd token: B done at 40
    requests = [replace(r, output_tokens=n) for r, n in zip(requests_at([0.0, 0.015], prompt=10), (3, 2))]
    log = run(requests, policies.parse("ar"))
    assert _times(log) == [(0, 0.01, 0.03, 3), (1, 0.03, 0.04, 2)]
    assert log.step_start_s.tolist() == pytest.approx([0.0, 0.01, 0.02, 0.03])
    assert log.step_batch.tolist() == [0, 1, 1, 1]


def test_golden_timeline_linear_draft_always_accepted():
    # p -> 1: every draft token is accepted, so a k=2 draft emits 3 tokens a
    # round. One request, output 8: prefill (1 token, 10 ms), then rounds of
    # 3, 3 and the last 1 (capped by the output length): done at 40 ms.
    log = run(requests_at([0.0], prompt=10, output=8), policies.parse("linear:k=2"),
              accept=acceptance.AcceptanceModel.iid(1 - 1e-12))
    assert _times(log) == [(0, 0.01, 0.04, 8)]
    assert log.chunk_tokens.tolist() == [1, 3, 3, 1]
    assert log.round_accepted.tolist() == [2, 2, 2]


def test_a_step_after_an_idle_spell_pays_the_wake_cost():
    # Worked by hand, 10 ms a step, wake 30 ms x (1 - exp(-idle / 0.5 s)):
    # A arrives at 0.5 s after 0.5 s idle: prefill 0.5-0.5290 (10 ms + 19.0 ms),
    # two decode steps to 0.5490 (A done: 3 tokens). B arrives at 2.0 s after
    # 1.4510 s idle: prefill 2.0-2.0384 (10 ms + 28.4 ms), decode to 2.0584.
    requests = requests_at([0.5, 2.0], prompt=10, output=3)
    plain = costs.build("constant:10", LLAVA, H100)
    waking = replace(plain, wake_s=0.03, wake_tau_s=0.5)
    log = run(requests, policies.parse("ar"), cost_model=waking)
    wake_a = 0.03 * -np.expm1(-0.5 / 0.5)
    wake_b = 0.03 * -np.expm1(-(2.0 - (0.53 + wake_a)) / 0.5)
    assert (wake_a, wake_b) == pytest.approx((0.01896, 0.02835), abs=1e-5)
    assert log.step_duration_s.tolist() == pytest.approx([0.01 + wake_a, 0.01, 0.01, 0.01 + wake_b, 0.01, 0.01])
    assert [r.first_token_s for r in log.requests] == pytest.approx([0.51 + wake_a, 2.01 + wake_b])
    busy = requests_at([0.2, 0.205], prompt=10, output=3)  # B arrives while A runs: only A's prefill wakes
    woken = run(busy, policies.parse("ar"), cost_model=waking).step_duration_s
    assert len(woken) == 4 and woken.tolist() == pytest.approx(
        run(busy, policies.parse("ar"), cost_model=plain).step_duration_s + [0.03 * -np.expm1(-0.2 / 0.5), 0, 0, 0])
    # With wake_next_share 1/4 the step after A's prefill pays a quarter of A's wake.
    shared = run(requests, policies.parse("ar"), cost_model=replace(waking, wake_next_share=0.25)).step_duration_s
    assert shared[:3].tolist() == pytest.approx([0.01 + 0.75 * wake_a, 0.01 + 0.25 * wake_a, 0.01])


def test_a_wake_cost_must_be_non_negative():
    with pytest.raises(InputError, match="wake_tau_s"):
        replace(costs.build("constant:10", LLAVA, H100), wake_s=0.01, wake_tau_s=0.0)
    with pytest.raises(InputError, match="wake_next_share"):
        replace(costs.build("constant:10", LLAVA, H100), wake_s=0.01, wake_next_share=1.5)


@pytest.mark.parametrize("p", [0.5, 0.8])
@pytest.mark.parametrize("k", [1, 3, 5])
def test_mean_tokens_per_round_closed_form(p, k):
    # i.i.d. acceptance p, draft length k: tokens per round = accepted + 1 with
    # P(accepted >= j) = p^j, mean (1 - p^(k+1)) / (1 - p). The bound is four
    # standard errors (a false alarm about once in 16,000 runs).
    log = run(requests_at(np.zeros(40), output=400), policies.parse(f"linear:k={k}"),
              accept=acceptance.AcceptanceModel.iid(p))
    emitted = log.round_accepted + 1
    j = np.arange(1, k + 1)
    mean = acceptance.mean_chain_tokens(p, k)
    second = 1 + np.sum((2 * j + 1) * p**j)  # E[X^2] for X = 1 + accepted
    sd = np.sqrt(second - mean**2)
    assert abs(emitted.mean() - mean) < 4 * sd / np.sqrt(len(emitted)), (emitted.mean(), mean)


def test_chain_tree_prices_and_accepts_like_linear():
    # A tree of top-1 children only is a chain: same plan, same price, same log.
    reqs = requests_at(np.linspace(0, 2, 30), output=50, images=(576,))
    roof = costs.build("roofline", LLAVA, H100)
    linear = run(reqs, policies.parse("linear:k=4"), cost_model=roof)
    chain = run(reqs, policies.parse("tree:depth=4,topk=1,budget=4"), cost_model=roof)
    assert np.array_equal(linear.step_duration_s, chain.step_duration_s)
    assert np.array_equal(linear.chunk_tokens, chain.chunk_tokens)
    assert np.array_equal(linear.step_plans, chain.step_plans)


@pytest.mark.parametrize("spec", ["ar", "linear:k=3", "tree", "truncate", "batch_table", "goodput", "marginal",
                                  "oracle"])
def test_every_request_finishes_with_its_output(spec, roofline):
    reqs = requests_at(np.sort(np.random.default_rng(1).uniform(0, 3, 60)), output=40, images=(576,))
    log = run(reqs, policies.parse(spec), cost_model=roofline)
    assert log.complete
    assert per_request_tokens(log).tolist() == [40] * 60
    for r in log.requests:
        assert r.arrival_s <= r.admitted_s < r.first_token_s <= r.finish_s
    assert np.all(np.diff(log.chunk_time_s) >= 0)


def test_same_seed_same_log_different_seed_differs(roofline):
    reqs = requests_at(np.linspace(0, 1, 20), output=30)
    a, b = (run(reqs, policies.parse("marginal"), cost_model=roofline, seed=7) for _ in range(2))
    c = run(reqs, policies.parse("marginal"), cost_model=roofline, seed=8)
    assert np.array_equal(a.chunk_time_s, b.chunk_time_s) and np.array_equal(a.round_accepted, b.round_accepted)
    assert not np.array_equal(a.round_accepted, c.round_accepted)


def test_preemption_recomputes_and_never_drops(roofline):
    # A KV cache of 1,000 tokens holds about five of these requests at once:
    # the newest are preempted, recompute their prompt + output, and finish.
    reqs = requests_at(np.zeros(12), prompt=100, output=60)
    log = run(reqs, policies.parse("linear:k=3"), cost_model=roofline, kv_tokens=1000)
    assert log.complete
    assert sum(r.preemptions for r in log.requests) > 0
    assert per_request_tokens(log).tolist() == [60] * 12


def test_max_num_seqs_caps_the_batch(roofline):
    log = run(requests_at(np.zeros(20), output=20), policies.parse("ar"), cost_model=roofline,
              engine=EngineConfig(max_num_seqs=4))
    assert log.step_batch.max() == 4


def test_request_larger_than_kv_cache_is_an_input_error():
    with pytest.raises(InputError, match="kv_cache_tokens"):
        run(requests_at([0.0], prompt=500, output=600), policies.parse("ar"), kv_tokens=1000)


def test_light_load_drafts_trees_heavy_load_short_chains(roofline):
    # The marginal rule: idle capacity -> trees; compute-bound -> few tokens.
    light = run(requests_at(np.arange(5) * 2.0, output=100), policies.parse("marginal"), cost_model=roofline)
    heavy = run(requests_at(np.zeros(128), prompt=1500, output=100), policies.parse("marginal"), cost_model=roofline,
                engine=EngineConfig(max_num_seqs=128))
    light_share = light.step_plans.sum(axis=0) / light.step_plans.sum()
    assert light_share[2] > 0.9  # trees
    busy = heavy.step_batch >= 100
    assert heavy.round_drafted.mean() < 0.25 * light.round_drafted.mean()
    assert heavy.step_plans[busy, 2].sum() < heavy.step_plans[busy].sum()


def test_sim_imports_and_runs_without_torch():
    code = (
        "import sys, importlib.abc\n"
        "class Block(importlib.abc.MetaPathFinder):\n"
        "    def find_spec(self, name, path, target=None):\n"
        "        if name == 'torch' or name.startswith('torch.'): raise ImportError('torch blocked')\n"
        "sys.meta_path.insert(0, Block())\n"
        "import simspec.sim, simspec.experiment, simspec.config\n"
        "from simspec import config, experiment\n"
        "r = experiment.run(config.build(flag_values={'workload': {'num_requests': 10}, 'policies': ['marginal']}))\n"
        "assert r.metrics['marginal']['completed'] == 10\n"
        "assert 'torch' not in sys.modules and 'triton' not in sys.modules\n"
        "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


@pytest.mark.parametrize("drafting", ["level", "chain"])
def test_first_drafter_call_absorbs_what_each_request_accepted(drafting):
    # Only drafter rows cost (1 ms each), so the run's busy time counts them.
    # linear:k=1 drafts every round: its one call absorbs the prompt (first
    # round), then the tokens the last round committed; the last round's are
    # never run. Two requests at once share steps; that changes nothing.
    model = costs.CostModel(label="drafter rows only", calibrated=False,
                            draft_s_table=costs.base.frozen_table(1e-3 * costs.base.TOKENS))
    requests = requests_at([0.0, 0.0], prompt=12, output=30)
    log = run(requests, policies.parse("linear:k=1"), cost_model=model, engine=EngineConfig(drafting=drafting))
    last = {int(i): int(n) for i, n in zip(log.chunk_request, log.chunk_tokens)}
    rows = sum(r.prompt_tokens + r.output_tokens - 1 - last[r.id] for r in requests)
    assert log.step_duration_s.sum() == pytest.approx(rows * 1e-3)


def test_padded_attention_prices_rows_times_the_longest_context():
    # Only the padded-cache term costs (1 us a slot). AR, one request of P
    # prompt tokens: the prefill chunk has no cached context; decode step s
    # (s = 0 .. n-2) reads a cache of P + s tokens, one row.
    model = costs.CostModel(label="padded slots only", calibrated=False, kv_s_per_padded_token=1e-6)
    p, n = 20, 9
    log = run(requests_at([0.0], prompt=p, output=n), policies.parse("ar"), cost_model=model)
    assert log.step_duration_s.sum() == pytest.approx(1e-6 * sum(p + s for s in range(n - 1)))
    # Two requests prefilled together decode as two rows of the longer cache.
    log = run(requests_at([0.0, 0.0], prompt=p, output=3), policies.parse("ar"), cost_model=model)
    assert log.step_duration_s.sum() == pytest.approx(1e-6 * 2 * (p + p + 1))


def test_each_kind_of_attention_call_is_priced_as_its_own_kind():
    # Only attention floors cost: 1 ms a prefill call, 2 ms a decode call,
    # 3 ms a verification call. One request of 20 prompt tokens and 9
    # output tokens: a prefill step, then AR decodes 8 steps; linear:k=1
    # verifies a draft in every step after it.
    floors = costs.base.attention_table(*(costs.base.attention_row(floor_s=s) for s in (1e-3, 2e-3, 3e-3)))
    model = costs.CostModel(label="attention floors only", calibrated=False, attention=floors)
    requests = requests_at([0.0], prompt=20, output=9)
    ar = run(requests, policies.parse("ar"), cost_model=model)
    assert ar.step_duration_s.tolist() == pytest.approx([1e-3] + [2e-3] * 8)
    linear = run(requests, policies.parse("linear:k=1"), cost_model=model)
    steps = len(linear.step_duration_s)
    assert 1 < steps < 9 and linear.step_duration_s.tolist() == pytest.approx([1e-3] + [3e-3] * (steps - 1))


def test_chain_first_drafting_counts_each_off_chain_parent_once():
    """A chain-first engine drafts the rank-1 chain, then one row per plan
    node off that chain that has children, depth by depth."""
    from simspec.sim.steps import offchain_rows
    from simspec.types import RANK_BITS

    def code(*ranks):
        return sum(r << (RANK_BITS * d) for d, r in enumerate(ranks))

    paths = [(1,), (2,), (1, 1), (1, 2), (2, 1), (1, 1, 1), (2, 1, 1), (1, 2, 1), (1, 2, 2)]
    codes = np.array([[code(*p) for p in paths]], dtype=np.int64)
    rows = offchain_rows(codes, np.array([len(paths)]), 3)
    # depth 2: parent (2) is off the chain; depth 3: parents (2, 1) and (1, 2), the latter once
    assert rows.tolist() == [0, 1, 2]
    chain = np.array([[code(1), code(1, 1), code(1, 1, 1)]], dtype=np.int64)
    assert offchain_rows(chain, np.array([3]), 3).tolist() == [0, 0, 0]


@pytest.mark.parametrize("python", [False, True], ids=["compiled-path", "python-path"])
def test_a_run_without_event_detail_leaves_out_only_the_chunk_and_round_arrays(python, roofline):
    import dataclasses
    import pickle

    from simspec.sim import simulate
    from simspec.types import RunLog

    reqs = requests_at(np.sort(np.random.default_rng(2).uniform(0, 2, 50)), output=30, images=(576,))
    full, lean = (simulate(reqs, policy=policies.parse("marginal"), costs=roofline,
                           acceptance=acceptance.preset(acceptance.DEFAULT_PRESET), engine=EngineConfig(),
                           kv_budget_tokens=200_000, seed=3, event_detail=detail, _python=python)
                  for detail in (True, False))
    for field in dataclasses.fields(RunLog):
        a, b = getattr(full, field.name), getattr(lean, field.name)
        if field.name.startswith(("chunk_", "round_")):
            assert a is not None and len(a) and b is None, field.name
        else:
            assert pickle.dumps(a) == pickle.dumps(b), field.name


def test_a_long_run_keeps_counts_not_events_and_its_metrics(monkeypatch):
    """Past the detail and exact-gap limits the log drops its per-chunk and
    per-round arrays and bins the gaps; every metric but the ITL percentiles
    is unchanged, and those move by less than the bins' half width."""
    from simspec import logs, metrics

    requests = requests_at(np.arange(40) * 0.05, output=30)
    small = run(requests, policies.parse("linear:k=3"))
    monkeypatch.setattr(logs, "DETAIL_EVENTS", 10)
    monkeypatch.setattr(logs, "EXACT_GAPS", 10)
    monkeypatch.setattr(logs, "DETAIL_STEPS", 10)
    big = run(requests, policies.parse("linear:k=3"))
    assert small.chunk_request is not None and big.chunk_request is None and big.round_accepted is None
    assert small.step_batch is not None and big.step_batch is None and big.steps.steps == len(small.step_batch)
    assert metrics.mean_decode_batch(big) == pytest.approx(metrics.mean_decode_batch(small), rel=1e-12)
    edges = np.linspace(0, small.end_s, 7)
    assert metrics.tokens_per_s(big, edges).sum() == pytest.approx(metrics.tokens_per_s(small, edges).sum())
    assert big.gaps.exact_s is None and big.gaps.count == small.gaps.count == len(small.gaps.exact_s)
    a, b = metrics.summarize_full(small), metrics.summarize_full(big)
    for key in a:
        if key.endswith("_itl_ms") and not key.startswith(("mean", "std")):
            assert b[key] == pytest.approx(a[key], rel=(logs.GAP_RATIO - 1) / 2 + 1e-12), key
        elif key.endswith("_itl_ms"):
            assert b[key] == pytest.approx(a[key], rel=1e-9, abs=1e-9), key
        else:
            assert b[key] == a[key] or (a[key] != a[key] and b[key] != b[key]), key
