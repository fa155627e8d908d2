"""Visual-token selection by layer voting as Triton kernels (same signature as reference.py).

Three launches, each one pass over its data:
1. ``_logits_kernel``, one program per (request, layer, head): streams that
   head's int8 keys in blocks of tokens (the long dimension, masked at
   lengths[b]), writes the base-2 logits and keeps an online softmax max/sum.
   This pass reads every key byte once and is the whole cost: it runs at HBM
   bandwidth.
2. ``_head_mean_kernel``, one program per (request, layer, token block):
   softmax-normalises the logits and averages over heads.
3. ``_vote_kernel``, one program per request: each layer's top-k by repeated
   argmax (ties to the lower index), votes, then the top-k by (votes, summed
   score), written out in ascending index order via a prefix sum.

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section.

Imports: torch and triton only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

TOKENS_PER_STEP = 64   # keys streamed per loop step of the logits kernel
TOKENS_PER_MEAN = 128  # tokens per program of the head-mean kernel


@triton.jit
def _logits_kernel(q_ptr, k_ptr, s_ptr, len_ptr, logit_ptr, m_ptr, z_ptr,
                   Ly, N, H, D, qk_scale,
                   BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr):
    pid = tl.program_id(0).to(tl.int64)           # (b * Ly + l) * H + h
    bl = pid // H
    h = pid % H
    length = tl.load(len_ptr + bl // Ly)
    d = tl.arange(0, BLOCK_D)
    d_ok = d < D
    q = tl.load(q_ptr + pid * D + d, mask=d_ok, other=0.0).to(tl.float32) * qk_scale  # [BLOCK_D]
    k_base = k_ptr + bl * N * H * D + h * D
    s_base = s_ptr + bl * N * H + h
    out_base = logit_ptr + pid * N
    # Per-lane online softmax; -1e30 (not -inf) keeps empty lanes free of inf - inf.
    m_vec = tl.full([BLOCK_N], -1e30, tl.float32)  # [BLOCK_N]
    z_vec = tl.zeros([BLOCK_N], tl.float32)        # [BLOCK_N]
    for n0 in range(0, length, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)             # [BLOCK_N]
        n_ok = n < length
        keys = tl.load(k_base + n[:, None] * (H * D) + d[None, :],
                       mask=n_ok[:, None] & d_ok[None, :], other=0)      # [BLOCK_N, BLOCK_D] int8
        scale = tl.load(s_base + n * H, mask=n_ok, other=0.0)             # [BLOCK_N]
        x = tl.sum(keys.to(tl.float32) * q[None, :], axis=1) * scale      # [BLOCK_N] base-2 logits
        x = tl.where(n_ok, x, float("-inf"))
        tl.store(out_base + n, x, mask=n_ok)
        m_new = tl.maximum(m_vec, x)
        z_vec = z_vec * tl.exp2(m_vec - m_new) + tl.exp2(x - m_new)
        m_vec = m_new
    m = tl.max(m_vec, axis=0)
    tl.store(m_ptr + pid, m)
    tl.store(z_ptr + pid, tl.sum(z_vec * tl.exp2(m_vec - m), axis=0))


@triton.jit
def _head_mean_kernel(logit_ptr, m_ptr, z_ptr, len_ptr, score_ptr, Ly, N, H,
                      BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr):
    bl = tl.program_id(0).to(tl.int64)            # b * Ly + l
    n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)   # [BLOCK_N]
    hs = tl.arange(0, BLOCK_H)                    # [BLOCK_H]
    h_ok = hs < H
    length = tl.load(len_ptr + bl // Ly)
    n_ok = n < length
    m = tl.load(m_ptr + bl * H + hs, mask=h_ok, other=0.0)       # [BLOCK_H]
    z = tl.load(z_ptr + bl * H + hs, mask=h_ok, other=1.0)       # [BLOCK_H]
    z = tl.where(z > 0, z, 1.0)                                   # lengths[b] == 0: no keys, no sum
    x = tl.load(logit_ptr + (bl * H + hs[:, None]) * N + n[None, :],
                mask=h_ok[:, None] & n_ok[None, :], other=float("-inf"))   # [BLOCK_H, BLOCK_N]
    p = tl.exp2(x - m[:, None]) / z[:, None]                      # [BLOCK_H, BLOCK_N]
    score = tl.where(n_ok, tl.sum(p, axis=0) / H, -1.0)           # [BLOCK_N]
    tl.store(score_ptr + bl * N + n, score, mask=n < N)


@triton.jit
def _vote_kernel(score_ptr, len_ptr, out_ptr, Ly, N, k,
                 BLOCK_LY: tl.constexpr, BLOCK_N: tl.constexpr):
    b = tl.program_id(0).to(tl.int64)
    ls = tl.arange(0, BLOCK_LY)                   # [BLOCK_LY]
    n = tl.arange(0, BLOCK_N)                     # [BLOCK_N]
    l_ok = ls < Ly
    length = tl.load(len_ptr + b)
    valid = n < length
    # Scores are >= 0 for valid tokens and -1 beyond lengths[b]; -2 pads the tile.
    s = tl.load(score_ptr + (b * Ly + ls[:, None]) * N + n[None, :],
                mask=l_ok[:, None] & (n < N)[None, :], other=-2.0)      # [BLOCK_LY, BLOCK_N]
    total = tl.sum(tl.maximum(s, 0.0), axis=0)                           # [BLOCK_N]
    n_pick = tl.minimum(length, k)
    votes = tl.zeros([BLOCK_N], tl.int32)                                # [BLOCK_N]
    for _ in range(n_pick):
        best = tl.argmax(s, axis=1, tie_break_left=True)                 # [BLOCK_LY]
        hit = (n[None, :] == best[:, None]) & l_ok[:, None]              # [BLOCK_LY, BLOCK_N]
        votes += tl.sum(hit.to(tl.int32), axis=0)
        s = tl.where(hit, -3.0, s)
    votes = tl.where(valid, votes, -1)
    chosen = n < 0                                                       # [BLOCK_N] all False
    for _ in range(n_pick):
        cand = votes == tl.max(votes, axis=0)
        cand = cand & (total == tl.max(tl.where(cand, total, -1.0), axis=0))
        pick = n == tl.min(tl.where(cand, n, BLOCK_N), axis=0)
        chosen = chosen | pick
        votes = tl.where(pick, -2, votes)
    slot = tl.cumsum(chosen.to(tl.int32), axis=0) - 1                    # [BLOCK_N]
    tl.store(out_ptr + b * k + slot, n.to(tl.int64), mask=chosen)


def select_visual_tokens(queries: torch.Tensor, keys_q: torch.Tensor, scales: torch.Tensor,
                         lengths: torch.Tensor, k: int) -> torch.Tensor:
    B, Ly, N, H, D = keys_q.shape
    device = keys_q.device
    out = torch.full((B, k), -1, dtype=torch.int64, device=device)      # [B, k]
    if B == 0 or N == 0 or k == 0:
        return out
    queries = queries.contiguous()                                       # [B, Ly, H, D]
    keys_q = keys_q.contiguous()                                         # [B, Ly, N, H, D]
    scales = scales.contiguous()                                         # [B, Ly, N, H]
    lengths = lengths.contiguous()                                       # [B]
    logits = torch.empty((B, Ly, H, N), dtype=torch.float32, device=device)  # [B, Ly, H, N]
    m = torch.empty((B, Ly, H), dtype=torch.float32, device=device)      # [B, Ly, H]
    z = torch.empty((B, Ly, H), dtype=torch.float32, device=device)      # [B, Ly, H]
    score = torch.empty((B, Ly, N), dtype=torch.float32, device=device)  # [B, Ly, N]
    _logits_kernel[(B * Ly * H,)](queries, keys_q, scales, lengths, logits, m, z, Ly, N, H, D,
                                  math.log2(math.e) / math.sqrt(D),
                                  BLOCK_N=TOKENS_PER_STEP, BLOCK_D=triton.next_power_of_2(D),
                                  num_warps=4, num_stages=3)
    _head_mean_kernel[(B * Ly, triton.cdiv(N, TOKENS_PER_MEAN))](
        logits, m, z, lengths, score, Ly, N, H,
        BLOCK_H=triton.next_power_of_2(H), BLOCK_N=TOKENS_PER_MEAN, num_warps=4)
    block_n = triton.next_power_of_2(N)
    _vote_kernel[(B,)](score, lengths, out, Ly, N, k,
                       BLOCK_LY=triton.next_power_of_2(Ly), BLOCK_N=block_n,
                       num_warps=16 if block_n >= 2048 else 4)
    return out
