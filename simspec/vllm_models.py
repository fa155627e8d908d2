"""Local Hugging Face-format Llama models that vLLM can serve (issue 20).

Imports: the standard library, numpy and simspec.types / simspec.files. No
transformers, tokenizers, safetensors or torch: every file is written by
hand, deterministically from a seed, with no downloads.

``build(folder, config)`` writes three model folders, each a complete
checkpoint (``config.json``, ``generation_config.json``, ``model.safetensors``,
``tokenizer.json``, ``tokenizer_config.json``):

- ``target``: the model served;
- ``draft_same``: the target's own weights, a draft every token of which the
  target accepts (an oracle for vLLM's draft-model speculation);
- ``draft_1layer``: the target's embedding, first layer, final norm and LM
  head alone, a draft the target rarely agrees with;

plus ``simspec-models.json``, what was built (size, seed, parameter counts).

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
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import numpy as np

from simspec.files import dump_json, staged_folder, write_atomic, write_text
from simspec.types import InputError, require

SPECIAL_TOKENS = ("<unk>", "<s>", "</s>")
"""Ids 0, 1, 2: unknown, beginning and end of sequence."""
UNK_ID, BOS_ID, EOS_ID = 0, 1, 2

MODELS = ("target", "draft_same", "draft_1layer")
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
                          max_positions=self.max_positions)


SIZES = {
    # Engine time dominates the frontend's on a 2-core CPU (issue 20: ~27 ms decode steps): ~120M parameters.
    "120m": LlamaShape(layers=12, hidden=768, heads=12, kv_heads=12, intermediate=3072, vocab_tokens=4096),
    # For tests and quick checks: ~1.6M parameters, mostly embedding and LM head.
    "tiny": LlamaShape(layers=2, hidden=128, heads=4, kv_heads=4, intermediate=512, vocab_tokens=4096),
}


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmModelsConfig:
    """What ``simspec vllm-models`` builds."""

    size: str = "120m"
    seed: int = 0

    def __post_init__(self) -> None:
        require(self.size in SIZES, f"size must be one of {', '.join(SIZES)} (got {self.size!r})")
        require(isinstance(self.seed, int) and self.seed >= 0, f"seed must be an integer >= 0 (got {self.seed})")


@dataclass(frozen=True, slots=True, kw_only=True)
class TensorSpec:
    """One weight: its checkpoint name, shape and how it is initialised."""

    name: str
    shape: tuple[int, ...]
    ones: bool = False  # an RMSNorm weight (all 1); else normal(0, 0.02)


INIT_STD = 0.02


def tensors(shape: LlamaShape) -> list[TensorSpec]:
    """The weights of ``LlamaForCausalLM`` with untied embeddings, in file order."""
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
    out += [TensorSpec(name="model.norm.weight", shape=(h,), ones=True),
            TensorSpec(name="lm_head.weight", shape=(shape.vocab_tokens, h))]
    return out


def parameters(shape: LlamaShape) -> int:
    return sum(int(np.prod(t.shape)) for t in tensors(shape))


def weight(spec: TensorSpec, seed: int) -> np.ndarray:
    """The float32 values of one tensor: the same for a name and seed in every model."""
    if spec.ones:
        return np.ones(spec.shape, np.float32)
    rng = np.random.default_rng([seed, zlib.crc32(spec.name.encode())])
    return rng.standard_normal(spec.shape, dtype=np.float32) * np.float32(INIT_STD)


def bf16_bytes(x: np.ndarray) -> bytes:
    """float32 -> bfloat16, rounded to nearest even, as little-endian bytes."""
    bits = np.ascontiguousarray(x, dtype="<f4").view("<u4")
    rounded = (bits + np.uint32(0x7FFF) + ((bits >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
    return rounded.astype("<u2").tobytes()


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


def write_safetensors(path: Path, specs: list[TensorSpec], seed: int) -> None:
    def write(f: BinaryIO) -> None:
        f.write(safetensors_header(specs))
        f.writelines(bf16_bytes(weight(t, seed)) for t in specs)

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
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
        "attention_bias": False,
        "attention_dropout": 0.0,
        "mlp_bias": False,
        "initializer_range": INIT_STD,
        "tie_word_embeddings": False,
        "bos_token_id": BOS_ID,
        "eos_token_id": EOS_ID,
        "pad_token_id": None,
        "dtype": "bfloat16",
        "torch_dtype": "bfloat16",
        "use_cache": True,
    }


def generation_config() -> dict:
    return {"bos_token_id": BOS_ID, "eos_token_id": EOS_ID}


def write_model(folder: Path, shape: LlamaShape, seed: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / "config.json", dump_json(model_config(shape)))
    write_text(folder / "generation_config.json", dump_json(generation_config()))
    write_text(folder / "tokenizer.json", dump_json(tokenizer_json(shape.vocab_tokens), indent=None))
    write_text(folder / "tokenizer_config.json", dump_json(tokenizer_config(shape)))
    write_safetensors(folder / "model.safetensors", tensors(shape), seed)


def shapes(config: VllmModelsConfig) -> dict[str, LlamaShape]:
    """Each model folder's shape."""
    target = SIZES[config.size]
    return {"target": target, "draft_same": target, "draft_1layer": target.with_layers(1)}


def check_folder(folder: Path) -> None:
    """Refuse a folder ``build`` must not replace: a file, or a non-empty folder it did not make."""
    if not folder.exists():
        return
    require(folder.is_dir(), f"{folder} is a file (give a folder for the models)")
    if any(folder.iterdir()) and not (folder / MANIFEST).is_file():
        raise InputError(f"{folder} is not empty and holds no {MANIFEST} (give a new or empty folder, "
                         f"or one `simspec vllm-models` wrote)")


def build(folder: str | os.PathLike, config: VllmModelsConfig) -> dict[str, int]:
    """Write the models into ``folder`` (built beside it, then put in place:
    an error leaves the folder as it was). Returns parameters per model."""
    folder = Path(folder)
    check_folder(folder)
    sizes = shapes(config)
    counts = {name: parameters(shape) for name, shape in sizes.items()}
    with staged_folder(folder) as tmp:
        write_model(tmp / "target", sizes["target"], config.seed)
        shutil.copytree(tmp / "target", tmp / "draft_same")  # the same bytes: the oracle draft
        write_model(tmp / "draft_1layer", sizes["draft_1layer"], config.seed)
        write_text(tmp / MANIFEST, dump_json({
            "builder": "simspec vllm-models",
            "size": config.size,
            "seed": config.seed,
            "models": {name: {"parameters": counts[name], "layers": sizes[name].layers,
                              "hidden": sizes[name].hidden} for name in MODELS},
        }, sort_keys=False))
    return counts
