"""Tree attention, modelled on vLLM's tree-attention test: every node's output
equals plain attention over [cached context, its root-to-node path]; a chain
tree is linear causal verification; one node is decode attention; random
trees with odd shapes, GQA, ragged caches and trees, split caches; input checks."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from simspec_kernels.tree_attention import tree_attention
from simspec_kernels.tree_attention import triton as kernel

DTYPES = [pytest.param(torch.float32, id="fp32"), pytest.param(torch.float16, id="fp16"),
          pytest.param(torch.bfloat16, id="bf16")]
# (B, Q, H, Hkv, L, D, cache_lengths, tree_sizes)
CASES = [pytest.param(c, id="B{}-Q{}-H{}-Hkv{}-L{}-D{}-cache{}-tree{}".format(
             *c[:6], "_".join(map(str, c[6])), "_".join(map(str, c[7]))))
         for c in [(1, 1, 1, 1, 1, 16, (1,), (1,)),
                   (2, 7, 2, 2, 37, 16, (37, 0), (7, 4)),
                   (2, 37, 4, 2, 7, 32, (7, 3), (37, 20)),
                   (3, 7, 4, 1, 129, 16, (129, 64, 1), (7, 1, 0)),
                   (1, 129, 2, 1, 37, 16, (37,), (129,))]]


def random_parents(B, Q, gen):
    """Random topologically ordered trees: node i hangs under -1 or any earlier node."""
    parents = torch.empty((B, Q), dtype=torch.int64)                           # [B, Q]
    for i in range(Q):
        parents[:, i] = torch.randint(-1, i, (B,), generator=gen) if i else -1
    return parents


def make_inputs(B, Q, H, Hkv, L, D, cache_lengths, tree_sizes, dtype, gen, parents=None, device="cpu"):
    q = torch.randn((B, Q, H, D), generator=gen)                               # [B, Q, H, D]
    kv = [torch.randn((B, L, Hkv, D), generator=gen) for _ in range(2)]      # [B, L, Hkv, D]
    tree = [torch.randn((B, Q, Hkv, D), generator=gen) for _ in range(2)]    # [B, Q, Hkv, D]
    parents = random_parents(B, Q, gen) if parents is None else parents
    floats = [t.to(dtype).to(device) for t in (q, *kv, *tree)]
    ints = [torch.as_tensor(x, dtype=torch.int64).to(device) for x in (cache_lengths, parents, tree_sizes)]
    return floats[0], floats[1], floats[2], ints[0], floats[3], floats[4], ints[1], ints[2]


def path(parents_row, node):
    """Root-to-node path within the tree, node included."""
    nodes = []
    while node >= 0:
        nodes.append(node)
        node = int(parents_row[node])
    return nodes[::-1]


def path_attention(q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes):
    """Per node: SDPA (fp32) over [cache, root-to-node path]; zeros for padded nodes."""
    B, Q, H, D = q.shape
    group = H // k_cache.shape[2]
    out = torch.zeros((B, Q, H, D))                                            # [B, Q, H, D]
    for b in range(B):
        n = int(cache_lengths[b])
        for i in range(int(tree_sizes[b])):
            nodes = path(parents[b].tolist(), i)
            keys = torch.cat([k_cache[b, :n], k_tree[b, nodes]]).float().repeat_interleave(group, 1)    # [T, H, D]
            values = torch.cat([v_cache[b, :n], v_tree[b, nodes]]).float().repeat_interleave(group, 1)  # [T, H, D]
            out[b, i] = F.scaled_dot_product_attention(q[b, i, :, None].float(), keys.transpose(0, 1),
                                                       values.transpose(0, 1))[:, 0]
    return out


@pytest.mark.parametrize("case", CASES)
def test_reference_matches_path_attention(case, gen):
    inputs = make_inputs(*case, torch.float32, gen)
    torch.testing.assert_close(tree_attention(*inputs, impl="reference"), path_attention(*inputs),
                               atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("case", CASES)
def test_triton_matches_reference(case, dtype, device, tol, gen):
    inputs = make_inputs(*case, dtype, gen, device=device)
    out = tree_attention(*inputs, impl="triton")
    assert out.dtype == dtype and out.shape == inputs[0].shape
    torch.testing.assert_close(out.float(), tree_attention(*inputs, impl="reference").float(), **tol)
    padded = torch.arange(case[1], device=device) >= inputs[7][:, None]       # [B, Q]
    assert (out[padded] == 0).all()


@pytest.mark.parametrize("dtype", [pytest.param(torch.float32, id="fp32"), pytest.param(torch.bfloat16, id="bf16")])
def test_split_cache_matches_reference(dtype, device, tol, gen):
    """Long caches split across programs (flash-decoding) merge back to the same answer."""
    inputs = make_inputs(2, 7, 4, 2, 200, 16, (200, 70), (7, 5), dtype, gen, device=device)
    out = kernel.launch(*inputs, splits=3)
    torch.testing.assert_close(out.float(), tree_attention(*inputs, impl="reference").float(), **tol)


def test_cache_views_with_strides(device, gen):
    """The cache is a slice of a larger preallocated one, keys and values interleaved: no copies needed."""
    B, Q, H, Hkv, L, D = 2, 7, 4, 2, 37, 16
    q, _, _, cl, kt, vt, parents, sizes = make_inputs(B, Q, H, Hkv, L, D, (37, 20), (7, 3), torch.float32, gen,
                                                      device=device)
    store = torch.randn((B, 64, 2, Hkv, D), generator=gen).to(device)         # [B, Lmax, k|v, Hkv, D]
    k_cache, v_cache = store[:, :L, 0], store[:, :L, 1]                        # [B, L, Hkv, D] strided views
    out = tree_attention(q, k_cache, v_cache, cl, kt, vt, parents, sizes, impl="triton")
    expected = tree_attention(q, k_cache.contiguous(), v_cache.contiguous(), cl, kt, vt, parents, sizes,
                              impl="reference")
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_chain_tree_is_linear_verification(impl, gen):
    B, Q, H, Hkv, L, D = 2, 7, 4, 2, 37, 16
    chain = torch.arange(-1, Q - 1).expand(B, Q)                               # [B, Q] node i under i - 1
    q, kc, vc, cl, kt, vt, parents, sizes = make_inputs(B, Q, H, Hkv, L, D, (L, L), (Q, Q), torch.float32, gen,
                                                        parents=chain)
    out = tree_attention(q, kc, vc, cl, kt, vt, parents, sizes, impl=impl)
    keys = torch.cat([kc, kt], 1).repeat_interleave(H // Hkv, 2).transpose(1, 2)     # [B, H, L+Q, D]
    values = torch.cat([vc, vt], 1).repeat_interleave(H // Hkv, 2).transpose(1, 2)   # [B, H, L+Q, D]
    causal = torch.ones(Q, L + Q, dtype=torch.bool).tril(diagonal=L)                 # [Q, L+Q]
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values, attn_mask=causal).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_single_node_is_decode_attention(impl, gen):
    B, H, Hkv, L, D = 3, 4, 4, 129, 32
    q, kc, vc, cl, kt, vt, parents, sizes = make_inputs(B, 1, H, Hkv, L, D, (L, L, L), (1, 1, 1),
                                                        torch.float32, gen)
    out = tree_attention(q, kc, vc, cl, kt, vt, parents, sizes, impl=impl)
    keys = torch.cat([kc, kt], 1).transpose(1, 2)                              # [B, H, L+1, D]
    values = torch.cat([vc, vt], 1).transpose(1, 2)                            # [B, H, L+1, D]
    expected = F.scaled_dot_product_attention(q.transpose(1, 2), keys, values).transpose(1, 2)
    torch.testing.assert_close(out, expected, atol=1e-5, rtol=1e-5)


def _args():
    q, kc, vc, cl, kt, vt, parents, sizes = make_inputs(2, 5, 4, 2, 9, 16, (9, 3), (5, 2), torch.float32,
                                                        torch.Generator().manual_seed(0))
    return dict(q=q, k_cache=kc, v_cache=vc, cache_lengths=cl, k_tree=kt, v_tree=vt, parents=parents,
                tree_sizes=sizes)


@pytest.mark.parametrize("change, name", [
    pytest.param(dict(q=torch.zeros(2, 5, 4)), "q", id="q-rank"),
    pytest.param(dict(k_cache=torch.zeros(2, 9, 3, 16)), "k_cache", id="H-not-multiple-of-Hkv"),
    pytest.param(dict(v_cache=torch.zeros(2, 8, 2, 16)), "v_cache", id="v_cache-L"),
    pytest.param(dict(k_tree=torch.zeros(2, 5, 2, 32)), "k_tree", id="k_tree-D"),
    pytest.param(dict(v_tree=torch.zeros(2, 5, 2, 16, dtype=torch.float16)), "v_tree", id="v_tree-dtype"),
    pytest.param(dict(cache_lengths=torch.tensor([10, 3])), "cache_lengths", id="cache-above-L"),
    pytest.param(dict(tree_sizes=torch.tensor([6, 2])), "tree_sizes", id="tree-above-Q"),
    pytest.param(dict(parents=torch.tensor([[-1, 0, 2, 0, 1], [-1, 0, 0, 0, 0]])), "parents", id="parent-not-before"),
    pytest.param(dict(parents=torch.tensor([[-1, 0, 1, -2, 1], [-1, 0, 0, 0, 0]])), "parents",
                 id="parent-below-minus-1"),
    pytest.param(dict(parents=torch.zeros(2, 5, dtype=torch.int32)), "parents", id="parents-dtype"),
])
def test_bad_input_names_the_tensor(change, name):
    with pytest.raises(ValueError, match=name):
        tree_attention(**{**_args(), **change})


@pytest.mark.parametrize("impl", ["reference", "triton"])
def test_padded_parents_are_ignored(impl):
    """Parents of padded nodes may hold anything (here: out of range); they are never read."""
    args = _args()
    out = tree_attention(**args, impl=impl)
    args["parents"] = args["parents"].clone()
    args["parents"][1, 2:] = torch.tensor([7, 9, -5])                           # request 1 has 2 valid nodes
    torch.testing.assert_close(tree_attention(**args, impl=impl), out, atol=0, rtol=0)
