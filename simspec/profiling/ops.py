"""The operators of a profile as torch code at a model spec's real shapes.

Imports: torch, simspec_kernels, simspec.costs, simspec.profiling.grid. Weights
are random (timing does not depend on their values) and built once per
operator; inputs are built per shape point, outside the timed call.

Each operator is a ``Case``: ``setup(bench)`` builds its weights and returns
``make(*point)``, which allocates one point's inputs and returns the timed
closure; ``nbytes(model, elem_bytes, *point)`` bounds the tensors the point
allocates, for the CPU size guard. Conventions the cost-model fit must know
(also written to meta.json ``notes``):

- per-layer pieces time one layer of the target at ``tokens`` rows.
- ``drafter_step``: ``tokens`` requests with one draft position each, each
  cross-attending to ``kept_tokens`` visual tokens; the drafter's decoder
  layer attends only to the step's own position (its cached-context
  attention is priced like one layer of ``attn_decode``).
- ``vision_encoder``: the ViT blocks and the projector (the patch embedding
  is a small convolution, left out); a CLIP tile of LLaVA-1.6 AnyRes is one
  sequence, a Qwen2-VL image one sequence whose 2x2 patches the projector
  merges.
- ``select`` / ``int8_quantize``: keys per KV head; the saved query is one
  per KV head (averaged within a GQA group).

Shape letters: B batch, T tokens, Q query tokens, L context, N visual
tokens, K kept tokens, H heads, D head dim, C hidden, M MLP hidden, V vocab.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch.nn.attention.bias import causal_lower_right

from simspec.costs import ModelSpec
from simspec_kernels.cross_attention import gated_cross_attention
from simspec_kernels.int8_cache import quantize_keys
from simspec_kernels.selection import select_visual_tokens
from simspec_kernels.tree_attention import tree_attention as tree_attention_kernel
from simspec.profiling.grid import SELECT_KEPT_TOKENS, SELECT_LAYERS

ROPE_POSITIONS = 1 << 15  # rotary table length (positions of the largest profiled context)
VISION_HEAD_DIM = 64
VISION_HEADS = 16  # CLIP ViT-L and Qwen2-VL's ViT both use 16 heads
KERNEL_OPS = ("select", "int8_quantize", "drafter_step", "attn_tree_verify")
"""Operators timed through simspec_kernels, with ``impl="auto"`` (Triton on a GPU, the kernels' own
plain-PyTorch references on a CPU)."""

Timed = Callable[[], object]


@dataclass(frozen=True, slots=True, kw_only=True)
class Bench:
    """Where and at which precision operators are built."""

    model: ModelSpec
    device: torch.device
    dtype: torch.dtype

    def rand(self, *shape: int) -> torch.Tensor:
        return torch.empty(shape, device=self.device, dtype=self.dtype).uniform_(-1.0, 1.0)

    def weight(self, *shape: int) -> torch.Tensor:
        """Linear weight [out, in] (or a norm's [C]) keeping activations near unit scale."""
        bound = 1.0 / math.sqrt(shape[-1]) if len(shape) > 1 else 1.0
        return torch.empty(shape, device=self.device, dtype=self.dtype).uniform_(-bound, bound)


@dataclass(frozen=True, slots=True)
class Case:
    setup: Callable[[Bench], Callable[..., Timed]]
    nbytes: Callable[..., int]  # (model, elem_bytes, *point) -> bytes the point allocates


def rms_norm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.shape[-1],), w, eps=1e-6)


def rope_table(b: Bench) -> tuple[torch.Tensor, torch.Tensor]:
    """cos, sin [ROPE_POSITIONS, D/2]."""
    D = b.model.head_dim
    freq = 10000.0 ** (-torch.arange(0, D, 2, device=b.device, dtype=torch.float32) / D)  # [D/2]
    angle = torch.arange(ROPE_POSITIONS, device=b.device, dtype=torch.float32)[:, None] * freq  # [P, D/2]
    return angle.cos().to(b.dtype), angle.sin().to(b.dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
               positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D], k [T, Hkv, D] rotated by their positions [T] (rotate-half form)."""
    c, s = cos[positions][:, None, :], sin[positions][:, None, :]  # [T, 1, D/2]

    def rotate(x):
        x1, x2 = x.chunk(2, dim=-1)
        return torch.cat((x1 * c - x2 * s, x2 * c + x1 * s), dim=-1)

    return rotate(q), rotate(k)


# --- the target's decoder layer, piece by piece --------------------------------------------

def _norm(b: Bench):
    w = b.weight(b.model.hidden)

    def make(tokens):
        x = b.rand(tokens, b.model.hidden)  # [T, C]
        return lambda: rms_norm(x, w)
    return make


def _linear(in_features: Callable[[ModelSpec], int], out_features: Callable[[ModelSpec], int]):
    def setup(b: Bench):
        w = b.weight(out_features(b.model), in_features(b.model))

        def make(tokens):
            x = b.rand(tokens, in_features(b.model))  # [T, in]
            return lambda: F.linear(x, w)
        return make
    return setup


def _linear_bytes(in_features, out_features):
    return lambda m, e, tokens: e * (in_features(m) * out_features(m) + tokens * (in_features(m) + out_features(m)))


def _qkv(m: ModelSpec) -> int:
    return (m.heads + 2 * m.kv_heads) * m.head_dim


def _rope(b: Bench):
    m = b.model
    cos, sin = rope_table(b)

    def make(tokens):
        q, k = b.rand(tokens, m.heads, m.head_dim), b.rand(tokens, m.kv_heads, m.head_dim)
        positions = torch.arange(tokens, device=b.device)
        return lambda: apply_rope(q, k, cos, sin, positions)
    return make


def _act(b: Bench):
    M = b.model.mlp_hidden

    def make(tokens):
        x = b.rand(tokens, 2 * M)  # [T, 2M] gate | up
        return lambda: F.silu(x[:, :M]) * x[:, M:]
    return make


def _add(b: Bench):
    def make(tokens):
        x, residual = b.rand(tokens, b.model.hidden), b.rand(tokens, b.model.hidden)
        return lambda: x + residual
    return make


def _lm_head(b: Bench):
    m = b.model
    norm, head = b.weight(m.hidden), b.weight(m.vocab, m.hidden)

    def make(tokens):
        x = b.rand(tokens, m.hidden)  # [T, C] last hidden states
        return lambda: F.linear(rms_norm(x, norm), head)  # [T, V]
    return make


# --- attention -------------------------------------------------------------------------------

def _prefill(b: Bench):
    m = b.model

    def make(tokens, context_tokens):
        L = context_tokens + tokens
        q = b.rand(1, m.heads, tokens, m.head_dim)  # [1, H, T, D]
        k, v = b.rand(1, m.kv_heads, L, m.head_dim), b.rand(1, m.kv_heads, L, m.head_dim)  # [1, Hkv, L, D]
        gqa = m.heads != m.kv_heads
        if context_tokens == 0:
            return lambda: F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=gqa)
        mask = causal_lower_right(tokens, L)  # chunk row i sees the context and chunk rows <= i
        return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    return make


def _decode(b: Bench):
    m = b.model

    def make(batch, context_tokens):
        q = b.rand(batch, m.heads, 1, m.head_dim)  # [B, H, 1, D]
        k = b.rand(batch, m.kv_heads, context_tokens, m.head_dim)  # [B, Hkv, L, D]
        v = b.rand(batch, m.kv_heads, context_tokens, m.head_dim)
        return lambda: F.scaled_dot_product_attention(q, k, v, enable_gqa=m.heads != m.kv_heads)
    return make


def heap_parents(batch: int, nodes: int, device: torch.device) -> torch.Tensor:
    """[B, Q] parents of a binary tree in heap order (node i's parent (i-1)//2; root -1)."""
    return ((torch.arange(nodes, device=device) - 1).div(2, rounding_mode="floor")).expand(batch, nodes).clone()


def _tree_verify(b: Bench):
    m = b.model
    tree_attention = functools.partial(tree_attention_kernel, impl="auto")

    def make(batch, query_tokens, context_tokens):
        q = b.rand(batch, query_tokens, m.heads, m.head_dim)  # [B, Q, H, D]
        k_cache = b.rand(batch, context_tokens, m.kv_heads, m.head_dim)  # [B, L, Hkv, D]
        v_cache = b.rand(batch, context_tokens, m.kv_heads, m.head_dim)
        k_tree = b.rand(batch, query_tokens, m.kv_heads, m.head_dim)  # [B, Q, Hkv, D]
        v_tree = b.rand(batch, query_tokens, m.kv_heads, m.head_dim)
        lengths = torch.full((batch,), context_tokens, device=b.device, dtype=torch.int64)  # [B]
        parents = heap_parents(batch, query_tokens, b.device)  # [B, Q] int64
        sizes = torch.full((batch,), query_tokens, device=b.device, dtype=torch.int64)  # [B]
        return lambda: tree_attention(q, k_cache, v_cache, lengths, k_tree, v_tree, parents, sizes)
    return make


def _attention_bytes(m: ModelSpec, e: int, batch: int, queries: int, context: int) -> int:
    kv = 2 * batch * context * m.kv_heads * m.head_dim
    return e * (batch * queries * 2 * m.heads * m.head_dim + kv)


def _tree_bytes(m: ModelSpec, e: int, batch: int, queries: int, context: int) -> int:
    """The kernel's reference (what runs on a CPU) concatenates cache and tree
    keys and values, upcasts them to fp32 and materialises the scores."""
    L = context + queries
    kv = 2 * batch * L * m.kv_heads * m.head_dim
    scores = batch * queries * L * (3 * 4 * m.heads + 1)  # fp32 scores, masked, softmax; bool mask
    return kv * (2 * e + 4) + scores + 2 * e * batch * queries * m.heads * m.head_dim


# --- vision encoder ---------------------------------------------------------------------------

def vision_layout(m: ModelSpec) -> tuple[int, int, int]:
    """(sequences, patches per sequence, patches merged per visual token) of one image."""
    patches, visual = m.vision_patches_per_image, m.visual_tokens_per_image
    if patches % visual == 0:  # Qwen2-VL: one sequence, 2x2 patches merged into a token
        return 1, patches, patches // visual
    cls = patches - visual  # CLIP: one CLS token per tile (LLaVA-1.6 AnyRes: 5 tiles of 577)
    if 0 < cls and patches % cls == 0:
        return cls, patches // cls, 1
    return 1, patches, 1


def _vision_heads(m: ModelSpec) -> int:
    return VISION_HEADS if m.vision_hidden % VISION_HEADS == 0 else max(1, m.vision_hidden // VISION_HEAD_DIM)


def vit_block(x: torch.Tensor, w: dict[str, torch.Tensor], heads: int) -> torch.Tensor:
    """Pre-norm ViT block over x [S, P, Cv] (S sequences of P patches)."""
    S, P, Cv = x.shape
    h = F.layer_norm(x, (Cv,), w["ln1"], w["ln1_b"])
    q, k, v = F.linear(h, w["qkv"], w["qkv_b"]).view(S, P, 3, heads, Cv // heads).permute(2, 0, 3, 1, 4)  # [S, h, P, d]
    a = F.scaled_dot_product_attention(q, k, v).transpose(1, 2).reshape(S, P, Cv)  # [S, P, Cv]
    x = x + F.linear(a, w["o"], w["o_b"])
    h = F.layer_norm(x, (Cv,), w["ln2"], w["ln2_b"])
    return x + F.linear(F.gelu(F.linear(h, w["fc1"], w["fc1_b"])), w["fc2"], w["fc2_b"])


def _vision(b: Bench):
    m = b.model
    Cv, Mv = m.vision_hidden, m.vision_mlp_hidden
    sequences, patches, merge = vision_layout(m)
    mid = merge * Cv if merge > 1 else m.hidden  # LLaVA: mlp2x_gelu; Qwen2-VL: merger MLP
    blocks = [dict(ln1=b.weight(Cv), ln1_b=b.weight(Cv), qkv=b.weight(3 * Cv, Cv), qkv_b=b.weight(3 * Cv),
                   o=b.weight(Cv, Cv), o_b=b.weight(Cv), ln2=b.weight(Cv), ln2_b=b.weight(Cv),
                   fc1=b.weight(Mv, Cv), fc1_b=b.weight(Mv), fc2=b.weight(Cv, Mv), fc2_b=b.weight(Cv))
              for _ in range(m.vision_layers)]
    proj_a, proj_b = b.weight(mid, merge * Cv), b.weight(m.hidden, mid)
    heads = _vision_heads(m)

    def make(images):
        x = b.rand(images * sequences, patches, Cv)  # [S, P, Cv] patch embeddings
        rows = images * m.visual_tokens_per_image

        def encode():
            h = x
            for w in blocks:
                h = vit_block(h, w, heads)
            tokens = h.reshape(-1, Cv)[: rows * merge].reshape(rows, merge * Cv)  # CLS rows dropped
            return F.linear(F.gelu(F.linear(tokens, proj_a)), proj_b)  # [images * N, C]
        return encode
    return make


def _vision_bytes(m: ModelSpec, e: int, images: int) -> int:
    sequences, patches, merge = vision_layout(m)
    rows = images * sequences * patches
    projector = merge * m.vision_hidden * (merge * m.vision_hidden + m.hidden) + m.hidden * m.hidden
    return e * (m.vision_params + projector + rows * (4 * m.vision_hidden + m.vision_mlp_hidden))


# --- drafter, selection, quantization -----------------------------------------------------------

def _drafter(b: Bench):
    m = b.model
    C, M, D = m.hidden, m.mlp_hidden, m.head_dim
    cross_attention = functools.partial(gated_cross_attention, impl="auto")
    fc = b.weight(C, 2 * C)
    n1, qkv, o, n2 = b.weight(C), b.weight(_qkv(m), C), b.weight(C, C), b.weight(C)
    up, down = b.weight(2 * M, C), b.weight(C, M)
    wq, wk, wv, wo = (b.weight(C, C) for _ in range(4))
    gate = torch.full((), 0.5, device=b.device, dtype=b.dtype)
    norm, head = b.weight(C), b.weight(m.vocab, C)
    cos, sin = rope_table(b)

    def layer(x):  # one decoder layer over x [T, C]; each position attends to itself
        T = x.shape[0]
        q, k, v = F.linear(rms_norm(x, n1), qkv).split([m.heads * D, m.kv_heads * D, m.kv_heads * D], dim=-1)
        q, k = apply_rope(q.view(T, m.heads, D), k.view(T, m.kv_heads, D), cos, sin,
                          torch.zeros(T, dtype=torch.long, device=b.device))
        a = F.scaled_dot_product_attention(q[:, :, None], k[:, :, None], v.view(T, m.kv_heads, 1, D),
                                           enable_gqa=m.heads != m.kv_heads)  # [T, H, 1, D]
        x = x + F.linear(a.reshape(T, C), o)
        g, u = F.linear(rms_norm(x, n2), up).chunk(2, dim=-1)
        return x + F.linear(F.silu(g) * u, down)

    def make(tokens, kept_tokens):
        features = b.rand(tokens, 2 * C)  # [T, 2C] target feature | token embedding
        visual = b.rand(tokens, kept_tokens, C) if kept_tokens else None  # [B=T, K, C] kept visual tokens

        def step():
            x = layer(F.linear(features, fc))  # [T, C]
            if visual is not None:
                x = cross_attention(x[:, None], visual, wq, wk, wv, wo, gate, m.heads)[:, 0]
            return F.linear(rms_norm(x, norm), head)  # [T, V] draft logits
        return step
    return make


def _drafter_bytes(m: ModelSpec, e: int, tokens: int, kept_tokens: int) -> int:
    weights = 6 * m.hidden * m.hidden + m.layer_params + m.lm_head_params
    visual = tokens * kept_tokens * m.hidden * (e + 3 * 4)  # kept tokens, fp32 k and v in the reference
    return e * (weights + tokens * (6 * m.hidden + 2 * m.mlp_hidden + m.vocab)) + visual


def _select(b: Bench):
    m = b.model
    select = functools.partial(select_visual_tokens, impl="auto")

    def make(requests, visual_tokens):
        shape = (requests, SELECT_LAYERS, visual_tokens, m.kv_heads, m.head_dim)
        queries = b.rand(requests, SELECT_LAYERS, m.kv_heads, m.head_dim)  # [B, Ly, H, D]
        keys_q = torch.randint(-127, 128, shape, device=b.device, dtype=torch.int8)  # [B, Ly, N, H, D]
        scales = torch.rand(shape[:-1], device=b.device, dtype=torch.float32) / 127  # [B, Ly, N, H]
        lengths = torch.full((requests,), visual_tokens, device=b.device, dtype=torch.int64)  # [B]
        return lambda: select(queries, keys_q, scales, lengths, SELECT_KEPT_TOKENS)
    return make


def _select_bytes(m: ModelSpec, e: int, requests: int, visual_tokens: int) -> int:
    """int8 keys, plus the fp32 dequantised copy and product of the reference."""
    keys = requests * SELECT_LAYERS * visual_tokens * m.kv_heads * m.head_dim
    return keys * (1 + 4 + 4) + 4 * keys // m.head_dim


def _quantize(b: Bench):
    m = b.model
    quantize = functools.partial(quantize_keys, impl="auto")

    def make(visual_tokens):
        keys = b.rand(m.layers, visual_tokens, m.kv_heads, m.head_dim)  # [layers as B, N, Hkv, D]
        return lambda: quantize(keys)
    return make


def _quantize_bytes(m: ModelSpec, e: int, visual_tokens: int) -> int:
    return (e + 3 * 4 + 1) * m.layers * visual_tokens * m.kv_heads * m.head_dim  # fp32 temporaries, int8 out


_HIDDEN = lambda m: m.hidden  # noqa: E731 - feature sizes of the linear pieces
_MLP = lambda m: m.mlp_hidden  # noqa: E731
_GATE_UP = lambda m: 2 * m.mlp_hidden  # noqa: E731


def _norm_bytes(m, e, tokens):
    return e * (m.hidden + 2 * tokens * m.hidden)


CASES: dict[str, Case] = {
    "input_layernorm": Case(_norm, _norm_bytes),
    "attn_pre_proj": Case(_linear(_HIDDEN, _qkv), _linear_bytes(_HIDDEN, _qkv)),
    "attn_rope": Case(_rope, lambda m, e, t: e * (ROPE_POSITIONS * m.head_dim + 2 * t * _qkv(m))),
    "attn_post_proj": Case(_linear(_HIDDEN, _HIDDEN), _linear_bytes(_HIDDEN, _HIDDEN)),
    "post_attention_layernorm": Case(_norm, _norm_bytes),
    "mlp_up_proj": Case(_linear(_HIDDEN, _GATE_UP), _linear_bytes(_HIDDEN, _GATE_UP)),
    "mlp_act": Case(_act, lambda m, e, t: e * 3 * t * m.mlp_hidden),
    "mlp_down_proj": Case(_linear(_MLP, _HIDDEN), _linear_bytes(_MLP, _HIDDEN)),
    "add": Case(_add, lambda m, e, t: e * 3 * t * m.hidden),
    "attn_prefill": Case(_prefill, lambda m, e, t, c: _attention_bytes(m, e, 1, t, c + t)),
    "attn_decode": Case(_decode, lambda m, e, b, c: _attention_bytes(m, e, b, 1, c)),
    "attn_tree_verify": Case(_tree_verify, _tree_bytes),
    "lm_head": Case(_lm_head, lambda m, e, t: e * (m.lm_head_params + t * (2 * m.hidden + m.vocab))),
    "vision_encoder": Case(_vision, _vision_bytes),
    "drafter_step": Case(_drafter, _drafter_bytes),
    "select": Case(_select, _select_bytes),
    "int8_quantize": Case(_quantize, _quantize_bytes),
}
