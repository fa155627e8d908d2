"""Dynamic-resolution images: an image's size becomes a Qwen2-VL model's
visual tokens as its processor computes them; fixed-size models keep theirs."""

from __future__ import annotations

import pytest

from conftest import invoke
from simspec import costs


@pytest.mark.parametrize("width, height, tokens", [
    (896, 896, 1024),  # 32 x 32 cells of 28 pixels: the catalog's default count
    (448, 448, 256),
    (1344, 896, 1536),  # 48 x 32
    (1000, 700, 900),  # sides rounded to multiples of 28: 1008 x 700 -> 36 x 25
    (10, 10, 4),  # scaled up to min_pixels 3136: 56 x 56
    (8000, 8000, 16384),  # scaled down to max_pixels 12845056: 3584 x 3584
])
def test_qwen2_vl_turns_an_image_size_into_its_processors_tokens(width, height, tokens):
    model = costs.model_spec("Qwen2.5-VL-7B").at_image_size(width, height)
    assert model.visual_tokens_per_image == tokens and model.vision_patches_per_image == 4 * tokens


def test_a_fixed_size_model_keeps_its_count():
    llava = costs.model_spec("LLaVA-1.5-7B")
    assert llava.at_image_size(1344, 896) == llava


def mean_ttft(*argv) -> float:
    code, out, err = invoke(["simulate", "--model", "Qwen2.5-VL-7B", "--num-requests", "100", "--policy", "ar",
                             "--multimodal-share", "1", *argv])
    assert code == 0, err
    row = next(line for line in out.splitlines() if line.startswith("ar "))
    return float(row.replace("*", " ").split()[1])


def test_larger_images_take_longer_to_first_token():
    small, default, large = mean_ttft("--image-size", "448x448"), mean_ttft(), mean_ttft("--image-size", "1344x896")
    assert small < default < large
    assert mean_ttft("--image-size", "896x896") == default  # the default is 896 x 896
