"""Visual-token selection: reference and Triton kernel judged against a
float64 brute force over the dequantized keys, with near-ties handled by
interval bounds; planted and tied cases with exact answers; input checks."""

from __future__ import annotations

import math

import pytest
import torch

from simspec_kernels.int8_cache import quantize_keys
from simspec_kernels.selection import select_visual_tokens

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
# (B, Ly, N, H, D, lengths, k): ragged lengths, k above some lengths, an empty request.
CASES = [pytest.param(c, id="B{}-Ly{}-N{}-H{}-D{}-len{}-k{}".format(*c[:5], "_".join(map(str, c[5])), c[6]))
         for c in [(1, 1, 1, 1, 16, (1,), 1),
                   (2, 2, 7, 2, 16, (7, 3), 8),
                   (2, 3, 37, 2, 32, (37, 0), 8),
                   (3, 4, 129, 2, 16, (129, 100, 5), 8)]]
# Brute force and kernels may disagree by this much on one layer's score
# (fp32 vs float64 over <= 129 tokens and D <= 32: ~1e-8; a wide margin).
SCORE_TOL = 1e-6


def make_inputs(B, Ly, N, H, D, lengths, dtype, gen, device="cpu"):
    queries = torch.randn((B, Ly, H, D), generator=gen).to(dtype)               # [B, Ly, H, D]
    keys_q, scales = quantize_keys(torch.randn((B * Ly, N, H, D), generator=gen), impl="reference")
    return (queries.to(device), keys_q.view(B, Ly, N, H, D).to(device),       # [B, Ly, N, H, D]
            scales.view(B, Ly, N, H).to(device), torch.tensor(lengths, dtype=torch.int64, device=device))


def brute_force_bounds(queries, keys_q, scales, lengths, k):
    """Per request, float64 from the dequantized keys: for each valid token the
    lowest and highest vote count any score error <= SCORE_TOL could give it,
    and its summed score."""
    D = queries.shape[-1]
    keys = keys_q.double() * scales.double()[..., None]                          # [B, Ly, N, H, D]
    logits = torch.einsum("blhd,blnhd->blhn", queries.double(), keys) / math.sqrt(D)  # [B, Ly, H, N]
    bounds = []
    for b, n in enumerate(lengths.tolist()):
        score = torch.softmax(logits[b, :, :, :n], dim=-1).mean(dim=1)          # [Ly, n]
        picks = min(k, n)
        above = score[:, None, :] > score[:, :, None] + 2 * SCORE_TOL           # [Ly, n, n]: u surely above t
        maybe = score[:, None, :] >= score[:, :, None] - 2 * SCORE_TOL          # u perhaps above t
        maybe = maybe & ~torch.eye(n, dtype=torch.bool)
        votes_low = (maybe.sum(-1) < picks).sum(0)                              # [n] surely in a layer's top-k
        votes_high = (above.sum(-1) < picks).sum(0)                             # [n] perhaps in it
        bounds.append((votes_low, votes_high, score.sum(0)))
    return bounds


def surely_above(bound, u, t, n_layers):
    """Token u outranks token t for every score error within the tolerance."""
    low, high, total = bound
    slack = 2 * n_layers * SCORE_TOL
    return bool(low[u] > high[t] or (low[u] == high[t] and total[u] > total[t] + slack))


def check_valid(chosen, lengths, k, bounds, n_layers):
    """Every pick is a well-formed index and no pick has k tokens surely above it."""
    for row, n, bound in zip(chosen.tolist(), lengths.tolist(), bounds):
        picks = min(k, n)
        real = row[:picks]
        assert row[picks:] == [-1] * (k - picks)
        assert real == sorted(set(real)) and all(0 <= t < n for t in real)
        for t in real:
            beaten_by = sum(surely_above(bound, u, t, n_layers) for u in range(n))
            assert beaten_by < picks, f"token {t} has {beaten_by} tokens surely above it, k={picks}"


def separated(chosen_row, n, bound, n_layers):
    """Every chosen token is surely above every other token: the answer is unambiguous."""
    inside = [t for t in chosen_row if t >= 0]
    outside = [u for u in range(n) if u not in inside]
    return all(surely_above(bound, t, u, n_layers) for t in inside for u in outside)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_reference_matches_brute_force(case, dtype, gen):
    B, Ly, N, H, D, lengths, k = case
    inputs = make_inputs(B, Ly, N, H, D, lengths, dtype, gen)
    chosen = select_visual_tokens(*inputs, k, impl="reference")
    assert chosen.shape == (B, k) and chosen.dtype == torch.int64
    check_valid(chosen, inputs[3], k, brute_force_bounds(*inputs, k), Ly)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_triton_matches_reference(case, dtype, device, gen):
    B, Ly, N, H, D, lengths, k = case
    inputs = make_inputs(B, Ly, N, H, D, lengths, dtype, gen, device)
    chosen = select_visual_tokens(*inputs, k, impl="triton").cpu()
    expected = select_visual_tokens(*inputs, k, impl="reference").cpu()
    cpu_inputs = [t.cpu() for t in inputs]
    bounds = brute_force_bounds(*cpu_inputs, k)
    check_valid(chosen, cpu_inputs[3], k, bounds, Ly)
    for b, n in enumerate(lengths):
        if separated(expected[b].tolist(), n, bounds[b], Ly):
            assert chosen[b].tolist() == expected[b].tolist()


@pytest.mark.parametrize("device_impl", [pytest.param("reference", id="reference"),
                                         pytest.param("triton", id="triton")])
def test_planted_tokens_win(device_impl, gen):
    """Tokens whose keys align with every layer's query win every vote: an unambiguous answer."""
    B, Ly, N, H, D, k = 2, 3, 129, 2, 16, 5
    planted = [[3, 17, 64, 100, 128], [0, 1, 2, 50, 77]]
    queries = torch.randn((B, Ly, H, D), generator=gen)                        # [B, Ly, H, D]
    keys = torch.randn((B, Ly, N, H, D), generator=gen)                        # [B, Ly, N, H, D]
    for b, tokens in enumerate(planted):
        keys[b, :, tokens] = 4 * queries[b, :, None]                           # large positive logits
    keys_q, scales = quantize_keys(keys.view(B * Ly, N, H, D), impl="reference")
    lengths = torch.tensor([129, 80])
    chosen = select_visual_tokens(queries, keys_q.view(B, Ly, N, H, D), scales.view(B, Ly, N, H),
                                  lengths, k, impl=device_impl)
    assert chosen.tolist() == planted
    bounds = brute_force_bounds(queries, keys_q.view(B, Ly, N, H, D), scales.view(B, Ly, N, H), lengths, k)
    assert all(separated(planted[b], int(lengths[b]), bounds[b], Ly) for b in range(B))


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_exact_ties_go_to_lower_indices(impl):
    """Zero queries score every token alike: every layer and the final ranking tie everywhere."""
    B, Ly, N, H, D, k = 2, 2, 37, 2, 16, 4
    keys_q, scales = quantize_keys(torch.randn(B * Ly, N, H, D), impl="reference")
    chosen = select_visual_tokens(torch.zeros(B, Ly, H, D), keys_q.view(B, Ly, N, H, D), scales.view(B, Ly, N, H),
                                  torch.tensor([37, 2]), k, impl=impl)
    assert chosen.tolist() == [[0, 1, 2, 3], [0, 1, -1, -1]]


def _inputs(B=2, Ly=2, N=7, H=2, D=16):
    keys_q, scales = quantize_keys(torch.randn(B * Ly, N, H, D), impl="reference")
    return dict(queries=torch.randn(B, Ly, H, D), keys_q=keys_q.view(B, Ly, N, H, D),
                scales=scales.view(B, Ly, N, H), lengths=torch.tensor([N] * B), k=3)


@pytest.mark.parametrize("change, name", [
    pytest.param(dict(queries=torch.randn(2, 2, 16)), "queries", id="queries-rank"),
    pytest.param(dict(queries=torch.randn(2, 2, 3, 16)), "keys_q", id="keys_q-H"),
    pytest.param(dict(keys_q=torch.zeros(2, 2, 7, 2, 16)), "keys_q", id="keys_q-dtype"),
    pytest.param(dict(scales=torch.ones(2, 2, 7, 2, dtype=torch.float16)), "scales", id="scales-dtype"),
    pytest.param(dict(scales=torch.ones(2, 2, 6, 2)), "scales", id="scales-N"),
    pytest.param(dict(lengths=torch.tensor([7, 8])), "lengths", id="lengths-above-N"),
    pytest.param(dict(lengths=torch.tensor([7, -1])), "lengths", id="lengths-negative"),
    pytest.param(dict(lengths=torch.tensor([7, 7], dtype=torch.int32)), "lengths", id="lengths-dtype"),
    pytest.param(dict(lengths=torch.tensor([7])), "lengths", id="lengths-B"),
    pytest.param(dict(k=0), "k", id="k-zero"),
    pytest.param(dict(k=2.5), "k", id="k-float"),
])
def test_bad_input_names_the_tensor(change, name):
    with pytest.raises(ValueError, match=name):
        select_visual_tokens(**{**_inputs(), **change})
