"""Plain-torch stand-ins for simspec_kernels, so profiling never waits on them.

Imports: torch, and simspec_kernels when it is importable. ``kernel(name)``
returns the kernel package's public function (called with ``impl="auto"``)
or, where it cannot be imported yet, the stand-in below of the same
signature and the same math (Uni-LaSpec: int8 visual keys, attention-guided
voting selection, gated cross-attention; EAGLE tree attention). A profile
timed with a stand-in says so in meta.json (``"kernels": "reference"``).

Shape letters: B batch, Ly voting layers, N visual tokens, K kept tokens,
Q query / tree tokens, L cached context, H heads, D head dim, C hidden.
"""

from __future__ import annotations

import functools
import importlib
import math
from typing import Callable

import torch
import torch.nn.functional as F

INT8_MAX = 127


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """keys [B, N, H, D] -> (int8 [B, N, H, D], scale [B, N, H]): symmetric,
    one scale per token and head."""
    scale = keys.abs().amax(dim=-1).float().clamp_min(1e-8) / INT8_MAX  # [B, N, H]
    q = torch.round(keys.float() / scale[..., None]).clamp_(-INT8_MAX, INT8_MAX).to(torch.int8)
    return q, scale


def select_visual_tokens(queries: torch.Tensor, keys_q: torch.Tensor, scales: torch.Tensor,
                         lengths: torch.Tensor, k: int) -> torch.Tensor:
    """Top-``k`` visual tokens per request by layer voting.

    queries [B, Ly, H, D] (the verifier's saved query per voting layer),
    keys_q [B, Ly, N, H, D] int8, scales [B, Ly, N, H], lengths [B] ->
    indices [B, k] (ascending). Each layer ranks tokens by head-averaged
    attention probability and votes for its top k; the k most-voted tokens
    win, ties broken by mean attention. One request at a time, so the
    dequantised keys never exceed one request's size.
    """
    B, Ly, N, H, D = keys_q.shape
    picked = []
    for b in range(B):
        n = int(lengths[b])
        keys = keys_q[b, :, :n].to(queries.dtype)  # [Ly, n, H, D]
        logits = torch.einsum("lhd,lnhd->lhn", queries[b], keys).float()  # [Ly, H, n]
        logits = logits * scales[b, :, :n].transpose(1, 2).float() / math.sqrt(D)
        probs = logits.softmax(dim=-1).mean(dim=1)  # [Ly, n]
        top = probs.topk(min(k, n), dim=-1).indices  # [Ly, k]
        ones = torch.ones(top.numel(), device=keys_q.device)
        votes = torch.zeros(n, device=keys_q.device).index_add_(0, top.flatten(), ones)  # [n] votes per token
        score = votes + probs.mean(dim=0)  # mean attention < 1: only breaks ties between vote counts
        picked.append(score.topk(min(k, n)).indices.sort().values)  # [k]
    return torch.stack(picked)


def gated_cross_attention(hidden: torch.Tensor, visual: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                          wv: torch.Tensor, wo: torch.Tensor, gate: torch.Tensor, n_heads: int,
                          visual_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """hidden [B, Q, C] attends to visual [B, K, C] (weights [C, C] applied
    as ``x @ w``); returns hidden + tanh(gate) * attention output [B, Q, C]
    (gate 0: hidden unchanged)."""
    B, Q, C = hidden.shape
    K = visual.shape[1]
    D = C // n_heads
    q = (hidden @ wq).view(B, Q, n_heads, D).transpose(1, 2)  # [B, H, Q, D]
    k = (visual @ wk).view(B, K, n_heads, D).transpose(1, 2)  # [B, H, K, D]
    v = (visual @ wv).view(B, K, n_heads, D).transpose(1, 2)  # [B, H, K, D]
    mask = None
    if visual_lengths is not None:
        mask = (torch.arange(K, device=visual.device) < visual_lengths[:, None])[:, None, None, :]  # [B, 1, 1, K]
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)  # [B, H, Q, D]
    return hidden + torch.tanh(gate) * (out.transpose(1, 2).reshape(B, Q, C) @ wo)


def ancestors(parents: torch.Tensor) -> torch.Tensor:
    """parents [B, Q] (-1 for a root) -> [B, Q, Q] bool: node i sees node j
    iff j is i or one of its ancestors."""
    B, Q = parents.shape
    seen = torch.eye(Q, dtype=torch.bool, device=parents.device).expand(B, Q, Q).clone()
    node = parents.clone()  # [B, Q] the ancestor reached so far
    rows = torch.arange(Q, device=parents.device).expand(B, Q)
    for _ in range(Q):
        up = node >= 0
        if not up.any():
            break
        b, i = up.nonzero(as_tuple=True)
        seen[b, rows[b, i], node[b, i]] = True
        node = torch.where(up, parents.gather(1, node.clamp_min(0)), node)
    return seen


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor,
                   k_tree: torch.Tensor, v_tree: torch.Tensor, parents: torch.Tensor,
                   tree_sizes: torch.Tensor) -> torch.Tensor:
    """Tree verification attention: q [B, Q, H, D] over each request's
    cache k/v [B, L, Hkv, D] (first cache_lengths [B] valid) and its tree
    nodes k/v [B, Q, Hkv, D] on the node's root path (parents [B, Q], first
    tree_sizes [B] valid) -> [B, Q, H, D]."""
    B, Q, H, D = q.shape
    L = k_cache.shape[1]
    cached = torch.arange(L, device=q.device) < cache_lengths[:, None]  # [B, L]
    in_tree = torch.arange(Q, device=q.device) < tree_sizes[:, None]  # [B, Q]
    tree_mask = ancestors(parents) & in_tree[:, None, :]  # [B, Q, Q]
    mask = torch.cat([cached[:, None, :].expand(B, Q, L), tree_mask], dim=2)[:, None]  # [B, 1, Q, L + Q]
    k = torch.cat([k_cache, k_tree], dim=1).transpose(1, 2)  # [B, Hkv, L + Q, D]
    v = torch.cat([v_cache, v_tree], dim=1).transpose(1, 2)  # [B, Hkv, L + Q, D]
    out = F.scaled_dot_product_attention(q.transpose(1, 2), k, v, attn_mask=mask,
                                         enable_gqa=H != k.shape[1])  # [B, H, Q, D]
    return out.transpose(1, 2)


REFERENCES: dict[str, tuple[str, Callable]] = {
    "quantize_keys": ("simspec_kernels.int8_cache", quantize_keys),
    "select_visual_tokens": ("simspec_kernels.selection", select_visual_tokens),
    "gated_cross_attention": ("simspec_kernels.cross_attention", gated_cross_attention),
    "tree_attention": ("simspec_kernels.tree_attention", tree_attention),
}


def kernel(name: str) -> tuple[Callable, bool]:
    """(function, True) from simspec_kernels, or (this module's stand-in,
    False) where the kernel package does not provide it yet."""
    module, stand_in = REFERENCES[name]
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return stand_in, False
    return functools.partial(fn, impl="auto"), True
