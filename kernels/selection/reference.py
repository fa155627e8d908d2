"""Visual-token selection by layer voting, plain PyTorch: the specification.

For each request b and voting layer l, the verifier's saved query (that of
the last verified token) scores the int8 visual keys:
``p[b,l,h,n] = softmax_{n < lengths[b]}(q[b,l,h] . (keys_q * scale)[b,l,n,h] / sqrt(D))``
and ``score[b,l,n] = mean_h p[b,l,h,n]``. Each layer votes for its top-k
tokens; a token's rank key is (votes, score summed over layers), compared
lexicographically; the top-k tokens by that key are returned sorted by index,
padded with -1 where a request has fewer than k visual tokens. Exact ties go
to the lower token index (stable sorts), as in the Triton kernel.

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section
(attention-guided selection of k visual tokens with multi-layer voting).

Imports: torch only.
"""

from __future__ import annotations

import math

import torch


def token_scores(queries: torch.Tensor, keys_q: torch.Tensor, scales: torch.Tensor,
                 lengths: torch.Tensor) -> torch.Tensor:
    """Head-mean attention probabilities, fp32 ``[B, Ly, N]``; -1 beyond lengths[b].

    A key's scale is one number per token and head, so it multiplies the
    dot product instead of the key. The keys are converted head-major, so
    each (request, layer, head) is one contiguous matrix: in the cache's
    token-major layout PyTorch's batched matmul strides through memory and
    a CPU call cost 10x as much."""
    B, Ly, N, H, D = keys_q.shape
    keys = keys_q.transpose(2, 3).to(torch.float32, memory_format=torch.contiguous_format)  # [B, Ly, H, N, D]
    dots = (keys @ queries.float()[..., None]).squeeze(-1)                                # [B, Ly, H, N]
    logits = dots * scales.transpose(2, 3) / math.sqrt(D)                                 # [B, Ly, H, N]
    valid = torch.arange(N, device=keys_q.device) < lengths[:, None]               # [B, N]
    logits = logits.masked_fill(~valid[:, None, None, :], float("-inf"))
    p = torch.softmax(logits, dim=-1).nan_to_num(0.0)                              # [B, Ly, H, N]
    return p.mean(dim=2).masked_fill(~valid[:, None, :], -1.0)                     # [B, Ly, N]


def select_visual_tokens(queries: torch.Tensor, keys_q: torch.Tensor, scales: torch.Tensor,
                         lengths: torch.Tensor, k: int) -> torch.Tensor:
    B, Ly, N, H, D = keys_q.shape
    score = token_scores(queries, keys_q, scales, lengths)                        # [B, Ly, N]
    valid = torch.arange(N, device=keys_q.device) < lengths[:, None]             # [B, N]
    per_layer = min(k, N)
    top = torch.sort(score, dim=-1, descending=True, stable=True).indices[..., :per_layer]  # [B, Ly, k]
    in_top = torch.zeros_like(score, dtype=torch.bool).scatter_(-1, top, True)      # [B, Ly, N]
    votes = (in_top & valid[:, None]).sum(dim=1).masked_fill(~valid, -1)            # [B, N]
    total = score.clamp(min=0).sum(dim=1)                                           # [B, N]
    # Lexicographic (votes, total), descending: sort by the minor key, then stably by the major one.
    order = torch.sort(total, dim=-1, descending=True, stable=True).indices         # [B, N]
    order = order.gather(-1, torch.sort(votes.gather(-1, order), dim=-1, descending=True, stable=True).indices)
    chosen = order[:, :per_layer]                                                   # [B, k]
    slot = torch.arange(per_layer, device=keys_q.device)
    chosen = chosen.masked_fill(slot >= lengths[:, None], N).sort(dim=-1).values   # N sorts after real tokens
    chosen = chosen.masked_fill(chosen == N, -1)
    out = torch.full((B, k), -1, dtype=torch.int64, device=keys_q.device)          # [B, k]
    out[:, :per_layer] = chosen
    return out
