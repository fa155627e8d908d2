"""Speculation on a mixture of experts against a dense model of the same
active size: the predicted speedup of ``linear:k=3`` over AR, by decode
batch size, from the cost model's own step prices.

A round verifies 1 + k tokens per request; a sparse layer reads the
weights of every expert its tokens touch (E (1 - (1 - k_e / E)^T) of
them, uniform routing: simspec.costs.specs.ModelSpec.experts_touched), so
verification touches more experts than decoding one token, and costs more
on a mixture than on the dense model, until the batch touches every expert
anyway. The dense twin keeps the model's attention and gives every layer a
dense MLP of experts_per_token x the expert width (the same active
parameters).

speedup(B) = tau x AR step(B) / (verify step(B, k) + k drafter calls(B)),
tau = 1 + the expected accepted tokens of a k=3 chain (``--tau``; 2.13 is
the default acceptance preset's on the default scenario), contexts of
``--context`` tokens, the roofline prior on ``--device``.

    python benchmarks/moe_speculation.py [--device h100-sxm] [--tau 2.13] [--context 1000]
"""

from __future__ import annotations

import argparse
from dataclasses import replace

from simspec import costs

K = 3
BATCHES = (1, 2, 4, 8, 16, 32, 64, 128, 256)
PAIRS = (("Qwen3-30B-A3B", 1), ("Mixtral-8x7B", 2))  # (model, tp)


def dense_twin(model: costs.ModelSpec) -> costs.ModelSpec:
    return replace(model, name=f"{model.name} dense twin", experts=0, experts_per_token=0, expert_mlp_hidden=0,
                   shared_mlp_hidden=0, dense_layers=0,
                   mlp_hidden=model.experts_per_token * model.expert_mlp_hidden + model.shared_mlp_hidden)


def speedup(cost: costs.CostModel, batch: int, context: int, tau: float) -> float:
    kv = batch * context
    ar = cost.overhead_s + cost.forward_s(batch, kv, kv, batch, batch, kv)
    rows = batch * (1 + K)
    verify = cost.forward_s(rows, kv, rows * context, rows, batch, kv, verifying=True)
    draft = K * cost.draft_level_s(batch, 0) + cost.draft_s_per_round + batch * cost.draft_s_per_round_request
    return tau * ar / (cost.overhead_s + verify + draft)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="h100-sxm")
    parser.add_argument("--tau", type=float, default=2.13)
    parser.add_argument("--context", type=int, default=1000)
    args = parser.parse_args()
    gpu = costs.gpu_spec(args.device)
    print(f"predicted speedup of linear:k={K} over ar (tau {args.tau}, {args.context}-token contexts, roofline prior "
          f"on {gpu.name})")
    print(f"{'model':30} {'tp':>2} " + " ".join(f"{'B=' + str(b):>6}" for b in BATCHES))
    for name, tp in PAIRS:
        moe = costs.model_spec(name, tp=tp)
        for model in (moe, dense_twin(moe)):
            cost = costs.build("roofline", model, gpu)
            row = " ".join(f"{speedup(cost, b, args.context, args.tau):6.2f}" for b in BATCHES)
            print(f"{model.name:30} {tp:2d} {row}")
        touched = " ".join(f"{moe.experts_touched(b) / moe.experts:6.0%}" for b in BATCHES)
        print(f"{'  experts an AR step touches':30} {'':2} {touched}")


if __name__ == "__main__":
    main()
