"""int8 visual-key quantization as a Triton kernel (same signature as reference.py).

One program quantizes a block of (token, head) rows: it loads the rows, takes
max |k| per row, divides with IEEE rounding (``tl.math.div_rn``, not the
approximate division Triton emits for ``/``) and rounds half to even, so the
int8 codes equal the reference's bit for bit.

Uni-LaSpec (Nie et al., arXiv 2611.01617), visual-token selection section.

Imports: torch and triton only.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

ROWS_PER_PROGRAM = 32


@triton.jit
def _round_half_even(x):
    # libdevice.rint is not available to the interpreter; |x| <= 127 here, so
    # x - floor(x) is exact and this is rint.
    f = tl.floor(x)
    d = x - f
    odd = (f - 2.0 * tl.floor(f * 0.5)) == 1.0
    return tl.where((d > 0.5) | ((d == 0.5) & odd), f + 1.0, f)


@triton.jit
def _quantize_kernel(keys_ptr, q_ptr, scale_ptr, n_rows, D,
                     BLOCK_R: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK_R + tl.arange(0, BLOCK_R)   # [BLOCK_R]
    cols = tl.arange(0, BLOCK_D)                                              # [BLOCK_D]
    row_ok = rows < n_rows
    mask = row_ok[:, None] & (cols[None, :] < D)                              # [BLOCK_R, BLOCK_D]
    offs = rows[:, None] * D + cols[None, :]                                  # [BLOCK_R, BLOCK_D]
    k = tl.load(keys_ptr + offs, mask=mask, other=0.0).to(tl.float32)         # [BLOCK_R, BLOCK_D]
    amax = tl.max(tl.abs(k), axis=1)                                          # [BLOCK_R]
    scale = tl.where(amax > 0, tl.math.div_rn(amax, tl.full([BLOCK_R], 127.0, tl.float32)), 1.0)
    x = tl.math.div_rn(k, tl.broadcast_to(scale[:, None], [BLOCK_R, BLOCK_D]))
    q = tl.minimum(tl.maximum(_round_half_even(x), -127.0), 127.0)
    tl.store(q_ptr + offs, q.to(tl.int8), mask=mask)
    tl.store(scale_ptr + rows, scale, mask=row_ok)


def quantize_keys(keys: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    B, N, H, D = keys.shape
    keys = keys.contiguous()                                          # [B, N, H, D]
    q = torch.empty(keys.shape, dtype=torch.int8, device=keys.device)  # [B, N, H, D]
    scale = torch.empty((B, N, H), dtype=torch.float32, device=keys.device)  # [B, N, H]
    n_rows = B * N * H
    if n_rows and D:
        grid = (triton.cdiv(n_rows, ROWS_PER_PROGRAM),)
        _quantize_kernel[grid](keys, q, scale, n_rows, D,
                               BLOCK_R=ROWS_PER_PROGRAM, BLOCK_D=triton.next_power_of_2(D), num_warps=4)
    elif n_rows:
        scale.fill_(1.0)
    return q, scale


def dequantize_keys(q: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
    # One fused multiply: PyTorch's elementwise kernel is already at bandwidth.
    return q.float() * scale[..., None]                               # [B, N, H, D]
