"""int8 visual-key cache: quantize the verifier's visual keys per (token, head).

Selection scores visual tokens from these int8 keys (see
``simspec_kernels.selection``), half the bytes of bf16 keys.
``quantize_keys`` has a plain-PyTorch reference (the spec, reference.py) and a
Triton kernel (triton.py) that matches it bit for bit.

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section (int8 key cache).

Imports: torch (triton lazily, only for impl="triton").
"""

from __future__ import annotations

import torch

from .._common import FLOATS, Dims, choose
from . import reference

__all__ = ["quantize_keys", "dequantize_keys"]


def quantize_keys(keys: torch.Tensor, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization per (token, head).

    keys: [B, N, H, D] float16 / bfloat16 / float32.
    Returns ``q`` int8 [B, N, H, D] and ``scale`` float32 [B, N, H] with
    ``scale = max_d |k| / 127`` (1.0 for an all-zero row) and
    ``q = round(k / scale)`` (half to even) clamped to [-127, 127].
    impl: "reference" | "triton" | "auto" (triton on CUDA or under TRITON_INTERPRET=1).
    """
    Dims().check("keys", keys, "B N H D", FLOATS)
    if choose(impl, keys) == "triton":
        from . import triton as kernel
        return kernel.quantize_keys(keys)
    return reference.quantize_keys(keys)


def dequantize_keys(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    """float32 keys back from int8 codes: ``q * scale``.

    q: [B, N, H, D] int8; scale: [B, N, H] float32. Returns float32 [B, N, H, D].
    """
    dims = Dims()
    dims.check("q", q, "B N H D", (torch.int8,))
    dims.check("scale", scale, "B N H", (torch.float32,))
    return reference.dequantize_keys(q, scale)
