"""Predicted latency per engine mode, and what each vLLM rule moves.

For LLaVA-1.5-7B (SpecVLM acceptance preset, half the requests with one
image) and Llama-2-7B (text only, iid acceptance 0.7: an assumption, no
published preset is shipped for it) on the H100, Gamma CV 2 arrivals at
10%, 50% and 90% of the AR saturation rate of today's engine (``--engine
simspec``), it prints mean TTFT / TPOT / E2EL (ms) of every policy each
mode runs, and then the vLLM rules applied one at a time on top of the
simspec engine, with how much each moved linear:k=3's mean E2EL.

    python benchmarks/engine_modes.py [--requests N] [--seed S] [--models A,B]
"""

from __future__ import annotations

import argparse
import dataclasses

from simspec import config as configuration, experiment

LOADS = (0.1, 0.5, 0.9)
MODELS = {  # model: (acceptance, multimodal share)
    "LLaVA-1.5-7B": ("SpecVLM/LLaVA-1.5-7B", 0.5),
    "Llama-2-7B": ("iid:0.7", 0.0),
}
POLICIES = {
    "simspec": ("ar", "linear:k=3", "linear:k=5", "tree", "marginal"),
    "vllm": ("ar", "linear:k=3", "linear:k=5"),
    "sglang": ("ar", "linear:k=3", "linear:k=5", "tree"),
}
RULES = (  # vLLM's fields, added one at a time to the simspec engine (docs/engines.md)
    ("batch limits 1024 seqs / 8192 tokens", {"max_num_seqs": 1024, "max_num_batched_tokens": 8192}),
    ("drafter sees the full image", {"drafter_context": "full"}),
    ("drafter runs over prefill chunks", {"drafter_over_prefill": True}),
    ("CUDA graphs: padding and graph regimes", {"cudagraph_mode": "full_and_piecewise"}),
    ("vLLM's scheduling order, budget, lookahead", {"scheduler": "vllm"}),
    ("encoder budget per step", {"encoder_budget": "vllm"}),
    ("KV in 16-token blocks + drafter's KV layer", {"block_size": 16, "drafter_kv_layers": 1}),
    ("KV sized as vLLM's memory profile", {"memory": "vllm"}),
    ("prefix caching (this workload shares nothing)", {"prefix_caching": True}),
    ("async scheduling", {"async_scheduling": True}),
)


def scenario(model: str, kind: str, rate: float | None, requests: int, seed: int, policies=None):
    acceptance, share = MODELS[model]
    workload = {"num_requests": requests, "multimodal_share": share, "arrival": "gamma", "burstiness": 0.25}
    if rate is not None:
        workload["rate_per_s"] = rate
    flags = {"model": model, "device": "h100-sxm", "acceptance": acceptance, "seed": seed, "workload": workload,
             "engine": {"kind": kind}}
    if policies:
        flags["policies"] = list(policies)
    return configuration.build({}, flags)


def cell(m: dict) -> str:
    return f"{m['mean_ttft_ms']:7.1f} {m['mean_tpot_ms']:6.2f} {m['mean_e2el_ms']:8.1f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--models", default=",".join(MODELS))
    args = parser.parse_args()
    for model in args.models.split(","):
        base = scenario(model, "simspec", None, args.requests, args.seed, ["ar"])
        saturation = experiment.saturation_rate(base)
        own = {kind: experiment.saturation_rate(scenario(model, kind, None, args.requests, args.seed, ["ar"]))
               for kind in ("vllm", "sglang")}
        print(f"\n{model} on H100: AR saturation {saturation:.2f} req/s with --engine simspec "
              f"(vllm {own['vllm']:.2f}, sglang {own['sglang']:.2f}); "
              f"{experiment.cost_model_line(experiment.resolve(base), width=None)}")
        print(f"{'load':>5s} {'req/s':>6s}  {'engine':8s} {'policy':11s} {'TTFT':>7s} {'TPOT':>6s} {'E2EL':>8s}"
              f"  E2EL vs simspec")
        for load in LOADS:
            rate = load * saturation
            today = experiment.run(scenario(model, "simspec", rate, args.requests, args.seed,
                                            POLICIES["simspec"])).metrics
            for kind, names in POLICIES.items():
                m = today if kind == "simspec" else experiment.run(
                    scenario(model, kind, rate, args.requests, args.seed, names)).metrics
                for p in names:
                    moved = m[p]["mean_e2el_ms"] / today[p]["mean_e2el_ms"] - 1
                    print(f"{load:5.0%} {rate:6.2f}  {kind:8s} {p:11s} {cell(m[p])}  {moved:+7.1%}")
        print("\nvLLM's rules one at a time on the simspec engine, linear:k=3 (ar) mean E2EL, ms:")
        print(f"{'load':>5s}  {'rule':40s} {'linear:k=3':>10s} {'moved':>7s} {'ar':>8s} {'moved':>7s}")
        for load in LOADS:
            cfg = scenario(model, "simspec", load * saturation, args.requests, args.seed, ["ar", "linear:k=3"])
            before = experiment.run(cfg).metrics
            print(f"{load:5.0%}  {'simspec engine (today)':40s} {before['linear:k=3']['mean_e2el_ms']:10.1f} "
                  f"{'':7s} {before['ar']['mean_e2el_ms']:8.1f}")
            engine = cfg.engine
            for name, fields in RULES:
                engine = dataclasses.replace(engine, **fields)
                after = experiment.run(dataclasses.replace(cfg, engine=engine)).metrics
                moves = [after[p]["mean_e2el_ms"] / before[p]["mean_e2el_ms"] - 1 for p in ("linear:k=3", "ar")]
                print(f"{load:5.0%}  {'+ ' + name:40s} {after['linear:k=3']['mean_e2el_ms']:10.1f} {moves[0]:+7.1%} "
                      f"{after['ar']['mean_e2el_ms']:8.1f} {moves[1]:+7.1%}")
                before = after


if __name__ == "__main__":
    main()
