"""Gated cross-attention of draft tokens to the kept visual tokens, plain PyTorch: the spec.

``out = hidden + tanh(gate) * (softmax(q k^T / sqrt(D)) v) @ wo`` with
``q = hidden @ wq``, ``k = visual @ wk``, ``v = visual @ wv`` split into
n_heads heads of D = C / n_heads, keys beyond ``visual_lengths[b]`` masked.
A request with no kept visual tokens gets ``hidden`` back, and so does every
request when the gate is 0: the drafter without cross-attention.

Uni-LaSpec (Nie et al., arXiv 2611.01617), drafter section (the drafter
sees the selected visual tokens through a tanh-gated cross-attention,
Flamingo style).

Imports: torch only.
"""

from __future__ import annotations

import math

import torch


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Attention core: q [B, Q, H, D] over k, v [B, K, H, D] masked at lengths [B]; fp32 math."""
    B, Q, H, D = q.shape
    K = k.shape[1]
    scores = torch.einsum("bqhd,bkhd->bhqk", q.float(), k.float()) / math.sqrt(D)  # [B, H, Q, K]
    keep = torch.arange(K, device=q.device) < lengths[:, None]                      # [B, K]
    scores = scores.masked_fill(~keep[:, None, None, :], float("-inf"))
    p = torch.softmax(scores, dim=-1).nan_to_num(0.0)                               # [B, H, Q, K]
    return torch.einsum("bhqk,bkhd->bqhd", p, v.float()).to(q.dtype)               # [B, Q, H, D]


def gated_cross_attention(hidden: torch.Tensor, visual: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                          wv: torch.Tensor, wo: torch.Tensor, gate: torch.Tensor, n_heads: int,
                          visual_lengths: torch.Tensor) -> torch.Tensor:
    B, Q, C = hidden.shape
    K = visual.shape[1]
    h = hidden.float()                                                # [B, Q, C]
    x = visual.float()                                                # [B, K, C]
    q = (h @ wq.float()).view(B, Q, n_heads, C // n_heads)           # [B, Q, H, D]
    k = (x @ wk.float()).view(B, K, n_heads, C // n_heads)           # [B, K, H, D]
    v = (x @ wv.float()).view(B, K, n_heads, C // n_heads)           # [B, K, H, D]
    o = cross_attention(q, k, v, visual_lengths).reshape(B, Q, C)    # [B, Q, C]
    return (h + torch.tanh(gate.float()) * (o @ wo.float())).to(hidden.dtype)  # [B, Q, C]
