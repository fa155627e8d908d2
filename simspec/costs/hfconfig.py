"""A model's shape from its Hugging Face ``config.json``: the same
:class:`~simspec.costs.specs.ModelSpec` the catalog holds, read from the
file the user serves (no download, plain JSON).

Imports: the standard library, simspec.costs.specs, simspec.files,
simspec.types. DESIGN.md "Cost models".

Families read (``model_type``):

- dense decoders: ``llama``, ``mistral``, ``qwen2``, ``qwen3``;
- mixtures of experts: ``mixtral``, ``qwen2_moe``, ``qwen3_moe`` (the
  experts, how many a token routes to, their width, which layers are
  sparse, Qwen2-MoE's shared expert);
- DeepSeek-V3 / R1: ``deepseek_v3`` (:func:`_deepseek`: latent attention,
  first_k_dense_replace dense layers, routed and shared experts, the MTP
  module as its default drafter, FP8 weights from ``quantization_config``);
- Llama 4: ``llama4`` (:func:`_llama4_text`: the decoder in
  ``text_config``, interleaved MoE layers with a shared expert;
  :func:`_llama4_vision`: its processor's tiling, 144 visual tokens a
  336-pixel tile and a global view, by default of a DEFAULT_IMAGE_PX square
  image) and its text-only ``llama4_text``;
- VLMs: ``llava`` (a decoder in ``text_config`` and a CLIP vision tower in
  ``vision_config``: (image_size / patch_size)^2 visual tokens an image,
  one more through the encoder with ``vision_feature_select_strategy``
  ``default``, which drops the CLS token), ``qwen2_vl`` and ``qwen2_5_vl``
  (the decoder's fields at the top or in ``text_config``, the vision
  tower's in ``vision_config``; images by default 896 x 896 pixels: 64 x
  64 patches of 14, merged 2 x 2 into 1,024 visual tokens, other sizes
  through ModelSpec.at_image_size); the tiling families ``llava_next``
  (LLaVA's decoder and CLIP tower, AnyRes over ``image_grid_pinpoints``),
  ``llava_onevision`` (a SigLIP tower, AnyRes with the
  ``vision_aspect_ratio`` cap) and InternVL, ``internvl_chat`` (OpenGVLab's:
  ``llm_config``, ``force_image_size``, ``downsample_ratio``,
  ``min_dynamic_patch``, ``max_dynamic_patch``, ``use_thumbnail``) and
  ``internvl`` (transformers': ``text_config``, ``downsample_ratio``, the
  tiling its processor's defaults), each with its image rule
  (simspec.costs.images.IMAGE_RULES).

Other expert and latent-attention families (``deepseek_v2``, ``dbrx``,
``olmoe``...) are refused by name: what they cost is not priced yet. A
field the file leaves out takes the default of transformers'
config class where the family's configs rely on it (Llama's and CLIP's,
below); elsewhere it is an error naming the file and the field.
"""

from __future__ import annotations

from pathlib import Path

from simspec.costs import catalog, specs
from simspec.costs.catalog import MODELS_BY_KEY
from simspec.costs.images import DEFAULT_IMAGE_PX, LLAMA4_MAX_TILES, ImageTiling
from simspec.costs.specs import ModelSpec, at_default_image
from simspec.files import read_json
from simspec.types import InputError, require

DENSE = ("llama", "mistral", "qwen2", "qwen3")
MOE = ("mixtral", "qwen2_moe", "qwen3_moe")
VLMS = ("llava", "qwen2_vl", "qwen2_5_vl", "llava_next", "llava_onevision", "internvl_chat", "internvl")
LATENT = ("deepseek_v3",)
LLAMA4 = ("llama4", "llama4_text")
SUPPORTED = DENSE + MOE + VLMS + LATENT + LLAMA4
EXPERTS = ("deepseek_v2", "dbrx", "olmoe", "jamba", "granitemoe", "phimoe")
# transformers' LlamaConfig defaults (models/llama/configuration_llama.py): llava-hf's configs leave the
# Vicuna / Llama decoder's shape to them (e.g. llava-1.5-7b-hf's text_config names only its vocabulary
# and context).
LLAMA_DEFAULTS = {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008, "num_hidden_layers": 32,
                  "num_attention_heads": 32, "max_position_embeddings": 2048}
# transformers' CLIPVisionConfig defaults (models/clip/configuration_clip.py), ViT-B/32 at 224 pixels.
CLIP_DEFAULTS = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "image_size": 224,
                 "patch_size": 32}
DTYPE_BYTES = {"float32": 4, "float16": 2, "bfloat16": 2, "float8_e4m3fn": 1}
# InternVL's tiling where a config leaves it out: the transformers-native ``internvl`` configs keep it in
# preprocessor_config.json (GotOcr2ImageProcessor: min_patches 1, max_patches 12, crop_to_patches), the
# internvl_chat ones in config.json (OpenGVLab/InternVL3-8B: min_dynamic_patch 1, max_dynamic_patch 12,
# use_thumbnail true).
INTERNVL_MIN_TILES, INTERNVL_MAX_TILES = 1, 12
# Llama4TextConfig's attention_chunk_size where a config leaves it out (transformers'
# models/llama4/configuration_llama4.py); meta-llama's Scout and Maverick configs give 8192.
LLAMA4_ATTENTION_CHUNK = 8192


class _Fields:
    """One JSON object of the file, read field by field with errors naming both."""

    def __init__(self, path: Path, table: dict, where: str, defaults: dict | None = None):
        self.path, self.table, self.where, self.defaults = path, table, where, defaults or {}

    def _name(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key

    def int(self, key: str, default: int | None = None, low: int = 1) -> int:
        value = self.table.get(key)
        if value is None:  # left out, or null (transformers' "same as the heads" for num_key_value_heads)
            value = self.defaults.get(key, default)
        require(value is not None, f"model config {self.path}: missing field {self._name(key)}")
        require(isinstance(value, int) and not isinstance(value, bool) and value >= low,
                f"model config {self.path}: {self._name(key)} must be an integer >= {low} (got {value!r})")
        return value

    def fraction(self, key: str) -> float:
        """A number in (0, 1] (a pixel-shuffle or downsample ratio)."""
        value = self.table.get(key)
        require(value is not None, f"model config {self.path}: missing field {self._name(key)}")
        require(isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value <= 1,
                f"model config {self.path}: {self._name(key)} must be a number in (0, 1] (got {value!r})")
        return float(value)

    def bool(self, key: str, default: bool) -> bool:
        value = self.table.get(key, default)
        require(isinstance(value, bool), f"model config {self.path}: {self._name(key)} must be true or false "
                                         f"(got {value!r})")
        return value

    def sub(self, key: str, defaults: dict | None = None) -> "_Fields":
        value = self.table.get(key)
        require(isinstance(value, dict), f"model config {self.path}: missing field {self._name(key)} (an object)")
        return _Fields(self.path, value, self._name(key), defaults)


def model_spec(name: str, drafter: str | None = None, tp: int = 1) -> ModelSpec:
    """The model ``name`` names: a catalog model (any case) or a Hugging
    Face ``config.json`` (the file or its folder), with ``drafter`` as its
    draft head where given, sharded over ``tp`` GPUs."""
    if name.lower() in MODELS_BY_KEY or not _is_path(name):
        return catalog.model_spec(name, drafter, tp)
    return catalog.deployed(read_model_config(name), drafter, tp)


def _is_path(name: str) -> bool:
    return "/" in name or "\\" in name or name.endswith(".json") or Path(name).exists()


def config_path(path: str | Path) -> Path:
    """The ``config.json`` a path names: the file, or the one in the folder."""
    path = Path(path)
    if path.is_dir():
        path = path / "config.json"
    require(path.is_file(), f"model config {path} does not exist (give a catalog name or a config.json path)")
    return path


def read_model_config(path: str | Path) -> ModelSpec:
    """The ModelSpec of the Hugging Face config at ``path`` (module docstring)."""
    path = config_path(path)
    raw = read_json(path, "model config")
    require(isinstance(raw, dict), f"model config {path}: not a JSON object")
    top = _Fields(path, raw, "")
    kind = raw.get("model_type")
    if kind in EXPERTS:
        raise InputError(f"model config {path}: model_type {kind!r} is not read yet (interleaved experts or "
                         f"latent attention); supported: {', '.join(SUPPORTED)}")
    require(kind in SUPPORTED, f"model config {path}: model_type must be one of {', '.join(SUPPORTED)} "
                               f"(got {kind!r})")
    name = str(raw.get("_name_or_path") or path.parent.name or path.stem)
    if kind in LATENT:
        return ModelSpec(name=name, **_deepseek(top))
    if kind == "llama4_text":
        return ModelSpec(name=name, **_llama4_text(top), visual_tokens_per_image=0)
    if kind == "llama4":
        return at_default_image(name=name, **_llama4_text(top.sub("text_config"), top), **_llama4_vision(top))
    if kind in DENSE:
        return ModelSpec(name=name, **_decoder(top), visual_tokens_per_image=0)
    if kind in MOE:
        return ModelSpec(name=name, **_decoder(top), **_experts(top, kind), visual_tokens_per_image=0)
    if kind in TILED:
        return TILED[kind](top, name)
    if kind == "llava":
        text = _llava_text(top)
        vision = top.sub("vision_config", CLIP_DEFAULTS)
        side = vision.int("image_size") // vision.int("patch_size")
        tokens = side * side + (raw.get("vision_feature_select_strategy", "default") == "full")
        return ModelSpec(name=name, **_decoder(text, top), visual_tokens_per_image=tokens,
                         vision_patches_per_image=side * side + 1, **_vision_tower(vision))
    text = top.sub("text_config") if isinstance(raw.get("text_config"), dict) and "hidden_size" in raw["text_config"] \
        else top
    vision = top.sub("vision_config")
    patch, merge = vision.int("patch_size"), vision.int("spatial_merge_size")
    patches = (DEFAULT_IMAGE_PX // patch) ** 2
    if kind == "qwen2_vl":  # ViT width embed_dim, MLP embed_dim x mlp_ratio
        width = vision.int("embed_dim")
        mlp = width * vision.int("mlp_ratio")
    else:
        width, mlp = vision.int("hidden_size"), vision.int("intermediate_size")
    return ModelSpec(name=name, **_decoder(text, top), visual_tokens_per_image=patches // (merge * merge),
                     vision_patches_per_image=patches, vision_layers=vision.int("depth"), vision_hidden=width,
                     vision_mlp_hidden=mlp, image_rule="qwen2_vl" if (patch, merge) == (14, 2) else "")


def _llava_text(top: _Fields) -> _Fields:
    """A LLaVA-family config's decoder: ``text_config`` (Llama's defaults
    where it leaves fields out), a dense decoder."""
    text = top.sub("text_config", LLAMA_DEFAULTS)
    kind = text.table.get("model_type", "llama")
    require(kind in DENSE, f"model config {top.path}: text_config.model_type must be one of {', '.join(DENSE)} "
                           f"(got {kind!r})")
    return text


def _pinpoints(top: _Fields, tile_px: int) -> tuple[tuple[int, int], ...]:
    """``image_grid_pinpoints``: (height, width) pixel sizes, each a multiple of the tile."""
    value = top.table.get("image_grid_pinpoints")
    require(value is not None, f"model config {top.path}: missing field image_grid_pinpoints")
    ok = isinstance(value, list) and value and all(
        isinstance(p, list) and len(p) == 2 and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                    and x % tile_px == 0 for x in p) for p in value)
    require(ok, f"model config {top.path}: image_grid_pinpoints must be a list of [height, width] pairs, "
                f"multiples of vision_config.image_size {tile_px} (got {value!r})")
    return tuple((h, w) for h, w in value)


def _anyres_tiling(top: _Fields, vision: _Fields, max_tiles: int = 0) -> ImageTiling:
    """LLaVA-NeXT's and OneVision's tiles: the tower's image_size and patch,
    its CLS (CLIP has one, SigLIP none), the pinpoints, the select strategy."""
    tile = vision.int("image_size")
    strategy = top.table.get("vision_feature_select_strategy", "default")
    require(strategy in ("default", "full"), f"model config {top.path}: vision_feature_select_strategy must be "
                                             f"default or full (got {strategy!r})")
    cls = 0 if "siglip" in str(vision.table.get("model_type", "")) else 1
    return ImageTiling(tile_px=tile, patch_px=vision.int("patch_size"), encoder_extra_tokens=cls,
                       keep_cls=strategy == "full", pinpoints=_pinpoints(top, tile), max_tiles=max_tiles)


def _vision_tower(vision: _Fields) -> dict:
    return dict(vision_layers=vision.int("num_hidden_layers"), vision_hidden=vision.int("hidden_size"),
                vision_mlp_hidden=vision.int("intermediate_size"))


def _llava_next(top: _Fields, name: str) -> ModelSpec:
    """LLaVA-NeXT (LLaVA-1.6): LLaVA's decoder and CLIP tower, AnyRes over
    ``image_grid_pinpoints``. By default the catalog's count: the base view
    and the most tiles a pinpoint holds, a tower's square each (2,880 for
    LLaVA-1.6's pinpoints); --image-size gives the processor's count."""
    vision = top.sub("vision_config", CLIP_DEFAULTS)
    tiling = _anyres_tiling(top, vision)
    views = 1 + max(h * w for h, w in tiling.pinpoints) // (tiling.tile_px * tiling.tile_px)
    n = tiling.side_patches
    return ModelSpec(name=name, **_decoder(_llava_text(top), top), visual_tokens_per_image=views * n * n,
                     vision_patches_per_image=views * (n * n + tiling.encoder_extra_tokens), **_vision_tower(vision),
                     image_rule="llava_next", image_tiling=tiling)


def _onevision(top: _Fields, name: str) -> ModelSpec:
    """LLaVA-OneVision: a Qwen2 decoder in ``text_config``, a SigLIP tower,
    AnyRes with the ``vision_aspect_ratio`` cap (anyres_max_N, 9 where left
    out); visual tokens of a DEFAULT_IMAGE_PX square image by default."""
    vision = top.sub("vision_config")
    cap = top.table.get("vision_aspect_ratio", "anyres_max_9")
    require(isinstance(cap, str) and cap.startswith("anyres_max_") and cap[11:].isdigit() and int(cap[11:]) > 0,
            f"model config {top.path}: vision_aspect_ratio must be anyres_max_N, N >= 1 (got {cap!r})")
    tiling = _anyres_tiling(top, vision, max_tiles=int(cap[11:]))
    return at_default_image(name=name, **_decoder(_llava_text(top), top), **_vision_tower(vision),
                            image_rule="llava_onevision", image_tiling=tiling)


def _side(f: _Fields, key: str) -> int:
    """An image or patch side: an integer, or the [height, width] pair of a square (transformers' internvl)."""
    value = f.table.get(key)
    if isinstance(value, list) and len(value) == 2 and value[0] == value[1]:
        return _Fields(f.path, {key: value[0]}, f.where).int(key)
    return f.int(key)


def _internvl(top: _Fields, name: str) -> ModelSpec:
    """InternVL (``internvl_chat``: ``llm_config``, tiling fields at the top;
    ``internvl``: ``text_config``, the tiling its processor's defaults): an
    InternViT tower, 448-pixel tiles, pixel shuffle by ``downsample_ratio``;
    visual tokens of a DEFAULT_IMAGE_PX square image by default."""
    chat = top.table.get("model_type") == "internvl_chat"
    text = top.sub("llm_config" if chat else "text_config")
    require(text.table.get("model_type") in DENSE,
            f"model config {top.path}: {text.where}.model_type must be one of {', '.join(DENSE)} "
            f"(got {text.table.get('model_type')!r})")
    vision = top.sub("vision_config")
    ratio = top.fraction("downsample_ratio")
    tile = top.int("force_image_size", _side(vision, "image_size")) if chat else _side(vision, "image_size")
    lo = top.int("min_dynamic_patch", INTERNVL_MIN_TILES) if chat else INTERNVL_MIN_TILES
    hi = top.int("max_dynamic_patch", INTERNVL_MAX_TILES) if chat else INTERNVL_MAX_TILES
    if chat and not top.bool("dynamic_image_size", True):
        lo = hi = 1
    require(lo <= hi, f"model config {top.path}: min_dynamic_patch {lo} exceeds max_dynamic_patch {hi}")
    tiling = ImageTiling(tile_px=tile, patch_px=_side(vision, "patch_size"), encoder_extra_tokens=1,
                       min_tiles=lo, max_tiles=hi, thumbnail=top.bool("use_thumbnail", True) if chat else True,
                       downsample=ratio)
    return at_default_image(name=name, **_decoder(text, top), **_vision_tower(vision), image_rule="internvl",
                            image_tiling=tiling)


TILED = {"llava_next": _llava_next, "llava_onevision": _onevision, "internvl_chat": _internvl, "internvl": _internvl}


def _experts(f: _Fields, kind: str) -> dict:
    """The mixture-of-experts fields: Mixtral's experts are its intermediate_size
    wide, in every layer; Qwen's moe_intermediate_size wide, in every
    decoder_sparse_step-th layer not in mlp_only_layers, with Qwen2-MoE's
    shared expert beside them."""
    layers = f.int("num_hidden_layers")
    if kind == "mixtral":
        return dict(experts=f.int("num_local_experts"), experts_per_token=f.int("num_experts_per_tok"),
                    expert_mlp_hidden=f.int("intermediate_size"))
    step = f.int("decoder_sparse_step", 1)
    only = f.table.get("mlp_only_layers") or []
    require(isinstance(only, list) and all(isinstance(i, int) for i in only),
            f"model config {f.path}: mlp_only_layers must be a list of layer indices (got {only!r})")
    sparse = sum(1 for i in range(layers) if i not in only and (i + 1) % step == 0)
    require(sparse > 0, f"model config {f.path}: no sparse layer (decoder_sparse_step {step}, mlp_only_layers {only})")
    shared = f.int("shared_expert_intermediate_size", low=0) if kind == "qwen2_moe" else 0
    return dict(experts=f.int("num_experts"), experts_per_token=f.int("num_experts_per_tok"),
                expert_mlp_hidden=f.int("moe_intermediate_size"), shared_mlp_hidden=shared,
                dense_layers=layers - sparse)


def _deepseek(f: _Fields) -> dict:
    """DeepSeek-V3's fields (transformers' DeepseekV3Config, the
    deepseek-ai/DeepSeek-V3 config.json): the decoder's, latent attention's
    ranks and head widths, experts in every moe_layer_freq-th layer from
    first_k_dense_replace on (vLLM's deepseek_v2.py: layer_idx >=
    first_k_dense_replace and layer_idx % moe_layer_freq == 0), shared
    experts n_shared_experts x moe_intermediate_size wide, the MTP layers
    (num_nextn_predict_layers: the drafter where there are any), and one
    byte a decoder weight under an fp8 quantization_config."""
    layers = f.int("num_hidden_layers")
    first, freq = f.int("first_k_dense_replace", low=0), f.int("moe_layer_freq", 1)
    sparse = sum(1 for i in range(layers) if i >= first and i % freq == 0)
    require(sparse > 0, f"model config {f.path}: no sparse layer (first_k_dense_replace {first}, moe_layer_freq "
                        f"{freq}, num_hidden_layers {layers})")
    moe = f.int("moe_intermediate_size")
    nope, rope = f.int("qk_nope_head_dim"), f.int("qk_rope_head_dim")
    mtp = f.int("num_nextn_predict_layers", 0, low=0)
    decoder = _decoder(f)
    decoder.update(kv_heads=1, explicit_head_dim=nope + rope)  # vLLM's MLA: one latent "head" a token
    return dict(**decoder, visual_tokens_per_image=0, experts=f.int("n_routed_experts"),
                experts_per_token=f.int("num_experts_per_tok"), expert_mlp_hidden=moe,
                shared_mlp_hidden=f.int("n_shared_experts", 0, low=0) * moe, dense_layers=layers - sparse,
                weight_dtype_bytes=_quantized_bytes(f), q_lora_rank=f.int("q_lora_rank"),
                kv_lora_rank=f.int("kv_lora_rank"), qk_nope_head_dim=nope, qk_rope_head_dim=rope,
                v_head_dim=f.int("v_head_dim"), mtp_layers=mtp, drafter=specs.MTP if mtp else "eagle1")


def _quantized_bytes(f: _Fields) -> int:
    """Bytes a decoder weight takes under the file's quantization_config:
    1 for ``quant_method`` fp8, 0 (the dtype's) without one."""
    quant = f.table.get("quantization_config")
    if quant is None:
        return 0
    method = quant.get("quant_method") if isinstance(quant, dict) else None
    require(method == "fp8", f"model config {f.path}: quantization_config.quant_method must be fp8 (got "
                             f"{method!r}); other quantizations are not read yet")
    return 1


def _llama4_text(text: _Fields, outer: _Fields | None = None) -> dict:
    """Llama 4's decoder (transformers' Llama4TextConfig; meta-llama/
    Llama-4-Scout-17B-16E's config.json), from ``text_config`` (``llama4``;
    ``outer`` its top level) or the top level (``llama4_text``): layer i
    sparse where (i + 1) % interleave_moe_layer_step == 0 (as the config
    class builds moe_layers), each a router over num_local_experts experts
    intermediate_size wide beside a shared expert of the same width; dense
    layers intermediate_size_mlp wide."""
    layers = text.int("num_hidden_layers")
    step = text.int("interleave_moe_layer_step")
    sparse = sum(1 for i in range(layers) if (i + 1) % step == 0)
    require(sparse > 0, f"model config {text.path}: no sparse layer (interleave_moe_layer_step {step}, "
                        f"num_hidden_layers {layers})")
    expert = text.int("intermediate_size")
    decoder = _decoder(text, outer)
    decoder["mlp_hidden"] = text.int("intermediate_size_mlp")
    chunk, chunked = _chunked_layers(text, layers)
    return dict(**decoder, experts=text.int("num_local_experts"), experts_per_token=text.int("num_experts_per_tok"),
                expert_mlp_hidden=expert, shared_mlp_hidden=expert, dense_layers=layers - sparse,
                attention_chunk=chunk, chunked_layers=chunked)


def _chunked_layers(text: _Fields, layers: int) -> tuple[int, int]:
    """(attention_chunk, chunked_layers) of a Llama 4 decoder, as
    transformers' Llama4TextConfig and vLLM's llama4.py read them: layer i
    attends within chunks of attention_chunk_size tokens where
    no_rope_layers[i] is 1 (it uses RoPE), to the whole context where it is
    0 (a NoPE layer). attention_chunk_size left out is the config class's
    8192, null is no chunking; no_rope_layers left out, null or empty is a
    NoPE layer every no_rope_layer_interval (4) layers."""
    if "attention_chunk_size" in text.table and text.table["attention_chunk_size"] is None:
        return 0, 0
    chunk = text.int("attention_chunk_size", LLAMA4_ATTENTION_CHUNK)
    rope = text.table.get("no_rope_layers")
    if not rope:
        interval = text.int("no_rope_layer_interval", 4)
        rope = [int((i + 1) % interval != 0) for i in range(layers)]
    require(isinstance(rope, list) and len(rope) == layers and all(v in (0, 1) and not isinstance(v, bool)
                                                                    for v in rope),
            f"model config {text.path}: {text._name('no_rope_layers')} must list 0 or 1 for each of the "
            f"{layers} layers (got {rope!r:.80})")
    chunked = sum(rope)
    return (chunk, chunked) if chunked else (0, 0)


def _llama4_vision(top: _Fields) -> dict:
    """Llama 4's vision tower and image rule (Llama4VisionConfig): tiles of
    image_size pixels in patch_size patches (and a class token through the
    encoder), pixel_shuffle_ratio^2 of a tile's patches as visual tokens (144
    at 336 / 14 and 0.5), at most LLAMA4_MAX_TILES tiles and a global view
    (simspec.costs.images.llama4_canvas)."""
    vision = top.sub("vision_config")
    tiling = ImageTiling(tile_px=vision.int("image_size"), patch_px=vision.int("patch_size"),
                         encoder_extra_tokens=1, max_tiles=LLAMA4_MAX_TILES,
                         downsample=vision.fraction("pixel_shuffle_ratio"))
    return dict(**_vision_tower(vision), image_rule="llama4", image_tiling=tiling)


def _decoder(f: _Fields, outer: _Fields | None = None) -> dict:
    """The decoder's ModelSpec fields; ``outer`` (a VLM's top level) may hold its dtype."""
    heads = f.int("num_attention_heads")
    hidden = f.int("hidden_size")
    head_dim = f.table.get("head_dim")
    explicit = f.int("head_dim") if head_dim is not None else 0
    require(explicit or hidden % heads == 0,
            f"model config {f.path}: hidden_size {hidden} is not a multiple of num_attention_heads {heads}; "
            f"give head_dim")
    dtype = f.table.get("torch_dtype", f.table.get("dtype"))
    if dtype is None and outer is not None:
        dtype = outer.table.get("torch_dtype", outer.table.get("dtype"))
    dtype = dtype or "bfloat16"
    require(dtype in DTYPE_BYTES, f"model config {f.path}: torch_dtype must be one of {', '.join(DTYPE_BYTES)} "
                                  f"(got {dtype!r})")
    kv_heads = f.int("num_key_value_heads", heads)
    require(heads % kv_heads == 0, f"model config {f.path}: num_attention_heads {heads} is not a multiple of "
                                   f"num_key_value_heads {kv_heads}")
    return dict(layers=f.int("num_hidden_layers"), hidden=hidden, heads=heads,
                kv_heads=kv_heads, mlp_hidden=f.int("intermediate_size"),
                vocab=f.int("vocab_size"), max_context_tokens=f.int("max_position_embeddings", low=2),
                dtype_bytes=DTYPE_BYTES[dtype], explicit_head_dim=explicit if explicit != hidden // heads else 0,
                tied_embeddings=f.bool("tie_word_embeddings", False))


__all__ = ["model_spec", "read_model_config", "config_path", "SUPPORTED", "DENSE", "VLMS", "EXPERTS", "LATENT",
           "LLAMA4"]
