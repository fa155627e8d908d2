"""Gated cross-attention: draft-token states attend to the kept visual tokens.

``gated_cross_attention`` adds ``tanh(gate) * attention(hidden -> visual) @ wo``
to the drafter's hidden states; the projections are torch GEMMs, the
attention core has a plain-PyTorch reference (the spec, reference.py) and a
flash-style Triton kernel (triton.py). Gate 0 is the drafter without
cross-attention.

Uni-LaSpec (Nie et al., arXiv 2611.01617), drafter section (visual tokens enter the
drafter through a gated cross-attention).

Imports: torch (triton lazily, only for impl="triton").
"""

from __future__ import annotations

import operator

import torch

from .._common import FLOATS, INT64, Dims, check_range, choose
from . import reference

__all__ = ["gated_cross_attention"]


def gated_cross_attention(hidden: torch.Tensor, visual: torch.Tensor, wq: torch.Tensor, wk: torch.Tensor,
                          wv: torch.Tensor, wo: torch.Tensor, gate: torch.Tensor, n_heads: int,
                          visual_lengths: torch.Tensor | None = None, impl: str = "auto") -> torch.Tensor:
    """``hidden + tanh(gate) * softmax(q k^T / sqrt(D)) v @ wo`` over the kept visual tokens.

    hidden: [B, Q, C] float, draft-token states (C = n_heads * D).
    visual: [B, K, C] hidden's dtype, the K kept visual token states (K may be 0).
    wq, wk, wv, wo: [C, C] hidden's dtype, applied as ``x @ w``.
    gate: 0-dim float tensor (tanh-gated; 0 returns ``hidden``).
    n_heads: H, dividing C.
    visual_lengths: [B] int64 valid kept tokens per request, 0 <= len <= K
        (None: all K); keys beyond it are masked.
    Returns [B, Q, C] in hidden's dtype.
    impl: "reference" | "triton" | "auto" (triton on CUDA or under TRITON_INTERPRET=1).
    """
    dims = Dims()
    dims.check("hidden", hidden, "B Q C", FLOATS)
    same = (hidden.dtype,)
    dims.check("visual", visual, "B K C", same)
    for name, w in (("wq", wq), ("wk", wk), ("wv", wv), ("wo", wo)):
        dims.check(name, w, "C C", same)
    dims.check("gate", gate, "", FLOATS)
    try:
        n_heads = operator.index(n_heads)
    except TypeError:
        raise ValueError(f"n_heads must be an int dividing C={dims['C']}, got {n_heads!r}") from None
    if isinstance(n_heads, bool) or n_heads < 1 or dims["C"] % n_heads:
        raise ValueError(f"n_heads must be an int >= 1 dividing C={dims['C']}, got {n_heads!r}")
    if visual_lengths is None:
        visual_lengths = torch.full((dims["B"],), dims["K"], dtype=torch.int64, device=hidden.device)
    else:
        dims.check("visual_lengths", visual_lengths, "B", INT64)
        check_range("visual_lengths", visual_lengths, 0, dims["K"], f"[0, K={dims['K']}]")
    args = (hidden, visual, wq, wk, wv, wo, gate, n_heads, visual_lengths)
    if choose(impl, hidden, visual) == "triton":
        from . import triton as kernel
        return kernel.gated_cross_attention(*args)
    return reference.gated_cross_attention(*args)
