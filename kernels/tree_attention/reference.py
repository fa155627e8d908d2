"""Tree attention for speculative verification, plain PyTorch: the specification.

Each draft-tree node attends to the request's cached context (its first
``cache_lengths[b]`` tokens) and to the tree nodes on its root-to-node path:
its ancestors and itself, found by following ``parents`` (-1: a child of the
last cached token; nodes are topologically ordered, parent < node). Grouped
query attention maps query head h to key/value head ``h // (H / Hkv)``;
scores are scaled by 1/sqrt(D). Padded nodes (index >= tree_sizes[b]) give
zeros. A chain tree is linear (causal) verification; a one-node tree is
decode attention.

EAGLE-2 (Li et al., 2024), dynamic draft trees verified in one forward pass;
vLLM v1 tree attention (spec_decode) for the masking scheme. Uni-LaSpec
(Nie et al., arXiv 2611.01617), load-adaptive verification section: trees
are verified when the GPU has idle capacity.

Imports: torch only.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def ancestor_mask(parents: torch.Tensor, tree_sizes: torch.Tensor) -> torch.Tensor:
    """bool [B, Q, Q]: ``mask[b, i, j]`` iff node j is node i or one of its ancestors (valid nodes only).

    Transitive closure by pointer doubling: start from "itself or its
    parent" and square the relation until paths of length Q are covered
    (ceil(log2 Q) batched matmuls instead of a Python loop over nodes)."""
    B, Q = parents.shape
    node = torch.arange(Q, device=parents.device)                                      # [Q]
    live = node < tree_sizes[:, None]                                                  # [B, Q]
    parent = torch.where(live, parents, -1)                                            # [B, Q] padded: no parent
    step = (node[None, None, :] == parent[:, :, None]) | torch.eye(Q, dtype=torch.bool, device=parents.device)
    closure = step.float()                                                             # [B, Q, Q]
    reach = 1
    while reach < Q:  # closure covers paths of up to `reach` edges
        closure = (torch.bmm(closure, closure) > 0).float()
        reach *= 2
    return (closure > 0) & live[:, :, None] & live[:, None, :]


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor,
                   k_tree: torch.Tensor, v_tree: torch.Tensor, parents: torch.Tensor,
                   tree_sizes: torch.Tensor) -> torch.Tensor:
    """Scaled dot-product attention with an explicit [context | ancestors] mask.

    Keys and values are concatenated head-major, so every request's block is
    contiguous: with the token-major layout of the cache, PyTorch's batched
    matmuls copy or stride through memory and a CPU call costs up to B^2
    times one request's."""
    B, Q, H, D = q.shape
    L, Hkv = k_cache.shape[1], k_cache.shape[2]
    keys = torch.cat([k_cache.transpose(1, 2), k_tree.transpose(1, 2)], dim=2).float()     # [B, Hkv, L+Q, D]
    values = torch.cat([v_cache.transpose(1, 2), v_tree.transpose(1, 2)], dim=2).float()   # [B, Hkv, L+Q, D]
    node = torch.arange(Q, device=q.device)                                                # [Q]
    node_ok = node < tree_sizes[:, None]                                                   # [B, Q]
    cached = torch.arange(L, device=q.device) < cache_lengths[:, None]                   # [B, L]
    # a padded node sees itself (a row with no key would give NaN); its output is zeroed below
    own = ~node_ok[:, :, None] & torch.eye(Q, dtype=torch.bool, device=q.device)          # [B, Q, Q]
    allowed = torch.cat([cached[:, None, :] & node_ok[:, :, None],
                         ancestor_mask(parents, tree_sizes) | own], dim=-1)               # [B, Q, L+Q]
    out = F.scaled_dot_product_attention(q.transpose(1, 2).float(), keys, values, attn_mask=allowed[:, None],
                                         enable_gqa=H != Hkv)                              # [B, H, Q, D]
    out = out.transpose(1, 2)                                                              # [B, Q, H, D]
    return out.masked_fill(~node_ok[:, :, None, None], 0.0).to(q.dtype)
