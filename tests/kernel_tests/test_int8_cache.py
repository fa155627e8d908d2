"""int8 key quantization: the reference round-trips within half a step, the
Triton kernel reproduces it bit for bit; dispatch and input checks."""

from __future__ import annotations

import pytest
import torch

from simspec_kernels import _common
from simspec_kernels.int8_cache import dequantize_keys, quantize_keys

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
SHAPES = [pytest.param(s, id="B{}-N{}-H{}-D{}".format(*s))
          for s in [(1, 1, 1, 16), (2, 7, 3, 32), (1, 37, 2, 16), (2, 129, 1, 17)]]


def random_keys(shape, dtype, gen, device="cpu"):
    """Gaussian keys with an outlier row and an all-zero row (the first), which the scales must survive."""
    keys = torch.randn(shape, generator=gen) * 3                      # [B, N, H, D]
    keys[-1, -1, -1, 0] = 1000.0
    keys[0, 0, 0] = 0.0
    return keys.to(dtype).to(device)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_reference_round_trip_within_half_step(shape, dtype, gen):
    keys = random_keys(shape, dtype, gen)
    q, scale = quantize_keys(keys, impl="reference")
    assert q.dtype == torch.int8 and q.shape == keys.shape
    assert scale.dtype == torch.float32 and scale.shape == keys.shape[:3]
    error = (dequantize_keys(q, scale) - keys.float()).abs()          # [B, N, H, D]
    # Half a step, plus the fp32 rounding of k / scale and q * scale on a key that sits on a half.
    assert (error <= scale[..., None] / 2 + keys.float().abs() * 2**-22).all()
    assert scale[0, 0, 0] == 1.0 and (q[0, 0, 0] == 0).all()          # the all-zero row
    nonzero = keys.float().abs().amax(-1) > 0                         # [B, N, H]
    assert (q.abs().amax(-1)[nonzero] == 127).all()                   # the full int8 range is used


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_rounds_half_to_even(impl):
    # scale = 127 / 127 = 1, so k / scale lands exactly on the halves.
    row = torch.tensor([127.0, 0.5, 1.5, 2.5, -2.5, -0.5, 3.49, 126.5])
    q, scale = quantize_keys(row.view(1, 1, 1, 8), impl=impl)
    assert scale.item() == 1.0
    assert q.flatten().tolist() == [127, 0, 2, 2, -2, 0, 3, 126]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", SHAPES)
def test_triton_bit_exact(shape, dtype, device, gen):
    keys = random_keys(shape, dtype, gen, device)
    q_ref, scale_ref = quantize_keys(keys, impl="reference")
    q, scale = quantize_keys(keys, impl="triton")
    assert torch.equal(q, q_ref)
    torch.testing.assert_close(scale, scale_ref, rtol=1e-6, atol=0)


def test_empty_batch():
    q, scale = quantize_keys(torch.zeros(0, 5, 2, 16), impl="triton")
    assert q.shape == (0, 5, 2, 16) and scale.shape == (0, 5, 2)


@pytest.mark.parametrize("call, name", [
    pytest.param(lambda: quantize_keys(torch.zeros(2, 3, 16)), "keys", id="keys-rank"),
    pytest.param(lambda: quantize_keys(torch.zeros(1, 2, 3, 16, dtype=torch.int32)), "keys", id="keys-dtype"),
    pytest.param(lambda: dequantize_keys(torch.zeros(1, 2, 3, 16, dtype=torch.int8), torch.ones(1, 2, 4)),
                 "scale", id="scale-H"),
    pytest.param(lambda: dequantize_keys(torch.zeros(1, 2, 3, 16), torch.ones(1, 2, 3)), "q", id="q-dtype"),
    pytest.param(lambda: quantize_keys(torch.zeros(1, 2, 3, 16), impl="cuda"), "impl", id="impl-name"),
])
def test_bad_input_names_the_tensor(call, name):
    with pytest.raises(ValueError, match=name):
        call()


def test_auto_picks_triton_only_on_cuda_or_interpreter(monkeypatch):
    cpu = torch.zeros(1)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    assert _common.choose("auto", cpu) == "triton"
    monkeypatch.setenv("TRITON_INTERPRET", "0")
    assert _common.choose("auto", cpu) == "reference"
    assert _common.choose("reference", cpu) == "reference"
    with pytest.raises(ValueError, match="TRITON_INTERPRET"):
        _common.choose("triton", cpu)
