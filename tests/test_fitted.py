"""Cost models fitted to operator profiles: loading, fitting, composing."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from conftest import H100, LLAVA
from simspec import costs
from simspec.costs import attention, curves, fitted, profiles
from simspec.costs.base import (A_PAIR, A_PAIR_KNEE, A_PAIR_OVER, A_QUERY, A_REQUEST, DECODE, PREFILL, VERIFY,
                                blend)
from simspec.types import InputError, StepShape

TOKENS = [1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096]


def knee(params: float, tokens):
    """A GEMM's time on an H100-like device, ms: flat, then a slope."""
    t = np.asarray(tokens, dtype=float)
    return 0.004 + blend(2 * params / 2.5e12, 2 * params * t / 5e14) * 1e3


def write_profile(folder, ops: dict[str, pd.DataFrame], **meta):
    folder.mkdir(parents=True, exist_ok=True)
    base = {"device": "Test GPU", "device_slug": folder.parent.name, "model": folder.name, "source": "synthetic",
            "memory_bytes": 80e9}
    (folder / "meta.json").write_text(json.dumps({**base, **meta}))
    for op, table in ops.items():
        table.to_csv(folder / f"{op}.csv", index=False)


def layer_ops(noise=0.0, seed=0) -> dict[str, pd.DataFrame]:
    rng = np.random.default_rng(seed)
    h, m = LLAVA.hidden, LLAVA.mlp_hidden
    params = {"input_layernorm": h / 50, "attn_pre_proj": 3 * h * h, "attn_rope": h / 20, "attn_post_proj": h * h,
              "post_attention_layernorm": h / 50, "mlp_up_proj": 2 * h * m, "mlp_act": m / 20, "mlp_down_proj": h * m,
              "add": h / 100}
    out = {}
    for op, p in params.items():
        ms = knee(p, TOKENS) * (1 + noise * rng.standard_normal(len(TOKENS)))
        out[op] = pd.DataFrame({"tokens": TOKENS, "median_ms": ms, "p10_ms": ms * 0.95, "p90_ms": ms * 1.05,
                                "samples": 20, "skipped": ""})
    return out


def attention_ops() -> dict[str, pd.DataFrame]:
    rows = [(b, c) for b in (1, 8, 32, 64) for c in (128, 512, 2048, 8192)]
    decode = pd.DataFrame(rows, columns=["batch", "context_tokens"])
    kv = decode.batch * decode.context_tokens
    decode["median_ms"] = 0.01 + blend(kv * 2e-6, kv * 1e-9)
    prefill = pd.DataFrame([(t, c) for t in (64, 256, 1024, 4096) for c in (0, 1024, 4096)],
                           columns=["tokens", "context_tokens"])
    pairs = prefill.tokens * prefill.context_tokens + prefill.tokens * (prefill.tokens + 1) / 2
    prefill["median_ms"] = 0.01 + blend((prefill.context_tokens + prefill.tokens) * 2e-6, pairs * 1e-9)
    return {"attn_decode": decode, "attn_prefill": prefill}


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_layer_fits_predict_held_out_points(tmp_path, noise):
    write_profile(tmp_path / "test-gpu" / "Llama-2-7B", layer_ops(noise))
    result = fitted.fit_profiles([profiles.load(tmp_path / "test-gpu" / "Llama-2-7B")], LLAVA, H100)
    for fit in result.fits:
        assert fit.median_ape <= 0.05 + 2 * noise, fit
    assert result.layer.median_ape <= 0.05 + noise
    assert "attention" in result.prior and not result.cost_model.calibrated


def test_fitted_curves_are_monotone_in_tokens(tmp_path):
    write_profile(tmp_path / "g" / "Llama-2-7B", layer_ops(0.08, seed=3))
    model = fitted.fit_profiles([profiles.load(tmp_path / "g" / "Llama-2-7B")], LLAVA, H100).cost_model
    assert np.all(np.diff(model.layers_s) >= 0)


@pytest.mark.slow
def test_full_profile_is_calibrated_and_prices_like_its_measurements(tmp_path):
    ops = {**layer_ops(), **attention_ops(),
           "lm_head": pd.DataFrame({"tokens": TOKENS, "median_ms": knee(LLAVA.lm_head_params, TOKENS)}),
           "vision_encoder": pd.DataFrame({"images": [1, 2, 4], "median_ms": [3.0, 5.0, 9.0]}),
           "drafter_step": pd.DataFrame([(t, k, 0.3 + 0.001 * t + 1e-4 * t * k) for t in TOKENS[:12] for k in (0, 8, 32)],
                                        columns=["tokens", "kept_tokens", "median_ms"]),
           "select": pd.DataFrame([(r, v, 0.02 + 1e-6 * r * v) for r in (1, 8, 32) for v in (576, 2880)],
                                  columns=["requests", "visual_tokens", "median_ms"]),
           "int8_quantize": pd.DataFrame({"visual_tokens": [576, 1152, 2880], "median_ms": [0.01, 0.02, 0.05]})}
    write_profile(tmp_path / "h100-sxm" / "LLaVA-1.5-7B", ops)
    model = costs.build("auto", LLAVA, H100, profiles_root=tmp_path)
    assert model.calibrated and model.label.startswith("fitted profile")
    layer = sum(ops[op].median_ms.to_numpy() * (2 if op == "add" else 1) for op in profiles.LAYER_OPS)
    assert model.layers_s[1024] / 1e-3 == pytest.approx(
        LLAVA.layers * (layer[TOKENS.index(1024)]) + LLAVA.layers * 0.01, rel=0.03)
    assert model.vision_s(576) == pytest.approx(3.01e-3, rel=0.02)  # one image + its int8 keys
    assert model.select_s(8, 8 * 576) == pytest.approx((0.02 + 1e-6 * 8 * 576) * 1e-3, rel=0.02)
    step = model.step_s(StepShape(forward_tokens=8, kv_read_tokens=8 * 2048, attn_pairs=8 * 2048, logit_tokens=8))
    assert 0 < step < 0.05


@pytest.mark.slow
def test_drafter_and_selection_forms_recover_cross_attention_and_squared_keys(tmp_path):
    # A drafter step: 0.3 ms + 0.001 ms a row, and once it cross-attends a
    # 0.25 ms call, 0.002 ms a row and 1e-4 ms a kept token read; selection
    # with a term in each request's keys squared (a CPU's caches). Both are
    # judged on held-out grid points, every K and request count included.
    def drafter(t, k):
        return 0.3 + 0.001 * t + (k > 0) * (0.25 + 0.002 * t) + 1e-4 * t * k

    def select(r, v):
        return 0.05 + 2e-5 * r * v + 3e-9 * r * v * v

    ops = {**layer_ops(), **attention_ops(),
           "drafter_step": pd.DataFrame([(t, k, drafter(t, k)) for t in TOKENS[:12] for k in (0, 8, 64)],
                                        columns=["tokens", "kept_tokens", "median_ms"]),
           "select": pd.DataFrame([(r, v, select(r, v)) for r in (1, 2, 4, 8) for v in (576, 1152, 2880)],
                                  columns=["requests", "visual_tokens", "median_ms"])}
    write_profile(tmp_path / "h100-sxm" / "LLaVA-1.5-7B", ops)
    found = profiles.find("h100-sxm", LLAVA, tmp_path)
    result = fitted.fit_profiles(found, LLAVA, H100)
    fits = {f.op: f for f in result.fits}
    assert fits["drafter_step"].points == 36 and len(fits["drafter_step"].heldout) > 0
    assert fits["drafter_step"].median_ape < 0.02 and fits["select"].median_ape < 0.02
    model = result.cost_model
    for t, k in ((1, 0), (3, 8), (40, 64), (100, 16)):  # off the grid too
        assert model.draft_level_s(t, t * k) == pytest.approx(drafter(t, k) * 1e-3, rel=0.03), (t, k)
    assert model.select_s(3, 3 * 2000) == pytest.approx(select(3, 2000) * 1e-3, rel=0.03)
    tables = model.tables  # the compiled prices agree with the model's own
    assert costs.base.draft_cost(tables, 40, 40 * 64) == pytest.approx(model.draft_level_s(40, 40 * 64), rel=1e-12)
    assert costs.base.select_cost(tables, 3, 6000) == pytest.approx(model.select_s(3, 6000), rel=1e-12)


def test_a_layer_shape_profile_serves_a_model_with_the_same_layers(tmp_path):
    write_profile(tmp_path / "h100-sxm" / "Llama-2-7B", layer_ops())
    model = costs.build("auto", LLAVA, H100, profiles_root=tmp_path)  # LLaVA-1.5-7B's LM is Llama-2-7B-shaped
    assert model.label.startswith("fitted profile") and "roofline prior for" in model.label
    assert costs.build("auto", costs.model_spec("LLaVA-1.6-13B"), H100, profiles_root=tmp_path).label.startswith(
        "roofline prior")


@pytest.mark.parametrize("damage,needle", [
    (lambda f: (f / "meta.json").unlink(), "no meta.json"),
    (lambda f: (f / "meta.json").write_text("{"), "not valid JSON"),
    (lambda f: (f / "meta.json").write_text("{}"), "missing key"),
    (lambda f: (f / "attn_pre_proj.csv").write_text("tokens,ms\n1,2\n"), "missing column"),
    (lambda f: (f / "attn_pre_proj.csv").write_text("tokens,median_ms\n1,abc\n"), "line 2"),
    (lambda f: (f / "mystery.csv").write_text("tokens,median_ms\n1,2\n"), "unknown operator"),
])
def test_malformed_profiles_name_the_file(tmp_path, damage, needle):
    folder = tmp_path / "h100-sxm" / "Llama-2-7B"
    write_profile(folder, layer_ops())
    damage(folder)
    with pytest.raises(InputError, match=needle):
        profiles.load(folder)


def test_profiled_device_without_datasheet_needs_every_piece(tmp_path):
    write_profile(tmp_path / "cpu-test" / "LLaVA-1.5-7B", layer_ops())
    cpu = costs.gpu_spec("cpu-test", profiles_root=tmp_path)
    assert cpu.memory_bytes == 80e9
    with pytest.raises(InputError, match="no datasheet numbers"):
        costs.build("auto", LLAVA, cpu, profiles_root=tmp_path)


@pytest.mark.slow
def test_costs_report_command(tmp_path, capsys):
    from simspec.cli import main

    write_profile(tmp_path / "h100-sxm" / "Llama-2-7B", {**layer_ops(0.02), **attention_ops()})
    png = tmp_path / "fit.png"
    assert main(["costs", "report", "--device", "h100-sxm", "--model", "LLaVA-1.5-7B", "--profiles",
                 str(tmp_path), "--png", str(png)]) == 0
    out = capsys.readouterr().out
    assert "held-out median APE" in out and "decoder layer (composed)" in out and "attn_decode" in out
    assert png.read_bytes().startswith(b"\x89PNG")


def test_costs_report_without_a_profile_is_one_line(tmp_path, capsys):
    from simspec.cli import main

    assert main(["costs", "report", "--device", "h100-sxm", "--model", "LLaVA-1.6-13B", "--profiles",
                 str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("simspec: error: device h100-sxm: no profile")


TRUE_ATTENTION = {  # by kind (costs.base PREFILL, DECODE, VERIFY); decode has a cache knee between measured sizes
    PREFILL: attention.AttentionFit(floor_ms=0.01, kv_ms=2e-6, pair_ms=1e-8, request_ms=0.0, query_ms=3e-5),
    DECODE: attention.AttentionFit(floor_ms=0.003, kv_ms=1e-6, pair_ms=0.0, request_ms=0.002, query_ms=0.0,
                                kv_over_ms=4e-6, kv_knee=20000.0),
    VERIFY: attention.AttentionFit(floor_ms=0.02, kv_ms=3e-6, pair_ms=5e-8, request_ms=0.001, query_ms=2e-4),
}


def attention_tables(truth: dict[int, attention.AttentionFit]) -> dict[str, pd.DataFrame]:
    """Every attention table, timed by its kind's ``truth`` exactly."""
    tables = {
        "attn_decode": pd.DataFrame([(b, c) for b in (1, 8, 32, 64) for c in (128, 512, 2048, 8192)],
                                    columns=["batch", "context_tokens"]),
        "attn_prefill": pd.DataFrame([(t, c) for t in (16, 64, 256, 1024, 4096) for c in (0, 1024, 4096)],
                                     columns=["tokens", "context_tokens"]),
        "attn_tree_verify": pd.DataFrame([(b, q, c) for b in (1, 8, 64) for q in (1, 8, 64) for c in (128, 2048)],
                                         columns=["batch", "query_tokens", "context_tokens"]),
    }
    for table in tables.values():
        table["median_ms"] = 1.0
    profile = profiles.Profile(folder=None, meta={}, tables=tables)
    a = attention.attention_terms(profile)
    ms = np.zeros(len(a.ms))
    for kind, fit in truth.items():
        ms[a.which == kind] = fit(a[a.which == kind])
    start = 0
    for op in attention.ATTENTION_OPS:  # attention_terms' order
        tables[op]["median_ms"] = ms[start:start + len(tables[op])]
        start += len(tables[op])
    return tables


@pytest.mark.slow
def test_attention_fit_recovers_each_kinds_coefficients_and_cache_knee(tmp_path):
    write_profile(tmp_path / "test-gpu" / "Llama-2-7B", attention_tables(TRUE_ATTENTION))
    found, fits = attention.fit_attention(attention.attention_terms(profiles.load(tmp_path / "test-gpu" / "Llama-2-7B")))
    assert set(found) == {PREFILL, DECODE, VERIFY}
    for kind, truth in TRUE_ATTENTION.items():
        for name in attention.AttentionFit.__slots__:
            assert getattr(found[kind], name) == pytest.approx(getattr(truth, name), rel=1e-3, abs=1e-12), (kind, name)
    assert all(fit.p95_ape < 1e-3 for fit in fits)
    assert [fit.kind for fit in fits] == ["attention", "attention + cache knee", "attention"]


@pytest.mark.slow
def test_fitted_attention_terms_reach_the_simulators_forward(tmp_path):
    write_profile(tmp_path / "h100-sxm" / "Llama-2-7B", {**layer_ops(), **attention_tables(TRUE_ATTENTION)})
    model = costs.build("auto", LLAVA, H100, profiles_root=tmp_path)
    per_model = 1e-3 * LLAVA.layers
    for kind, truth in TRUE_ATTENTION.items():
        assert model.attention[kind] == pytest.approx(truth.row(per_model), rel=1e-3, abs=1e-12)
    # 8 decode requests over 1000 tokens each: one more request costs its sequence, query and context
    for verifying, kind in ((False, DECODE), (True, VERIFY)):
        base = model.forward_s(8, 8000, 8000, 8, 8, verifying=verifying)
        more = model.forward_s(9, 9000, 9000, 9, 9, verifying=verifying)
        assert more - base > model.attention[kind, A_REQUEST] + model.attention[kind, A_QUERY]
    tokens = np.arange(1, 2049)
    for requests in (1, 64):  # monotone in tokens at any request count
        assert np.all(np.diff(model.forward_s(tokens, 1000 * requests, tokens * 1000, tokens, requests,
                                              verifying=True)) >= 0)
    assert model.forward_s(64, 64000, 64000, 64, 64) > model.forward_s(64, 64000, 64000, 64, 1)
    # A prefill chunk is priced as prefill: 512 tokens over 1024 cached, with 8 decode requests.
    prefill = (512, 1536, 512 * 1024 + 512 * 513 // 2, 1)
    mixed = model.forward_s(520, 1536 + 8000, prefill[2] + 8000, 9, 9, prefill=prefill)
    as_decode = model.forward_s(520, 1536 + 8000, prefill[2] + 8000, 9, 9)
    assert mixed != pytest.approx(as_decode, rel=1e-3)


@pytest.mark.slow
def test_an_attention_kind_the_profile_lacks_is_priced_as_a_measured_one_and_said(tmp_path):
    tables = attention_tables(TRUE_ATTENTION)
    del tables["attn_tree_verify"]
    write_profile(tmp_path / "h100-sxm" / "Llama-2-7B", {**layer_ops(), **tables})
    model = costs.build("auto", LLAVA, H100, profiles_root=tmp_path)
    pairs = [A_PAIR, A_PAIR_OVER, A_PAIR_KNEE]  # a verifying kernel computes its pairs as prefill does
    others = [k for k in range(model.attention.shape[1]) if k not in pairs]
    assert model.attention[VERIFY, others] == pytest.approx(model.attention[DECODE, others])
    assert model.attention[VERIFY, pairs] == pytest.approx(model.attention[PREFILL, pairs])
    assert "verify attention priced as decode plus prefill's pair compute" in model.label


def test_a_gpu_gemm_is_fitted_in_whole_row_tiles():
    tokens = np.arange(8, 1025, 8)
    ms = 0.02 + 0.01 * np.ceil(tokens / 64)  # a staircase: each 64-row tile costs the same
    curve, fit = curves.fit_curve(tokens, ms, "mlp_up_proj", tile=64)
    assert fit.p95_ape < 0.01 and fit.kind.endswith("tile 64")
    grid = np.arange(1, 4097)
    assert np.all(np.diff(curve(grid)) >= 0)
    assert curve(65) == curve(128) and curve(129) > curve(128)


def test_repeat_differences_compare_the_points_both_profiles_measured(tmp_path):
    from simspec.costs import report

    first, again = layer_ops(), layer_ops()
    again["mlp_up_proj"] = again["mlp_up_proj"].assign(median_ms=again["mlp_up_proj"].median_ms * 1.10)
    again["add"] = again["add"].iloc[::2]  # the repeat measured every other point
    del again["attn_rope"]
    write_profile(tmp_path / "a" / "h100-sxm" / "Llama-2-7B", first)
    write_profile(tmp_path / "b" / "h100-sxm" / "Llama-2-7B", again)
    found = profiles.find("h100-sxm", LLAVA, tmp_path / "a")
    repeat = report.load_repeat(tmp_path / "b", H100, LLAVA)
    diff = report.repeat_differences(found, repeat)
    np.testing.assert_allclose(diff["mlp_up_proj"], 0.10, rtol=1e-9)
    np.testing.assert_allclose(diff["attn_pre_proj"], 0.0, atol=1e-12)
    assert len(diff["add"]) == len(TOKENS[::2]) and "attn_rope" not in diff
    assert fitted.COMPOSED_LAYER not in diff  # a piece is missing from the repeat


def test_repeat_difference_of_the_composed_layer_weighs_each_piece_by_its_time(tmp_path):
    from simspec.costs import report

    first = layer_ops()
    again = {op: t.assign(median_ms=t.median_ms * (1.5 if op == "add" else 1.0)) for op, t in first.items()}
    write_profile(tmp_path / "a" / "h100-sxm" / "Llama-2-7B", first)
    write_profile(tmp_path / "b" / "h100-sxm" / "Llama-2-7B", again)
    diff = report.repeat_differences(profiles.find("h100-sxm", LLAVA, tmp_path / "a"),
                                     report.load_repeat(tmp_path / "b" / "h100-sxm" / "Llama-2-7B", H100, LLAVA))
    layer = sum(t.median_ms.to_numpy() * (2 if op == "add" else 1) for op, t in first.items())
    np.testing.assert_allclose(diff[fitted.COMPOSED_LAYER], 0.5 * 2 * first["add"].median_ms.to_numpy() / layer)


@pytest.mark.slow
def test_costs_report_prints_the_repeat_difference(tmp_path, capsys):
    from simspec.cli import main

    write_profile(tmp_path / "a" / "h100-sxm" / "Llama-2-7B", layer_ops(0.02, seed=1))
    write_profile(tmp_path / "b" / "h100-sxm" / "Llama-2-7B", layer_ops(0.02, seed=2))
    assert main(["costs", "report", "--device", "h100-sxm", "--model", "LLaVA-1.5-7B", "--profiles",
                 str(tmp_path / "a"), "--repeat", str(tmp_path / "b"), "--png", str(tmp_path / "fit.png")]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = next(line for line in lines if line.startswith("operator"))
    assert header.split()[-6:] == ["repeat", "median", "diff", "repeat", "p95", "diff"]
    layer = next(line for line in lines if line.startswith("decoder layer (composed)"))
    assert layer.split()[-2:] != ["-", "-"] and layer.split()[-1].endswith("%")


@pytest.mark.parametrize("where, message", [
    ("b/h100-sxm/LLaVA-1.5-13B", "a profile of LLaVA-1.5-13B, whose layers are not LLaVA-1.5-7B's"),
    ("b/a100-80gb/Llama-2-7B", "a profile of device a100-80gb, not h100-sxm"),
    ("empty", "no profile of LLaVA-1.5-7B on h100-sxm"),
])
def test_costs_report_refuses_a_repeat_of_something_else(tmp_path, capsys, where, message):
    from simspec.cli import main

    write_profile(tmp_path / "a" / "h100-sxm" / "Llama-2-7B", layer_ops())
    folder = tmp_path / where
    if where == "empty":
        folder.mkdir()
    else:
        write_profile(folder, layer_ops())
    assert main(["costs", "report", "--device", "h100-sxm", "--model", "LLaVA-1.5-7B", "--profiles",
                 str(tmp_path / "a"), "--repeat", str(folder), "--png", str(tmp_path / "fit.png")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and message in err[0]
