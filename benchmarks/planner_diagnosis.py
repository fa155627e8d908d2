"""What each adaptive planner predicts for its own plan and for the fixed chains, batch by batch.

For decode batches recorded from the default scenario (LLaVA-1.5-7B on
H100, Gamma CV 2 at 12 req/s; tests/data/planner/recorded_12rps.npz, or
``--record`` to record them afresh), it plans each batch with every
adaptive policy and with ``linear:k=1..3`` and prints, per plan: draft
tokens, draft depth, the expected accepted tokens by the planner's
valuations (history: goodput's alpha^d; confidence: the drafter's path
confidences) and by the acceptance model's true probabilities, the step's
seconds as the simulator's formula charges it (a request's first drafter
call priced as one row, as the planners price it), and the step's tokens
per second by the confidences and by the truth. An adaptive plan whose
predicted rate is below a chain's is a planner that does not find its own
best option.

    python benchmarks/planner_diagnosis.py [--batches FILE.npz] [--record N]
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
RECORDED = ROOT / "tests" / "data" / "planner" / "recorded_12rps.npz"
PLANS = ("marginal", "goodput:k_max=7", "truncate:k_max=7", "linear:k=1", "linear:k=2", "linear:k=3")


def load(path: Path) -> list[dict]:
    """Recorded batches: {field: array} each, with the draw's true ranks and top-1 probabilities."""
    data = np.load(path)
    sizes = sorted({key.split("_", 1)[0] for key in data.files}, key=lambda s: int(s[1:]))
    return [{key.split("_", 1)[1]: data[key] for key in data.files if key.startswith(size + "_")} for size in sizes]


def record(requests: int, out: Path) -> None:
    """Serve the scenario with marginal in pure Python (NUMBA_DISABLE_JIT) and keep every 97th
    decode batch of 8 or more requests with its draw."""
    os.environ["NUMBA_DISABLE_JIT"] = "1"
    from simspec import config as configuration, experiment, policies
    from simspec.sim import simulate, steps

    config = configuration.build(flag_values={"workload": {"rate_per_s": 12.0, "num_requests": requests}})
    scenario = experiment.resolve(config)
    plan_batch, draw_round = steps.rules.plan_batch, steps.draw_round
    last, kept, calls = {}, {}, [0]

    def draw(*args):
        conf, true_ranks, p1 = draw_round(*args)
        last.update(true_ranks=true_ranks, p1=p1)
        return conf, true_ranks, p1

    def plan(kernel, params, batch, tables):
        calls[0] += 1
        b = len(batch.context_tokens)
        if b >= 8 and calls[0] % 97 == 0:
            fields = dict(batch._asdict(), true_ranks=last["true_ranks"].copy(), p1=last["p1"].copy())
            kept.update({f"b{b}n{calls[0]}_{k}": np.asarray(v) for k, v in fields.items()})
        return plan_batch(kernel, params, batch, tables)

    steps.draw_round, steps.rules.plan_batch = draw, plan
    simulate(scenario.requests, policy=policies.parse("marginal"), costs=scenario.costs,
             acceptance=scenario.acceptance, engine=config.engine, kv_budget_tokens=scenario.kv_budget_tokens,
             seed=config.seed)
    np.savez_compressed(out, **kept)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batches", type=Path, default=RECORDED)
    parser.add_argument("--record", type=int, default=0, metavar="N",
                        help="record afresh from N requests (pure Python: ~15 s for 400) into --batches")
    args = parser.parse_args()
    if args.record:
        record(args.record, args.batches)
    sys.path.insert(0, str(ROOT / "tests"))
    from test_marginal_planner import conf_value, history_value, rank_at, step_s
    from simspec import config as configuration, experiment, policies, trees
    from simspec.policies import rules

    scenario = experiment.resolve(configuration.build())
    model, tail = scenario.costs, scenario.acceptance.draws.tail

    def true_value(batch, plan, p1):
        total = 0.0
        for i in range(len(plan.num_nodes)):
            for code in plan.codes[i, :plan.num_nodes[i]]:
                path = 1.0
                for d in range(1, trees.depth(code) + 1):
                    r = rank_at(code, d)
                    path *= p1[i, d - 1] if r == 1 else (1 - p1[i, d - 1]) * tail[r - 2]
                total += path
        return total

    print(f"{'B':>3s} {'plan':17s} {'drafts':>6s} {'D':>2s} {'history':>7s} {'conf':>6s} {'true':>6s} "
          f"{'step ms':>7s} {'conf tok/s':>10s} {'true tok/s':>10s}")
    for fields in load(args.batches):
        p1 = fields.pop("p1")
        fields["true_ranks"] = np.zeros_like(fields["true_ranks"])
        batch = rules.Batch(**{k: (v.item() if v.ndim == 0 else v) for k, v in fields.items()})
        b = len(batch.context_tokens)
        for spec in PLANS:
            policy = policies.parse(spec)
            plan = rules.plan_batch(policy.kernel, policy.params(), batch, model.tables)
            seconds = step_s(model, batch, plan)
            conf, true = conf_value(batch, plan), true_value(batch, plan, p1)
            print(f"{b:3d} {spec:17s} {plan.num_nodes.sum():6d} {plan.draft_steps.max():2d} "
                  f"{history_value(batch, plan):7.1f} {conf:6.1f} {true:6.1f} {seconds * 1e3:7.2f} "
                  f"{(b + conf) / seconds:10.0f} {(b + true) / seconds:10.0f}")
        print()


if __name__ == "__main__":
    main()
