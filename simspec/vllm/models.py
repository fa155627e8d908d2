"""Local Hugging Face-format Llama models that vLLM can serve.

Imports: the standard library, numpy and simspec.types / simspec.files; torch
only through ``simspec.vllm.distill``, imported inside :func:`distill_draft`.
No transformers, tokenizers or safetensors: every file is written by hand,
deterministically from a seed, with no downloads.

``build(folder, config)`` writes five model folders (four with
``--no-distilled``), each a complete
checkpoint (``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``):

- ``target``: the model served;
- ``draft_same``: the target's own weights, a draft every token of which the
  target accepts (an oracle for vLLM's draft-model speculation);
- ``draft_1layer``: the target's embedding, first layer, final norm and LM
  head alone, a draft the target rarely agrees with;
- ``draft_distilled``: a small Llama with a tied head (:data:`DISTILL`),
  trained on the target's greedy continuations of prompts like
  ``vllm bench serve --dataset-name random``'s (``simspec.vllm.distill``,
  torch, imported only here), from a start that predicts its current token
  again (:func:`copying_draft`); a partially accepted draft;
- ``eagle``: an EAGLE-1 head for the target in the layout vLLM's
  ``EagleLlamaForCausalLM`` loads (:func:`eagle_tensors`), untrained, whose
  weights make it predict its current token again (:func:`copying_eagle`):
  partially accepted, as the distilled draft, by vLLM's
  ``{"method": "eagle"}`` speculation;

plus ``simspec-models.json``, what was built (size, seed, parameter counts,
and for the distilled draft what training saw and the held-out agreement of
it, of its untrained start and of ``draft_1layer``, with the wall times:
the one part that differs between two builds).

Weights are random (normal, std 0.02 as Hugging Face's Llama initialises
them; norms 1) and drawn per tensor name from ``(seed, crc32(name))``, so a
tensor is the same in every model that has it. The tokenizer is a word-level
vocabulary of made-up words split on whitespace: decoding joins the words
with one space and encoding splits them again, so ``decode`` then ``encode``
gives the ids back, which ``vllm bench serve --dataset-name random`` needs.

File formats, as read by their readers:
- safetensors (https://github.com/huggingface/safetensors, README "Format"):
  an 8-byte little-endian header length N, N bytes of JSON mapping each
  tensor name to ``{"dtype", "shape", "data_offsets": [begin, end]}``
  (offsets into the data after the header) plus ``"__metadata__"``, then the
  raw little-endian tensor bytes. The header is padded with spaces to a
  multiple of 8 bytes.
- tokenizer.json: the serialisation of Hugging Face ``tokenizers``
  (https://huggingface.co/docs/tokenizers/api/models#tokenizers.models.WordLevel):
  a ``WordLevel`` model, a ``WhitespaceSplit`` pre-tokenizer and a
  ``WordPiece`` decoder without clean-up, whose decode of words that do not
  start with its ``##`` prefix is the words joined by single spaces.
- bf16 is float32's upper 16 bits; :func:`bf16_bytes` rounds to nearest even.
"""

from __future__ import annotations

import json
import os
import shutil
import zlib
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from simspec.files import dump_json, staged_folder, write_atomic, write_text
from simspec.types import InputError, require

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
"""Ids 0, 1, 2: unknown, beginning and end of sequence."""
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

MODELS = ("target", "draft_same", "draft_1layer", "draft_distilled", "eagle")
"""The model folders ``build`` writes, in order."""

MANIFEST = "simspec-models.json"
"""What ``build`` made; its presence marks a folder ``build`` may replace."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaShape:
    """The sizes of a Llama decoder (Hugging Face ``LlamaConfig`` fields)."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    intermediate: int
    vocab_tokens: int
    max_positions: int = 2048
    tied: bool = False  # tie_word_embeddings: the LM head is the embedding (no lm_head.weight)

    def __post_init__(self) -> None:
        for name in ("layers", "hidden", "heads", "kv_heads", "intermediate", "vocab_tokens", "max_positions"):
            require(getattr(self, name) >= 1, f"LlamaShape.{name} must be >= 1 (got {getattr(self, name)})")
        require(self.hidden % self.heads == 0,
                f"LlamaShape.hidden ({self.hidden}) must be a multiple of heads ({self.heads})")
        require(self.heads % self.kv_heads == 0,
                f"LlamaShape.heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        require(self.vocab_tokens > len(SPECIAL_TOKENS),
                f"LlamaShape.vocab_tokens must be > {len(SPECIAL_TOKENS)} (got {self.vocab_tokens})")

    @property
    def head_dim(self) -> int:
        return self.hidden // self.heads

    def with_layers(self, layers: int) -> LlamaShape:
        return LlamaShape(layers=layers, hidden=self.hidden, heads=self.heads, kv_heads=self.kv_heads,
                          intermediate=self.intermediate, vocab_tokens=self.vocab_tokens,
                          max_positions=self.max_positions, tied=self.tied)


SIZES = {
    # Engine time dominates the frontend's on a 2-core CPU (~27 ms decode steps, validation/vllm-cpu): ~120M parameters.
    "120m": LlamaShape(layers=12, hidden=768, heads=12, kv_heads=12, intermediate=3072, vocab_tokens=4096),
    # For tests and quick checks: ~1.6M parameters, mostly embedding and LM head.
    "tiny": LlamaShape(layers=2, hidden=128, heads=4, kv_heads=4, intermediate=512, vocab_tokens=4096),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class DistillSize:
    """The distilled draft of one size and how much the target generates for it."""

    draft: LlamaShape
    train_sequences: int  # prompts the target continues for training
    heldout_sequences: int  # more, for the agreement recorded
    steps: int  # optimizer steps (``--distill-steps``)
    batch_sequences: int
    prompt_tokens: int = 64  # as `vllm bench serve --random-input-len 64 --random-output-len 64`
    continuation_tokens: int = 64


DISTILL = {
    # ~2 min on one core here: the target's continuations dominate (~1 s a sequence), then 100 steps.
    "120m": DistillSize(draft=LlamaShape(layers=2, hidden=256, heads=4, kv_heads=4, intermediate=768,
                                         vocab_tokens=4096, tied=True),
                        train_sequences=48, heldout_sequences=16, steps=100, batch_sequences=8),
    "tiny": DistillSize(draft=LlamaShape(layers=1, hidden=64, heads=2, kv_heads=2, intermediate=256,
                                         vocab_tokens=4096, tied=True),
                        train_sequences=24, heldout_sequences=8, steps=20, batch_sequences=4),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmModelsConfig:
    """What ``simspec vllm-models`` builds."""

    size: str = "120m"
    seed: int = 0
    distilled: bool = True  # build draft_distilled (needs torch)
    distill_steps: int | None = None  # None: the size's DISTILL steps

    def __post_init__(self) -> None:
        require(self.size in SIZES, f"size must be one of {', '.join(SIZES)} (got {self.size!r})")
        require(isinstance(self.seed, int) and self.seed >= 0, f"seed must be an integer >= 0 (got {self.seed})")
        require(self.distill_steps is None or self.distill_steps >= 1,
                f"distill_steps must be >= 1 (got {self.distill_steps})")

    @property
    def models(self) -> tuple[str, ...]:
        return tuple(m for m in MODELS if self.distilled or m != "draft_distilled")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """One weight: its checkpoint name, shape and how it is initialised."""

    name: str
    shape: tuple[int, ...]
    ones: bool = False  # an RMSNorm weight (all 1); else normal(0, 0.02)


INIT_STD = 0.02
RMS_NORM_EPS = 1e-5
ROPE_THETA = 10000.0


def tensors(shape: LlamaShape) -> list[TensorSpec]:
    """The weights of ``LlamaForCausalLM``, in file order (no ``lm_head`` when tied)."""
    h, kv = shape.hidden, shape.kv_heads * shape.head_dim
    out = [TensorSpec(name="model.embed_tokens.weight", shape=(shape.vocab_tokens, h))]
    for i in range(shape.layers):
        p = f"model.layers.{i}."
        out += [
            TensorSpec(name=p + "input_layernorm.weight", shape=(h,), ones=True),
            TensorSpec(name=p + "self_attn.q_proj.weight", shape=(h, h)),  # [out, in], as torch.nn.Linear
            TensorSpec(name=p + "self_attn.k_proj.weight", shape=(kv, h)),
            TensorSpec(name=p + "self_attn.v_proj.weight", shape=(kv, h)),
            TensorSpec(name=p + "self_attn.o_proj.weight", shape=(h, h)),
            TensorSpec(name=p + "post_attention_layernorm.weight", shape=(h,), ones=True),
            TensorSpec(name=p + "mlp.gate_proj.weight", shape=(shape.intermediate, h)),
            TensorSpec(name=p + "mlp.up_proj.weight", shape=(shape.intermediate, h)),
            TensorSpec(name=p + "mlp.down_proj.weight", shape=(h, shape.intermediate)),
        ]
    out.append(TensorSpec(name="model.norm.weight", shape=(h,), ones=True))
    if not shape.tied:
        out.append(TensorSpec(name="lm_head.weight", shape=(shape.vocab_tokens, h)))
    return out


def parameters(shape: LlamaShape) -> int:
    return sum(int(np.prod(t.shape)) for t in tensors(shape))


def weight(spec: TensorSpec, seed: int, stream: str = "") -> np.ndarray:
    """The float32 values of one tensor: the same for a name, seed and stream in every model."""
    if spec.ones:
        return np.ones(spec.shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32((stream + spec.name).encode())])
    return rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(INIT_STD)


def bf16_bits(x: np.ndarray) -> np.ndarray:
    """float32 -> bfloat16 bit patterns (uint16), rounded to nearest even."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    return ((bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)).astype("<u2")


def bf16_bytes(x: np.ndarray) -> bytes:
    """float32 -> bfloat16, rounded to nearest even, as little-endian bytes."""
    return bf16_bits(x).tobytes()


def bf16_rounded(x: np.ndarray) -> np.ndarray:
    """The float32 values a bf16 checkpoint holds of ``x``."""
    return (bf16_bits(x).astype(np.uint32) << np.uint32(16)).view(np.float32)


def safetensors_header(specs: list[TensorSpec], dtype: str = "BF16", itemsize: int = 2) -> bytes:
    """The length prefix and JSON header of a safetensors file holding ``specs`` in order."""
    entries: dict[str, object] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for t in specs:
        size = int(np.prod(t.shape)) * itemsize
        entries[t.name] = {"dtype": dtype, "shape": list(t.shape), "data_offsets": [offset, offset + size]}
        offset += size
    header = json.dumps(entries, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header


def write_safetensors(path: Path, specs: list[TensorSpec], values) -> None:
    """``values(spec)``: the float32 array of each tensor, written in bf16."""
    def write(f: BinaryIO) -> None:
        f.write(safetensors_header(specs))
        f.writelines(bf16_bytes(values(t)) for t in specs)

    write_atomic(path, write)


def words(count: int) -> list[str]:
    """``count`` distinct made-up words (two or three syllables), the same every time."""
    syllables = [c + v for c in "bdfgklmnprstvz" for v in "aeiou"]  # 70
    out = [a + b for a in syllables for b in syllables]
    out += [a + b + c for a in syllables for b in syllables for c in syllables]
    require(count <= len(out), f"vocab_tokens must be <= {len(out) + len(SPECIAL_TOKENS)} (got {count})")
    return out[:count]


def vocabulary(vocab_tokens: int) -> dict[str, int]:
    names = list(SPECIAL_TOKENS) + words(vocab_tokens - len(SPECIAL_TOKENS))
    return {name: i for i, name in enumerate(names)}


def tokenizer_json(vocab_tokens: int) -> dict:
    """A ``tokenizers`` serialisation: word-level, split on whitespace, decode joins with spaces."""
    special = [{"id": i, "content": name, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": True} for i, name in enumerate(SPECIAL_TOKENS)]
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": special,
        "normalizer": None,
        "pre_tokenizer": {"type": "WhitespaceSplit"},
        "post_processor": None,
        "decoder": {"type": "WordPiece", "prefix": "##", "cleanup": False},
        "model": {"type": "WordLevel", "vocab": vocabulary(vocab_tokens), "unk_token": SPECIAL_TOKENS[UNK_ID]},
    }


CHAT_TEMPLATE = "{% for message in messages %}{{ message['content'] }} {% endfor %}"
"""Messages' contents joined: enough for ``/v1/chat/completions`` to run."""


def tokenizer_config(shape: LlamaShape) -> dict:
    return {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "unk_token": SPECIAL_TOKENS[UNK_ID],
        "bos_token": SPECIAL_TOKENS[BOS_ID],
        "eos_token": SPECIAL_TOKENS[EOS_ID],
        "model_max_length": shape.max_positions,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    }


def model_config(shape: LlamaShape) -> dict:
    """``config.json`` of a Hugging Face ``LlamaForCausalLM``."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": shape.hidden,
        "intermediate_size": shape.intermediate,
        "num_hidden_layers": shape.layers,
        "num_attention_heads": shape.heads,
        "num_key_value_heads": shape.kv_heads,
        "head_dim": shape.head_dim,
        "vocab_size": shape.vocab_tokens,
        "max_position_embeddings": shape.max_positions,
        "hidden_act": "silu",
        "rms_norm_eps": RMS_NORM_EPS,
        "rope_theta": ROPE_THETA,
        "rope_parameters": {"rope_type": "default", "rope_theta": ROPE_THETA},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": shape.tied,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}


def write_model(folder: Path, shape: LlamaShape, values, specs: list[TensorSpec] | None = None) -> None:
    """A checkpoint of ``shape`` whose tensors ``specs`` (default: a Llama's,
    :func:`tensors`) are ``values(spec)`` (float32, written in bf16)."""
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.json", dump_json(model_config(shape)))
    write_text(folder / "generation_config.json", dump_json(generation_config()))
    write_text(folder / "tokenizer.json", dump_json(tokenizer_json(shape.vocab_tokens), indent=None))
    write_text(folder / "tokenizer_config.json", dump_json(tokenizer_config(shape)))
    write_safetensors(folder / "model.safetensors", tensors(shape) if specs is None else specs, values)


def shapes(config: VllmModelsConfig) -> dict[str, LlamaShape]:
    """Each model folder's shape (``config.json``); the EAGLE head's is its one layer's."""
    target = SIZES[config.size]
    out = {"target": target, "draft_same": target, "draft_1layer": target.with_layers(1)}
    if config.distilled:
        out["draft_distilled"] = DISTILL[config.size].draft
    out["eagle"] = target.with_layers(1)
    return out


def model_tensors(name: str, shape: LlamaShape) -> list[TensorSpec]:
    """The checkpoint's tensors of model folder ``name``."""
    return eagle_tensors(shape) if name == "eagle" else tensors(shape)


def distill_prompts(count: int, prompt_tokens: int, vocab_tokens: int, seed: int) -> np.ndarray:
    """Prompts like those `vllm bench serve --dataset-name random` sends: [count, P] token ids,
    none special. Even rows are that dataset's own, a run of consecutive ids from a
    random offset (vllm/benchmarks/datasets/datasets.py, ``generate_token_sequence``);
    odd rows are uniformly random ids."""
    rng = np.random.default_rng([seed, zlib.crc32(b"draft_distilled.prompts")])
    ordinary = vocab_tokens - len(SPECIAL_TOKENS)
    offsets = rng.integers(0, ordinary, count)  # [count]
    runs = (offsets[:, None] + np.arange(prompt_tokens)[None, :]) % ordinary  # [count, P]
    uniform = rng.integers(0, ordinary, (count, prompt_tokens))  # [count, P]
    return len(SPECIAL_TOKENS) + np.where((np.arange(count) % 2 == 0)[:, None], runs, uniform)


UNTRAINED = "draft_distilled_untrained"
"""The distilled draft's starting point (:func:`copying_draft`), measured beside it."""

DRAFT_STREAM = "draft_distilled/"
"""The random stream of the distilled draft's initial weights (not the target's)."""


def copying_draft(shape: LlamaShape, seed: int) -> dict[str, np.ndarray]:
    """The distilled draft before training: random weights whose attention and
    MLP outputs (``o_proj``, ``down_proj``) are zero, so the residual stream is the
    token's embedding and, the head being that embedding (tied), the draft starts
    by predicting its current token again: the commonest way a random target
    repeats itself (about half its greedy tokens at 120m)."""
    require(shape.tied, "the copying draft needs tied embeddings (LlamaShape.tied)")
    out = {}
    for spec in tensors(shape):
        zero = spec.name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight"))
        out[spec.name] = np.zeros(spec.shape, np.float32) if zero else weight(spec, seed, DRAFT_STREAM)
    return out


# --- the EAGLE-1 head ---------------------------------------------------------------------------------

EAGLE_STREAM = "eagle/"
"""The random stream of the EAGLE head's weights (not the target's)."""


def eagle_tensors(shape: LlamaShape) -> list[TensorSpec]:
    """An EAGLE-1 head for a target of ``shape``, as vLLM's ``EagleLlamaForCausalLM``
    loads it (vllm/model_executor/models/llama_eagle.py, which prefixes ``model.``
    to every name): ``fc`` on the concatenation [embedding, target hidden state],
    then one decoder layer ``layers.0.`` without ``input_layernorm`` (vLLM replaces
    layer 0's by an identity, as EAGLE does) and no final norm. No
    ``embed_tokens`` or ``lm_head``: vLLM then shares the target's
    (vllm/v1/spec_decode/llm_base_proposer.py, ``_maybe_share_embeddings``,
    ``_maybe_share_lm_head``)."""
    layer = [TensorSpec(name=t.name.removeprefix("model."), shape=t.shape, ones=t.ones)
             for t in tensors(shape.with_layers(1))
             if t.name.startswith("model.layers.0.") and not t.name.endswith("input_layernorm.weight")]
    return [TensorSpec(name="fc.weight", shape=(shape.hidden, 2 * shape.hidden)), *layer]  # [out, in]


EAGLE_RECORD = {
    "speculative_method": "eagle",
    "layout": "EAGLE-1 (vLLM EagleLlamaForCausalLM): fc + 1 decoder layer; the target's embed_tokens and lm_head",
    "weights": "copying: fc = [0 | I] passes the target's hidden state, o_proj and down_proj are zero",
}
"""What the manifest says of the EAGLE head, beside its size."""


def copying_eagle(shape: LlamaShape, seed: int) -> dict[str, np.ndarray]:
    """An EAGLE head that predicts its current token again, untrained.

    vLLM feeds it, at each position, the token the target emitted there and the
    target's last hidden state (after its final norm) that the token was
    sampled from. ``fc`` = [0 | I] passes that hidden state through and the
    layer's output projections (``o_proj``, ``down_proj``) are zero, so the
    head's output is the target's hidden state itself: under the target's LM
    head its argmax is the token just emitted, exactly, under greedy
    decoding. Fed its own output for the next draft position, it proposes the
    same token again. The other weights are random (:data:`EAGLE_STREAM`),
    a start that training could move. The target's embedding, shared, plays
    no part: the target is untied, so the embedding of a token is not what
    the LM head scores it by."""
    h = shape.hidden
    out = {}
    for spec in eagle_tensors(shape):
        if spec.name == "fc.weight":
            out[spec.name] = np.concatenate([np.zeros((h, h), np.float32), np.eye(h, dtype=np.float32)], 1)
        elif spec.name.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight")):
            out[spec.name] = np.zeros(spec.shape, np.float32)
        else:
            out[spec.name] = weight(spec, seed, EAGLE_STREAM)
    return out


def _rms_norm(x: np.ndarray, weight_: np.ndarray) -> np.ndarray:
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + np.float32(RMS_NORM_EPS)) * weight_


def _rope(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """Rotate-half rotary embedding (vLLM's ``is_neox_style``). x: [T, H, D]; positions: [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / ROPE_THETA ** (np.arange(0, d, 2, dtype=np.float32) / d)  # [D/2]
    angles = np.concatenate([positions[:, None] * inv_freq[None, :]] * 2, -1)[:, None, :]  # [T, 1, D]
    rotated = np.concatenate([-x[..., d // 2:], x[..., : d // 2]], -1)  # [T, H, D]
    return (x * np.cos(angles) + rotated * np.sin(angles)).astype(np.float32)


def eagle_forward(weights: dict[str, np.ndarray], shape: LlamaShape, embeds: np.ndarray,
                  hidden: np.ndarray) -> np.ndarray:
    """vLLM's EAGLE-1 head (``llama_eagle.py``, ``LlamaModel.forward``) over one
    sequence's positions 0..T-1, causal, float32: the hidden states whose LM-head
    argmax is each position's draft token.
    embeds: [T, hidden] (the tokens' embeddings); hidden: [T, hidden] (the target's) -> [T, hidden]."""
    t, hd, heads, kv_heads = embeds.shape[0], shape.head_dim, shape.heads, shape.kv_heads
    p = "layers.0."
    x = np.concatenate([embeds, hidden], -1) @ weights["fc.weight"].T  # [T, hidden]
    positions = np.arange(t, dtype=np.float32)  # [T]
    q = _rope((x @ weights[p + "self_attn.q_proj.weight"].T).reshape(t, heads, hd), positions)  # [T, H, D]
    k = _rope((x @ weights[p + "self_attn.k_proj.weight"].T).reshape(t, kv_heads, hd), positions)  # [T, KV, D]
    v = (x @ weights[p + "self_attn.v_proj.weight"].T).reshape(t, kv_heads, hd)  # [T, KV, D]
    k, v = np.repeat(k, heads // kv_heads, 1), np.repeat(v, heads // kv_heads, 1)  # [T, H, D]
    scores = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(hd))  # [H, T, T]
    scores = np.where(np.tril(np.ones((t, t), bool))[None], scores, -np.inf)
    probs = np.exp(scores - scores.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)  # [H, T, T]
    attn = np.einsum("hts,shd->thd", probs, v).reshape(t, heads * hd)  # [T, hidden]
    x = x + attn @ weights[p + "self_attn.o_proj.weight"].T  # vLLM's residual, with layer 0's identity norm
    y = _rms_norm(x, weights[p + "post_attention_layernorm.weight"])
    gate = y @ weights[p + "mlp.gate_proj.weight"].T  # [T, intermediate]
    swiglu = gate / (1 + np.exp(-gate)) * (y @ weights[p + "mlp.up_proj.weight"].T)  # [T, intermediate]
    mlp = swiglu @ weights[p + "mlp.down_proj.weight"].T  # [T, hidden]
    return (x + mlp).astype(np.float32)  # hidden_states + residual; no final norm


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    """A draft's greedy agreement with the target on held-out continuations."""

    top1: float  # P(draft argmax == target's greedy token), continuation positions
    chain: tuple[float, ...]  # [K]: per round, P(first j draft tokens accepted), j = 1..K: vLLM's per-position rates
    acceptance_length: float  # 1 + sum(chain)
    drafts: int  # vLLM's rounds of K-token drafts, replayed


@dataclass(frozen=True, slots=True, kw_only=True)
class Distillation:
    """What training ``draft_distilled`` saw and how well it agrees with the target."""

    steps: int
    batch_sequences: int
    train_sequences: int
    heldout_sequences: int
    prompt_tokens: int
    continuation_tokens: int
    train_tokens: int  # labelled positions the optimizer saw, over all steps
    final_loss: float  # nats, last 10 steps
    heldout: dict[str, HeldOut]  # draft_distilled, draft_1layer and UNTRAINED, on the same held-out sequences
    generate_s: float  # wall time: the target's continuations
    train_s: float  # wall time: training


@dataclass(frozen=True, slots=True, kw_only=True)
class Built:
    parameters: dict[str, int]  # per model folder
    distillation: Distillation | None  # None without draft_distilled


def distill_draft(config: VllmModelsConfig) -> tuple[dict[str, np.ndarray], Distillation]:
    """Train the distilled draft on the target (simspec.vllm.distill, torch): its weights and record."""
    try:
        from simspec.vllm import distill as vllm_distill
    except ImportError as err:
        raise InputError(f"draft_distilled needs torch ({err}): pip install 'simspec[kernels]', "
                         f"or give --no-distilled") from None
    size, target_shape = DISTILL[config.size], SIZES[config.size]
    steps = config.distill_steps or size.steps
    served = {s.name: bf16_rounded(weight(s, config.seed)) for s in tensors(target_shape)}
    one_layer = target_shape.with_layers(1)
    prompts = distill_prompts(size.train_sequences + size.heldout_sequences, size.prompt_tokens,
                              target_shape.vocab_tokens, config.seed)  # [N, P]
    start = copying_draft(size.draft, config.seed)
    done = vllm_distill.distill(
        served, model_config(target_shape), start, model_config(size.draft),
        train_prompts=prompts[:size.train_sequences], heldout_prompts=prompts[size.train_sequences:],
        new_tokens=size.continuation_tokens, seed=config.seed, frozen=("model.embed_tokens.weight",),
        plan=vllm_distill.DistillPlan(steps=steps, batch_sequences=size.batch_sequences),
        baselines={"draft_1layer": ({s.name: served[s.name] for s in tensors(one_layer)}, model_config(one_layer)),
                   UNTRAINED: ({k: bf16_rounded(w) for k, w in start.items()}, model_config(size.draft))})
    agreements = {"draft_distilled": done.agreement, **done.baselines}
    record = Distillation(
        steps=steps, batch_sequences=size.batch_sequences, train_sequences=done.train_sequences,
        heldout_sequences=done.heldout_sequences, prompt_tokens=size.prompt_tokens,
        continuation_tokens=size.continuation_tokens, train_tokens=done.train_tokens,
        final_loss=round(done.final_loss, 4), generate_s=round(done.generate_s, 1), train_s=round(done.train_s, 1),
        heldout={name: HeldOut(top1=round(a.top1, 4), chain=tuple(round(c, 4) for c in a.chain),
                                acceptance_length=round(a.acceptance_length, 4), drafts=a.drafts)
                 for name, a in agreements.items()})
    return done.weights, record


def check_folder(folder: Path) -> None:
    """Refuse a folder ``build`` must not replace: a file, or a non-empty folder it did not make."""
    if not folder.exists():
        return
    require(folder.is_dir(), f"{folder} is a file (give a folder for the models)")
    if any(folder.iterdir()) and not (folder / MANIFEST).is_file():
        raise InputError(f"{folder} is not empty and holds no {MANIFEST} (give a new or empty folder, "
                         f"or one `simspec vllm-models` wrote)")


def build(folder: str | os.PathLike, config: VllmModelsConfig) -> Built:
    """Write the models into ``folder`` (built beside it, then put in place:
    an error leaves the folder as it was)."""
    folder = Path(folder)
    check_folder(folder)
    sizes = shapes(config)
    counts = {name: sum(int(np.prod(t.shape)) for t in model_tensors(name, shape)) for name, shape in sizes.items()}
    distilled, record = distill_draft(config) if config.distilled else (None, None)
    with staged_folder(folder) as tmp:
        write_model(tmp / "target", sizes["target"], lambda t: weight(t, config.seed))
        shutil.copytree(tmp / "target", tmp / "draft_same")  # the same bytes: the oracle draft
        write_model(tmp / "draft_1layer", sizes["draft_1layer"], lambda t: weight(t, config.seed))
        if distilled is not None:
            write_model(tmp / "draft_distilled", sizes["draft_distilled"], lambda t: distilled[t.name])
        eagle = copying_eagle(sizes["eagle"], config.seed)
        write_model(tmp / "eagle", sizes["eagle"], lambda t: eagle[t.name], eagle_tensors(sizes["eagle"]))
        models = {name: {"parameters": counts[name], "layers": sizes[name].layers, "hidden": sizes[name].hidden,
                         "tied": sizes[name].tied} for name in config.models}
        models["eagle"].update(EAGLE_RECORD)
        manifest = {"builder": "simspec vllm-models", "size": config.size, "seed": config.seed, "models": models}
        if record is not None:
            manifest["distillation"] = asdict(record)
        write_text(tmp / MANIFEST, dump_json(manifest, sort_keys=False))
    return Built(parameters=counts, distillation=record)
