"""Tiling VLMs (LLaVA-NeXT, LLaVA-OneVision, InternVL): an image's size
becomes visual tokens and vision-encoder work as their processors count
them, their configs read as the catalog holds them.

The hand-computed cases follow the processors' steps (simspec.costs.specs:
best_pinpoint, _unpadded_grid, internvl_grid); each comment gives them."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from conftest import invoke
from simspec import costs
from simspec.costs import images
from simspec.costs.hfconfig import read_model_config

CONFIGS = Path(__file__).parent / "data" / "configs"
CATALOG = ("Qwen2.5-VL-32B", "InternVL3-8B", "InternVL3-78B", "LLaVA-OneVision-7B", "LLaVA-OneVision-72B")


def tokens(model: str, width: int, height: int) -> tuple[int, int]:
    spec = costs.model_spec(model).at_image_size(width, height)
    return spec.visual_tokens_per_image, spec.vision_patches_per_image


@pytest.mark.parametrize("width, height, visual, encoder", [
    # 1000 x 500: the 336 x 672 (h x w) pinpoint keeps 672 x 336 image pixels, as 672 x 672 and 336 x 1008
    # do, with the least waste -> 1 x 2 tiles, a 24 x 48 grid; 1000 x 24 == 500 x 48, so the columns are
    # the unpadded side: floor(1000 x 24 / 500) = 48, no padding. 24 x 48 + 24 newlines + 576 base = 1,752;
    # 3 views x 577 through CLIP.
    (1000, 500, 1752, 1731),
    # 672 x 672: the 2 x 2 pinpoint, a 48 x 48 grid unpadded: 2,304 + 48 + 576.
    (672, 672, 2928, 2885),
    # 1024 x 768: 672 x 672 keeps 672 x 504 pixels, the most -> 48 x 48; wider than the grid, so rows:
    # floor(768 x 48 / 1024) = 36, padding 6 a side -> 36 x 48 + 36 + 576 = 2,340.
    (1024, 768, 2340, 2885),
])
def test_llava_next_counts_as_its_processor(width, height, visual, encoder):
    assert tokens("LLaVA-1.6-7B", width, height) == (visual, encoder)


def test_llava_next_keeps_the_catalog_count_by_default():
    spec = costs.model_spec("LLaVA-1.6-13B")
    assert (spec.visual_tokens_per_image, spec.vision_patches_per_image) == (2880, 5 * 577)
    assert spec.image_rule == "llava_next"


@pytest.mark.parametrize("width, height, visual, encoder", [
    # 448 x 448: the 768 x 768 pinpoint (2 x 2 tiles of 384), 54 x 54 features, under the cap
    # (sqrt(2916 / (9 x 729)) = 0.67): 2,916 + 54 newlines + 729 base; 5 x 729 through SigLIP (no CLS).
    (448, 448, 3699, 5 * 729),
    # 1920 x 1080: the 1152 x 1920 pinpoint (3 x 5 tiles), an 81 x 135 grid; rows unpadded to
    # floor(1080 x 135 / 1920) = 75; ratio sqrt(75 x 135 / 6561) = 1.242 > 1.1, so the grid is downscaled
    # to floor(75 / 1.242) x floor(135 / 1.242) = 60 x 108: 6,480 + 60 + 729 = 7,269; 16 x 729 encoded.
    (1920, 1080, 7269, 16 * 729),
])
def test_onevision_counts_as_its_processor(width, height, visual, encoder):
    assert tokens("LLaVA-OneVision-7B", width, height) == (visual, encoder)


def test_onevision_caps_a_large_image_at_nine_base_views():
    """2304 x 2304 fills the 6 x 6 pinpoint: 162 x 162 = 26,244 features, ratio 2, downscaled to 81 x 81:
    the same 7,371 tokens as 1152 x 1152 (3 x 3, ratio 1, not downscaled), though it encodes 37 tiles."""
    assert tokens("LLaVA-OneVision-7B", 2304, 2304) == (6561 + 81 + 729, 37 * 729)
    assert tokens("LLaVA-OneVision-7B", 1152, 1152) == (6561 + 81 + 729, 10 * 729)
    uncapped = dataclasses.replace(costs.model_spec("LLaVA-OneVision-7B"), image_rule="llava_next")
    assert uncapped.at_image_size(2304, 2304).visual_tokens_per_image == 26244 + 162 + 729
    cap = 1.1 ** 2 * 9 * 729
    for side in range(100, 4000, 53):
        visual, _ = tokens("LLaVA-OneVision-7B", side, side * 3 // 4)
        assert visual - 729 <= cap + 163  # the features (and at most 162 newlines) stay under the cap


@pytest.mark.parametrize("width, height, grid", [
    (448, 448, (1, 1)),
    (896, 896, (2, 2)),  # ties (1, 1), (2, 2), (3, 3): area 802,816 > half 2 x 2's 802,816 / 2, not 3 x 3's
    (1344, 1344, (3, 3)),  # 1,806,336 > 0.5 x 448^2 x 9 = 903,168
    (1000, 500, (2, 1)),  # (2, 1) and (4, 2) tie; 500,000 < 0.5 x 448^2 x 8: the smaller stays
    (2000, 1000, (4, 2)),  # 2,000,000 > 802,816: the larger wins
    (500, 1000, (1, 2)),
    (1024, 768, (4, 3)),  # exactly 4:3
    (1920, 1080, (4, 2)),  # 16:9 is 0.222 from 2:1 (and 4:2, larger wins), 5:3 would be closer but is 15 tiles
    (5000, 100, (12, 1)),
])
def test_internvl_picks_the_closest_grid(width, height, grid):
    assert images.internvl_grid(width, height, costs.model_spec("InternVL3-8B").image_tiling) == grid


@pytest.mark.parametrize("width, height, tiles", [
    (448, 448, 1),  # one tile, no thumbnail
    (1000, 500, 3),  # 2 x 1 + thumbnail
    (1024, 768, 13),
    (1920, 1080, 9),
])
def test_internvl_counts_256_tokens_a_tile(width, height, tiles):
    assert tokens("InternVL3-8B", width, height) == (256 * tiles, 1025 * tiles)  # 32 x 32 patches + CLS encoded
    assert tokens("InternVL3-78B", width, height) == (256 * tiles, 1025 * tiles)


@pytest.mark.parametrize("model", ["LLaVA-1.6-7B", "InternVL3-8B", "Qwen2.5-VL-32B"])
@pytest.mark.parametrize("aspect", [(1, 1), (4, 3), (16, 9)])
def test_tokens_grow_with_the_image_at_a_fixed_aspect(model, aspect):
    counts = [tokens(model, side * aspect[0] // aspect[1], side) for side in range(50, 3000, 41)]
    assert all(a[0] <= b[0] and a[1] <= b[1] for a, b in zip(counts, counts[1:]))
    if (model, aspect) != ("InternVL3-8B", (4, 3)):
        assert counts[-1][0] > counts[0][0]


def test_internvl_tiles_an_exact_grid_aspect_alike_at_any_size():
    """A 4:3 image matches the 4 x 3 grid exactly, and no other grid ties it: 13 tiles small or large."""
    assert tokens("InternVL3-8B", 200, 150) == tokens("InternVL3-8B", 4000, 3000) == (13 * 256, 13 * 1025)


@pytest.mark.parametrize("name", CATALOG)
def test_the_catalog_entry_is_its_config(name):
    assert read_model_config(CONFIGS / name) == costs.model_spec(name)


def test_transformers_internvl_reads_as_internvl_chat(tmp_path):
    """The transformers-native ``internvl`` layout (text_config, [448, 448] sides, tiling from the
    processor's defaults) of InternVL3-8B gives the catalog's model."""
    chat = json.loads((CONFIGS / "InternVL3-8B" / "config.json").read_text())
    vision = {**chat["vision_config"], "model_type": "internvl_vision", "image_size": [448, 448],
              "patch_size": [14, 14]}
    native = {"_name_or_path": "InternVL3-8B", "model_type": "internvl", "downsample_ratio": 0.5,
              "torch_dtype": "bfloat16", "text_config": chat["llm_config"], "vision_config": vision}
    (tmp_path / "config.json").write_text(json.dumps(native))
    assert read_model_config(tmp_path) == costs.model_spec("InternVL3-8B")


def test_a_llava_next_config_of_llava16s_shape_is_the_catalogs_model(tmp_path):
    """llava-hf/llava-v1.6-vicuna-7b-hf's fields: LLaVA-1.5's, with AnyRes pinpoints."""
    config = {"model_type": "llava_next", "torch_dtype": "float16", "vision_feature_select_strategy": "default",
              "image_grid_pinpoints": [[336, 672], [672, 336], [672, 672], [1008, 336], [336, 1008]],
              "text_config": {"model_type": "llama", "max_position_embeddings": 4096, "vocab_size": 32000},
              "vision_config": {"model_type": "clip_vision_model", "hidden_size": 1024, "image_size": 336,
                                "intermediate_size": 4096, "num_hidden_layers": 24, "patch_size": 14}}
    (tmp_path / "config.json").write_text(json.dumps(config))
    spec = read_model_config(tmp_path)
    assert dataclasses.replace(spec, name="LLaVA-1.6-7B") == costs.model_spec("LLaVA-1.6-7B")


def mean_ttft(*argv) -> float:
    code, out, err = invoke(["simulate", "--model", "InternVL3-8B", "--num-requests", "20", "--policy", "ar",
                             "--multimodal-share", "1", *argv])
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("ar "))
    return float(row.replace("*", " ").split()[1])


def test_more_internvl_tiles_take_longer_to_first_token():
    assert mean_ttft("--image-size", "1344x896") > mean_ttft("--image-size", "448x448")
