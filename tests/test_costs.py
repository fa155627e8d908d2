"""Cost models: roofline shape, closed forms, one formula for all callers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import H100, LLAVA
from simspec import costs
from simspec.types import InputError, StepShape


@pytest.mark.parametrize("gpu", list(costs.GPUS))
@pytest.mark.parametrize("model", ["LLaVA-1.5-7B", "LLaVA-1.6-13B", "Qwen2-VL-7B"])
def test_roofline_is_monotone_flat_then_sloped(gpu, model):
    c = costs.build("roofline", costs.model_spec(model), costs.gpu_spec(gpu))
    assert not c.calibrated and "roofline prior" in c.label
    tokens = np.arange(1, 4097)
    t = c.forward_s(tokens, 1000, tokens * 1000, tokens)
    assert np.all(np.diff(t) >= 0)
    assert t[15] < 1.05 * t[0]  # 16 tokens cost about as much as one: memory-bound
    assert t[4095] > 5 * t[0]  # 4096 are compute-bound


def test_marginal_token_cost_is_small_below_the_knee_and_large_beyond(roofline):
    small = StepShape(forward_tokens=8, kv_read_tokens=8000, attn_pairs=8000, logit_tokens=8)
    large = StepShape(forward_tokens=2048, kv_read_tokens=8000, attn_pairs=8000, logit_tokens=2048)
    assert roofline.marginal_token_s(large) > 20 * roofline.marginal_token_s(small)


def test_h100_decode_step_is_in_the_measured_range(roofline):
    # LLaVA-1.5-7B (Vicuna-7B) batch-1 decode on an H100 runs at about
    # 5-8 ms a token in vLLM; the prior must land there.
    step = roofline.step_s(StepShape(forward_tokens=1, kv_read_tokens=1000, attn_pairs=1000, logit_tokens=1))
    assert 0.004 < step < 0.009


def test_constant_and_affine_closed_forms():
    constant = costs.build("constant:12.5", LLAVA, H100)
    affine = costs.build("affine:4,0.01", LLAVA, H100)
    shapes = [StepShape(forward_tokens=n, kv_read_tokens=5 * n, attn_pairs=7 * n, logit_tokens=n,
                        vision_tokens=576, draft_level_tokens=(2, 8)) for n in (1, 100, 5000)]
    assert [constant.step_s(s) for s in shapes] == pytest.approx([0.0125] * 3)
    assert [affine.step_s(s) for s in shapes] == pytest.approx([0.004 + 1e-5 * n for n in (1, 100, 5000)])


def with_attention_terms(model):
    """``model`` with more per-sequence and per-query attention terms (a fitted model's form)."""
    a = model.attention.copy()
    a[:, costs.base.A_REQUEST] += 3e-5
    a[:, costs.base.A_QUERY] += 2e-6
    return dataclasses.replace(model, attention=costs.base.attention_table(*a), kv_s_per_padded_token=1e-8)


@pytest.mark.parametrize("terms", [False, True], ids=["roofline", "with-request-query-and-padding-terms"])
def test_compiled_step_cost_equals_the_sum_of_its_parts(roofline, terms):
    model = with_attention_terms(roofline) if terms else roofline
    shape = StepShape(forward_tokens=300, kv_read_tokens=9000, attn_pairs=90000, logit_tokens=40, attn_requests=12,
                      padded_kv_tokens=12 * 1500, vision_tokens=1152, draft_level_tokens=(4, 16, 16), draft_kept_visual_tokens=32,
                      select_visual_tokens=2304, select_requests=4)
    # the CPU part per step and per sequence; a drafted step's round costs, per round and per decoding request
    cpu = model.overhead_s + 12 * model.overhead_s_per_request
    rounds = model.draft_s_per_round + 12 * model.draft_s_per_round_request
    parts = (cpu + model.forward_s(300, 9000, 90000, 40, 12, 18000) + model.vision_s(1152) + rounds
             + sum(model.draft_level_s(t, 32) for t in (4, 16, 16)) + model.select_s(4, 2304))
    assert model.step_s(shape) == pytest.approx(parts, rel=1e-12)
    tables = model.tables
    compiled = costs.base.forward_cost(tables, costs.base.Forward(300, 9000, 90000, 40, 12, 18000, 0, 0, 0, 0, False))
    assert compiled == pytest.approx(model.forward_s(300, 9000, 90000, 40, 12, 18000), rel=1e-12)
    extra = 12 * 3e-5 + 300 * 2e-6 + 18000 * 1e-8 if terms else 0.0
    assert compiled == pytest.approx(roofline.forward_s(300, 9000, 90000, 40, 12, 18000) + extra, rel=1e-12)


def by_kind(model):
    """``model`` with its own attention coefficients for each kind, one of them past a cache knee."""
    row = costs.base.attention_row
    table = costs.base.attention_table(
        row(kv_s=1e-7, pair_s=1e-10, request_s=1e-5, query_s=1e-6, floor_s=2e-4),  # prefill
        row(kv_s=3e-7, pair_s=2e-10, request_s=2e-5, kv_over_s=1e-6, kv_knee=4000),  # decode
        row(kv_s=5e-7, pair_s=4e-10, query_s=3e-6, floor_s=1e-4, pair_over_s=1e-9, pair_knee=20000))
    return dataclasses.replace(model, attention=table)


SPLIT = dict(forward_tokens=300, kv_read_tokens=9000, attn_pairs=90000, logit_tokens=40, attn_requests=12,
             prefill_tokens=200, prefill_kv_tokens=1200, prefill_attn_pairs=60000, prefill_requests=2)


@pytest.mark.parametrize("verifying", [False, True])
def test_each_kind_of_attention_is_priced_by_its_own_coefficients(roofline, verifying):
    model = by_kind(roofline)
    # Prefill: 200 tokens of 2 chunks reading 1200 tokens over 60000 pairs;
    # the rounds: 100 tokens of 10 requests over 7800 tokens and 30000 pairs.
    if verifying:  # past the pair knee (20000): 10000 pairs at the extra price
        memory, compute, linear = 7800 * 5e-7, 30000 * 4e-10 + 10000 * 1e-9, 100 * 3e-6 + 1e-4
    else:  # past the kv knee (4000): 3800 tokens at the extra price
        memory, compute, linear = 7800 * 3e-7 + 3800 * 1e-6, 30000 * 2e-10, 10 * 2e-5
    memory += 1200 * 1e-7
    compute += 60000 * 1e-10
    linear += 2 * 1e-5 + 200 * 1e-6 + 2e-4
    attention = costs.base.blend(memory, compute) + linear
    no_attention = dataclasses.replace(roofline, attention=costs.base.ZERO_ATTENTION)
    expected = no_attention.forward_s(300, 9000, 90000, 40, 12) + attention
    shape = StepShape(**SPLIT, verifying=verifying)
    assert model.step_s(shape) == pytest.approx(model.overhead_s + expected, rel=1e-12)
    compiled = costs.base.forward_cost(model.tables, costs.base.Forward(300, 9000, 90000, 40, 12, 0, 200, 1200, 60000, 2,
                                                                         verifying))
    assert compiled == pytest.approx(expected, rel=1e-12)


def test_one_set_of_coefficients_prices_every_split_alike(roofline):
    one = roofline.attention[costs.base.DECODE].copy()
    one[costs.base.A_FLOOR] = 0.0  # a floor is paid per kind of call in the step
    model = with_attention_terms(dataclasses.replace(roofline, attention=costs.base.attention_table(one, one, one)))
    whole = model.step_s(StepShape(**{k: v for k, v in SPLIT.items() if not k.startswith("prefill")}))
    for verifying in (False, True):
        assert model.step_s(StepShape(**SPLIT, verifying=verifying)) == pytest.approx(whole, rel=1e-12)


def test_tables_extrapolate_past_their_end(roofline):
    n = costs.base.TABLE_TOKENS
    inside, edge, beyond = roofline.forward_s(np.array([n - 2, n - 1, n + 99]), 0, 0, 0)
    assert beyond - edge == pytest.approx(100 * (edge - inside), rel=1e-9)


def test_the_compiled_table_lookup_reads_inside_and_extrapolates_past_the_end():
    table = np.array([0.5, 0.75, 1.5, 2.0])
    assert [costs.base.table_at(table, t) for t in range(4)] == table.tolist()
    assert costs.base.table_at(table, 6) == 2.0 + 3 * (2.0 - 1.5)
    assert costs.base.table_at(np.array([0.25]), 5) == 0.25  # one entry: flat past it


def test_kv_budget_from_memory():
    from simspec.sim import EngineConfig
    tokens = EngineConfig().kv_budget_tokens(LLAVA, H100)
    expected = (80e9 * 0.9 - LLAVA.weight_bytes - 2 * 1024**3) / LLAVA.kv_bytes_per_token
    assert tokens == int(expected) and 80_000 < tokens < 140_000


@pytest.mark.parametrize("spec,needle", [("constant:-1", r"STEP_MS: each number must be in \[0, 1e\+06\] ms"),
                                         ("constant:0", "STEP_MS must be > 0"), ("constant:nan", r"in \[0, 1e\+06\]"),
                                         ("constant:x", "constant:STEP_MS"),
                                         ("affine:1", "affine:BASE_MS,PER_TOKEN_MS"),
                                         ("affine:-1,2", r"PER_TOKEN_MS: each number must be in \[0"),
                                         ("affine:0,0", "not both 0"), ("affine:1,inf", r"in \[0, 1e\+06\]"),
                                         ("magic", "cost_model must be one of")])
def test_bad_cost_models_name_the_problem(spec, needle):
    with pytest.raises(InputError, match=needle):
        costs.build(spec, LLAVA, H100)


@pytest.mark.parametrize("lookup,name", [(costs.model_spec, "LLaVA-9B"), (costs.gpu_spec, "h300")])
def test_unknown_specs(lookup, name):
    with pytest.raises(InputError, match="must be one of"):
        lookup(name)


@pytest.mark.parametrize("spec", ["auto", "roofline"])
def test_a_device_known_only_from_profiles_has_no_prior_for_other_models(spec):
    """The CPU is profiled for the tiny VLM and LLaVA-1.5-7B only: Qwen2-VL
    on it has neither a profile nor datasheet numbers to price it with."""
    cpu = costs.gpu_spec("cpu-intel-xeon-processor")
    with pytest.raises(InputError, match="no datasheet for a roofline prior and no profile of Qwen2-VL-7B"):
        costs.build(spec, costs.model_spec("Qwen2-VL-7B"), cpu)


def test_cost_models_are_kept_until_their_profile_changes(tmp_path):
    import os
    import shutil

    from simspec.costs.profiles import default_root

    shutil.copytree(default_root() / "h100-sxm", tmp_path / "h100-sxm")
    first = costs.build("auto", LLAVA, H100, tmp_path)
    assert costs.build("auto", LLAVA, H100, tmp_path) is first  # fitted once
    csv = next((tmp_path / "h100-sxm").rglob("*.csv"))
    os.utime(csv, ns=(0, csv.stat().st_mtime_ns + 10**9))  # re-measured: refitted
    again = costs.build("auto", LLAVA, H100, tmp_path)
    assert again is not first and again.label == first.label


def test_a_fitted_model_is_stored_between_processes_and_refitted_when_a_byte_changes(tmp_path, monkeypatch):
    import shutil

    from simspec.costs.profiles import default_root

    monkeypatch.setenv("SIMSPEC_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(default_root() / "h100-sxm", tmp_path / "h100-sxm")
    sources = costs._sources("auto", H100, tmp_path)
    fitted = costs._stored("auto", LLAVA, H100, tmp_path, sources)
    assert len(list((tmp_path / "cache" / "cost-models").glob("*.pickle"))) == 1
    monkeypatch.setattr(costs, "_make", lambda *a: pytest.fail("fitted again, not read back"))
    stored = costs._stored("auto", LLAVA, H100, tmp_path, sources)
    for name in ("layers_s", "head_s", "attention", "vision_s_table", "draft_s_table"):
        assert np.array_equal(getattr(stored, name), getattr(fitted, name)), name
        assert not getattr(stored, name).flags.writeable, name
    assert stored == fitted  # every other field
    monkeypatch.undo()
    monkeypatch.setenv("SIMSPEC_CACHE_DIR", str(tmp_path / "cache"))
    csv = next((tmp_path / "h100-sxm").rglob("*.csv"))
    csv.write_bytes(csv.read_bytes() + b"\n")  # same numbers, other bytes: another key
    refitted = []
    monkeypatch.setattr(costs, "_make", lambda *a: refitted.append(a) or fitted)
    costs._stored("auto", LLAVA, H100, tmp_path, costs._sources("auto", H100, tmp_path))
    assert refitted


def test_the_store_is_keyed_by_the_priors_fixed_terms_as_the_process_holds_them(tmp_path, monkeypatch):
    """benchmarks/published.py --fit varies the prior's fixed terms at run
    time: a model stored under other terms must not be read back for them."""
    import shutil
    import sys

    from simspec.costs.profiles import default_root

    prior = sys.modules["simspec.costs.roofline"]
    monkeypatch.setenv("SIMSPEC_CACHE_DIR", str(tmp_path / "cache"))
    shutil.copytree(default_root() / "h100-sxm", tmp_path / "h100-sxm")
    sources = costs._sources("auto", H100, tmp_path)
    llama = costs.model_spec("Llama-3.1-8B", "eagle1")  # no profile of its own on the H100: the prior
    before = costs._stored("auto", llama, H100, tmp_path, sources)
    monkeypatch.setattr(prior, "FIXED", dataclasses.replace(prior.FIXED, draft_step_s=prior.FIXED.draft_step_s + 1e-3))
    after = costs._stored("auto", llama, H100, tmp_path, sources)
    assert np.allclose(after.draft_s_table, before.draft_s_table + 1e-3)


def test_the_compiled_blend_root_is_the_fourth_root_within_an_ulp():
    from simspec.costs.base import BLEND_P, blend_root

    assert BLEND_P == 4  # blend_root takes two square roots
    x = np.random.default_rng(0).random(2000) * np.logspace(-15, 3, 2000)
    got = np.array([blend_root(v) for v in x])
    assert np.all(np.abs(got - x ** 0.25) <= np.spacing(x ** 0.25))
    assert np.mean(got != x ** 0.25) < 0.3  # most are the correctly rounded power itself
