"""DeepSeek-V3 (latent attention, shared experts, FP8 weights, the MTP
drafter), Llama 4 Scout (interleaved experts, its processor's image tiling)
and the B200: read from their config files as the catalog holds them,
sized and priced as docs/models.md says."""

from __future__ import annotations

import sys
from dataclasses import replace
from pathlib import Path

import pytest

from conftest import invoke
from simspec import config as run_config
from simspec import costs
from simspec.costs.hfconfig import read_model_config
from simspec.costs.images import llama4_canvas
from simspec.serving.config import EngineConfig
from simspec.types import InputError

DATA = Path(__file__).resolve().parent / "data" / "llmfam"
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "benchmarks"))


def counts(m: costs.ModelSpec) -> tuple[float, float]:
    """(parameters, active parameters a token) in billions, one GPU at tp 1:
    decoder, embeddings and LM head, vision tower; active a text token: the
    dense layers, embeddings and LM head, and in a sparse layer attention,
    shared MLP, router and k experts (the vision tower runs on images only)."""
    embed = (1 if m.tied_embeddings else 2) * m.lm_head_params
    total = m.decoder_params + embed + m.vision_params
    dense = m.layers - m.sparse_layers
    active = (dense * m.layer_params + embed
              + m.sparse_layers * (m.sparse_always_params + m.experts_per_token * m.expert_params))
    return total / 1e9, active / 1e9


def test_the_deepseek_v3_config_reads_as_the_catalog_holds_it():
    spec = read_model_config(DATA / "deepseek_v3.json")
    assert spec.name == "deepseek-ai/DeepSeek-V3"
    assert replace(spec, name="DeepSeek-V3") == costs.model_spec("DeepSeek-V3")
    assert (spec.kv_lora_rank, spec.qk_rope_head_dim, spec.q_lora_rank, spec.v_head_dim) == (512, 64, 1536, 128)
    assert (spec.experts, spec.experts_per_token, spec.dense_layers, spec.sparse_layers) == (256, 8, 3, 58)
    assert (spec.shared_mlp_hidden, spec.weight_bytes_per_param, spec.dtype_bytes) == (2048, 1, 2)
    assert spec.drafter == "mtp" and spec.mtp_layers == 1


def test_the_llama4_config_reads_its_text_config_and_tiles_a_default_image_3_by_3():
    spec = read_model_config(DATA / "llama4_scout.json")
    assert replace(spec, name="Llama-4-Scout-17B-16E") == costs.model_spec("Llama-4-Scout-17B-16E")
    # 896 x 896: the least upscaling fits it into 3 x 3 tiles of 336 (scale 1008 / 896), plus the global
    # view: 10 views of 144 tokens, 577 through the encoder each
    assert (spec.visual_tokens_per_image, spec.vision_patches_per_image) == (1440, 5770)
    assert (spec.experts, spec.experts_per_token, spec.sparse_layers, spec.shared_mlp_hidden) == (16, 1, 48, 8192)
    assert spec.max_context_tokens == 10485760


@pytest.mark.parametrize("width, height, grid, tokens", [
    (300, 200, (1, 1), 144),  # upscaled into one tile (scale 1.12): no global view
    (336, 336, (1, 1), 144),
    (337, 336, (1, 2), 432),  # a pixel too wide for one tile: two and the global view
    (1344, 336, (1, 4), 720),  # exactly four tiles wide (scale 1)
    (200, 3000, (9, 1), 1440),  # tall: 9 rows (scale 3024 / 3000)
    (4000, 3000, (3, 4), 1872),  # no canvas upscales: the least downscaling (0.336) on the smallest canvas, 3 x 4
])
def test_llama4_tiles_an_image_as_its_processor_fits_it(width, height, grid, tokens):
    scout = costs.model_spec("Llama-4-Scout-17B-16E")
    assert llama4_canvas(width, height, scout.image_tiling) == grid
    served = scout.at_image_size(width, height)
    views = tokens // 144
    assert (served.visual_tokens_per_image, served.vision_patches_per_image) == (tokens, views * 577)


def test_maverick_style_interleaving_keeps_every_other_layer_dense(tmp_path):
    text = (DATA / "llama4_scout.json").read_text().replace('"interleave_moe_layer_step": 1',
                                                           '"interleave_moe_layer_step": 2')
    (tmp_path / "config.json").write_text(text)
    spec = read_model_config(tmp_path)
    assert (spec.sparse_layers, spec.dense_layers, spec.mlp_hidden) == (24, 24, 16384)
    scout = costs.model_spec("Llama-4-Scout-17B-16E")
    dense_minus_sparse = spec.layer_params - (scout.sparse_always_params + scout.experts * scout.expert_params)
    assert spec.decoder_params - scout.decoder_params == 24 * dense_minus_sparse


@pytest.mark.parametrize("tp", [1, 8])
def test_latent_kv_is_one_latent_a_layer_replicated_on_every_gpu(tp):
    spec = costs.model_spec("DeepSeek-V3", tp=tp)
    assert spec.kv_bytes_per_token == 61 * (512 + 64) * 2  # 70,272 bytes, bf16, whatever the degree


def test_deepseek_v3_counts_671b_parameters_37b_active():
    total, active = counts(costs.model_spec("DeepSeek-V3"))
    assert total == pytest.approx(671, rel=0.01)  # arXiv 2412.19437: 671B total (here 671.0B)
    assert active == pytest.approx(37, rel=0.03)  # and 37B activated (here 37.6B)


def test_llama4_scout_counts_109b_parameters_17b_active():
    total, active = counts(costs.model_spec("Llama-4-Scout-17B-16E"))
    assert total == pytest.approx(109, rel=0.02)  # Meta's model card: 109B total, 17B active (here 108.6B, 17.2B)
    assert active == pytest.approx(17, rel=0.03)


def test_llama4_maverick_counts_400b_parameters_17b_active_in_every_second_layer():
    maverick = costs.model_spec("Llama-4-Maverick-17B-128E")
    total, active = counts(maverick)
    assert total == pytest.approx(400, rel=0.02)  # Meta's model card: 400B total, 17B active (here 401.5B, 17.2B)
    assert active == pytest.approx(17, rel=0.03)
    assert (maverick.sparse_layers, maverick.dense_layers, maverick.chunked_layers) == (24, 24, 36)


def test_maverick_in_bf16_needs_eight_h200s_not_eight_h100s():
    with pytest.raises(InputError, match="does not fit on NVIDIA H100"):
        EngineConfig().kv_budget_tokens(costs.model_spec("Llama-4-Maverick-17B-128E", tp=8), costs.gpu_spec("h100-sxm"))
    assert EngineConfig().kv_budget_tokens(costs.model_spec("Llama-4-Maverick-17B-128E", tp=8),
                                           costs.gpu_spec("h200")) > 100_000


def test_fp8_weights_take_a_byte_and_the_mtp_layer_its_experts():
    spec = costs.model_spec("DeepSeek-V3")
    embed = 2 * spec.lm_head_params * 2  # embeddings and LM head stay bf16
    rope = 163_840 * 64 * 2  # the rotary table: a row of qk_rope_head_dim for each position, bf16
    assert spec.rope_table_bytes == rope
    assert spec.weight_bytes == spec.decoder_params + embed + spec.drafter_weight_params + rope
    assert spec.drafter_weight_params == 2 * 7168 * 7168 + spec.sparse_always_params + 256 * spec.expert_params
    eagle = costs.model_spec("DeepSeek-V3", "eagle1")
    assert spec.weight_bytes - eagle.weight_bytes > 10e9  # the MTP layer holds all 256 experts (~11.6 GB)


@pytest.mark.parametrize("tp", [1, 8])
def test_h100_refuses_deepseek_v3_naming_a_device_to_try(tp):
    with pytest.raises(InputError) as err:
        EngineConfig().kv_budget_tokens(costs.model_spec("DeepSeek-V3", tp=tp), costs.gpu_spec("h100-sxm"))
    message = str(err.value)
    assert "\n" not in message and "does not fit" in message and "try a device with more memory" in message


@pytest.mark.parametrize("device", ["h200", "b200"])
def test_deepseek_v3_fits_on_eight_h200s_or_b200s(device):
    assert EngineConfig().kv_budget_tokens(costs.model_spec("DeepSeek-V3", tp=8), costs.gpu_spec(device)) > 100_000


def test_one_h200_is_told_the_degree_that_fits():
    with pytest.raises(InputError, match="try --tp 8 or more"):
        EngineConfig().kv_budget_tokens(costs.model_spec("DeepSeek-V3"), costs.gpu_spec("h200"))


def test_fp8_weights_compute_at_fp8_rate_only_where_the_device_has_it():
    from simspec.costs.roofline import gemm_flops

    h100, a100, b200 = (costs.gpu_spec(s) for s in ("h100-sxm", "a100-80gb", "b200"))
    assert gemm_flops(h100, 1) / gemm_flops(h100, 2) == pytest.approx(1979 / 989)  # TFLOPS dense, datasheet
    assert gemm_flops(a100, 1) == gemm_flops(a100, 2)  # no FP8 tensor cores
    assert (b200.fp8_flops, b200.bf16_flops, b200.sms, b200.link_bytes_per_s) == (4.5e15, 2.25e15, 148, 900e9)


def test_the_mtp_drafter_is_deepseeks_default_and_refused_elsewhere():
    assert run_config.build({"model": "DeepSeek-V3"}).drafter == "mtp"
    assert run_config.build({"model": "DeepSeek-V3", "drafter": "eagle3"}).drafter == "eagle3"
    assert run_config.build({}).drafter == "eagle1"
    with pytest.raises(InputError, match="drafter mtp needs"):
        costs.model_spec("Llama-3.1-8B", "mtp")


def test_mtp_speculation_beats_ar_at_batch_1_and_touches_more_experts_than_one_token():
    import moe_speculation

    cost = costs.build("roofline", costs.model_spec("DeepSeek-V3", tp=8), costs.gpu_spec("h200"))
    moe_speculation.K = 1
    try:
        assert moe_speculation.speedup(cost, 1, 1000, tau=1.57) > 1.05  # tau: the default preset's k=1 chain
    finally:
        moe_speculation.K = 3
    call = cost.draft_level_s(1, 0)
    assert 0 < call < cost.forward_s(1, 1000, 1000, 1, 1, 1000) / 4  # one layer of 61, plus the head


def test_simulate_runs_deepseek_v3_on_eight_h200s_and_mtp_beats_ar_alone():
    code, out, err = invoke(["simulate", "--model", "DeepSeek-V3", "--tp", "8", "--device", "h200",
                             "--policy", "ar", "--policy", "linear:k=1", "--num-requests", "20",
                             "--multimodal-share", "0", "--arrival", "poisson", "--rate", "0.05"])
    assert code == 0, err
    rows = {line.split()[0]: float(line.split()[4]) for line in out.splitlines()
            if line.startswith(("ar ", "linear:k=1"))}
    assert rows["linear:k=1"] < rows["ar"]  # mean E2EL, requests one at a time
