"""How long a policy takes to plan one step, by decode batch size.

Times ``rules.plan_batch`` for ``marginal`` (or ``--policy``, with its defaults) inside a
compiled loop (no Python call per plan) on random decode batches of the
default scenario's shape (LLaVA-1.5-7B on the H100 roofline prior,
contexts 200-3,000 tokens, drafter confidences falling with rank),
and prints microseconds a plan and the nodes it verifies. Run it against
two checkouts (PYTHONPATH) to compare planners (the same machine and moment for both).
Each size is timed ``--repeats`` times and the fastest kept: on a shared or
virtual machine one timing moves by tens of percent from run to run, the
fastest far less.

    python benchmarks/planner_speed.py [--policy marginal] [--sizes 1,8,32,64,128,256] [--batches 20]
                                       [--cost-model roofline] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import numba  # noqa: E402
import numpy as np  # noqa: E402

from simspec import costs, policies  # noqa: E402
from simspec.policies import rules  # noqa: E402


@numba.njit
def _plans(policy: int, params: np.ndarray, batch, tables, repeat: int) -> int:
    nodes = 0
    for _ in range(repeat):
        nodes += rules.plan_batch(policy, params, batch, tables).num_nodes.sum()
    return nodes


def random_batch(rng: np.random.Generator, b: int, depth: int = 8, ranks: int = 10) -> rules.Batch:
    top = rng.uniform(0.3, 0.95, (b, depth))
    conf = np.empty((b, depth, ranks))
    conf[:, :, 0] = top
    for r in range(1, ranks):
        conf[:, :, r] = np.minimum(conf[:, :, r - 1], (1 - top) * 0.3 * 0.5 ** (r - 1))
    visual = rng.choice([0, 576], b)
    return rules.Batch(
        context_tokens=rng.integers(200, 3000, b), visual_tokens=visual, kept_visual_tokens=np.where(visual > 0, 8, 0),
        remaining_tokens=rng.integers(1, 300, b), recent_accepted=rng.uniform(0.5, 4.0, b), conf=conf,
        true_ranks=np.zeros((b, depth), dtype=np.int64), prefill_tokens=0, prefill_attn_pairs=0,
        prefill_kv_tokens=0, prefill_requests=0, vision_tokens=0, prefill_max_context=0)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--policy", default="marginal", help="a policy spec, as simspec simulate --policy takes")
    parser.add_argument("--sizes", default="1,8,32,64,128,256")
    parser.add_argument("--batches", type=int, default=20, help="random batches a size")
    parser.add_argument("--cost-model", default="roofline")
    parser.add_argument("--seconds", type=float, default=0.5, help="timed per batch size and repeat")
    parser.add_argument("--repeats", type=int, default=5, help="timings a size; the fastest is printed")
    args = parser.parse_args()
    spec = policies.parse(args.policy)
    params = spec.params()
    tables = costs.build(args.cost_model, costs.model_spec("LLaVA-1.5-7B"), costs.gpu_spec("h100-sxm")).tables
    rng = np.random.default_rng(0)
    print(f"{args.policy} plan_batch, {args.cost_model}; load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'batch':>6s} {'us/plan':>9s} {'nodes/plan':>11s}")
    for b in (int(s) for s in args.sizes.split(",")):
        batches = [random_batch(rng, b) for _ in range(args.batches)]
        _plans(spec.kernel, params, batches[0], tables, 1)  # compile or load
        nodes = [_plans(spec.kernel, params, x, tables, 1) for x in batches]
        started = time.perf_counter()
        _plans(spec.kernel, params, batches[0], tables, 3)
        once_s = (time.perf_counter() - started) / 3
        repeat = max(1, int(args.seconds / args.batches / max(once_s, 1e-7)))
        us = np.inf
        for _ in range(args.repeats):
            started = time.perf_counter()
            for x in batches:
                _plans(spec.kernel, params, x, tables, repeat)
            us = min(us, (time.perf_counter() - started) / (repeat * len(batches)) * 1e6)
        print(f"{b:6d} {us:9.1f} {np.mean(nodes):11.1f}", flush=True)


if __name__ == "__main__":
    main()
