"""Gated cross-attention with a Triton attention core (same signature as reference.py).

The four projections are dense GEMMs and stay in torch (cuBLAS, in the input
dtype); the attention core is a flash-attention style kernel: one program per
(request, head, block of draft tokens) streams the kept visual keys/values in
blocks, masked at ``lengths[b]``, with an online softmax and fp32
accumulators. The residual add and the tanh gate run in fp32, so gate 0 gives
``hidden`` back exactly.

Uni-LaSpec (Nie et al., arXiv 2611.01617), drafter section.

Imports: torch and triton only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .._common import upcast_dots

LOG2E = math.log2(math.e)


@triton.jit
def _cross_attention_kernel(q_ptr, k_ptr, v_ptr, len_ptr, o_ptr,
                            sq_b, sq_q, sq_h, sk_b, sk_k, sk_h, sv_b, sv_k, sv_h, so_b, so_q, so_h,
                            Q, H, D, qk_scale,
                            BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_D: tl.constexpr,
                            PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    b = bh // H
    h = bh % H
    rows = tl.program_id(1) * BLOCK_Q + tl.arange(0, BLOCK_Q)    # [BLOCK_Q]
    d = tl.arange(0, BLOCK_D)                                     # [BLOCK_D]
    row_ok = rows < Q
    d_ok = d < D
    length = tl.load(len_ptr + b)
    q = tl.load(q_ptr + b * sq_b + h * sq_h + rows[:, None] * sq_q + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)   # [BLOCK_Q, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_Q], float("-inf"), tl.float32)           # [BLOCK_Q]
    l_i = tl.zeros([BLOCK_Q], tl.float32)                         # [BLOCK_Q]
    acc = tl.zeros([BLOCK_Q, BLOCK_D], tl.float32)                # [BLOCK_Q, BLOCK_D]
    for k0 in range(0, length, BLOCK_K):
        cols = k0 + tl.arange(0, BLOCK_K)                          # [BLOCK_K]
        col_ok = cols < length
        kt = tl.load(k_ptr + b * sk_b + h * sk_h + cols[None, :] * sk_k + d[:, None],
                     mask=d_ok[:, None] & col_ok[None, :], other=0.0)   # [BLOCK_D, BLOCK_K]
        if UPCAST:
            kt = kt.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale          # [BLOCK_Q, BLOCK_K] base-2
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))                 # finite: col k0 is always valid
        alpha = tl.exp2(m_i - m_new)
        p = tl.exp2(s - m_new[:, None])                            # [BLOCK_Q, BLOCK_K]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + b * sv_b + h * sv_h + cols[:, None] * sv_k + d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)    # [BLOCK_K, BLOCK_D]
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]              # no keys: zeros
    tl.store(o_ptr + b * so_b + h * so_h + rows[:, None] * so_q + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])


def cross_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Attention core: q [B, Q, H, D] over k, v [B, K, H, D] masked at lengths [B]."""
    B, Q, H, D = q.shape
    out = torch.empty_like(q)                                         # [B, Q, H, D]
    if out.numel() == 0:
        return out
    q, k, v = (t if t.stride(-1) == 1 else t.contiguous() for t in (q, k, v))
    block_q = max(16, min(64, triton.next_power_of_2(Q)))
    grid = (B * H, triton.cdiv(Q, block_q))
    _cross_attention_kernel[grid](q, k, v, lengths.contiguous(), out,
                                  q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
                                  v.stride(0), v.stride(1), v.stride(2), out.stride(0), out.stride(1), out.stride(2),
                                  Q, H, D, LOG2E / math.sqrt(D),
                                  BLOCK_Q=block_q, BLOCK_K=16 if k.shape[1] <= 16 else 64,
                                  BLOCK_D=max(16, triton.next_power_of_2(D)),
                                  PRECISION="ieee" if q.dtype == torch.float32 else "tf32",
                                  UPCAST=upcast_dots(q.dtype), num_warps=4)
    return out


def gated_cross_attention(hidden: torch.Tensor, visual: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                          wv: torch.Tensor, wo: torch.Tensor, gate: torch.Tensor, n_heads: int,
                          visual_lengths: torch.Tensor) -> torch.Tensor:
    B, Q, C = hidden.shape
    K = visual.shape[1]
    q = (hidden @ wq).view(B, Q, n_heads, C // n_heads)              # [B, Q, H, D]
    k = (visual @ wk).view(B, K, n_heads, C // n_heads)              # [B, K, H, D]
    v = (visual @ wv).view(B, K, n_heads, C // n_heads)              # [B, K, H, D]
    o = cross_attention(q, k, v, visual_lengths).view(B, Q, C)       # [B, Q, C]
    return (hidden.float() + torch.tanh(gate.float()) * (o @ wo).float()).to(hidden.dtype)  # [B, Q, C]
