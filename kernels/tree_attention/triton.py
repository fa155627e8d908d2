"""Tree attention as Triton kernels (same signature as reference.py).

``_tree_attention_kernel``: one program per (block of packed rows, request,
key/value head, split). A row is one (tree node, query head of this kv head's
group), so the G query heads sharing a kv head share every key/value load
(GQA). The program streams its share of the cached context in blocks (masked
at cache_lengths[b]), then the tree's own keys/values, masking each tree block
with the ancestor sets it builds in registers by walking ``parents`` up from
each row's node (no [Q, Q] mask ever goes through memory). Online softmax,
fp32 accumulators, exp2 with log2(e) folded into the scale.

When requests x kv heads x row blocks would leave the GPU's SMs idle (small
batch, long context), the cached context is split across programs
(flash-decoding) and ``_combine_kernel`` merges the partial results by their
log-sum-exp.

EAGLE-2 dynamic-tree verification; vLLM v1 tree attention. Uni-LaSpec
(Nie et al., arXiv 2611.01617), load-adaptive verification section.

Imports: torch and triton only.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl

from .._common import upcast_dots

LOG2E = math.log2(math.e)
BLOCK_L = 64          # cached keys per loop step
MIN_SPLIT_KEYS = 256  # a split streams at least this many cached keys
COMBINE_ROWS = 16     # (node, head) rows merged per program of the combine kernel


@triton.jit
def _tree_attention_kernel(q_ptr, kc_ptr, vc_ptr, kt_ptr, vt_ptr, par_ptr, clen_ptr, tsize_ptr, o_ptr, lse_ptr,
                           sq_b, sq_q, sq_h, skc_b, skc_l, skc_h, svc_b, svc_l, svc_h,
                           skt_b, skt_q, skt_h, svt_b, svt_q, svt_h, sp_b,
                           so_s, so_b, so_q, so_h, sl_s, sl_b, sl_q,
                           Q, Hkv, D, qk_scale, split_len,
                           G: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_L: tl.constexpr, BLOCK_T: tl.constexpr,
                           BLOCK_D: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                           SPLIT: tl.constexpr):
    bk = tl.program_id(1).to(tl.int64)
    b = bk // Hkv
    kvh = bk % Hkv
    split = tl.program_id(2)
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)     # [BLOCK_M] packed (node, head in group)
    node = rows // G                                               # [BLOCK_M]
    head = kvh * G + rows % G                                      # [BLOCK_M]
    d = tl.arange(0, BLOCK_D)                                      # [BLOCK_D]
    d_ok = d < D
    tree_size = tl.load(tsize_ptr + b).to(tl.int32)
    row_ok = node < tree_size
    q = tl.load(q_ptr + b * sq_b + node[:, None] * sq_q + head[:, None] * sq_h + d[None, :],
                mask=row_ok[:, None] & d_ok[None, :], other=0.0)    # [BLOCK_M, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)            # [BLOCK_M]
    l_i = tl.zeros([BLOCK_M], tl.float32)                          # [BLOCK_M]
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)                 # [BLOCK_M, BLOCK_D]
    last_node = tl.max(tl.where(row_ok, node, -1), axis=0)         # -1: every row is padding

    # The cached context: this split's share, none for an all-padding block.
    cache_len = tl.load(clen_ptr + b).to(tl.int32)
    start = split * split_len
    stop = tl.where(last_node >= 0, tl.minimum(start + split_len, cache_len), 0)
    kc_base = kc_ptr + b * skc_b + kvh * skc_h
    vc_base = vc_ptr + b * svc_b + kvh * svc_h
    for l0 in range(start, stop, BLOCK_L):
        cols = l0 + tl.arange(0, BLOCK_L)                           # [BLOCK_L]
        col_ok = cols < stop
        kt = tl.load(kc_base + cols[None, :] * skc_l + d[:, None],
                     mask=d_ok[:, None] & col_ok[None, :], other=0.0)    # [BLOCK_D, BLOCK_L]
        v = tl.load(vc_base + cols[:, None] * svc_l + d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)     # [BLOCK_L, BLOCK_D]
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale            # [BLOCK_M, BLOCK_L] base-2
        s = tl.where(col_ok[None, :], s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])                                    # [BLOCK_M, BLOCK_L]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    # The tree: split 0 only, blocks up to the block's last valid node.
    tree_stop = tl.where(split == 0, last_node + 1, 0)
    kt_base = kt_ptr + b * skt_b + kvh * skt_h
    vt_base = vt_ptr + b * svt_b + kvh * svt_h
    for t0 in range(0, tree_stop, BLOCK_T):
        tcols = t0 + tl.arange(0, BLOCK_T)                          # [BLOCK_T]
        # Walk each row up its root-to-node path; ancestors only get smaller.
        cur = tl.where(row_ok, node, -1)                            # [BLOCK_M]
        allowed = (rows[:, None] < 0) & (tcols[None, :] < 0)        # [BLOCK_M, BLOCK_T] all False
        while tl.max(cur, axis=0) >= t0:
            allowed = allowed | (cur[:, None] == tcols[None, :])
            cur = tl.load(par_ptr + b * sp_b + cur, mask=cur >= 0, other=-1).to(tl.int32)
        col_ok = tcols < tree_size
        kt = tl.load(kt_base + tcols[None, :] * skt_q + d[:, None],
                     mask=d_ok[:, None] & col_ok[None, :], other=0.0)    # [BLOCK_D, BLOCK_T]
        v = tl.load(vt_base + tcols[:, None] * svt_q + d[None, :],
                    mask=col_ok[:, None] & d_ok[None, :], other=0.0)     # [BLOCK_T, BLOCK_D]
        if UPCAST:
            kt = kt.to(tl.float32)
            v = v.to(tl.float32)
        s = tl.dot(q, kt, input_precision=PRECISION) * qk_scale            # [BLOCK_M, BLOCK_T]
        s = tl.where(allowed, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp2(m_i - m_use)
        p = tl.exp2(s - m_use[:, None])                                    # [BLOCK_M, BLOCK_T]
        l_i = l_i * alpha + tl.sum(p, axis=1)
        acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION)
        m_i = m_new

    has = row_ok & (l_i > 0)
    out = tl.where(has[:, None], acc / tl.where(has, l_i, 1.0)[:, None], 0.0)   # [BLOCK_M, BLOCK_D]
    row_in = node < Q
    tl.store(o_ptr + split * so_s + b * so_b + node[:, None] * so_q + head[:, None] * so_h + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_in[:, None] & d_ok[None, :])
    if SPLIT:
        lse = tl.where(has, m_i + tl.log2(tl.where(has, l_i, 1.0)), float("-inf"))   # [BLOCK_M]
        tl.store(lse_ptr + split * sl_s + b * sl_b + node * sl_q + head, lse, mask=row_in)


@triton.jit
def _combine_kernel(part_ptr, lse_ptr, o_ptr, S, n_rows, Q, H, D, sp_s, sl_s, so_b, so_q, so_h,
                    BLOCK_S: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)   # [BLOCK_R] (b * Q + node) * H + head
    s = tl.arange(0, BLOCK_S)                                                # [BLOCK_S]
    d = tl.arange(0, BLOCK_D)                                                # [BLOCK_D]
    row_ok = rows < n_rows
    lse = tl.load(lse_ptr + s[:, None] * sl_s + rows[None, :],
                  mask=(s < S)[:, None] & row_ok[None, :], other=float("-inf"))   # [BLOCK_S, BLOCK_R]
    m = tl.max(lse, axis=0)                                                  # [BLOCK_R]
    w = tl.exp2(lse - tl.where(m == float("-inf"), 0.0, m)[None, :])         # [BLOCK_S, BLOCK_R]
    part = tl.load(part_ptr + s[:, None, None] * sp_s + rows[None, :, None] * D + d[None, None, :],
                   mask=(s < S)[:, None, None] & row_ok[None, :, None] & (d < D)[None, None, :],
                   other=0.0)                                                # [BLOCK_S, BLOCK_R, BLOCK_D]
    total = tl.sum(w, axis=0)                                                # [BLOCK_R]
    out = tl.sum(part * w[:, :, None], axis=0) / tl.where(total > 0, total, 1.0)[:, None]  # [BLOCK_R, BLOCK_D]
    b = rows // (Q * H)
    node = (rows // H) % Q
    head = rows % H
    tl.store(o_ptr + (b * so_b + node * so_q + head * so_h)[:, None] + d[None, :],
             out.to(o_ptr.dtype.element_ty), mask=row_ok[:, None] & (d < D)[None, :])


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 1


def launch(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor,
           k_tree: torch.Tensor, v_tree: torch.Tensor, parents: torch.Tensor, tree_sizes: torch.Tensor,
           splits: int | None = None) -> torch.Tensor:
    """``tree_attention`` with the number of cache splits chosen (None: enough to fill the GPU)."""
    B, Q, H, D = q.shape
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    group = H // Hkv
    out = torch.empty_like(q)                                         # [B, Q, H, D]
    if out.numel() == 0:
        return out
    q, k_cache, v_cache, k_tree, v_tree = (t if t.stride(-1) == 1 else t.contiguous()
                                          for t in (q, k_cache, v_cache, k_tree, v_tree))
    parents, cache_lengths, tree_sizes = parents.contiguous(), cache_lengths.contiguous(), tree_sizes.contiguous()
    block_m = max(16, min(64, triton.next_power_of_2(Q * group)))
    block_t = max(16, min(64, triton.next_power_of_2(Q)))
    m_blocks = triton.cdiv(Q * group, block_m)
    if splits is None:
        splits = 1
        programs = m_blocks * B * Hkv
        if programs < 2 * _sm_count(q.device):
            splits = max(1, min(triton.cdiv(2 * _sm_count(q.device), programs), L // MIN_SPLIT_KEYS))
    split_len = triton.cdiv(triton.cdiv(max(L, 1), splits), BLOCK_L) * BLOCK_L
    splits = max(1, triton.cdiv(L, split_len))
    if splits == 1:
        target, lse = out, out                                        # lse unused
        so = (0, out.stride(0), out.stride(1), out.stride(2))
        sl = (0, 0, 0)
    else:
        target = torch.empty((splits, B, Q, H, D), dtype=torch.float32, device=q.device)  # [S, B, Q, H, D]
        lse = torch.empty((splits, B, Q, H), dtype=torch.float32, device=q.device)        # [S, B, Q, H]
        so = target.stride()[:4]
        sl = lse.stride()[:3]
    _tree_attention_kernel[(m_blocks, B * Hkv, splits)](
        q, k_cache, v_cache, k_tree, v_tree, parents, cache_lengths, tree_sizes, target, lse,
        q.stride(0), q.stride(1), q.stride(2), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), k_tree.stride(0), k_tree.stride(1), k_tree.stride(2),
        v_tree.stride(0), v_tree.stride(1), v_tree.stride(2), parents.stride(0), *so, *sl,
        Q, Hkv, D, LOG2E / math.sqrt(D), split_len,
        G=group, BLOCK_M=block_m, BLOCK_L=BLOCK_L, BLOCK_T=block_t, BLOCK_D=max(16, triton.next_power_of_2(D)),
        PRECISION="ieee" if q.dtype == torch.float32 else "tf32", UPCAST=upcast_dots(q.dtype),
        SPLIT=splits > 1, num_warps=4, num_stages=2)
    if splits > 1:
        n_rows = B * Q * H
        _combine_kernel[(triton.cdiv(n_rows, COMBINE_ROWS),)](
            target, lse, out, splits, n_rows, Q, H, D, target.stride(0), lse.stride(0),
            out.stride(0), out.stride(1), out.stride(2),
            BLOCK_S=triton.next_power_of_2(splits), BLOCK_R=COMBINE_ROWS, BLOCK_D=triton.next_power_of_2(D))
    return out


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor,
                   k_tree: torch.Tensor, v_tree: torch.Tensor, parents: torch.Tensor,
                   tree_sizes: torch.Tensor) -> torch.Tensor:
    return launch(q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes)
