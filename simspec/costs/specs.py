"""Spec sheets: model shapes and GPU datasheet numbers.

Imports: stdlib and simspec.types. The numbers are public architecture
configs (Hugging Face ``config.json`` of each model) and vendor datasheets;
per-layer costs are scaled to whole models from these shapes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from simspec.types import InputError, require


@dataclass(frozen=True, slots=True, kw_only=True)
class ImageTiling:
    """How a tiling VLM cuts an image into tiles of its vision tower
    (:meth:`ModelSpec.at_image_size`, rules "llava_next", "llava_onevision",
    "internvl")."""

    tile_px: int  # a tile's side: the tower's image_size (LLaVA) or force_image_size (InternVL)
    patch_px: int  # the tower's patch side
    encoder_extra_tokens: int = 0  # CLS tokens a tile adds through the encoder (CLIP, InternViT 1; SigLIP 0)
    keep_cls: bool = False  # LLaVA's vision_feature_select_strategy "full": the LM sees the base view's CLS too
    pinpoints: tuple[tuple[int, int], ...] = ()  # LLaVA's image_grid_pinpoints, (height, width) pixels
    max_tiles: int = 0  # OneVision: the anyres_max_N cap (in base views); InternVL: max_dynamic_patch
    min_tiles: int = 1  # InternVL: min_dynamic_patch
    thumbnail: bool = True  # InternVL: use_thumbnail (a global view when there is more than one tile)
    downsample: float = 1.0  # InternVL: downsample_ratio (pixel shuffle 0.5: a quarter of the patches)

    @property
    def side_patches(self) -> int:
        """Patches along a tile's side."""
        return self.tile_px // self.patch_px


@dataclass(frozen=True, slots=True, kw_only=True)
class ModelSpec:
    """Shape of a VLM: decoder LM, vision encoder, and its EAGLE-style drafter."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    mlp_hidden: int  # gated MLP (gate + up + down)
    vocab: int
    max_context_tokens: int
    visual_tokens_per_image: int  # 0 = text-only model
    vision_layers: int = 0
    vision_hidden: int = 0
    vision_mlp_hidden: int = 0
    vision_patches_per_image: int = 0  # tokens through the vision encoder per image
    dtype_bytes: int = 2
    # What drafts (DRAFTERS, :func:`check_drafter`): "eagle1" (EAGLE-1/2: fc
    # over [feature, embedding] + one decoder layer, the target's LM head),
    # "eagle3" (EAGLE-3: fc over three of the target's layers' features, one
    # decoder layer whose attention takes [embedding, feature], and its own
    # LM head over a draft vocabulary of min(vocab, EAGLE3_DRAFT_VOCAB)
    # tokens), "medusa" (MEDUSA_HEADS heads over the target's last hidden
    # state, each a residual block and its own LM head), "ngram" (prompt
    # lookup: no weights), "mtp" (the model's own multi-token-prediction
    # module, DeepSeek-V3's: a projection over [embedding, hidden] and
    # ``mtp_layers`` decoder layers of the target's shape, sharing its
    # embedding and LM head) or "draft-model:NAME" (a separate draft model,
    # NAME one of MODELS, run as its own decoder layers and LM head).
    drafter: str = "eagle1"
    # Attention heads' width where the config gives it apart from hidden /
    # heads (Qwen3, Llama-3.2-1B...; 0: hidden // heads).
    explicit_head_dim: int = 0
    tied_embeddings: bool = False  # the LM head is the embedding matrix (held once)
    # GPUs the model is sharded over (tensor parallelism, Megatron-style as
    # vLLM and SGLang shard it): attention heads, MLP columns, the vocabulary
    # and the vision tower split N ways, KV heads too (each GPU keeps at
    # least one: fewer KV heads than GPUs are replicated). Every weight,
    # parameter and KV figure below is one GPU's.
    tensor_parallel: int = 1
    # GPUs the drafter is sharded over: 0 the target's degree (what vLLM
    # and SGLang do by default), or 1 (vLLM's draft_tensor_parallel_size=1:
    # the whole drafter on one GPU, no all-reduces of its own).
    draft_tensor_parallel: int = 0
    # Mixture of experts: a sparse layer's MLP is ``experts`` routed experts
    # of ``expert_mlp_hidden`` each (gated), ``experts_per_token`` of them
    # per token, and a shared MLP of ``shared_mlp_hidden`` every token runs
    # (0: none); ``dense_layers`` of the layers keep a dense MLP of
    # ``mlp_hidden``. 0 experts: a dense model.
    experts: int = 0
    experts_per_token: int = 0
    expert_mlp_hidden: int = 0
    shared_mlp_hidden: int = 0
    dense_layers: int = 0
    # How an image's size becomes visual tokens (:meth:`at_image_size`): ""
    # a fixed count whatever the size (LLaVA-1.5 resizes every image to its
    # tower's square); "qwen2_vl" as Qwen2-VL's and Qwen2.5-VL's processor
    # does it (QWEN_VL_*); "llava_next", "llava_onevision" and "internvl"
    # tile the image as ``image_tiling`` says (IMAGE_RULES).
    image_rule: str = ""
    # Bytes a decoder weight takes where they differ from dtype_bytes (0: the
    # same): DeepSeek-V3's FP8 checkpoint holds its decoder's linear layers
    # in one byte and keeps the embedding, the LM head and the KV cache at
    # dtype_bytes (arXiv 2412.19437 section 3.3.2: embedding, output head,
    # gating and attention stay in BF16 or FP32).
    weight_dtype_bytes: int = 0
    # Multi-head latent attention (DeepSeek-V2/V3) where kv_lora_rank > 0:
    # queries through a q_lora_rank-wide low-rank pair (q_a, q_b), keys and
    # values compressed by kv_a into one latent of kv_lora_rank plus a
    # shared rotary key of qk_rope_head_dim, expanded per head by kv_b (keys
    # qk_nope_head_dim, values v_head_dim wide), output from heads x
    # v_head_dim. The cache holds the latent and the rotary key per token and
    # layer, whatever the heads (:attr:`kv_bytes_per_token`).
    q_lora_rank: int = 0
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    mtp_layers: int = 0  # multi-token-prediction decoder layers the checkpoint ships (the "mtp" drafter)
    image_tiling: ImageTiling | None = None

    def __post_init__(self):
        check_drafter(self.drafter)
        n = self.tensor_parallel
        require(n in TP_DEGREES, f"tp must be one of {', '.join(map(str, TP_DEGREES))} (got {n})")
        if n > 1:  # vLLM refuses these too (vllm/config/model.py: verify_with_parallel_config)
            require(self.heads % n == 0, f"model {self.name}: {self.heads} attention heads are not divisible by "
                                         f"tp {n} (vLLM refuses it too)")
            require(self.kv_heads % n == 0 or n % self.kv_heads == 0,
                    f"model {self.name}: {self.kv_heads} KV heads neither divide nor are a multiple of tp {n}")
            require(self.mlp_hidden % n == 0, f"model {self.name}: MLP width {self.mlp_hidden} is not divisible by "
                                              f"tp {n}")
            require(self.expert_mlp_hidden % n == 0, f"model {self.name}: expert MLP width {self.expert_mlp_hidden} "
                                                     f"is not divisible by tp {n}")
        require(self.draft_tensor_parallel in (0, 1, n),
                f"draft_tp must be 1 or the target's tp {n} (got {self.draft_tensor_parallel})")
        if self.experts:
            require(1 <= self.experts_per_token <= self.experts and self.expert_mlp_hidden > 0
                    and 0 <= self.dense_layers < self.layers,
                    f"model {self.name}: a mixture of experts needs 1 <= experts_per_token <= experts ({self.experts}), "
                    f"an expert MLP width and fewer dense layers than layers")
        if self.kv_lora_rank:
            require(min(self.q_lora_rank, self.qk_nope_head_dim, self.qk_rope_head_dim, self.v_head_dim) > 0,
                    f"model {self.name}: latent attention needs q_lora_rank, qk_nope_head_dim, qk_rope_head_dim and "
                    f"v_head_dim > 0")
        require(self.drafter_kind != MTP or self.mtp_layers > 0,
                f"model {self.name}: drafter mtp needs a model that ships a multi-token-prediction module "
                f"(num_nextn_predict_layers > 0 in its config, e.g. DeepSeek-V3)")

    @property
    def drafter_kind(self) -> str:
        """The drafter's kind: one of DRAFTERS (``draft-model`` for ``draft-model:NAME``)."""
        return self.drafter.partition(":")[0]

    @property
    def draft_degree(self) -> int:
        """GPUs the drafter is sharded over (draft_tensor_parallel, 0 meaning the target's)."""
        return self.draft_tensor_parallel or self.tensor_parallel

    @property
    def drafter_whole(self) -> "ModelSpec":
        """The spec whose drafter figures hold for the drafter's own degree:
        this one, or, for a drafter on one GPU, the same model unsharded."""
        if self.draft_degree == self.tensor_parallel:
            return self
        return replace(self, tensor_parallel=1, draft_tensor_parallel=0)

    @property
    def draft_model(self) -> "ModelSpec | None":
        """The separate draft model's spec (``draft-model:NAME``), else None."""
        return MODELS_BY_KEY[self.drafter.partition(":")[2].lower()] if self.drafter_kind == DRAFT_MODEL else None

    @property
    def head_dim(self) -> int:
        return self.explicit_head_dim or self.hidden // self.heads

    @property
    def q_dim(self) -> int:
        """Width of one GPU's queries (and attention output): its heads x head_dim."""
        return self.heads_per_gpu * self.head_dim

    @property
    def heads_per_gpu(self) -> int:
        return self.heads // self.tensor_parallel

    @property
    def kv_heads_per_gpu(self) -> int:
        """KV heads one GPU holds: kv_heads / tp, at least one (replicated)."""
        return max(self.kv_heads // self.tensor_parallel, 1)

    def _shard(self, params: int) -> int:
        return -(-params // self.tensor_parallel)

    @property
    def multimodal(self) -> bool:
        return self.visual_tokens_per_image > 0

    @property
    def layer_params(self) -> int:
        """One GPU's weights of one decoder layer (attention projections + gated MLP)."""
        return self.attention_params + 3 * self.hidden * (self.mlp_hidden // self.tensor_parallel)

    @property
    def latent(self) -> bool:
        """Multi-head latent attention (kv_lora_rank > 0)."""
        return self.kv_lora_rank > 0

    @property
    def weight_bytes_per_param(self) -> int:
        """Bytes a decoder weight takes: weight_dtype_bytes, else dtype_bytes."""
        return self.weight_dtype_bytes or self.dtype_bytes

    def at_image_size(self, width: int, height: int) -> "ModelSpec":
        """The model serving images of ``width`` x ``height`` pixels: its
        visual tokens (what the LM sees) and vision-encoder tokens (every
        tile through the tower) by its image rule (IMAGE_RULES). A
        fixed-size model is unchanged."""
        require(1 <= width <= MAX_IMAGE_SIDE and 1 <= height <= MAX_IMAGE_SIDE,
                f"image_size must be WIDTHxHEIGHT with each side in 1..{MAX_IMAGE_SIDE} pixels "
                f"(got {width}x{height})")
        rule = IMAGE_RULES.get(self.image_rule)
        if rule is None:
            return self
        tokens, patches = rule(self, width, height)
        return replace(self, visual_tokens_per_image=tokens, vision_patches_per_image=patches)

    @property
    def attention_params(self) -> int:
        """One GPU's attention projections of one layer (Q, K, V, O; latent
        attention: :meth:`_latent_attention_params`)."""
        if self.latent:
            return self._latent_attention_params()
        return self.hidden * (2 * self.q_dim + 2 * self.kv_heads_per_gpu * self.head_dim)

    def _latent_attention_params(self) -> int:
        """Latent attention's projections, one GPU's: q_a (hidden -> q_lora_rank)
        and kv_a (hidden -> kv_lora_rank + the rotary key) on every GPU, as
        vLLM runs them (ReplicatedLinear in vllm/model_executor/models/
        deepseek_v2.py: the latent is not split); q_b (q_lora_rank -> heads x
        (nope + rope)), kv_b (kv_lora_rank -> heads x (nope + v)) and o
        (heads x v -> hidden) split by heads. In the absorbed form vLLM
        decodes with, kv_b's two halves fold into the query and the output:
        the same weights, read once a step."""
        heads = self.heads_per_gpu
        replicated = self.hidden * (self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim)
        q_b = self.q_lora_rank * heads * (self.qk_nope_head_dim + self.qk_rope_head_dim)
        kv_b = self.kv_lora_rank * heads * (self.qk_nope_head_dim + self.v_head_dim)
        return replicated + q_b + kv_b + heads * self.v_head_dim * self.hidden

    @property
    def sparse_layers(self) -> int:
        """Layers whose MLP is a mixture of experts (0: a dense model)."""
        return self.layers - self.dense_layers if self.experts else 0

    @property
    def expert_params(self) -> int:
        """One GPU's share of one routed expert (each expert sharded N ways, as vLLM shards them without
        expert parallelism)."""
        return 3 * self.hidden * (self.expert_mlp_hidden // self.tensor_parallel)

    @property
    def sparse_always_params(self) -> int:
        """What a sparse layer runs for every token besides its experts: attention, the shared MLP, the router."""
        return (self.attention_params + 3 * self.hidden * (self.shared_mlp_hidden // self.tensor_parallel)
                + self.hidden * self.experts)

    def experts_touched(self, tokens):
        """Expected distinct experts ``tokens`` tokens route to in one sparse
        layer, each token choosing experts_per_token of them uniformly and
        independently: E (1 - (1 - k / E)^T) (MoESD, arXiv 2505.19645, models
        expert activation the same way)."""
        e, k = self.experts, self.experts_per_token
        return e * (1.0 - (1.0 - k / e) ** tokens)

    @property
    def lm_head_params(self) -> int:
        """One GPU's share of the LM head (the vocabulary split N ways)."""
        return self._shard(self.vocab) * self.hidden

    @property
    def vision_params(self) -> int:
        h, m = self.vision_hidden, self.vision_mlp_hidden
        return self._shard(self.vision_layers * (4 * h * h + 2 * h * m))

    @property
    def drafter_params(self) -> int:
        """The weights one drafter call runs besides an LM head: EAGLE-1's
        fc over [feature, embedding] + one decoder layer; EAGLE-3's fc over
        three features + a layer whose Q, K and V projections read 2 x
        hidden; one Medusa head's residual block (a hidden x hidden linear
        with its bias); a draft model's decoder layers; none for n-grams."""
        kind = self.drafter_kind
        if kind == "eagle3":
            kv = self.kv_heads_per_gpu * self.head_dim
            return self._shard(3 * self.hidden * self.hidden) + self.layer_params + self.hidden * (self.q_dim + 2 * kv)
        if kind == "medusa":
            return self._shard(self.hidden * self.hidden + self.hidden)
        if kind == DRAFT_MODEL:
            return self._shard(self.draft_model.layers * self.draft_model.layer_params)
        if kind == "ngram":
            return 0
        if kind == MTP:
            return self.mtp_projection_params + self.mtp_layers * self.mtp_layer_params
        return self._shard(2 * self.hidden * self.hidden) + self.layer_params

    @property
    def mtp_projection_params(self) -> int:
        """The MTP module's projection over [embedding, hidden] (eh_proj, 2 x
        hidden -> hidden): a plain nn.Linear in vLLM's deepseek_mtp.py, held
        whole on every GPU."""
        return 2 * self.hidden * self.hidden

    @property
    def mtp_layer_params(self) -> int:
        """One GPU's weights of one MTP decoder layer: a sparse layer of the
        target's shape where the target has experts (DeepSeek-V3's MTP layer
        is index num_hidden_layers, past first_k_dense_replace), else a dense one."""
        if self.experts:
            return self.sparse_always_params + self.experts * self.expert_params
        return self.layer_params

    @property
    def drafter_head_params(self) -> int:
        """The LM head a drafter call runs: the target's (EAGLE-1, shared),
        EAGLE-3's own over its draft vocabulary, one Medusa head's own, the
        draft model's; none for n-grams."""
        kind = self.drafter_kind
        if kind == DRAFT_MODEL:
            return self._shard(self.draft_model.lm_head_params)
        if kind == "ngram":
            return 0
        vocab = min(self.vocab, EAGLE3_DRAFT_VOCAB) if kind == "eagle3" else self.vocab
        return self._shard(vocab) * self.hidden

    @property
    def drafter_weight_params(self) -> int:
        """The drafter's weights in GPU memory besides the target's."""
        kind = self.drafter_kind
        if kind in ("eagle1", MTP):
            # the target's LM head is shared (and for MTP its embedding: vLLM's
            # v1/spec_decode/eagle.py logs "Detected MTP model. Sharing target
            # model embedding weights" and the same for lm_head)
            return self.drafter_params
        if kind == "medusa":
            return MEDUSA_HEADS * (self.drafter_params + self.drafter_head_params)
        if kind == DRAFT_MODEL:
            return self.drafter_params + 2 * self._shard(self.draft_model.lm_head_params)  # embeddings + LM head
        return self.drafter_params + self.drafter_head_params

    @property
    def decoder_params(self) -> int:
        """One GPU's decoder-layer weights (attention, MLPs, every expert, routers)."""
        return ((self.layers - self.sparse_layers) * self.layer_params
                + self.sparse_layers * (self.sparse_always_params + self.experts * self.expert_params))

    @property
    def weight_bytes(self) -> int:
        """One GPU's weights in memory: the decoder at weight_bytes_per_param,
        embeddings, LM head and vision tower at dtype_bytes, the drafter's own."""
        total = (
            (1 if self.tied_embeddings else 2) * self.lm_head_params  # embeddings + LM head
            + self.vision_params
        )
        if self.draft_model is not None:
            draft_bytes = self.draft_model.dtype_bytes
        else:
            draft_bytes = self.weight_bytes_per_param if self.drafter_kind == MTP else self.dtype_bytes
        # A drafter on one GPU holds all its weights there (the GPU the KV budget is bound by).
        return (self.decoder_params * self.weight_bytes_per_param + total * self.dtype_bytes
                + self.drafter_whole.drafter_weight_params * draft_bytes)

    @property
    def kv_bytes_per_token(self) -> int:
        """One GPU's KV cache bytes per token. Latent attention caches one
        latent of kv_lora_rank plus the rotary key per layer, and every GPU
        holds all of it (vLLM: MLA runs with one KV head, "MLA is always
        replicated as the hidden dim can't be split",
        vllm/distributed/kv_transfer/kv_connector/utils.py, quoted in
        github.com/vllm-project/vllm/issues/47929)."""
        if self.latent:
            return self.layers * (self.kv_lora_rank + self.qk_rope_head_dim) * self.dtype_bytes
        return 2 * self.layers * self.kv_heads_per_gpu * self.head_dim * self.dtype_bytes


def _qwen2_vl_image(model: ModelSpec, width: int, height: int) -> tuple[int, int]:
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


def _llava_next_image(model: ModelSpec, width: int, height: int) -> tuple[int, int]:
    """LLaVA-NeXT's AnyRes (transformers' LlavaNextProcessor
    ``_get_number_of_features``; vLLM's llava_next.py ``get_num_image_tokens``):
    the image is fitted to the best pinpoint, cut into tiles of the tower's
    side plus one base view of the whole image; the LM sees the base view's
    n x n features, the unpadded grid of the tiles' features and one
    newline token a grid row. Every tile and the base view run through the
    tower (n x n patches and the CLS each)."""
    t = model.image_tiling
    n = t.side_patches
    best_h, best_w = best_pinpoint(width, height, t.pinpoints)
    tiles_h, tiles_w = best_h // t.tile_px, best_w // t.tile_px
    rows, cols = _unpadded_grid(width, height, n * tiles_h, n * tiles_w)
    base = n * n + (t.encoder_extra_tokens if t.keep_cls else 0)
    return rows * cols + rows + base, (1 + tiles_h * tiles_w) * (n * n + t.encoder_extra_tokens)


def _onevision_image(model: ModelSpec, width: int, height: int) -> tuple[int, int]:
    """LLaVA-OneVision's anyres_max_N (transformers' LlavaOnevisionProcessor
    ``_get_unpadded_features``, vLLM's llava_onevision.py): LLaVA-NeXT's
    count, and where the unpadded grid holds more than 1.1 x N base views'
    features (ratio = sqrt(rows x cols / (N n^2)) > 1.1) it is bilinearly
    downscaled to floor(rows / ratio) x floor(cols / ratio), its newlines
    with it. The encoder still runs every tile."""
    t = model.image_tiling
    n = t.side_patches
    best_h, best_w = best_pinpoint(width, height, t.pinpoints)
    tiles_h, tiles_w = best_h // t.tile_px, best_w // t.tile_px
    rows, cols = _unpadded_grid(width, height, n * tiles_h, n * tiles_w)
    ratio = math.sqrt(rows * cols / (t.max_tiles * n * n))
    if ratio > 1.1:
        rows, cols = int(rows // ratio), int(cols // ratio)
    base = n * n + (t.encoder_extra_tokens if t.keep_cls else 0)
    return rows * cols + rows + base, (1 + tiles_h * tiles_w) * (n * n + t.encoder_extra_tokens)


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


def _internvl_image(model: ModelSpec, width: int, height: int) -> tuple[int, int]:
    """InternVL's dynamic tiling: the grid internvl_grid picks, plus a
    thumbnail (the whole image at one tile) when there is more than one
    tile; each tile's n x n patches (and the CLS) through InternViT, pixel
    shuffle keeping (n x downsample)^2 tokens a tile (256 at 448 / 14, 0.5)
    for the LM (vLLM's ``get_num_image_tokens``: tiles x tokens a tile)."""
    t = model.image_tiling
    cols, rows = internvl_grid(width, height, t)
    tiles = cols * rows + (1 if t.thumbnail and cols * rows != 1 else 0)
    n = t.side_patches
    return tiles * int(n * n * t.downsample * t.downsample), tiles * (n * n + t.encoder_extra_tokens)


# How each image rule turns an image's size into (visual tokens, vision-encoder tokens).
IMAGE_RULES = {"qwen2_vl": _qwen2_vl_image, "llava_next": _llava_next_image,
               "llava_onevision": _onevision_image, "internvl": _internvl_image}


@dataclass(frozen=True, slots=True, kw_only=True)
class GpuSpec:
    """Datasheet numbers of one accelerator (dense, no sparsity)."""

    name: str
    slug: str
    memory_bytes: float
    hbm_bytes_per_s: float
    bf16_flops: float
    # Streaming multiprocessors (CUDA cores / cores per SM on the datasheet): the attention kernels' blocks
    # per sequence and head spread over them (simspec.costs.roofline); 0 for a device known only from its profiles.
    sms: int = 0
    # One GPU's link to the others, each direction, bytes/s: what a tensor-parallel all-reduce's bandwidth
    # term divides by (simspec.costs.collectives); 0 when unknown.
    link_bytes_per_s: float = 0.0
    # Dense FP8 tensor throughput, FLOP/s (0: none, or unknown): what a model with one-byte weights computes
    # its GEMMs at (simspec.costs.roofline).
    fp8_flops: float = 0.0


# Qwen2-VL / Qwen2.5-VL's image processor (Qwen/Qwen2-VL-7B-Instruct's preprocessor_config.json:
# patch_size 14, merge_size 2, min_pixels 3136, max_pixels 12845056).
QWEN_VL_PATCH, QWEN_VL_MERGE, QWEN_VL_MIN_PIXELS, QWEN_VL_MAX_PIXELS = 14, 2, 3136, 12845056
MAX_IMAGE_SIDE = 16384  # pixels a side an image size may give
TP_DEGREES = (1, 2, 4, 8)  # tensor-parallel degrees: the GPUs of one node
DRAFT_MODEL = "draft-model"
MTP = "mtp"
EAGLE_KINDS = ("eagle1", "eagle3")
DRAFTERS = (*EAGLE_KINDS, "medusa", MTP, "ngram", DRAFT_MODEL)
DRAFTER_FORMS = "eagle1, eagle3, medusa, mtp, ngram or draft-model:NAME"
# EAGLE-3 heads predict over the 32,000 most frequent target tokens
# (draft_vocab_size 32000 in the released Llama-3.1-8B EAGLE-3 head's config,
# EAGLE-3 paper arXiv 2503.01840).
EAGLE3_DRAFT_VOCAB = 32000
# Medusa-1 heads as Spec-Bench runs them on Vicuna-7B (evaluation/
# inference_medusa.py loads FasterDecoding/medusa-vicuna-7b-v1.3 with
# medusa_num_heads = 4, one residual layer each; Cai et al., arXiv
# 2401.10774: each head a residual block over the last hidden state and its
# own LM head).
MEDUSA_HEADS = 4


def check_drafter(drafter: str) -> None:
    """Raise InputError unless ``drafter`` names a drafter (DRAFTER_FORMS);
    a draft model must be a text-only spec of MODELS."""
    kind, _, name = drafter.partition(":")
    require(kind in DRAFTERS and (kind == DRAFT_MODEL) == bool(name),
            f"drafter must be one of {DRAFTER_FORMS} (got {drafter!r})")
    if kind == DRAFT_MODEL:
        spec = MODELS_BY_KEY.get(name.lower())
        require(spec is not None, f"drafter {drafter!r}: the draft model must be one of {', '.join(MODELS)}")
        require(not spec.multimodal, f"drafter {drafter!r}: the draft model must be a text-only model")


_GB = 1e9
_CLIP_L_336 = dict(vision_layers=24, vision_hidden=1024, vision_mlp_hidden=4096)
_QWEN2_VIT = dict(vision_layers=32, vision_hidden=1280, vision_mlp_hidden=5120)
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
        # Dynamic resolution; 1024 visual tokens (a 896x896 image after 2x2 merge).
        ModelSpec(name="Qwen2-VL-7B", **_QWEN2_7B, max_context_tokens=32768,
                  visual_tokens_per_image=1024, vision_patches_per_image=4096, **_QWEN2_VIT, image_rule="qwen2_vl"),
        ModelSpec(name="Qwen2.5-VL-7B", **_QWEN2_7B, max_context_tokens=32768,
                  visual_tokens_per_image=1024, vision_patches_per_image=4096, **_QWEN2_VIT, image_rule="qwen2_vl"),
        ModelSpec(name="Qwen2.5-VL-3B", layers=36, hidden=2048, heads=16, kv_heads=2,
                  mlp_hidden=11008, vocab=151936, max_context_tokens=32768,
                  visual_tokens_per_image=1024, vision_patches_per_image=4096, **_QWEN2_VIT, image_rule="qwen2_vl"),
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
        ModelSpec(name="Qwen2.5-VL-72B", **_QWEN25_72B, max_context_tokens=128000, visual_tokens_per_image=1024,
                  vision_patches_per_image=4096, vision_layers=32, vision_hidden=1280, vision_mlp_hidden=3456,
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
        ModelSpec(name="Qwen2.5-VL-32B", layers=64, hidden=5120, heads=40, kv_heads=8, mlp_hidden=27648,
                  vocab=152064, max_context_tokens=128000, visual_tokens_per_image=1024,
                  vision_patches_per_image=4096, vision_layers=32, vision_hidden=1280, vision_mlp_hidden=3456,
                  image_rule="qwen2_vl"),
        ModelSpec(name="InternVL3-8B", **{**_QWEN2_7B, "vocab": 151674}, max_context_tokens=32768,
                  visual_tokens_per_image=1280, vision_patches_per_image=5 * 1025, **_INTERNVIT_300M,
                  image_rule="internvl", image_tiling=_INTERNVL_TILES),
        ModelSpec(name="InternVL3-78B", **{**_QWEN25_72B, "vocab": 151674}, max_context_tokens=32768,
                  visual_tokens_per_image=1280, vision_patches_per_image=5 * 1025, **_INTERNVIT_6B,
                  image_rule="internvl", image_tiling=_INTERNVL_TILES),
        ModelSpec(name="LLaVA-OneVision-7B", **_QWEN2_7B, max_context_tokens=32768,
                  visual_tokens_per_image=7371, vision_patches_per_image=10 * 729, **_SIGLIP_SO400M,
                  image_rule="llava_onevision", image_tiling=_ONEVISION_TILES),
        ModelSpec(name="LLaVA-OneVision-72B", **_QWEN25_72B, max_context_tokens=32768,
                  visual_tokens_per_image=7371, vision_patches_per_image=10 * 729, **_SIGLIP_SO400M,
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
        # token, and a shared expert of 8192; bf16. Its vision tower (34 layers, 1408 wide, MLP 5632) turns one
        # 336-pixel tile of 14-pixel patches (576, plus a class token through the encoder) into 144 tokens
        # through a 0.5 pixel shuffle; one tile an image here (its processor tiles larger images). 108.6B
        # parameters, 17.2B active, against the model card's 109B and 17B.
        ModelSpec(name="Llama-4-Scout-17B-16E", layers=48, hidden=5120, heads=40, kv_heads=8, mlp_hidden=16384,
                  vocab=202048, max_context_tokens=10485760, visual_tokens_per_image=144,
                  vision_patches_per_image=577, vision_layers=34, vision_hidden=1408, vision_mlp_hidden=5632,
                  experts=16, experts_per_token=1, expert_mlp_hidden=8192, shared_mlp_hidden=8192),
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

# SMs: H100 SXM5 and H200 132 (16,896 CUDA cores), A100 108 (6,912), L40S 142 (18,176), A40 84 (10,752);
# NVIDIA's H100 and A100 architecture whitepapers and the L40S and A40 datasheets. Links: NVLink 900 GB/s
# per GPU on H100 SXM and H200 (the H100 and H200 datasheets; 450 GB/s each way), 600 GB/s on A100 SXM
# (the A100 datasheet; 300 each way); L40S and A40 talk over PCIe Gen4 x16, 64 GB/s bidirectional on their
# datasheets (32 each way; A40's NVLink bridge joins pairs only). Dense FP8 tensor throughput: H100 SXM and
# H200 1,979 TFLOPS (3,958 with sparsity on their datasheets), L40S 733 (1,466 with sparsity); A100 and A40
# have none. B200 (HGX B200, 1,000 W): 1.44 TB HBM3e for 8 GPUs (180 GB each; nvidia-smi shows 179 GB,
# docs.vultr.com/inference-cookbook/cuda/getting-started/hardware-overview), 8 TB/s, dense BF16 2.25 and
# FP8 4.5 PFLOPS (4.5 and 9 with sparsity; NVIDIA's HGX B200 figures as tabulated at
# glennklockwood.com/garden/processors/B200), NVLink 5 at 1.8 TB/s per GPU (900 GB/s each way), 148 SMs
# (74 enabled on each of its two dies: Chips and Cheese, "Nvidia's B200: Keeping the CUDA Juggernaut Rolling").
GPUS: dict[str, GpuSpec] = {
    spec.slug: spec
    for spec in (
        GpuSpec(name="NVIDIA H100 80GB HBM3 (SXM)", slug="h100-sxm", memory_bytes=80 * _GB,
                hbm_bytes_per_s=3.35e12, bf16_flops=989e12, sms=132, link_bytes_per_s=450e9, fp8_flops=1979e12),
        GpuSpec(name="NVIDIA H200 141GB HBM3e", slug="h200", memory_bytes=141 * _GB,
                hbm_bytes_per_s=4.8e12, bf16_flops=989e12, sms=132, link_bytes_per_s=450e9, fp8_flops=1979e12),
        GpuSpec(name="NVIDIA A100 80GB (SXM)", slug="a100-80gb", memory_bytes=80 * _GB,
                hbm_bytes_per_s=2.039e12, bf16_flops=312e12, sms=108, link_bytes_per_s=300e9),
        GpuSpec(name="NVIDIA L40S 48GB", slug="l40s", memory_bytes=48 * _GB,
                hbm_bytes_per_s=0.864e12, bf16_flops=362e12, sms=142, link_bytes_per_s=32e9, fp8_flops=733e12),
        # NVIDIA A40 product brief (PB-09976-001_v04, January 2021) and datasheet: 48 GB GDDR6 with ECC,
        # 696 GB/s; BF16 / FP16 tensor 149.7 TFLOPS dense (299.4 with sparsity), as tabulated at
        # https://hmc-tech.com/gpu/nvidia-a100-vs-nvidia-a40 (84 SMs, 6 MB L2). Vidur's A40 profiles.
        GpuSpec(name="NVIDIA A40", slug="a40", memory_bytes=48 * _GB,
                hbm_bytes_per_s=0.696e12, bf16_flops=149.7e12, sms=84, link_bytes_per_s=32e9),
        GpuSpec(name="NVIDIA B200 180GB HBM3e (HGX)", slug="b200", memory_bytes=180 * _GB,
                hbm_bytes_per_s=8.0e12, bf16_flops=2250e12, sms=148, link_bytes_per_s=900e9, fp8_flops=4500e12),
    )
}


MODELS_BY_KEY = {name.lower(): spec for name, spec in MODELS.items()}


def _lookup(table: dict, key: str, field: str):
    folded = {k.lower(): v for k, v in table.items()}
    if key.lower() not in folded:
        raise InputError(f"{field} must be one of {', '.join(table)} (got {key!r})")
    return folded[key.lower()]


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
        changes["drafter"] = drafter
    if tp != spec.tensor_parallel:
        changes["tensor_parallel"] = tp
    return replace(spec, **changes) if changes else spec


def gpu_spec(slug: str) -> GpuSpec:
    return _lookup(GPUS, slug, "device")
