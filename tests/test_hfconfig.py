"""Models from a Hugging Face config.json (simspec.costs.hfconfig): the
shapes the published configs give, read as the catalog holds them."""

from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from simspec import costs
from simspec.costs.hfconfig import read_model_config
from simspec.types import InputError

# llava-hf/llava-1.5-7b-hf's config.json as published (its text_config leaves
# the Vicuna-7B decoder's shape to LlamaConfig's defaults), with the
# catalog's vocabulary (the published file says 32064: added image tokens).
LLAVA_15_7B = {
    "_name_or_path": "llava-hf/llava-1.5-7b-hf", "model_type": "llava", "torch_dtype": "float16",
    "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "vocab_size": 32000},
    "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                      "intermediate_size": 4096, "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14},
    "vision_feature_select_strategy": "default"}
# Qwen/Qwen3-32B's config.json: head_dim 128 with 64 heads, wider than hidden_size 5120.
QWEN3_32B = {"model_type": "qwen3", "hidden_size": 5120, "intermediate_size": 25600, "num_hidden_layers": 64,
             "num_attention_heads": 64, "num_key_value_heads": 8, "head_dim": 128, "vocab_size": 151936,
             "max_position_embeddings": 40960, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}
# meta-llama/Llama-3.2-1B's config.json: tied embeddings.
LLAMA_32_1B = {"model_type": "llama", "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16,
               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 64, "vocab_size": 128256,
               "max_position_embeddings": 131072, "tie_word_embeddings": True, "torch_dtype": "bfloat16"}
# Qwen/Qwen2.5-VL-7B-Instruct's config.json (decoder fields at the top level, the vision tower's nested).
QWEN25_VL_7B = {"model_type": "qwen2_5_vl", "hidden_size": 3584, "intermediate_size": 18944, "num_hidden_layers": 28,
                "num_attention_heads": 28, "num_key_value_heads": 4, "vocab_size": 152064,
                "max_position_embeddings": 128000, "torch_dtype": "bfloat16",
                "vision_config": {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16,
                                  "patch_size": 14, "spatial_merge_size": 2, "out_hidden_size": 3584}}


def write(tmp_path, config: dict, name: str = "config.json"):
    path = tmp_path / name
    path.write_text(json.dumps(config))
    return path


def params(spec) -> int:
    """The decoder's weights (layers, embeddings, LM head), as a model card counts them."""
    return spec.layers * spec.layer_params + (1 if spec.tied_embeddings else 2) * spec.lm_head_params


def test_llava_from_its_config_is_the_catalogs_model(tmp_path):
    spec = costs.model_spec(str(write(tmp_path, LLAVA_15_7B)))
    catalog = costs.model_spec("LLaVA-1.5-7B")
    assert spec.name == "llava-hf/llava-1.5-7b-hf"
    assert dataclasses.replace(spec, name=catalog.name) == catalog  # 576 visual tokens, 577 through CLIP
    gpu = costs.gpu_spec("h100-sxm")
    ours, theirs = (costs.build("roofline", m, gpu).tables for m in (spec, catalog))
    assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))


def test_a_folder_names_its_config_json(tmp_path):
    write(tmp_path, QWEN3_32B)
    assert costs.model_spec(str(tmp_path)) == read_model_config(tmp_path / "config.json")


def test_qwen3_32b_counts_its_published_parameters(tmp_path):
    """Qwen3-32B's model card: 32.8B parameters; its queries are 64 x 128 = 8192 wide."""
    spec = read_model_config(write(tmp_path, QWEN3_32B))
    assert (spec.head_dim, spec.q_dim, spec.kv_heads) == (128, 8192, 8)
    assert params(spec) / 1e9 == pytest.approx(32.8, abs=0.05)
    assert spec.kv_bytes_per_token == 2 * 64 * 8 * 128 * 2


def test_llama_32_1b_holds_its_tied_embedding_once(tmp_path):
    """Llama 3.2 1B's model card: 1.23B parameters, the embedding shared with the LM head."""
    spec = read_model_config(write(tmp_path, LLAMA_32_1B))
    assert spec.tied_embeddings and spec.explicit_head_dim == 0  # 64 = 2048 / 32
    assert params(spec) / 1e9 == pytest.approx(1.236, abs=0.005)
    untied = read_model_config(write(tmp_path, {**LLAMA_32_1B, "tie_word_embeddings": False}, "untied.json"))
    assert untied.weight_bytes - spec.weight_bytes == spec.lm_head_params * spec.dtype_bytes


def test_qwen25_vl_turns_an_896_pixel_image_into_1024_visual_tokens(tmp_path):
    spec = read_model_config(write(tmp_path, QWEN25_VL_7B))
    assert (spec.visual_tokens_per_image, spec.vision_patches_per_image) == (1024, 4096)
    assert (spec.vision_layers, spec.vision_hidden, spec.vision_mlp_hidden) == (32, 1280, 3420)
    nested = {"model_type": "qwen2_5_vl", "vision_config": QWEN25_VL_7B["vision_config"],
              "text_config": {k: v for k, v in QWEN25_VL_7B.items() if k not in ("model_type", "vision_config")}}
    assert read_model_config(write(tmp_path, nested, "nested.json")) == spec  # newer files nest the decoder


def test_a_drafter_is_given_to_a_config_model(tmp_path):
    spec = costs.model_spec(str(write(tmp_path, LLAMA_32_1B)), "eagle3")
    assert spec.drafter == "eagle3"


@pytest.mark.parametrize("change, says", [
    ({"num_key_value_heads": 5}, "num_attention_heads 32 is not a multiple of num_key_value_heads 5"),
    ({"head_dim": None, "hidden_size": 2050}, "hidden_size 2050 is not a multiple of num_attention_heads 32"),
    ({"torch_dtype": "int3"}, "torch_dtype must be one of"),
    ({"tie_word_embeddings": "yes"}, "tie_word_embeddings must be true or false"),
    ({"vocab_size": 0}, "vocab_size must be an integer >= 1"),
])
def test_a_bad_field_is_named(tmp_path, change, says):
    config = {k: v for k, v in {**LLAMA_32_1B, **change}.items() if v is not None}
    with pytest.raises(InputError, match=says):
        read_model_config(write(tmp_path, config))
