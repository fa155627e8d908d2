"""Latency of simspec's kernels at serving shapes, as the profiler will see them.

On a CUDA GPU (Triton kernels, fp16, CUDA events):
- visual-token selection over 2880 visual tokens x 4 voting layers x 32 heads
  (D=128) for 32 requests, k=8; target < 0.1 ms;
- tree-verify attention (B=8, Q=60 tree nodes, L=2048 cached tokens, H=32,
  D=128) against ``torch.nn.functional.scaled_dot_product_attention`` with an
  explicit boolean mask of the same shape, as a ratio; target <= 1.3x;
- one drafter gated cross-attention step (B=32, Q=10 draft tokens, K=8 kept
  visual tokens, C=4096);
- int8 quantization of 2880 tokens x 32 heads x 128.

Without a GPU it runs the PyTorch references on the CPU (the Triton
interpreter is a correctness tool, far too slow to time) with smaller batches
where the full shape would not finish in a minute, and says so: CPU numbers
are not the GPU targets. It also prints how the references' cost per request
grows with the batch (1.0x: linear; the live engine on a CPU runs them, and
the profiler times them for the CPU cost model).

    python benchmarks/kernels_bench.py [--reps N]
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

from simspec_kernels.cross_attention import gated_cross_attention
from simspec_kernels.int8_cache import quantize_keys
from simspec_kernels.selection import select_visual_tokens
from simspec_kernels.tree_attention import tree_attention


def time_ms(fn, device: torch.device, reps: int, warmup: int) -> float:
    """Mean milliseconds per call after warm-up (CUDA events on GPU, perf_counter on CPU)."""
    for _ in range(warmup):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(reps):
            fn()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / reps
    begin = time.perf_counter()
    for _ in range(reps):
        fn()
    return (time.perf_counter() - begin) * 1e3 / reps


def random_tree(batch: int, nodes: int) -> torch.Tensor:
    """EAGLE-2 like draft trees: each node under one of the few most recent nodes (or the root)."""
    gen = torch.Generator().manual_seed(0)
    parents = torch.empty((batch, nodes), dtype=torch.int64)                  # [B, Q]
    for i in range(nodes):
        parents[:, i] = torch.randint(max(-1, i - 4), i, (batch,), generator=gen) if i else -1
    return parents


def selection_inputs(B, Ly, N, H, D, gen, device, dtype):
    """(queries, int8 keys, scales, lengths) of select_visual_tokens, every request N visual tokens."""
    queries = torch.randn((B, Ly, H, D), generator=gen, device=device, dtype=dtype)          # [B, Ly, H, D]
    keys_q = torch.randint(-127, 128, (B, Ly, N, H, D), generator=gen, device=device, dtype=torch.int8)
    scales = torch.rand((B, Ly, N, H), generator=gen, device=device) * 0.02 + 0.01          # [B, Ly, N, H]
    lengths = torch.full((B,), N, dtype=torch.int64, device=device)           # [B]
    return queries, keys_q, scales, lengths


def tree_inputs(B, Q, L, H, D, gen, device, dtype):
    """tree_attention's arguments: full caches of L tokens, full random trees of Q nodes."""
    q = torch.randn((B, Q, H, D), generator=gen, device=device, dtype=dtype)  # [B, Q, H, D]
    k_cache, v_cache = (torch.randn((B, L, H, D), generator=gen, device=device, dtype=dtype)
                        for _ in range(2))                                    # [B, L, H, D]
    k_tree, v_tree = (torch.randn((B, Q, H, D), generator=gen, device=device, dtype=dtype)
                      for _ in range(2))                                      # [B, Q, H, D]
    parents = random_tree(B, Q).to(device)                                    # [B, Q]
    cache_lengths = torch.full((B,), L, dtype=torch.int64, device=device)     # [B]
    tree_sizes = torch.full((B,), Q, dtype=torch.int64, device=device)        # [B]
    return q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes


def bench_selection(device, dtype, impl, reps, warmup, gen, batch):
    B, Ly, N, H, D, k = batch, 4, 2880, 32, 128, 8
    queries, keys_q, scales, lengths = selection_inputs(B, Ly, N, H, D, gen, device, dtype)
    ms = time_ms(lambda: select_visual_tokens(queries, keys_q, scales, lengths, k, impl=impl), device, reps, warmup)
    gbytes = keys_q.numel() / 1e9
    print(f"selection      B={B} Ly={Ly} N={N} H={H} D={D} k={k}: {ms:8.3f} ms"
          f"  ({gbytes:.2f} GB of int8 keys read: {gbytes / ms * 1e3:.3g} GB/s)")
    if device.type == "cuda":
        from simspec_kernels.selection import triton as kernel
        raw = time_ms(lambda: kernel.select_visual_tokens(queries, keys_q, scales, lengths, k), device, reps, warmup)
        print(f"               kernels only (no input checks): {raw:8.3f} ms; target < 0.1 ms"
              f" (reading {gbytes:.2f} GB at 4.8 TB/s alone takes {gbytes / 4.8:.3f} ms)")


def bench_tree(device, dtype, impl, reps, warmup, gen, batch, context):
    B, Q, L, H, D = batch, 60, context, 32, 128
    q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes = tree_inputs(B, Q, L, H, D, gen,
                                                                                        device, dtype)
    ms = time_ms(lambda: tree_attention(q, k_cache, v_cache, cache_lengths, k_tree, v_tree, parents, tree_sizes,
                                        impl=impl), device, reps, warmup)
    # The same attention through SDPA: keys [cache; tree] and an explicit boolean mask.
    from simspec_kernels.tree_attention.reference import ancestor_mask
    mask = torch.cat([torch.ones((B, Q, L), dtype=torch.bool, device=device),
                      ancestor_mask(parents, tree_sizes)], dim=-1)[:, None]   # [B, 1, Q, L+Q]
    qs = q.transpose(1, 2)                                                    # [B, H, Q, D]
    ks = torch.cat([k_cache, k_tree], 1).transpose(1, 2)                      # [B, H, L+Q, D]
    vs = torch.cat([v_cache, v_tree], 1).transpose(1, 2)                      # [B, H, L+Q, D]
    sdpa = time_ms(lambda: F.scaled_dot_product_attention(qs, ks, vs, attn_mask=mask), device, reps, warmup)
    target = "; target <= 1.3x" if device.type == "cuda" else ""
    print(f"tree verify    B={B} Q={Q} L={L} H={H} D={D}: {ms:8.3f} ms vs SDPA+mask {sdpa:8.3f} ms"
          f" = {ms / sdpa:.2f}x{target}")


def bench_drafter(device, dtype, impl, reps, warmup, gen, hidden_size):
    B, Q, K, C = 32, 10, 8, hidden_size
    H = C // 128
    hidden = torch.randn((B, Q, C), generator=gen, device=device, dtype=dtype)  # [B, Q, C]
    visual = torch.randn((B, K, C), generator=gen, device=device, dtype=dtype)  # [B, K, C]
    wq, wk, wv, wo = (torch.randn((C, C), generator=gen, device=device, dtype=dtype) / C**0.5
                      for _ in range(4))                                      # [C, C] each
    gate = torch.tensor(0.5, device=device)
    ms = time_ms(lambda: gated_cross_attention(hidden, visual, wq, wk, wv, wo, gate, H, impl=impl),
                 device, reps, warmup)
    print(f"drafter x-attn B={B} Q={Q} K={K} C={C} H={H}: {ms:8.3f} ms (4 CxC projections + attention core)")


def bench_quantize(device, dtype, impl, reps, warmup, gen):
    N, H, D = 2880, 32, 128
    keys = torch.randn((1, N, H, D), generator=gen, device=device, dtype=dtype)  # [1, N, H, D]
    ms = time_ms(lambda: quantize_keys(keys, impl=impl), device, reps, warmup)
    mbytes = keys.numel() * (keys.element_size() + 1) / 1e6
    print(f"int8 quantize  N={N} H={H} D={D}: {ms:8.3f} ms  ({mbytes:.1f} MB moved: {mbytes / ms:.3g} GB/s)")


def bench_batch_scaling(reps: int, gen) -> None:
    """Per-request time of the tree-attention and selection references at
    batch 1..8 (LLaVA-1.5-7B heads, one core), relative to batch 1."""
    from simspec_kernels.selection import reference as selection
    from simspec_kernels.tree_attention import reference as tree
    H, D, L, Q, N, Ly = 32, 128, 1024, 16, 576, 4
    cpu = torch.device("cpu")
    cases = {"tree verify": (tree.tree_attention, lambda B: tree_inputs(B, Q, L, H, D, gen, cpu, torch.float32)),
             "selection": (selection.select_visual_tokens,
                           lambda B: (*selection_inputs(B, Ly, N, H, D, gen, cpu, torch.float32), 8))}
    for name, (fn, inputs) in cases.items():
        base, cells = None, []
        for B in (1, 2, 4, 8):
            args = inputs(B)
            per_request = time_ms(lambda: fn(*args), cpu, reps, 1) / B
            base = base or per_request
            cells.append(f"B={B} {per_request:7.2f} ms ({per_request / base:.1f}x)")
        print(f"{name:14s} reference, per request: " + "  ".join(cells))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--reps", type=int, default=None, help="timed calls per kernel (default 100 GPU, 3 CPU)")
    args = parser.parse_args()
    if torch.cuda.is_available():
        device, dtype, impl = torch.device("cuda"), torch.float16, "triton"
        gen = torch.Generator(device=device).manual_seed(0)
        reps, warmup = args.reps or 100, 10
        import triton
        print(f"device: {torch.cuda.get_device_name(device)}; torch {torch.__version__}, triton {triton.__version__};"
              f" Triton kernels, fp16, CUDA events, {reps} calls after {warmup} warm-up")
        bench_selection(device, dtype, impl, reps, warmup, gen, batch=32)
        bench_tree(device, dtype, impl, reps, warmup, gen, batch=8, context=2048)
        bench_drafter(device, dtype, impl, reps, warmup, gen, hidden_size=4096)
        bench_quantize(device, dtype, impl, reps, warmup, gen)
        return
    device, dtype, impl = torch.device("cpu"), torch.float32, "reference"
    gen = torch.Generator().manual_seed(0)
    reps, warmup = args.reps or 3, 1
    print(f"device: CPU ({torch.get_num_threads()} threads); torch {torch.__version__}. NO GPU: timing the PyTorch"
          f" references in fp32, {reps} calls after {warmup} warm-up. These numbers are NOT the GPU targets.")
    print("smaller CPU shape: selection batch 2 (not 32: the fp32 reference would dequantize 6 GB of keys)")
    bench_selection(device, dtype, impl, reps, warmup, gen, batch=2)
    bench_tree(device, dtype, impl, reps, warmup, gen, batch=8, context=2048)
    bench_drafter(device, dtype, impl, reps, warmup, gen, hidden_size=4096)
    bench_quantize(device, dtype, impl, reps, warmup, gen)
    print("cost per request as the batch grows (tree: L=1024 Q=16; selection: N=576 Ly=4; H=32 D=128):")
    bench_batch_scaling(reps, gen)


if __name__ == "__main__":
    main()
