"""The model catalog: every model ``--model NAME`` names, as its published
``config.json`` gives its shape (cited beside each), and the draft models
``--drafter draft-model:NAME`` names.

Imports: simspec.types, simspec.costs.specs, simspec.costs.images.
"""

from __future__ import annotations

from dataclasses import replace

from simspec.costs.images import LLAMA4_MAX_TILES, ImageTiling
from simspec.costs.specs import DRAFT_MODEL, ModelSpec, at_default_image, check_drafter_form
from simspec.types import require

_CLIP_L_336 = dict(vision_layers=24, vision_hidden=1024, vision_mlp_hidden=4096)
_QWEN2_VIT = dict(vision_layers=32, vision_hidden=1280, vision_mlp_hidden=5120)
_QWEN25_VIT = dict(vision_layers=32, vision_hidden=1280, vision_mlp_hidden=3456)  # Qwen2.5-VL-72B's config.json
_VICUNA_7B = dict(layers=32, hidden=4096, heads=32, kv_heads=32, mlp_hidden=11008, vocab=32000)
_VICUNA_13B = dict(layers=40, hidden=5120, heads=40, kv_heads=40, mlp_hidden=13824, vocab=32000)
# Meta's Llama 3 8B shapes (config.json of meta-llama/Meta-Llama-3-8B and Llama-3.1-8B).
_LLAMA3_8B = dict(layers=32, hidden=4096, heads=32, kv_heads=8, mlp_hidden=14336, vocab=128256)
_LLAMA_68M = dict(layers=2, hidden=768, heads=12, kv_heads=12, mlp_hidden=3072, vocab=32000)
_QWEN2_7B = dict(layers=28, hidden=3584, heads=28, kv_heads=4, mlp_hidden=18944, vocab=152064)
_LLAMA3_70B = dict(layers=80, hidden=8192, heads=64, kv_heads=8, mlp_hidden=28672, vocab=128256)
_QWEN25_72B = dict(layers=80, hidden=8192, heads=64, kv_heads=8, mlp_hidden=29568, vocab=152064)
# LLaVA-1.6's AnyRes over CLIP-L/14 at 336 (llava-hf/llava-v1.6-vicuna-7b-hf's config.json: image_grid_pinpoints,
# vision_feature_select_strategy "default").
_LLAVA_16_TILES = ImageTiling(tile_px=336, patch_px=14, encoder_extra_tokens=1,
                              pinpoints=((336, 672), (672, 336), (672, 672), (1008, 336), (336, 1008)))
# LLaVA-OneVision's anyres_max_9 over SigLIP-so400m/14 at 384 (llava-hf/llava-onevision-qwen2-7b-ov-hf's
# config.json: 384 x 384 up to 2304 x 2304 in steps of 384, vision_feature_select_strategy "full"; SigLIP has
# no CLS). The tower as that config gives it: 26 layers, 1152 wide, MLP 4304.
_ONEVISION_TILES = ImageTiling(tile_px=384, patch_px=14, max_tiles=9, keep_cls=True,
                               pinpoints=tuple((384 * i, 384 * j) for i in range(1, 7) for j in range(1, 7)))
_SIGLIP_SO400M = dict(vision_layers=26, vision_hidden=1152, vision_mlp_hidden=4304)
# InternVL's dynamic tiling (OpenGVLab/InternVL3-8B's config.json: force_image_size 448, patch 14,
# downsample_ratio 0.5, min_dynamic_patch 1, max_dynamic_patch 12, use_thumbnail true; InternViT has a CLS).
_INTERNVL_TILES = ImageTiling(tile_px=448, patch_px=14, encoder_extra_tokens=1, max_tiles=12, downsample=0.5)
# Llama 4's tiling (Llama-4-Scout's vision_config: image_size 336, patch_size 14, pixel_shuffle_ratio 0.5;
# its processor's max_patches; the tower has a class token).
_LLAMA4_TILES = ImageTiling(tile_px=336, patch_px=14, encoder_extra_tokens=1, max_tiles=LLAMA4_MAX_TILES,
                            downsample=0.5)
# InternViT-300M-448px-V2_5 (24 layers, 1024 wide, MLP 4096) and InternViT-6B-448px-V2_5 (45 layers, 3200 wide,
# MLP 12800), as OpenGVLab's InternVL conversion tools give their vision_config.
_INTERNVIT_300M = dict(vision_layers=24, vision_hidden=1024, vision_mlp_hidden=4096)
_INTERNVIT_6B = dict(vision_layers=45, vision_hidden=3200, vision_mlp_hidden=12800)

MODELS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(name="LLaVA-1.5-7B", **_VICUNA_7B, max_context_tokens=4096,
                  visual_tokens_per_image=576, vision_patches_per_image=577, **_CLIP_L_336),
        ModelSpec(name="LLaVA-1.5-13B", **_VICUNA_13B, max_context_tokens=4096,
                  visual_tokens_per_image=576, vision_patches_per_image=577, **_CLIP_L_336),
        # AnyRes: by default up to 4 tiles + one global view, 576 tokens each; --image-size gives the count
        # its processor gives a size (rule "llava_next": 2,928 at 672 x 672).
        ModelSpec(name="LLaVA-1.6-7B", **_VICUNA_7B, max_context_tokens=4096,
                  visual_tokens_per_image=2880, vision_patches_per_image=5 * 577, **_CLIP_L_336,
                  image_rule="llava_next", image_tiling=_LLAVA_16_TILES),
        ModelSpec(name="LLaVA-1.6-13B", **_VICUNA_13B, max_context_tokens=4096,
                  visual_tokens_per_image=2880, vision_patches_per_image=5 * 577, **_CLIP_L_336,
                  image_rule="llava_next", image_tiling=_LLAVA_16_TILES),
        # Dynamic resolution; by default an 896 x 896 image: 1,024 visual tokens after the 2 x 2 merge.
        at_default_image(name="Qwen2-VL-7B", **_QWEN2_7B, max_context_tokens=32768, **_QWEN2_VIT,
                         image_rule="qwen2_vl"),
        at_default_image(name="Qwen2.5-VL-7B", **_QWEN2_7B, max_context_tokens=32768, **_QWEN2_VIT,
                         image_rule="qwen2_vl"),
        at_default_image(name="Qwen2.5-VL-3B", layers=36, hidden=2048, heads=16, kv_heads=2,
                         mlp_hidden=11008, vocab=151936, max_context_tokens=32768, **_QWEN2_VIT,
                         image_rule="qwen2_vl"),
        # Text-only language models (LLaVA-1.5-7B's LM; Vidur's profiled shape).
        ModelSpec(name="Vicuna-7B", **_VICUNA_7B, max_context_tokens=4096, visual_tokens_per_image=0),
        ModelSpec(name="Llama-2-7B", **_VICUNA_7B, max_context_tokens=4096, visual_tokens_per_image=0),
        # Vidur's A100 attention profile of Llama 3 (grouped-query attention, 32 query / 8 KV heads); 3.1 is
        # the same decoder with a 128k context (max_position_embeddings 131072), the most common EAGLE-3 target.
        ModelSpec(name="Llama-3-8B", **_LLAMA3_8B, max_context_tokens=8192, visual_tokens_per_image=0),
        ModelSpec(name="Llama-3.1-8B", **_LLAMA3_8B, max_context_tokens=131072, visual_tokens_per_image=0),
        # The Llama checkpoints `simspec vllm-models` builds for validating
        # against a real vLLM (simspec/vllm/models.py SIZES), served in
        # float32 on this project's CPU machine (docs/vllm.md).
        ModelSpec(name="vllm-models-120m", layers=12, hidden=768, heads=12, kv_heads=12, mlp_hidden=3072, vocab=4096,
                  max_context_tokens=2048, visual_tokens_per_image=0, dtype_bytes=4),
        ModelSpec(name="vllm-models-tiny", layers=2, hidden=128, heads=4, kv_heads=4, mlp_hidden=512, vocab=4096,
                  max_context_tokens=2048, visual_tokens_per_image=0, dtype_bytes=4),
        # Separate draft models (Llama shapes, config.json of each on the Hugging Face hub): JackFram/llama-68m
        # and llama-160m (Miao et al., SpecInfer, arXiv 2305.09781) and double7/vicuna-68m (llama-68m fine-tuned
        # on ShareGPT, the draft model of Spec-Bench's SpS row), served in float16 as Spec-Bench loads them.
        ModelSpec(name="Llama-68M", **_LLAMA_68M, max_context_tokens=2048, visual_tokens_per_image=0),
        ModelSpec(name="Vicuna-68M", **_LLAMA_68M, max_context_tokens=2048, visual_tokens_per_image=0),
        ModelSpec(name="Llama-160M", **{**_LLAMA_68M, "layers": 12}, max_context_tokens=2048,
                  visual_tokens_per_image=0),
        # Large models, as their config.json on the Hugging Face hub gives them (meta-llama/Llama-3.1-70B,
        # meta-llama/Llama-3.3-70B-Instruct, Qwen/Qwen2.5-7B-Instruct, Qwen/Qwen2.5-72B-Instruct,
        # Qwen/Qwen2.5-VL-72B-Instruct, Qwen/Qwen3-8B, Qwen/Qwen3-32B); served with --tp where one GPU
        # cannot hold them. Qwen3's heads are 128 wide whatever hidden / heads is.
        ModelSpec(name="Llama-3.1-70B", **_LLAMA3_70B, max_context_tokens=131072, visual_tokens_per_image=0),
        ModelSpec(name="Llama-3.3-70B", **_LLAMA3_70B, max_context_tokens=131072, visual_tokens_per_image=0),
        ModelSpec(name="Qwen2.5-7B", **_QWEN2_7B, max_context_tokens=32768, visual_tokens_per_image=0),
        ModelSpec(name="Qwen2.5-72B", **_QWEN25_72B, max_context_tokens=32768, visual_tokens_per_image=0),
        at_default_image(name="Qwen2.5-VL-72B", **_QWEN25_72B, max_context_tokens=128000, **_QWEN25_VIT,
                         image_rule="qwen2_vl"),
        # Tiling and dynamic-resolution VLMs serving engineers run, each at an 896 x 896 image by default
        # (as the Qwen-VL entries; --image-size for others), tokens and encoder work by its rule:
        # - Qwen2.5-VL-32B: Qwen/Qwen2.5-VL-32B-Instruct's config.json (the Qwen2.5-32B decoder: 64 layers,
        #   40 query / 8 KV heads, its model card; hidden 5120, MLP 27648) with Qwen2.5-VL-72B's tower;
        #   1,024 tokens.
        # - InternVL3-8B / -78B: OpenGVLab/InternVL3-8B and -78B's config.json (llm_config Qwen2.5-7B /
        #   Qwen2.5-72B with 151,674 tokens, context 32768; InternViT-300M / InternViT-6B); 2 x 2 tiles and
        #   the thumbnail, 1,280 tokens, 5 x 1,025 through InternViT.
        # - LLaVA-OneVision-7B / -72B: llava-hf/llava-onevision-qwen2-7b-ov-hf and -72b-ov-hf's config.json
        #   (Qwen2-7B / Qwen2-72B, context 32768, SigLIP-so400m); the 1152 x 1152 pinpoint (3 x 3 tiles,
        #   81 x 81 features, under the anyres_max_9 cap), 81 newlines and the base view: 7,371 tokens,
        #   10 x 729 through SigLIP.
        # Read from stored sources: the InternViT towers, InternVL3-78B's decoder and vocabulary, the Qwen2.5-32B
        # decoder's layers and heads (its model card). Taken from those configs as published but not found in a
        # stored copy: Qwen2.5-VL-32B's hidden 5120, MLP 27648 and tower MLP 3456; LLaVA-OneVision's vocabulary
        # (Qwen2's 152064) and SigLIP's 26 layers.
        at_default_image(name="Qwen2.5-VL-32B", layers=64, hidden=5120, heads=40, kv_heads=8, mlp_hidden=27648,
                         vocab=152064, max_context_tokens=128000, **_QWEN25_VIT, image_rule="qwen2_vl"),
        at_default_image(name="InternVL3-8B", **{**_QWEN2_7B, "vocab": 151674}, max_context_tokens=32768,
                         **_INTERNVIT_300M, image_rule="internvl", image_tiling=_INTERNVL_TILES),
        at_default_image(name="InternVL3-78B", **{**_QWEN25_72B, "vocab": 151674}, max_context_tokens=32768,
                         **_INTERNVIT_6B, image_rule="internvl", image_tiling=_INTERNVL_TILES),
        at_default_image(name="LLaVA-OneVision-7B", **_QWEN2_7B, max_context_tokens=32768, **_SIGLIP_SO400M,
                         image_rule="llava_onevision", image_tiling=_ONEVISION_TILES),
        at_default_image(name="LLaVA-OneVision-72B", **_QWEN25_72B, max_context_tokens=32768, **_SIGLIP_SO400M,
                         image_rule="llava_onevision", image_tiling=_ONEVISION_TILES),
        ModelSpec(name="Qwen3-8B", layers=36, hidden=4096, heads=32, kv_heads=8, mlp_hidden=12288, vocab=151936,
                  explicit_head_dim=0, max_context_tokens=40960, visual_tokens_per_image=0),
        ModelSpec(name="Qwen3-32B", layers=64, hidden=5120, heads=64, kv_heads=8, mlp_hidden=25600, vocab=151936,
                  explicit_head_dim=128, max_context_tokens=40960, visual_tokens_per_image=0),
        # Mixtures of experts (config.json of Qwen/Qwen3-30B-A3B and mistralai/Mixtral-8x7B-v0.1): 30.5B
        # parameters, 3.3B active; 46.7B, 12.9B active, as their model cards state.
        ModelSpec(name="Qwen3-30B-A3B", layers=48, hidden=2048, heads=32, kv_heads=4, mlp_hidden=6144,
                  vocab=151936, explicit_head_dim=128, max_context_tokens=40960, visual_tokens_per_image=0,
                  experts=128, experts_per_token=8, expert_mlp_hidden=768),
        ModelSpec(name="Mixtral-8x7B", layers=32, hidden=4096, heads=32, kv_heads=8, mlp_hidden=14336, vocab=32000,
                  max_context_tokens=32768, visual_tokens_per_image=0, experts=8, experts_per_token=2,
                  expert_mlp_hidden=14336),
        # DeepSeek-V3 and DeepSeek-R1 (one shape: the config.json of deepseek-ai/DeepSeek-V3 and -R1, the
        # defaults of transformers' models/deepseek_v3/configuration_deepseek_v3.py; arXiv 2412.19437):
        # latent attention, 3 dense layers then 58 of 256 routed experts (8 a token) and one shared, one MTP
        # layer, FP8 decoder weights (quantization_config fp8, e4m3, 128 x 128 blocks) with BF16 embeddings,
        # head and KV cache (vLLM's kv_cache_dtype "auto": the model's dtype). 670.9B parameters here, 37.5B
        # active a token, against the paper's 671B and 37B (tests/test_deepseek_llama4.py); mtp drafts.
        *(ModelSpec(name=name, layers=61, hidden=7168, heads=128, kv_heads=1, mlp_hidden=18432, vocab=129280,
                    explicit_head_dim=192, max_context_tokens=163840, visual_tokens_per_image=0, experts=256,
                    experts_per_token=8, expert_mlp_hidden=2048, shared_mlp_hidden=2048, dense_layers=3,
                    weight_dtype_bytes=1, q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128,
                    qk_rope_head_dim=64, v_head_dim=128, mtp_layers=1, drafter="mtp")
          for name in ("DeepSeek-V3", "DeepSeek-R1")),
        # Llama 4 Scout (meta-llama/Llama-4-Scout-17B-16E config.json, transformers' models/llama4/
        # configuration_llama4.py): every layer sparse (interleave_moe_layer_step 1), 16 experts of 8192, one a
        # token, and a shared expert of 8192; bf16. Its vision tower (34 layers, 1408 wide, MLP 5632) turns each
        # 336-pixel tile of 14-pixel patches (576, plus a class token through the encoder) into 144 tokens
        # through a 0.5 pixel shuffle; its processor fits an image into up to 16 tiles and adds a global view
        # (simspec.costs.images.llama4_canvas). 108.6B parameters, 17.2B active, against the model card's 109B
        # and 17B. Three layers in four attend within 8,192-token chunks (attention_chunk_size 8192; its
        # no_rope_layers is empty, so the config class makes every fourth layer a global one).
        at_default_image(name="Llama-4-Scout-17B-16E", layers=48, hidden=5120, heads=40, kv_heads=8,
                         mlp_hidden=16384, vocab=202048, max_context_tokens=10485760, vision_layers=34,
                         vision_hidden=1408, vision_mlp_hidden=5632, experts=16, experts_per_token=1,
                         expert_mlp_hidden=8192, shared_mlp_hidden=8192, image_rule="llama4",
                         image_tiling=_LLAMA4_TILES, attention_chunk=8192, chunked_layers=36),
        # Llama 4 Maverick: Scout's shapes with 128 experts in every second layer (interleave_moe_layer_step 2:
        # 24 sparse layers, 24 dense ones 16384 wide) and a 1,048,576-token context (Maverick's text_config as
        # NVIDIA/TensorRT-LLM's Llama 4 test copies it, LLAMA_4_MAVERICK_TWO_LAYER_CONFIG, "reduced to 2 layers
        # from 48"; the vision tower taken as Scout's, which that test leaves out). 401.5B parameters, 17.2B
        # active, against the model card's 400B and 17B.
        at_default_image(name="Llama-4-Maverick-17B-128E", layers=48, hidden=5120, heads=40, kv_heads=8,
                         mlp_hidden=16384, vocab=202048, max_context_tokens=1048576, vision_layers=34,
                         vision_hidden=1408, vision_mlp_hidden=5632, experts=128, experts_per_token=1,
                         expert_mlp_hidden=8192, shared_mlp_hidden=8192, dense_layers=24, image_rule="llama4",
                         image_tiling=_LLAMA4_TILES, attention_chunk=8192, chunked_layers=36),
        # Small draft models of the same families (Qwen/Qwen2.5-0.5B-Instruct, meta-llama/Llama-3.2-1B), tied
        # embeddings: draft-model:Qwen2.5-0.5B for Qwen2.5-72B, draft-model:Llama-3.2-1B for Llama-3.1-70B.
        ModelSpec(name="Qwen2.5-0.5B", layers=24, hidden=896, heads=14, kv_heads=2, mlp_hidden=4864, vocab=151936,
                  max_context_tokens=32768, visual_tokens_per_image=0, tied_embeddings=True),
        ModelSpec(name="Llama-3.2-1B", layers=16, hidden=2048, heads=32, kv_heads=8, mlp_hidden=8192, vocab=128256,
                  max_context_tokens=131072, visual_tokens_per_image=0, tied_embeddings=True),
        # The shapes of Vidur's tensor-parallel MLP profiles (shared data's external_profiles/), as Vidur's own
        # vidur/config/model_config.py gives them (github.com/microsoft/vidur at 7d47513: Llama2_70BModelConfig,
        # CodeLlama34BModelConfig, Qwen72BModelConfig, Llama3_70BModelConfig); vocabularies as the models'
        # config.json (Vidur pads Llama-2's 32000 to 32768). Qwen-72B is the original Qwen (no grouped-query
        # attention); its config's intermediate_size 49152 is gate and up together, 24576 each.
        ModelSpec(name="Llama-2-70B", layers=80, hidden=8192, heads=64, kv_heads=8, mlp_hidden=28672, vocab=32000,
                  max_context_tokens=4096, visual_tokens_per_image=0),
        ModelSpec(name="CodeLlama-34B", layers=48, hidden=8192, heads=64, kv_heads=8, mlp_hidden=22016, vocab=32000,
                  max_context_tokens=16384, visual_tokens_per_image=0),
        ModelSpec(name="Qwen-72B", layers=80, hidden=8192, heads=64, kv_heads=64, mlp_hidden=24576, vocab=152064,
                  max_context_tokens=32768, visual_tokens_per_image=0),
        ModelSpec(name="Llama-3-70B", **_LLAMA3_70B, max_context_tokens=8192, visual_tokens_per_image=0),
        # The live engine's own target (simspec.models.vlm.VLMConfig defaults), float32 on CPU.
        ModelSpec(name="simspec-tiny-vlm", layers=3, hidden=128, heads=4, kv_heads=4, mlp_hidden=384, vocab=48,
                  max_context_tokens=256, visual_tokens_per_image=16, vision_patches_per_image=16,
                  vision_layers=1, vision_hidden=96, vision_mlp_hidden=192, dtype_bytes=4),
    )
}


MODELS_BY_KEY = {name.lower(): spec for name, spec in MODELS.items()}


def check_drafter(drafter: str) -> None:
    """Raise InputError unless ``drafter`` names a drafter (DRAFTER_FORMS);
    a draft model must be a text-only spec of MODELS."""
    check_drafter_form(drafter)
    kind, _, name = drafter.partition(":")
    if kind == DRAFT_MODEL:
        spec = MODELS_BY_KEY.get(name.lower())
        require(spec is not None, f"drafter {drafter!r}: the draft model must be one of {', '.join(MODELS)}")
        require(not spec.multimodal, f"drafter {drafter!r}: the draft model must be a text-only model")


def model_spec(name: str, drafter: str | None = None, tp: int = 1) -> ModelSpec:
    """The catalog's spec named ``name`` (any case), with ``drafter`` as its
    draft head where given (simspec.costs.model_spec also reads config files)."""
    require(name.lower() in MODELS_BY_KEY,
            f"model must be one of {', '.join(MODELS)}, or a path to a Hugging Face config.json (got {name!r})")
    spec = MODELS_BY_KEY[name.lower()]
    return deployed(spec, drafter, tp)


def deployed(spec: ModelSpec, drafter: str | None, tp: int) -> ModelSpec:
    """``spec`` with ``drafter`` as its draft head (where given) at tensor-parallel degree ``tp``."""
    changes = {}
    if drafter is not None and drafter != spec.drafter:
        check_drafter(drafter)
        kind, _, name = drafter.partition(":")
        changes.update(drafter=drafter, draft_spec=MODELS_BY_KEY[name.lower()] if kind == DRAFT_MODEL else None)
    if tp != spec.tensor_parallel:
        changes["tensor_parallel"] = tp
    return replace(spec, **changes) if changes else spec
