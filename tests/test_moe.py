"""Mixtures of experts: read from their configs, counted as their model
cards count them, and priced by the experts a step touches."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from conftest import load_benchmark
from simspec import costs
from simspec.costs.hfconfig import read_model_config

moe_speculation = load_benchmark("moe_speculation")  # its speedup and dense twin, tested here

H100 = costs.gpu_spec("h100-sxm")
# Qwen/Qwen3-30B-A3B's and mistralai/Mixtral-8x7B-v0.1's config.json (the fields simspec reads).
QWEN3_30B_A3B = {"model_type": "qwen3_moe", "hidden_size": 2048, "intermediate_size": 6144, "num_hidden_layers": 48,
                 "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128, "vocab_size": 151936,
                 "max_position_embeddings": 40960, "num_experts": 128, "num_experts_per_tok": 8,
                 "moe_intermediate_size": 768, "decoder_sparse_step": 1, "mlp_only_layers": [],
                 "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
MIXTRAL_8X7B = {"model_type": "mixtral", "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
                "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 32000,
                "max_position_embeddings": 32768, "num_local_experts": 8, "num_experts_per_tok": 2,
                "torch_dtype": "bfloat16"}


def write(tmp_path, config, name="config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def counts(m) -> tuple[float, float]:
    """(total, active) parameters in billions: layers, embeddings and LM head."""
    head = (1 if m.tied_embeddings else 2) * m.lm_head_params
    dense = (m.layers - m.sparse_layers) * m.layer_params
    total = dense + m.sparse_layers * (m.sparse_always_params + m.experts * m.expert_params) + head
    active = dense + m.sparse_layers * (m.sparse_always_params + m.experts_per_token * m.expert_params) + head
    return total / 1e9, active / 1e9


@pytest.mark.parametrize("config, name", [(QWEN3_30B_A3B, "Qwen3-30B-A3B"), (MIXTRAL_8X7B, "Mixtral-8x7B")])
def test_a_moe_config_reads_as_the_catalog_holds_it(tmp_path, config, name):
    spec = read_model_config(write(tmp_path, config))
    assert dataclasses.replace(spec, name=name) == costs.model_spec(name)


@pytest.mark.parametrize("name, total, active", [("Qwen3-30B-A3B", 30.5, 3.3), ("Mixtral-8x7B", 46.7, 12.9)])
def test_parameters_as_the_model_cards_count_them(name, total, active):
    assert counts(costs.model_spec(name)) == pytest.approx((total, active), abs=0.06)


def test_qwen_moe_layers_and_shared_experts(tmp_path):
    every_other = {**QWEN3_30B_A3B, "decoder_sparse_step": 2, "mlp_only_layers": [1]}  # layers 1, 3, ... sparse but 1
    spec = read_model_config(write(tmp_path, every_other))
    assert (spec.sparse_layers, spec.dense_layers) == (23, 25)
    shared = read_model_config(write(tmp_path, {**QWEN3_30B_A3B, "model_type": "qwen2_moe",
                                                "shared_expert_intermediate_size": 5632}, "q2.json"))
    assert shared.shared_mlp_hidden == 5632 and shared.sparse_always_params > spec.sparse_always_params


def test_experts_touched_rises_with_the_tokens_to_every_expert():
    m = costs.model_spec("Qwen3-30B-A3B")
    touched = m.experts_touched(np.array([1.0, 4.0, 32.0, 1024.0]))
    assert touched[0] == pytest.approx(8.0) and touched[1] == pytest.approx(128 * (1 - (120 / 128) ** 4))
    assert np.all(np.diff(touched) > 0) and touched[-1] == pytest.approx(128.0)


def test_the_weights_hold_every_expert_but_a_step_reads_the_touched_ones():
    m = costs.model_spec("Qwen3-30B-A3B")
    assert m.weight_bytes / 1e9 == pytest.approx(61.0 + m.drafter_weight_params * 2 / 1e9, abs=0.3)
    layers = costs.build("roofline", m, H100).tables.layers_s
    assert layers[1] < layers[64] / 3  # one token reads 8 of 128 experts a layer; 64 tokens nearly all


def test_verification_costs_a_moe_more_than_its_dense_twin_at_batch_1():
    """The 1 + 3 tokens a request verifies touch ~29 experts a layer where
    decoding touches 8: at batch 1 the verify step costs the mixture
    more, relative to its AR step, than the same-active-size dense model."""
    moe = costs.model_spec("Qwen3-30B-A3B")
    dense = moe_speculation.dense_twin(moe)

    def verify_over_ar(model, batch):
        t = costs.build("roofline", model, H100).tables.layers_s
        return t[4 * batch] / t[batch]

    assert verify_over_ar(moe, 1) > 1.5 * verify_over_ar(dense, 1)


def test_speculation_pays_less_on_a_moe_at_batch_1_and_more_at_medium_batches():
    """benchmarks/moe_speculation.py's table, as MoESD (arXiv 2505.19645)
    finds it: SD pays less on a mixture than on a dense model at small
    batches, more at medium ones, where the AR step already reads most
    experts and the round's fixed costs are a smaller share of a longer
    step."""
    moe = costs.model_spec("Qwen3-30B-A3B")
    pair = [costs.build("roofline", m, H100) for m in (moe, moe_speculation.dense_twin(moe))]
    at = {b: [moe_speculation.speedup(c, b, 1000, 2.13) for c in pair] for b in (1, 32)}
    assert at[1][0] < at[1][1] and at[32][0] > at[32][1]


def test_tp_shards_every_expert():
    full, shard = costs.model_spec("Mixtral-8x7B"), costs.model_spec("Mixtral-8x7B", tp=4)
    assert shard.expert_params * 4 == full.expert_params
    assert shard.weight_bytes == pytest.approx(full.weight_bytes / 4, rel=0.01)
