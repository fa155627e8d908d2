"""How a VLM's image size becomes visual tokens and vision-encoder work:
each image rule as its model's processor counts it.

Imports: the standard library. :meth:`simspec.costs.specs.ModelSpec.at_image_size`
applies the rule a model names (IMAGE_RULES) to the tiling it carries
(:class:`ImageTiling`; Qwen2-VL's rule needs none).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageTiling:
    """How a tiling VLM cuts an image into tiles of its vision tower
    (:meth:`ModelSpec.at_image_size`, rules "llava_next", "llava_onevision",
    "internvl", "llama4")."""

    tile_px: int  # a tile's side: the tower's image_size (LLaVA) or force_image_size (InternVL)
    patch_px: int  # the tower's patch side
    encoder_extra_tokens: int = 0  # CLS tokens a tile adds through the encoder (CLIP, InternViT 1; SigLIP 0)
    keep_cls: bool = False  # LLaVA's vision_feature_select_strategy "full": the LM sees the base view's CLS too
    pinpoints: tuple[tuple[int, int], ...] = ()  # LLaVA's image_grid_pinpoints, (height, width) pixels
    max_tiles: int = 0  # OneVision: the anyres_max_N cap (in base views); InternVL: max_dynamic_patch; Llama 4: max_patches
    min_tiles: int = 1  # InternVL: min_dynamic_patch
    thumbnail: bool = True  # InternVL: use_thumbnail; Llama 4 always (a global view when there is more than one tile)
    downsample: float = 1.0  # InternVL: downsample_ratio; Llama 4: pixel_shuffle_ratio (0.5: a quarter of the patches)

    @property
    def side_patches(self) -> int:
        """Patches along a tile's side."""
        return self.tile_px // self.patch_px



# Llama 4's tiles an image at most: its processor's max_patches, which config.json does not hold
# (transformers' Llama4ImageProcessorFast.max_patches, 16; vLLM serves with the processor's defaults).
LLAMA4_MAX_TILES = 16

DEFAULT_IMAGE_PX = 896
"""The square image side a dynamic-resolution or tiling model's default counts are of (no --image-size)."""

# Qwen2-VL / Qwen2.5-VL's image processor (Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json:
# patch_size 14, merge_size 2, min_pixels 3136, max_pixels 12845056).
QWEN_VL_PATCH, QWEN_VL_MERGE, QWEN_VL_MIN_PIXELS, QWEN_VL_MAX_PIXELS = 14, 2, 3136, 12845056


def _qwen2_vl_image(tiling: ImageTiling | None, width: int, height: int) -> tuple[int, int]:
    """Qwen2-VL's rule (its image processor's smart_resize): each side
    rounded to a multiple of 28 (14-pixel patches, merged 2 x 2), the area
    scaled into [QWEN_VL_MIN_PIXELS, QWEN_VL_MAX_PIXELS] keeping the aspect,
    one visual token per 28 x 28 pixels, four patches through the encoder
    for each."""
    f = QWEN_VL_PATCH * QWEN_VL_MERGE
    h, w = max(f, round(height / f) * f), max(f, round(width / f) * f)
    if h * w > QWEN_VL_MAX_PIXELS:
        beta = math.sqrt(height * width / QWEN_VL_MAX_PIXELS)
        h, w = max(f, math.floor(height / beta / f) * f), max(f, math.floor(width / beta / f) * f)
    elif h * w < QWEN_VL_MIN_PIXELS:
        beta = math.sqrt(QWEN_VL_MIN_PIXELS / (height * width))
        h, w = math.ceil(height * beta / f) * f, math.ceil(width * beta / f) * f
    tokens = (h // f) * (w // f)
    return tokens, tokens * QWEN_VL_MERGE ** 2


def best_pinpoint(width: int, height: int, pinpoints) -> tuple[int, int]:
    """The (height, width) of ``pinpoints`` an image is resized into, as
    transformers' ``select_best_resolution`` picks it: the most image
    pixels kept after fitting the image inside (capped at its own area),
    then the fewest wasted pixels; the first such in list order."""
    best, kept_best, waste_best = pinpoints[0], -1, math.inf
    for ph, pw in pinpoints:
        scale = min(pw / width, ph / height)
        kept = min(int(width * scale) * int(height * scale), width * height)
        waste = pw * ph - kept
        if kept > kept_best or (kept == kept_best and waste < waste_best):
            best, kept_best, waste_best = (ph, pw), kept, waste
    return best


def _unpadded_grid(width: int, height: int, rows: int, cols: int) -> tuple[int, int]:
    """The feature grid (rows, cols) left once LLaVA-NeXT strips the padding
    the resize to the pinpoint added (transformers' ``unpad_image``; the
    processors' ``_get_unpadded_features``): the side the image did not
    fill loses its padding, floor(side x the image's scale) kept, the
    padding split evenly. Integer floor division is exact here and agrees
    with the processors' ``int(round(x, 7))`` at every integer image size."""
    if width * rows > height * cols:  # wider than the grid: rows were padded
        padding = (rows - height * cols // width) // 2
        return rows - 2 * padding, cols
    padding = (cols - width * rows // height) // 2
    return rows, cols - 2 * padding


def _anyres_grid(t: ImageTiling, width: int, height: int) -> tuple[int, int, int]:
    """(rows, cols) of AnyRes's unpadded feature grid and the tiles it cut:
    the image fitted to its best pinpoint, cut into tiles of the tower's side."""
    n = t.side_patches
    best_h, best_w = best_pinpoint(width, height, t.pinpoints)
    tiles_h, tiles_w = best_h // t.tile_px, best_w // t.tile_px
    rows, cols = _unpadded_grid(width, height, n * tiles_h, n * tiles_w)
    return rows, cols, tiles_h * tiles_w


def _anyres_counts(t: ImageTiling, rows: int, cols: int, tiles: int) -> tuple[int, int]:
    """(visual tokens, encoder tokens) of an AnyRes grid: the grid, a newline
    a row and the base view for the LM; every tile and the base view through
    the tower."""
    n = t.side_patches
    base = n * n + (t.encoder_extra_tokens if t.keep_cls else 0)
    return rows * cols + rows + base, (1 + tiles) * (n * n + t.encoder_extra_tokens)


def _llava_next_image(tiling: ImageTiling | None, width: int, height: int) -> tuple[int, int]:
    """LLaVA-NeXT's AnyRes (transformers' LlavaNextProcessor
    ``_get_number_of_features``; vLLM's llava_next.py ``get_num_image_tokens``):
    the image is fitted to the best pinpoint, cut into tiles of the tower's
    side plus one base view of the whole image; the LM sees the base view's
    n x n features, the unpadded grid of the tiles' features and one
    newline token a grid row. Every tile and the base view run through the
    tower (n x n patches and the CLS each)."""
    rows, cols, tiles = _anyres_grid(tiling, width, height)
    return _anyres_counts(tiling, rows, cols, tiles)


def _onevision_image(tiling: ImageTiling | None, width: int, height: int) -> tuple[int, int]:
    """LLaVA-OneVision's anyres_max_N (transformers' LlavaOnevisionProcessor
    ``_get_unpadded_features``, vLLM's llava_onevision.py): LLaVA-NeXT's
    count, and where the unpadded grid holds more than 1.1 x N base views'
    features (ratio = sqrt(rows x cols / (N n^2)) > 1.1) it is bilinearly
    downscaled to floor(rows / ratio) x floor(cols / ratio), its newlines
    with it. The encoder still runs every tile."""
    rows, cols, tiles = _anyres_grid(tiling, width, height)
    n = tiling.side_patches
    ratio = math.sqrt(rows * cols / (tiling.max_tiles * n * n))
    if ratio > 1.1:
        rows, cols = int(rows // ratio), int(cols // ratio)
    return _anyres_counts(tiling, rows, cols, tiles)


def internvl_grid(width: int, height: int, tiling: ImageTiling) -> tuple[int, int]:
    """The (columns, rows) of tiles InternVL cuts an image into (its
    ``dynamic_preprocess`` / ``find_closest_aspect_ratio``; vLLM's
    internvl.py ``calculate_internvl_targets``): of the grids with
    min_tiles <= columns x rows <= max_tiles, in order of tile count, the
    one whose aspect is closest to the image's; on a tie a later (larger)
    grid wins while the image's area exceeds half the grid's pixels."""
    lo, hi, side = tiling.min_tiles, tiling.max_tiles, tiling.tile_px
    grids = sorted({(i, j) for n in range(lo, hi + 1) for i in range(1, n + 1) for j in range(1, n + 1)
                    if lo <= i * j <= hi}, key=lambda g: g[0] * g[1])
    aspect, area = width / height, width * height
    best, best_diff = (1, 1), math.inf
    for cols, rows in grids:
        diff = abs(aspect - cols / rows)
        if diff < best_diff:
            best, best_diff = (cols, rows), diff
        elif diff == best_diff and area > 0.5 * side * side * cols * rows:
            best = (cols, rows)
    return best


def _internvl_image(tiling: ImageTiling | None, width: int, height: int) -> tuple[int, int]:
    """InternVL's dynamic tiling: the grid internvl_grid picks, plus a
    thumbnail (the whole image at one tile) when there is more than one
    tile; each tile's n x n patches (and the CLS) through InternViT, pixel
    shuffle keeping (n x downsample)^2 tokens a tile (256 at 448 / 14, 0.5)
    for the LM (vLLM's ``get_num_image_tokens``: tiles x tokens a tile)."""
    t = tiling
    cols, rows = internvl_grid(width, height, t)
    tiles = cols * rows + (1 if t.thumbnail and cols * rows != 1 else 0)
    n = t.side_patches
    return tiles * int(n * n * t.downsample * t.downsample), tiles * (n * n + t.encoder_extra_tokens)


def llama4_canvas(width: int, height: int, tiling: ImageTiling) -> tuple[int, int]:
    """The (rows, columns) of tiles Llama 4's image processor fits an image
    into (transformers' models/llama4/image_processing_llama4_fast.py,
    ``find_supported_resolutions`` and ``get_best_fit`` with
    resize_to_max_canvas False, the processor's default): of the canvases of
    at most ``max_tiles`` tiles, the scale that fits the image into each
    without distortion is the lesser of its two sides'; the least scale of
    at least 1 wins (the least upscaling), else the greatest (the least
    downscaling), and of the canvases at that scale the smallest, the first
    in the processor's order on a tie. Scales are exact ratios here (the
    processor divides in float32, which gives equal ratios equal floats)."""
    by_ratio: dict[Fraction, list[tuple[int, int]]] = {}
    for tiles in range(tiling.max_tiles, 0, -1):  # the processor's order: most tiles first, grouped by aspect
        for rows in sorted(d for d in range(1, tiles + 1) if tiles % d == 0):
            by_ratio.setdefault(Fraction(rows, tiles // rows), []).append((rows, tiles // rows))
    canvases = [canvas for group in by_ratio.values() for canvas in group]
    side = tiling.tile_px
    scales = [min(Fraction(rows * side, height), Fraction(cols * side, width)) for rows, cols in canvases]
    upscaling = [s for s in scales if s >= 1]
    chosen = min(upscaling) if upscaling else max(scales)
    best = None
    for (rows, cols), scale in zip(canvases, scales):
        if scale == chosen and (best is None or rows * cols < best[0] * best[1]):
            best = (rows, cols)
    return best


def _llama4_image(tiling: ImageTiling | None, width: int, height: int) -> tuple[int, int]:
    """Llama 4's tiling: the canvas llama4_canvas picks, cut into tiles,
    plus a global view (the whole image at one tile) when there is more than
    one; each view's n x n patches (and the class token) through the tower,
    pixel shuffle keeping (n x pixel_shuffle_ratio)^2 tokens a view (144 at
    336 / 14, 0.5) for the LM: the <|patch|> tokens of the processor's
    prompt, which vLLM's own processor test counts as views x tokens a view
    (tests/models/multimodal/processing/test_llama4.py); the few marker and
    separator tokens around them are left out, as for the other rules."""
    t = tiling
    rows, cols = llama4_canvas(width, height, t)
    views = rows * cols + (1 if rows * cols > 1 else 0)
    n = t.side_patches
    return views * int(n * n * t.downsample * t.downsample), views * (n * n + t.encoder_extra_tokens)


# How each image rule turns an image's size into (visual tokens, vision-encoder tokens).
IMAGE_RULES = {"qwen2_vl": _qwen2_vl_image, "llava_next": _llava_next_image,
               "llava_onevision": _onevision_image, "internvl": _internvl_image, "llama4": _llama4_image}

