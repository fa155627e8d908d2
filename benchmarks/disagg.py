"""Prefill/decode disaggregation against colocated replicas on the same GPUs.

    python benchmarks/disagg.py [--gpus N] [--rate X] [--requests R] [--policy NAME] [--model M --tp T]

N GPUs' worth of replicas of the default scenario (LLaVA-1.5-7B on H100), Poisson arrivals, seed 0:
colocated behind least_requests, then every prefill:decode split of them, the KV cache over each
link (simspec.fleet.groups.LINKS). Prints mean and p99 TTFT, mean TPOT, mean and p99 E2EL (ms) and the
mean transfer. A benchmark, not a test: docs/fleets.md quotes it.
"""

from __future__ import annotations

import argparse

from simspec import config, costs, experiment
from simspec.fleet import groups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpus", type=int, default=4, help="replicas in all (each of --tp GPUs)")
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--requests", type=int, default=2000)
    parser.add_argument("--policy", default="linear:k=3")
    parser.add_argument("--model", default="LLaVA-1.5-7B")
    parser.add_argument("--tp", type=int, default=1)
    args = parser.parse_args()
    base = {"model": args.model, "tp": args.tp, "policies": [args.policy], "router": "least_requests",
            "workload": {"arrival": "poisson", "rate_per_s": args.rate, "num_requests": args.requests,
                         **({} if costs.model_spec(args.model).multimodal else {"multimodal_share": 0.0})}}
    print(f"{args.gpus} replicas of {args.model} at tp {args.tp} on h100-sxm, {args.policy}, {args.rate:g} req/s "
          f"Poisson, {args.requests} requests, least_requests, seed 0 (ms)")
    print("| fleet | link | mean TTFT | p99 TTFT | mean TPOT | mean E2EL | p99 E2EL | mean transfer |\n"
          "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    runs = [("colocated", None, {"replicas": args.gpus})]
    for p in range(1, args.gpus):
        split = groups.groups_of([{"name": "p", "replicas": p, "role": "prefill"},
                                  {"name": "d", "replicas": args.gpus - p, "role": "decode"}], "benchmark")
        runs += [(f"{p} prefill + {args.gpus - p} decode", link, {"fleet": split, "kv_link": link})
                 for link in groups.LINKS]
    for name, link, shape in runs:
        results = experiment.run(config.build({}, {**base, **shape}), event_detail=False)
        m = results.metrics[args.policy]
        moved = f"{results.fleets[0].transfer_s.mean() * 1e3:.2f}" if link else ""
        print(f"| {name} | {link or ''} | {m['mean_ttft_ms']:.0f} | {m['p99_ttft_ms']:.0f} | {m['mean_tpot_ms']:.2f} | "
              f"{m['mean_e2el_ms']:.0f} | {m['p99_e2el_ms']:.0f} | {moved} |")


if __name__ == "__main__":
    main()
