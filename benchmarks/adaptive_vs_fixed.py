"""Are the load-adaptive policies ever worse than the fixed chains they choose among?

On the default scenario (LLaVA-1.5-7B on H100, ``simspec simulate``'s
defaults), at each load of the dashboard's grid (0.25x to 1.5x of the AR
saturation rate) under Poisson and Gamma CV 2 arrivals, and on the Azure
LLM 2023 conversation trace (shared/data/traces), it serves the same
requests with ``ar``, ``linear:k=1..5`` and the adaptive policies, and
prints each adaptive policy's mean and p99 E2EL over the best fixed
option's (the fixed policy with the lowest mean, and the lowest p99), with
the paired difference of the means over the same requests and its
standard error. A cell passes when both ratios are at most 1.02.

    python benchmarks/adaptive_vs_fixed.py [--requests 400] [--jobs 2] [--seed 0] [--seeds 1] [--no-trace]
                                           [--trace PATH] [--adaptive marginal,goodput,truncate]

``--seeds N`` serves each cell with N seeds (seed .. seed + N - 1: other
arrivals, difficulties and draws at the same load) and pools their
requests, so a cell's p99 rests on N times as many requests: the p99 of
400 or 2,000 requests is their 4 or 20 longest, and moves by several
percent from seed to seed, more than the 2% bound.
"""

from __future__ import annotations

import argparse
import sys
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))

from simspec import config as configuration, experiment  # noqa: E402

LOADS = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)  # x AR saturation: the dashboard's grid (dashboard/whatif.py)
ARRIVALS = {"poisson": 1.0, "gamma CV 2": 0.25}  # burstiness (Gamma shape)
FIXED = ("ar", "linear:k=1", "linear:k=2", "linear:k=3", "linear:k=4", "linear:k=5")
ADAPTIVE = ("marginal", "goodput", "truncate")
TOLERANCE = 1.02


@dataclass(frozen=True)
class Cell:
    label: str
    mean_ms: dict  # policy -> mean E2EL
    p99_ms: dict  # policy -> p99 E2EL
    e2el_s: dict  # policy -> per-request E2EL (same requests, same order)

    def best_fixed(self, stat: str) -> str:
        table = self.mean_ms if stat == "mean" else self.p99_ms
        return min(FIXED, key=lambda p: table[p])

    def ratios(self, policy: str) -> tuple[float, float]:
        """(mean ratio, p99 ratio) of ``policy`` over the best fixed option."""
        return (self.mean_ms[policy] / self.mean_ms[self.best_fixed("mean")],
                self.p99_ms[policy] / self.p99_ms[self.best_fixed("p99")])

    def paired(self, policy: str) -> tuple[float, float]:
        """Mean of the per-request E2EL differences against the best fixed
        option by mean, relative to that option's mean, and its s.e."""
        base = self.e2el_s[self.best_fixed("mean")]
        diff = self.e2el_s[policy] - base
        return diff.mean() / base.mean(), diff.std(ddof=1) / np.sqrt(len(diff)) / base.mean()

    def passes(self, policy: str) -> bool:
        mean, p99 = self.ratios(policy)
        return mean <= TOLERANCE and p99 <= TOLERANCE


def config_for(flags: dict, policies=FIXED + ADAPTIVE):
    return configuration.build(flag_values={**flags, "policies": list(policies)})


def run_cell(label: str, flags: dict, policies=FIXED + ADAPTIVE) -> Cell:
    """Serve the cell's requests with each of ``policies``."""
    results = experiment.run(config_for(flags, policies), event_detail=False)
    e2el = {}
    for log in results.logs:
        table = log.table
        e2el[log.policy] = np.asarray(table.finish_s - table.arrival_s)
    return Cell(label, {p: m["mean_e2el_ms"] for p, m in results.metrics.items()},
                {p: m["p99_e2el_ms"] for p, m in results.metrics.items()}, e2el)


def pooled(cells: list[Cell]) -> Cell:
    """One cell of several seeds' cells: their requests together (each
    policy's in the same order), mean and p99 over them all (numpy's
    linear percentile, as simspec.metrics)."""
    if len(cells) == 1:
        return cells[0]
    e2el = {p: np.concatenate([c.e2el_s[p] for c in cells]) for p in cells[0].e2el_s}
    return Cell(cells[0].label, {p: float(x.mean() * 1e3) for p, x in e2el.items()},
                {p: float(np.percentile(x, 99) * 1e3) for p, x in e2el.items()}, e2el)


def grid(requests: int, saturation: float, seed: int = 0, mix: str | None = None) -> list[tuple[str, dict]]:
    cells = []
    classes = {"mix": mix} if mix else {}
    for arrival, shape in ARRIVALS.items():
        for load in LOADS:
            cells.append((f"{arrival} {load:.2f}x", {"seed": seed, "workload": {
                "arrival": "gamma", "burstiness": shape, "rate_per_s": load * saturation, "num_requests": requests,
                **classes}}))
    return cells


def _run(args):
    return run_cell(*args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=400)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0, help="the synthetic cells' (first) seed")
    parser.add_argument("--seeds", type=int, default=1, help="seeds a cell, their requests pooled")
    parser.add_argument("--no-trace", action="store_true")
    parser.add_argument("--trace", default=None, help="default: shared/data/traces/azure_llm_2023_conv.csv")
    parser.add_argument("--adaptive", default=",".join(ADAPTIVE), help="the policies compared, comma-separated")
    parser.add_argument("--mix", default=None, help="request classes, as simspec simulate --mix (e.g. spec-bench)")
    args = parser.parse_args()
    adaptive = tuple(args.adaptive.split(","))
    saturation = experiment.saturation_rate(configuration.build())
    seeds = range(args.seed, args.seed + args.seeds)
    print(f"AR saturation: {saturation:.2f} req/s; {args.requests} requests a cell"
          + (f" x {args.seeds} seeds ({seeds.start}-{seeds.stop - 1}), pooled" if args.seeds > 1 else "")
          + f"; pass: mean and p99 E2EL <= {TOLERANCE:.2f}x the best of {', '.join(FIXED)}")
    cells = [cell for s in seeds for cell in grid(args.requests, saturation, s, args.mix)]
    if not args.no_trace:
        from _shared import shared_file
        trace = args.trace or str(shared_file("traces", "azure_llm_2023_conv.csv"))
        cells += [("azure conv trace", {"seed": s, "workload": {
            "arrival": "trace", "trace_path": trace, "num_requests": None, "duration_s": None,
            **({"mix": args.mix} if args.mix else {})}}) for s in seeds]
    with ProcessPoolExecutor(args.jobs) as pool:
        served = list(pool.map(_run, [(label, flags, FIXED + adaptive) for label, flags in cells]))
    results = [pooled([c for c in served if c.label == label]) for label in dict.fromkeys(c.label for c in served)]
    header = f"{'cell':18s} {'best mean':>11s} {'best p99':>11s}" + "".join(
        f"  {p + ' mean/p99 (paired)':>34s}" for p in adaptive)
    print(header)
    passed = {p: 0 for p in adaptive}
    for cell in results:
        row = f"{cell.label:18s} {cell.best_fixed('mean'):>11s} {cell.best_fixed('p99'):>11s}"
        for p in adaptive:
            mean, p99 = cell.ratios(p)
            diff, se = cell.paired(p)
            ok = cell.passes(p)
            passed[p] += ok
            row += f"  {mean:6.3f} /{p99:6.3f} ({diff:+6.1%} +-{se:4.1%}) {'ok' if ok else '--':>2s}"
        print(row, flush=True)
    print("cells passed: " + ", ".join(f"{p} {passed[p]}/{len(results)}" for p in adaptive))


if __name__ == "__main__":
    main()
