"""The target VLM: patch encoder, projector, decoder-only LM, greedy decoding.

Imports: torch and :mod:`simspec.types`.

Layout of one sequence: N visual tokens (the projected patch features of the
image) at positions ``0..N-1``, then the text tokens (BOS, question, answer)
at positions ``N..N+T-1``. The LM is a pre-norm decoder (RMSNorm, RoPE,
causal attention, gated MLP). :meth:`TargetVLM.generate` decodes greedily
with a KV cache; :meth:`TargetVLM.forward` is the uncached spec it must
match. Shape letters: B batch, N visual tokens, T text tokens, L context
length, H heads, D head dim, C model width, V vocabulary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simspec_kernels.tree_attention import tree_attention  # the kernels package needs torch only
from simspec.types import require


@dataclass(frozen=True, slots=True, kw_only=True)
class VLMConfig:
    image_px: int = 32
    patch_px: int = 8
    vision_width: int = 96
    vision_layers: int = 1
    vision_heads: int = 4
    vision_mlp_hidden: int = 192
    width: int = 128
    layers: int = 3
    heads: int = 4
    mlp_hidden: int = 384
    vocab_size: int = 48
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        require(self.image_px > 0 and self.image_px % self.patch_px == 0,
                f"image_px must be a positive multiple of patch_px={self.patch_px}, got {self.image_px}")
        require(self.width % self.heads == 0 and (self.width // self.heads) % 2 == 0,
                f"width must be a multiple of 2*heads={2 * self.heads}, got {self.width}")
        require(self.vision_width % self.vision_heads == 0,
                f"vision_width must be a multiple of vision_heads={self.vision_heads}, got {self.vision_width}")
        for name in ("vision_layers", "vision_mlp_hidden", "layers", "mlp_hidden", "vocab_size"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def visual_tokens(self) -> int:
        return (self.image_px // self.patch_px) ** 2


@dataclass(frozen=True, slots=True, kw_only=True)
class VLMOutput:
    logits: torch.Tensor  # [B, T, V] next-token logits at each text position
    hidden: torch.Tensor  # [B, T, C] final-norm hidden states of the text positions
    visual: torch.Tensor  # [B, N, C] projected visual tokens (LM input)


@dataclass(frozen=True, slots=True, kw_only=True)
class VLMTrace:
    logits: torch.Tensor  # [B, T, V]
    hidden: torch.Tensor  # [B, T, C] final-norm hidden states of the text positions (drafter features)
    visual_hidden: torch.Tensor  # [B, N, C] final-norm hidden states of the visual positions
    queries: torch.Tensor  # [B, layers, T, H, D] queries at the text positions (RoPE applied)
    visual_keys: torch.Tensor  # [B, layers, N, H, D] keys at the visual positions


@dataclass(frozen=True, slots=True, kw_only=True)
class TreeOutput:
    hidden: torch.Tensor  # [B, Q, C] final-norm hidden states of the nodes
    keys: list[torch.Tensor]  # per layer [B, Q, H, D] the nodes' keys (RoPE applied)
    values: list[torch.Tensor]  # per layer [B, Q, H, D]
    queries: list[torch.Tensor]  # per layer [B, Q, H, D] (selection's voting queries)


class RMSNorm(nn.Module):
    def __init__(self, width: int, eps: float = 1e-6):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight


def rope(x: torch.Tensor, positions: torch.Tensor, base: float) -> torch.Tensor:
    """Rotate ``x: [B, H, L, D]`` by its ``positions``: ``[L]`` shared by the
    batch or ``[B, L]`` per row (half-split RoPE)."""
    half = x.shape[-1] // 2
    freqs = base ** (-torch.arange(half, dtype=torch.float32, device=x.device) / half)  # [D/2]
    angles = positions.to(torch.float32)[..., None] * freqs  # [L, D/2] or [B, L, D/2]
    if angles.dim() == 3:
        angles = angles[:, None]  # [B, 1, L, D/2]
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x1 * sin + x2 * cos], dim=-1)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, rope_base: float | None):
        super().__init__()
        self.heads, self.rope_base = heads, rope_base
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.out = nn.Linear(width, width, bias=False)

    def project(self, x: torch.Tensor, positions: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
        """Queries, keys, values ``[B, H, L, D]`` of ``x: [B, L, C]`` (RoPE applied)."""
        b, length, width = x.shape
        q, k, v = self.qkv(x).view(b, length, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        if self.rope_base is not None:
            q, k = rope(q, positions, self.rope_base), rope(k, positions, self.rope_base)
        return q, k, v

    def forward(self, x: torch.Tensor, positions: torch.Tensor | None = None,
                cache: list[torch.Tensor] | None = None, causal: bool = True,
                record: list | None = None) -> torch.Tensor:
        """``x: [B, L, C]``; ``cache`` ([k, v], each ``[B, H, L_past, D]``, or
        empty) is extended in place with this call's keys and values;
        ``record`` (a list) gets this call's ``(q, k)``."""
        b, length, width = x.shape
        q, k, v = self.project(x, positions)
        if record is not None:
            record.append((q, k))
        if cache is not None:
            if cache:
                k, v = torch.cat([cache[0], k], dim=2), torch.cat([cache[1], v], dim=2)
            cache[:] = [k, v]
        past = k.shape[2] - length
        mask = None
        if causal and length > 1:  # query i sees keys 0..past+i
            mask = torch.ones(length, k.shape[2], dtype=torch.bool, device=x.device).tril(past)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, L, D]
        return self.out(y.transpose(1, 2).reshape(b, length, width))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, hidden: int, rope_base: float | None):
        super().__init__()
        self.norm1, self.norm2 = RMSNorm(width), RMSNorm(width)
        self.attn = Attention(width, heads, rope_base)
        self.gate = nn.Linear(width, hidden, bias=False)
        self.up = nn.Linear(width, hidden, bias=False)
        self.down = nn.Linear(hidden, width, bias=False)

    def forward(self, x, positions=None, cache=None, causal=True, record=None):
        x = x + self.attn(self.norm1(x), positions, cache, causal, record)
        return self.mlp(x)

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """The block's second half: ``x`` plus the gated MLP of its norm."""
        h = self.norm2(x)
        return x + self.down(F.silu(self.gate(h)) * self.up(h))


ATTENTION_CALL_PAIRS = 4096
"""What one more attention call costs, in padded query-key pairs (CPU, reference)."""


def _attention_groups(sizes: torch.Tensor, cache_lengths: torch.Tensor) -> list[tuple[torch.Tensor | slice, int, int]]:
    """Rows of a ragged batch split in at most two attention calls, short
    trees apart from long prefill chunks, where that saves more padded
    query-key pairs than a call costs. Each group: (rows, its longest
    tree, its longest cache); one group takes every row as a slice, so
    its tensors are views, not gathered copies."""
    order = torch.argsort(sizes, stable=True)
    q, length = sizes[order].tolist(), cache_lengths[order].tolist()
    def padded(lo, hi):
        return (hi - lo) * q[hi - 1] * (max(length[lo:hi]) + q[hi - 1]) if hi > lo else 0
    b = len(q)
    best, cut = padded(0, b), b
    for split in range(1, b):
        if q[split - 1] < q[split]:
            cost = padded(0, split) + padded(split, b) + ATTENTION_CALL_PAIRS
            if cost < best:
                best, cut = cost, split
    if cut == b:
        return [(slice(None), q[-1], max(length))]
    return [(order[lo:hi], q[hi - 1], max(length[lo:hi])) for lo, hi in ((0, cut), (cut, b))]


class TargetVLM(nn.Module):
    def __init__(self, config: VLMConfig):
        super().__init__()
        self.config = c = config
        self.patch = nn.Linear(3 * c.patch_px**2, c.vision_width)
        self.patch_pos = nn.Parameter(torch.zeros(c.visual_tokens, c.vision_width))
        self.vision = nn.ModuleList(Block(c.vision_width, c.vision_heads, c.vision_mlp_hidden, None)
                                    for _ in range(c.vision_layers))
        self.vision_norm = RMSNorm(c.vision_width)
        self.projector = nn.Linear(c.vision_width, c.width)
        self.embed = nn.Embedding(c.vocab_size, c.width)
        self.blocks = nn.ModuleList(Block(c.width, c.heads, c.mlp_hidden, c.rope_base) for _ in range(c.layers))
        self.norm = RMSNorm(c.width)
        self.head = nn.Linear(c.width, c.vocab_size, bias=False)
        self.apply(self._init)
        nn.init.normal_(self.patch_pos, std=0.5)

    @staticmethod
    def _init(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            # std 1/sqrt(fan_in): with GPT-2's fixed 0.02 at width 128 the
            # text-to-image attention sat on a chance-level plateau for 1000s of steps
            fan_in = module.weight.shape[-1] if isinstance(module, nn.Linear) else 1
            nn.init.normal_(module.weight, std=fan_in**-0.5)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def encode_image(self, images: torch.Tensor) -> torch.Tensor:
        """``images: [B, P, P, 3]`` uint8 -> visual tokens ``[B, N, C]``."""
        c = self.config
        b = images.shape[0]
        require(tuple(images.shape[1:]) == (c.image_px, c.image_px, 3),
                f"images must be [B, {c.image_px}, {c.image_px}, 3], got {list(images.shape)}")
        g, p = c.image_px // c.patch_px, c.patch_px
        x = images.to(self.patch.weight.dtype) / 127.5 - 1.0  # the model's dtype
        x = x.view(b, g, p, g, p, 3).permute(0, 1, 3, 2, 4, 5).reshape(b, g * g, p * p * 3)  # [B, N, 3*p*p]
        x = self.patch(x) + self.patch_pos  # [B, N, vision_width]
        for block in self.vision:
            x = block(x, causal=False)
        return self.projector(self.vision_norm(x))  # [B, N, C]

    def _decode(self, x: torch.Tensor, start: int, caches=None, record=None) -> torch.Tensor:
        """Run the LM over ``x: [B, L, C]`` at positions ``start..start+L-1``."""
        positions = torch.arange(start, start + x.shape[1], device=x.device)
        for i, block in enumerate(self.blocks):
            x = block(x, positions, None if caches is None else caches[i], record=record)
        return self.norm(x)

    def trace(self, images: torch.Tensor, tokens: torch.Tensor) -> VLMTrace:
        """:meth:`forward` plus what the drafter learns from: the final hidden
        states of the visual positions, and every layer's queries at the text
        positions and keys at the visual positions (what selection scores)."""
        visual = self.encode_image(images)  # [B, N, C]
        n = visual.shape[1]
        record: list = []
        hidden = self._decode(torch.cat([visual, self.embed(tokens)], dim=1), 0, record=record)  # [B, N+T, C]
        text = hidden[:, n:]
        return VLMTrace(logits=self.head(text), hidden=text, visual_hidden=hidden[:, :n],
                        queries=torch.stack([q[:, :, n:].transpose(1, 2) for q, _ in record], 1),
                        visual_keys=torch.stack([k[:, :, :n].transpose(1, 2) for _, k in record], 1))

    def tree_forward(self, x: torch.Tensor, positions: torch.Tensor, parents: torch.Tensor, sizes: torch.Tensor,
                     k_cache: list[torch.Tensor], v_cache: list[torch.Tensor], cache_lengths: torch.Tensor,
                     impl: str = "auto") -> TreeOutput:
        """One LM forward over a ragged batch of token trees, each after its
        request's cached context (the live engine's step: prefill chunks are
        chains, verification rounds are draft trees).

        x: [B, Q, C] input embeddings; positions: [B, Q]; parents: [B, Q]
        (-1: child of the last cached token); sizes: [B] valid nodes;
        k_cache / v_cache: per layer ``[B, L, H, D]``; cache_lengths: [B].
        Attention is :func:`simspec_kernels.tree_attention.tree_attention`.
        """
        b, q_len, width = x.shape
        # The GEMMs run on the packed valid nodes (as a serving engine packs a
        # ragged batch), so a step's cost follows its real token count, not
        # batch x the longest chunk; only attention sees the padded layout.
        valid = torch.arange(q_len, device=x.device) < sizes[:, None]  # [B, Q]
        flat, flat_pos = x[valid][None], positions[valid][None]  # [1, T, C], [1, T]
        heads = self.config.heads
        groups = _attention_groups(sizes, cache_lengths)
        keys, values, queries = [], [], []
        for i, block in enumerate(self.blocks):
            packed = [t[0].transpose(0, 1) for t in block.attn.project(block.norm1(flat), flat_pos)]  # [T, H, D]
            q, k, v = (t.new_zeros(b, q_len, heads, width // heads) for t in packed)  # [B, Q, H, D]
            for padded, p in zip((q, k, v), packed):
                padded[valid] = p
            y = q.new_zeros(q.shape)
            for rows, q_g, l_g in groups:  # prefill chunks and draft trees apart, as engines batch them
                y[rows, :q_g] = tree_attention(q[rows, :q_g], k_cache[i][rows, :l_g], v_cache[i][rows, :l_g],
                                               cache_lengths[rows], k[rows, :q_g], v[rows, :q_g],
                                               parents[rows, :q_g], sizes[rows], impl=impl)
            flat = block.mlp(flat + block.attn.out(y[valid][None].reshape(1, -1, width)))
            keys.append(k)
            values.append(v)
            queries.append(q)
        hidden = x.new_zeros(b, q_len, width)
        hidden[valid] = self.norm(flat)[0]
        return TreeOutput(hidden=hidden, keys=keys, values=values, queries=queries)

    def forward(self, images: torch.Tensor, tokens: torch.Tensor) -> VLMOutput:
        """``images: [B, P, P, 3]`` uint8, ``tokens: [B, T]`` int64 (text after
        the visual tokens; right padding is harmless under causal attention)."""
        require(tokens.dim() == 2 and tokens.shape[0] == images.shape[0],
                f"tokens must be [B, T] with B={images.shape[0]}, got {list(tokens.shape)}")
        visual = self.encode_image(images)  # [B, N, C]
        x = torch.cat([visual, self.embed(tokens)], dim=1)  # [B, N+T, C]
        hidden = self._decode(x, 0)[:, visual.shape[1]:]  # [B, T, C]
        return VLMOutput(logits=self.head(hidden), hidden=hidden, visual=visual)

    @torch.no_grad()
    def generate(self, image: torch.Tensor, prompt: list[int] | tuple[int, ...], max_new_tokens: int,
                 eos_id: int | None = 2) -> list[int]:
        """Greedy decoding with a KV cache. ``image: [P, P, 3]`` uint8; returns
        the new tokens, stopping after ``eos_id`` (included) or the limit."""
        require(max_new_tokens >= 0, f"max_new_tokens must be >= 0, got {max_new_tokens}")
        require(len(prompt) >= 1, "prompt must hold at least one token (BOS)")
        caches: list[list[torch.Tensor]] = [[] for _ in self.blocks]
        visual = self.encode_image(image[None])  # [1, N, C]
        tokens = torch.tensor([list(prompt)], dtype=torch.long, device=visual.device)  # [1, T]
        x = torch.cat([visual, self.embed(tokens)], dim=1)
        hidden = self._decode(x, 0, caches)  # prefill
        length = x.shape[1]
        out: list[int] = []
        for _ in range(max_new_tokens):
            token = int(self.head(hidden[:, -1]).argmax(-1))
            out.append(token)
            if token == eos_id:
                break
            hidden = self._decode(self.embed(torch.tensor([[token]], device=visual.device)), length, caches)
            length += 1
        return out
