"""A model's shape and what it weighs, computes and caches per GPU.

Imports: the standard library, simspec.types, simspec.costs.images. The
numbers are public architecture configs (Hugging Face ``config.json`` of
each model; the catalog of them is simspec.costs.catalog); per-layer
costs are scaled to whole models from these shapes.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simspec.costs.images import DEFAULT_IMAGE_PX, IMAGE_RULES, ImageTiling
from simspec.types import MAX_IMAGE_SIDE, require


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
    # What drafts (DRAFTERS, simspec.costs.catalog.check_drafter): "eagle1" (EAGLE-1/2: fc
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
    # Chunked attention (Llama 4): ``chunked_layers`` of the layers attend
    # only within their query's chunk of ``attention_chunk`` tokens
    # (positions [c x chunk, (c + 1) x chunk)), the rest to the whole
    # context; 0 and 0: every layer attends to the whole context. Priced in
    # the attention a step reads and computes (simspec.costs.base.
    # LocalAttention); the KV cache holds every layer's whole context, as
    # vLLM and SGLang do by default (docs/models.md).
    attention_chunk: int = 0
    chunked_layers: int = 0
    # The separate draft model of a ``draft-model:NAME`` drafter (the
    # catalog's spec of NAME: simspec.costs.catalog.deployed sets it); None
    # for every other drafter.
    draft_spec: "ModelSpec | None" = None

    def __post_init__(self):
        check_drafter_form(self.drafter)
        require((self.drafter_kind == DRAFT_MODEL) == (self.draft_spec is not None),
                f"model {self.name}: a draft-model drafter needs its draft model's spec, and only it has one")
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
        require((self.attention_chunk > 0) == (self.chunked_layers > 0) and 0 <= self.chunked_layers <= self.layers,
                f"model {self.name}: chunked attention needs attention_chunk > 0 and 1..{self.layers} chunked layers, "
                f"or neither (got {self.attention_chunk}, {self.chunked_layers})")
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
        return self.draft_spec

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
        tokens, patches = rule(self.image_tiling, width, height)
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
    def rope_table_bytes(self) -> int:
        """The rotary embedding's cos/sin table every GPU keeps beside the
        weights: one row of the rotary width (``qk_rope_head_dim`` for latent
        attention, else the head) for each of the model's positions, at
        dtype_bytes (vLLM's rotary_embedding/base.py registers it as a buffer
        at load, over max_position_embeddings; layers share it). Llama 4
        Scout's 10,485,760 positions make it 2.5 GiB a GPU; 32 MiB for a
        131,072-token Llama 3.1. All of the head is taken as rotary."""
        width = self.qk_rope_head_dim if self.qk_rope_head_dim else self.head_dim
        return self.max_context_tokens * width * self.dtype_bytes

    @property
    def weight_bytes(self) -> int:
        """One GPU's weights in memory: the decoder at weight_bytes_per_param,
        embeddings, LM head and vision tower at dtype_bytes, the drafter's own,
        and the rotary table loaded with them (:attr:`rope_table_bytes`)."""
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
                + self.drafter_whole.drafter_weight_params * draft_bytes + self.rope_table_bytes)

    @property
    def drafter_kv_bytes_per_token(self) -> int:
        """One GPU's KV cache bytes per token of the drafter's own attention
        layers, at the drafter's degree: an EAGLE head's one layer and an MTP
        module's mtp_layers are layers of the target's shape; a draft model
        keeps its own cache (its layers, its KV heads, at least one a GPU);
        prompt lookup and Medusa's heads keep none."""
        whole = self.drafter_whole
        kind = self.drafter_kind
        if kind in EAGLE_KINDS:
            return whole.kv_bytes_per_token // whole.layers
        if kind == MTP:
            return self.mtp_layers * (whole.kv_bytes_per_token // whole.layers)
        if kind == DRAFT_MODEL:
            draft = self.draft_model
            heads = max(1, draft.kv_heads // whole.tensor_parallel)
            return 2 * draft.layers * heads * draft.head_dim * draft.dtype_bytes
        return 0

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


def check_drafter_form(drafter: str) -> None:
    """Raise InputError unless ``drafter`` has one of DRAFTER_FORMS
    (simspec.costs.catalog.check_drafter also checks a draft model's name)."""
    kind, _, name = drafter.partition(":")
    require(kind in DRAFTERS and (kind == DRAFT_MODEL) == bool(name),
            f"drafter must be one of {DRAFTER_FORMS} (got {drafter!r})")


def at_default_image(**fields) -> ModelSpec:
    """A dynamic-resolution or tiling VLM (``image_rule``, its
    ``image_tiling``) whose visual tokens and encoder tokens are its own
    rule's for a DEFAULT_IMAGE_PX square image: the counts a run without
    --image-size serves."""
    tokens, patches = IMAGE_RULES[fields["image_rule"]](fields.get("image_tiling"), DEFAULT_IMAGE_PX,
                                                         DEFAULT_IMAGE_PX)
    return ModelSpec(**fields, visual_tokens_per_image=tokens, vision_patches_per_image=patches)
