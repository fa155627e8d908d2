"""Visual-token selection: pick the k visual tokens the drafter will see.

The verifier's queries saved from its last verification pass (one per voting
layer and head: the last verified token's) score the int8 visual keys; each
layer votes for its top-k tokens and the k tokens with the most votes (ties:
higher summed score) win. ``select_visual_tokens`` has a plain-PyTorch
reference (the spec, reference.py) and Triton kernels (triton.py).

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section
(attention-guided selection with multi-layer voting over an int8 key cache).

Imports: torch (triton lazily, only for impl="triton").
"""

from __future__ import annotations

import operator

import torch

from .._common import FLOATS, INT64, Dims, check_range, choose
from . import reference

__all__ = ["select_visual_tokens"]


def select_visual_tokens(queries: torch.Tensor, keys_q: torch.Tensor, scales: torch.Tensor,
                         lengths: torch.Tensor, k: int, impl: str = "auto") -> torch.Tensor:
    """Top-k visual tokens per request by multi-layer attention voting.

    queries: [B, Ly, H, D] float, the verifier's saved query per voting layer and head.
    keys_q:  [B, Ly, N, H, D] int8 visual keys (see ``simspec_kernels.int8_cache``).
    scales:  [B, Ly, N, H] float32 dequantization scales.
    lengths: [B] int64, valid visual tokens per request, 0 <= lengths[b] <= N.
    k:       tokens to keep, >= 1.
    Returns int64 [B, k]: chosen token indices in ascending order, -1 padding
    where lengths[b] < k.
    impl: "reference" | "triton" | "auto" (triton on CUDA or under TRITON_INTERPRET=1).
    """
    dims = Dims()
    dims.check("queries", queries, "B Ly H D", FLOATS)
    dims.check("keys_q", keys_q, "B Ly N H D", (torch.int8,))
    dims.check("scales", scales, "B Ly N H", (torch.float32,))
    dims.check("lengths", lengths, "B", INT64)
    if isinstance(k, bool):
        raise ValueError(f"k must be an int >= 1, got {k!r}")
    try:
        k = operator.index(k)
    except TypeError:
        raise ValueError(f"k must be an int >= 1, got {k!r}") from None
    if k < 1:
        raise ValueError(f"k must be an int >= 1, got {k}")
    if dims["Ly"] < 1 or dims["H"] < 1 or dims["D"] < 1:
        raise ValueError(f"queries must be [B, Ly, H, D] with Ly, H, D >= 1, got shape {tuple(queries.shape)}")
    check_range("lengths", lengths, 0, dims["N"], f"[0, N={dims['N']}]")
    if choose(impl, queries, keys_q) == "triton":
        from . import triton as kernel
        return kernel.select_visual_tokens(queries, keys_q, scales, lengths, k)
    return reference.select_visual_tokens(queries, keys_q, scales, lengths, k)
