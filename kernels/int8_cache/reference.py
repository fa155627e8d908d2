"""int8 visual-key cache, plain PyTorch: the specification of the Triton kernel.

Symmetric quantization per (token, head): ``scale = max_d |k| / 127`` (1.0 for
an all-zero row), ``q = round_half_even(k / scale)`` clamped to [-127, 127].
Both divisions are tensor / tensor so that every backend rounds them the IEEE
way (PyTorch's CUDA division by a Python scalar multiplies by the reciprocal),
which is what lets the Triton kernel match this bit for bit.

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section:
the verifier's visual keys are kept as int8, so scoring them for selection
reads half the bytes of bf16 keys.

Imports: torch only.
"""

from __future__ import annotations

import torch

QMAX = 127.0


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    k = keys.float()                                                  # [B, N, H, D]
    amax = k.abs().amax(dim=-1)                                       # [B, N, H]
    scale = torch.where(amax > 0, amax / amax.new_tensor(QMAX), torch.ones_like(amax))  # [B, N, H]
    q = torch.round(k / scale[..., None]).clamp_(-QMAX, QMAX).to(torch.int8)           # [B, N, H, D]
    return q, scale


def dequantize_keys(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    return q.float() * scale[..., None]                               # [B, N, H, D]
