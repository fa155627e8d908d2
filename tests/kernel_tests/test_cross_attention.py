"""Gated cross-attention: the attention core (reference vs SDPA, Triton vs
reference) over ragged kept-token counts, the full gated op, and the
invariants gate 0 == hidden and no visual tokens == hidden; input checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from simspec_kernels.cross_attention import gated_cross_attention
from simspec_kernels.cross_attention import reference, triton as kernel

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
# (B, Q, K, H, D, lengths)
CORE_CASES = [pytest.param(c, id="B{}-Q{}-K{}-H{}-D{}-len{}".format(*c[:5], "_".join(map(str, c[5]))))
              for c in [(1, 1, 1, 1, 16, (1,)),
                        (2, 7, 8, 2, 16, (8, 3)),
                        (2, 10, 37, 2, 32, (37, 0)),
                        (3, 7, 129, 1, 16, (129, 64, 1)),
                        (1, 129, 7, 1, 16, (7,)),
                        (2, 7, 0, 2, 16, (0, 0))]]


def core_inputs(B, Q, K, H, D, lengths, dtype, gen, device="cpu"):
    q, k, v = (torch.randn(shape, generator=gen).to(dtype).to(device)
               for shape in ((B, Q, H, D), (B, K, H, D), (B, K, H, D)))       # [B, Q|K, H, D]
    return q, k, v, torch.tensor(lengths, dtype=torch.int64, device=device)


@pytest.mark.parametrize("case", CORE_CASES)
def test_reference_core_matches_sdpa(case, gen):
    q, k, v, lengths = core_inputs(*case, torch.float32, gen)
    out = reference.cross_attention(q, k, v, lengths)                         # [B, Q, H, D]
    for b, n in enumerate(lengths.tolist()):
        if n == 0:
            assert (out[b] == 0).all()
            continue
        expected = F.scaled_dot_product_attention(q[b:b + 1, :].transpose(1, 2), k[b:b + 1, :n].transpose(1, 2),
                                                  v[b:b + 1, :n].transpose(1, 2)).transpose(1, 2)
        torch.testing.assert_close(out[b:b + 1], expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CORE_CASES)
def test_triton_core_matches_reference(case, dtype, device, tol, gen):
    inputs = core_inputs(*case, dtype, gen, device)
    out = kernel.cross_attention(*inputs)
    assert out.dtype == dtype and out.shape == inputs[0].shape
    torch.testing.assert_close(out.float(), reference.cross_attention(*inputs).float(), **tol)


def drafter_inputs(B, Q, K, H, D, dtype, gen, device="cpu", gate=0.7):
    C = H * D
    hidden = torch.randn((B, Q, C), generator=gen)                             # [B, Q, C]
    visual = torch.randn((B, K, C), generator=gen)                             # [B, K, C]
    weights = [torch.randn((C, C), generator=gen) / C**0.5 for _ in range(4)]  # [C, C] each
    tensors = [t.to(dtype).to(device) for t in (hidden, visual, *weights)]
    return (*tensors, torch.tensor(gate, device=device), H)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [pytest.param((2, 10, 8, 2, 16), id="B2-Q10-K8-H2-D16"),
                                   pytest.param((3, 1, 37, 4, 16), id="B3-Q1-K37-H4-D16")])
def test_gated_triton_matches_reference(shape, dtype, device, tol, gen):
    args = drafter_inputs(*shape, dtype, gen, device)
    lengths = torch.arange(shape[0], device=device) * 3 % (shape[2] + 1)       # ragged, one request empty
    out = gated_cross_attention(*args, visual_lengths=lengths, impl="triton")
    expected = gated_cross_attention(*args, visual_lengths=lengths, impl="reference")
    assert out.dtype == dtype and out.shape == args[0].shape
    # The torch projections round to dtype before and after the core; the reference stays fp32.
    torch.testing.assert_close(out.float(), expected.float(), atol=4 * tol["atol"], rtol=4 * tol["rtol"])
    empty = lengths == 0
    assert torch.equal(out[empty], args[0][empty])


@pytest.mark.parametrize("impl", ["reference", "triton"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_gate_zero_is_the_drafter_without_cross_attention(dtype, impl, gen):
    args = drafter_inputs(2, 7, 8, 2, 16, dtype, gen, gate=0.0)
    assert torch.equal(gated_cross_attention(*args, impl=impl), args[0])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_no_kept_tokens_returns_hidden(impl, gen):
    args = drafter_inputs(2, 7, 0, 2, 16, torch.float32, gen)
    assert torch.equal(gated_cross_attention(*args, impl=impl), args[0])


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_masked_tokens_do_not_matter(impl, gen):
    """Keys beyond visual_lengths are ignored: changing them changes nothing."""
    args = list(drafter_inputs(2, 7, 8, 2, 16, torch.float32, gen))
    lengths = torch.tensor([5, 8])
    before = gated_cross_attention(*args, visual_lengths=lengths, impl=impl)
    args[1] = args[1].clone()
    args[1][0, 5:] = 100.0
    torch.testing.assert_close(gated_cross_attention(*args, visual_lengths=lengths, impl=impl), before,
                               atol=0, rtol=0)


def _args():
    hidden, visual, wq, wk, wv, wo, gate, heads = drafter_inputs(2, 3, 4, 2, 16, torch.float32,
                                                                 torch.Generator().manual_seed(0))
    return dict(hidden=hidden, visual=visual, wq=wq, wk=wk, wv=wv, wo=wo, gate=gate, n_heads=heads)


@pytest.mark.parametrize("change, name", [
    pytest.param(dict(hidden=torch.zeros(2, 3, 31)), "visual", id="visual-C"),
    pytest.param(dict(visual=torch.zeros(2, 4, 32, 1)), "visual", id="visual-rank"),
    pytest.param(dict(visual=torch.zeros(3, 4, 32)), "visual", id="visual-B"),
    pytest.param(dict(wk=torch.zeros(32, 16)), "wk", id="wk-shape"),
    pytest.param(dict(wo=torch.zeros(32, 32, dtype=torch.float16)), "wo", id="wo-dtype"),
    pytest.param(dict(gate=torch.zeros(1)), "gate", id="gate-rank"),
    pytest.param(dict(n_heads=3), "n_heads", id="heads-not-dividing"),
    pytest.param(dict(visual_lengths=torch.tensor([4, 5])), "visual_lengths", id="lengths-above-K"),
    pytest.param(dict(visual_lengths=torch.tensor([4])), "visual_lengths", id="lengths-B"),
])
def test_bad_input_names_the_tensor(change, name):
    with pytest.raises(ValueError, match=name):
        gated_cross_attention(**{**_args(), **change})
