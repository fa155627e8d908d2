"""Tree attention: verify a draft tree in one target forward pass.

Each tree node attends to the request's cached context plus its own
root-to-node path, so one forward scores every branch of the draft tree.
``tree_attention`` has a plain-PyTorch reference (the spec, reference.py)
and Triton kernels (triton.py) that build the ancestor masks in registers and
split long contexts across programs when the batch is small.

EAGLE-2 (dynamic draft trees) and vLLM v1 tree attention; Uni-LaSpec
(Nie et al., arXiv 2611.01617), load-adaptive verification section (trees under
light load).

Imports: torch (triton lazily, only for impl="triton").
"""

from __future__ import annotations

import torch

from .._common import FLOATS, INT64, Dims, check_range, choose
from . import reference

__all__ = ["tree_attention"]


def tree_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, cache_lengths: torch.Tensor,
                   k_tree: torch.Tensor, v_tree: torch.Tensor, parents: torch.Tensor, tree_sizes: torch.Tensor,
                   impl: str = "auto") -> torch.Tensor:
    """Attention of draft-tree nodes over [cached context, root-to-node path].

    q:             [B, Q, H, D] float, queries of the Q tree nodes (padded).
    k_cache, v_cache: [B, L, Hkv, D] q's dtype, cached context (padded); H % Hkv == 0.
    cache_lengths: [B] int64, valid cached tokens, 0 <= cache_lengths[b] <= L.
    k_tree, v_tree: [B, Q, Hkv, D] q's dtype, the nodes' own keys/values.
    parents:       [B, Q] int64, parent node index; -1 for a child of the last
                   cached token; -1 <= parents[b, i] < i for valid nodes.
    tree_sizes:    [B] int64, valid nodes, 0 <= tree_sizes[b] <= Q.
    Returns [B, Q, H, D] in q's dtype; padded nodes are zeros. Scale 1/sqrt(D).
    impl: "reference" | "triton" | "auto" (triton on CUDA or under TRITON_INTERPRET=1).
    """
    dims = Dims()
    dims.check("q", q, "B Q H D", FLOATS)
    same = (q.dtype,)
    dims.check("k_cache", k_cache, "B L Hkv D", same)
    dims.check("v_cache", v_cache, "B L Hkv D", same)
    dims.check("cache_lengths", cache_lengths, "B", INT64)
    dims.check("k_tree", k_tree, "B Q Hkv D", same)
    dims.check("v_tree", v_tree, "B Q Hkv D", same)
    dims.check("parents", parents, "B Q", INT64)
    dims.check("tree_sizes", tree_sizes, "B", INT64)
    if dims["Hkv"] < 1 or dims["H"] % dims["Hkv"]:
        raise ValueError(f"k_cache must be [B, L, Hkv, D] with Hkv dividing H={dims['H']}, "
                         f"got shape {tuple(k_cache.shape)}")
    check_range("cache_lengths", cache_lengths, 0, dims["L"], f"[0, L={dims['L']}]")
    check_range("tree_sizes", tree_sizes, 0, dims["Q"], f"[0, Q={dims['Q']}]")
    node = torch.arange(dims["Q"], device=parents.device)                  # [Q]
    live = node < tree_sizes[:, None]                                      # [B, Q]
    bad = live & ((parents < -1) | (parents >= node))                      # [B, Q]
    if bool(bad.any()):
        b, i = (int(x) for x in bad.nonzero()[0])
        raise ValueError(f"parents[{b}, {i}] = {int(parents[b, i])} must lie in [-1, {i}): "
                         "nodes are topologically ordered, -1 is a child of the last cached token")
    args = (q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes)
    if choose(impl, q, k_cache) == "triton":
        from . import triton as kernel
        return kernel.tree_attention(*args)
    return reference.tree_attention(*args)
