"""``simspec validate``: calibration from live runs, and the comparison of
simulation against live serving.

Imports: numpy, pandas, matplotlib, torch (through simspec.live),
simspec.sim, simspec.experiment and the calibration fits. DESIGN.md
"Validation". It sits above both the simulator and the live engine.

Validation: calibrate on one workload (its own seed: different images,
questions, output lengths and arrivals), then serve a **different** workload
live and in simulation with every policy at several loads, and compare every
metric. The simulator gets the cost model fitted to the calibration run's
steps and the acceptance model fitted to its acceptance traces; the
validation run's measurements never reach it.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Sequence

import numpy as np
import pandas as pd
from tqdm import tqdm

from simspec import metrics, policies, workloads
from simspec.acceptance import fit as acceptance_fit
from simspec.costs import steps as step_costs
from simspec.costs.steps import StepCostFit
from simspec.models.config import LIVE_MODEL
from simspec.profiling.runner import describe_device
from simspec.experiment import burst_rate, rate_at_load
from simspec.files import write_atomic, write_png, write_text
from simspec.seeds import derived_seed
from simspec.acceptance import AcceptanceModel
from simspec.costs import CostModel, affine
from simspec.live.engine import LiveConfig, LiveResult
from simspec.live.run import Models, live_workload, serve_live, warm_up, drafter_top1
from simspec.models.task import Example
from simspec.sim import EngineConfig, simulate
from simspec.types import Request, RunLog

COMPARED = [f"{stat}_{name}_ms" for name in ("ttft", "tpot", "e2el") for stat in ("mean", "median", "p95", "p99")] + [
    "request_throughput", "output_throughput", "spec_decode_acceptance_length"]
BOUNDS = {"mean_e2el_ms": 0.05, "mean_tpot_ms": 0.05, "output_throughput": 0.05, "p95_e2el_ms": 0.10,
          "mean_ttft_ms": 0.10}
"""The issue's bounds on |sim / live - 1|, per metric."""


def engine_config(live: LiveConfig) -> EngineConfig:
    """The simulator's engine settings for the live engine's."""
    return EngineConfig(max_num_seqs=live.max_num_seqs, max_num_batched_tokens=live.max_num_batched_tokens,
                        kv_cache_tokens=1 << 20, drafter_context=live.drafter_context, drafting="chain")


def simulate_mean(requests: Sequence[Request], policy: str, costs: CostModel, acceptance: AcceptanceModel,
                  engine: EngineConfig, seeds: int) -> tuple[dict[str, float], RunLog]:
    """The simulator's metrics averaged over ``seeds`` acceptance seeds (the
    live run is one draw of the models' acceptance; the simulator's mean is
    its prediction), and the first seed's log."""
    logs = [simulate(list(requests), policy=policies.parse(policy), label=policy, costs=costs,
                     acceptance=acceptance, engine=engine, kv_budget_tokens=1 << 20, seed=s) for s in range(seeds)]
    rows = [metrics.summarize(log) for log in logs]
    return {k: float(np.mean([r[k] for r in rows])) for k in rows[0]}, logs[0]


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateConfig:
    policies: tuple[str, ...] = ("ar", "linear:k=3", "tree:depth=4,topk=3,budget=12", "truncate", "marginal")
    loads: tuple[float, ...] = (0.25, 0.5, 0.75)  # x the live engine's AR saturation rate (simulated)
    burstiness: float = 0.25  # Gamma shape: CV 2 arrivals
    requests: int = 160  # per validation run
    calibration_requests: int = 100  # per policy in the calibration run
    calibration_load: float = 0.6
    output_mean_tokens: float = 40.0
    output_cv: float = 0.6
    sim_seeds: int = 5
    seed: int = 1  # validation workloads; calibration derives its own (simspec.seeds)
    speed_probes: bool = True  # time a fixed AR burst around each live run; scale the simulated step costs by it
    repeats: int = 1  # live runs of each policy and load, taken round the policies; the live value is their mean
    live: LiveConfig = LiveConfig()


QUICK = ValidateConfig(policies=("ar", "linear:k=3", "marginal"), loads=(0.3, 0.75), requests=80,
                       calibration_requests=60)


def _workload(v: ValidateConfig, rate: float, n: int, arrival: str) -> workloads.WorkloadConfig:
    return workloads.WorkloadConfig(arrival=arrival, rate_per_s=rate, burstiness=v.burstiness, num_requests=n,
                                    output_mean_tokens=v.output_mean_tokens, output_cv=v.output_cv)


def validation_workload(v: ValidateConfig, rate: float = 1.0) -> workloads.WorkloadConfig:
    """The workload served live and simulated at every load (Gamma arrivals, CV 1/sqrt(burstiness))."""
    return _workload(v, rate, v.requests, "gamma")


def calibrate(models: Models, v: ValidateConfig,
              progress: bool = True) -> tuple[CostModel, AcceptanceModel, Calibration, pd.DataFrame]:
    """Serve the calibration workloads live with every policy; fit the step
    costs and the acceptance model. The seeds are derived from the validation
    seed (simspec.seeds: calibration-poisson, calibration-gamma,
    capacity-burst): no request, image or arrival of validation. The
    last value is every calibration step (StepRecord's fields and the
    policy that ran it), in the order they ran."""
    steps, traces, ran = [], [], []
    guess = affine(1.0, 0.05)
    v = replace(v, live=replace(v.live, prior_top1=drafter_top1(models, v.live.drafter_context)))
    # A first capacity estimate from a short AR burst (all requests at t=0).
    requests, examples = burst_workload(v)
    burst = serve_live(models, "ar", requests, examples, guess, v.live)
    capacity = len(requests) / burst.log.end_s
    # Two calibration workloads of their own seeds: Poisson arrivals at
    # calibration_load of that guess, and bursty (Gamma CV 2) ones at half of it.
    workloads_ = [live_workload(_workload(v, v.calibration_load * capacity, v.calibration_requests, "poisson"),
                                derived_seed(v.seed, "calibration-poisson")),
                  live_workload(_workload(v, 0.5 * v.calibration_load * capacity, v.calibration_requests, "gamma"),
                                derived_seed(v.seed, "calibration-gamma"))]
    bar = tqdm(v.policies, desc="calibrate", disable=not progress, leave=False)
    for spec in bar:
        for requests, examples in workloads_:
            result = serve_live(models, spec, requests, examples, guess, v.live)
            steps += result.steps
            traces += result.traces
            ran += [spec] * len(result.steps)
    steps += burst.steps
    ran += ["ar (capacity burst)"] * len(burst.steps)
    kind = next(models.target.parameters()).device.type
    cost_model, fit = step_costs.fit_step_costs(steps, f"fitted to live engine steps ({kind})", model=LIVE_MODEL,
                                                device=describe_device(kind)[1])
    acceptance = acceptance_fit.fit_acceptance(traces, name="calibrated:live")
    table = pd.DataFrame([asdict(s) for s in steps]).assign(policy=ran)
    return cost_model, acceptance, Calibration(fit=fit, traces=len(traces), steps=len(steps),
                                               capacity_guess_req_s=capacity), table


def burst_workload(v: ValidateConfig) -> tuple[list[Request], list[Example]]:
    """16 requests at once, of calibration's own seed: calibration's first
    capacity guess and the speed probe."""
    return live_workload(_workload(v, 1000.0, 16, "poisson"), derived_seed(v.seed, "capacity-burst"))


def speed_probe(models: Models, v: ValidateConfig, burst: tuple[list[Request], list[Example]]) -> float:
    """Seconds this machine takes now to serve ``burst`` (:func:`burst_workload`)
    with AR. On a shared machine the live engine's speed drifts by several
    percent between minutes; probes before and after a live run say by how
    much, from calibration data only."""
    requests, examples = burst
    return serve_live(models, "ar", requests, examples, affine(1.0, 0.05), v.live).log.end_s


@dataclass(frozen=True, slots=True, kw_only=True)
class Compared:
    """One metric of one policy at one load: live (the mean of its runs) and simulated."""

    live: float
    sim: float
    live_runs: tuple[float, ...] = ()  # each live run's value, when there were several

    @property
    def rel_error(self) -> float:
        return self.sim / self.live - 1 if self.live else float("nan")

    def to_json(self) -> dict:
        return {"live": self.live, "sim": self.sim, "rel_error": self.rel_error,
                **({"live_runs": list(self.live_runs)} if self.live_runs else {})}


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One policy at one load: every compared metric."""

    load: str  # "load=0.25"
    policy: str
    metrics: dict[str, Compared]  # COMPARED -> live vs simulated
    speed_factor: float | None = None  # the machine's speed around the live runs / at calibration


@dataclass(frozen=True, slots=True, kw_only=True)
class NoiseFloor:
    """Two live runs of one policy on the same workload: how far they differ."""

    policy: str
    rel_diff: dict[str, float]  # COMPARED -> second / first - 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Calibration:
    fit: StepCostFit  # the step costs fitted to the calibration runs
    traces: int  # acceptance traces the acceptance model was fitted to
    steps: int
    capacity_guess_req_s: float  # the first AR burst's rate, which set the calibration loads

    def to_json(self) -> dict:
        return {"cost_fit": self.fit.to_json(), "traces": self.traces, "steps": self.steps,
                "capacity_guess_req_s": self.capacity_guess_req_s}


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    """What :func:`validate` measured (``report.json``: :meth:`to_json`)."""

    rows: tuple[Row, ...]  # load by load, policies in the config's order
    noise: dict[str, NoiseFloor]  # load -> the noise floor there
    calibration: Calibration
    acceptance: AcceptanceModel  # fitted to the calibration runs' traces
    ar_saturation_req_s: float  # simulated, with the calibrated models
    config: ValidateConfig
    wall_s: float

    @property
    def loads(self) -> list[str]:
        return list(dict.fromkeys(r.load for r in self.rows))

    def at(self, load: str) -> list[Row]:
        return [r for r in self.rows if r.load == load]

    def ranking(self, load: str, side: str) -> list[str]:
        """Policies by mean e2el, live or sim."""
        rows = self.at(load)
        return [r.policy for r in sorted(rows, key=lambda r: getattr(r.metrics["mean_e2el_ms"], side))]

    def table_json(self) -> dict:
        """``validation.json``: load -> policy -> metric -> live, sim, rel_error."""
        return {load: {r.policy: {m: c.to_json() for m, c in r.metrics.items()} for r in self.at(load)}
                for load in self.loads}

    def to_json(self) -> dict:
        speed = {load: {r.policy: r.speed_factor for r in self.at(load)} for load in self.loads
                 if any(r.speed_factor is not None for r in self.at(load))}
        return {"validation": self.table_json(),
                "ranking_by_mean_e2el": {load: {"live": self.ranking(load, "live"), "sim": self.ranking(load, "sim")}
                                         for load in self.loads},
                "live_repeat_rel_diff": {load: {"policy": n.policy, **n.rel_diff} for load, n in self.noise.items()},
                "calibration": self.calibration.to_json(),
                "acceptance_model": {k: getattr(self.acceptance, k) for k in self.acceptance.__dataclass_fields__},
                "ar_saturation_req_s": self.ar_saturation_req_s, "config": _jsonable(self.config),
                "wall_s": self.wall_s, "speed_factor": speed, "bounds": BOUNDS}


def validate(models: Models, v: ValidateConfig, out: Path | None, progress: bool = True) -> Validation:
    """Calibrate, then compare live and simulated serving (module docstring)."""
    started = time.perf_counter()
    warm_up(models, v.policies, v.live)
    costs, acceptance, cal, cal_steps = calibrate(models, v, progress)
    v = replace(v, live=replace(v.live, prior_top1=float(1.0 / (1.0 + np.exp(-acceptance.top1_logit)))))
    engine = engine_config(v.live)
    probe, _ = live_workload(_workload(v, 1.0, 200, "poisson"), derived_seed(v.seed, "saturation-probe"))
    saturation = burst_rate(probe, policy="ar", costs=costs, acceptance=acceptance, engine=engine,
                            kv_budget_tokens=1 << 20, seed=0)
    rows: list[Row] = []
    cdf_logs: list[tuple[str, RunLog, RunLog]] = []
    noise: dict[str, NoiseFloor] = {}
    if v.speed_probes:
        burst = burst_workload(v)
        reference = float(np.median([speed_probe(models, v, burst) for _ in range(3)]))
        before = speed_probe(models, v, burst)
    bar = tqdm(total=len(v.loads) * len(v.policies) * v.repeats, desc="validate", disable=not progress, leave=False)
    for load in v.loads:
        rate = rate_at_load(load, saturation)
        name = f"load={load:g}"
        requests, examples = live_workload(validation_workload(v, rate), v.seed)
        runs: dict[str, list[LiveResult]] = {spec: [] for spec in v.policies}
        factors: dict[str, list[float]] = {spec: [] for spec in v.policies}  # machine speed around each run
        again = None
        for _ in range(v.repeats):  # A B C, A B C: drift over minutes falls on every policy alike
            for spec in v.policies:
                runs[spec].append(serve_live(models, spec, requests, examples, costs, v.live))
                if v.speed_probes:
                    after = speed_probe(models, v, burst)
                    factors[spec].append(0.5 * (before + after) / reference)
                    before = after
                if v.repeats == 1 and spec == v.policies[0]:  # the noise floor: the same live run again
                    again = metrics.summarize(serve_live(models, spec, requests, examples, costs, v.live).log)
                    if v.speed_probes:
                        before = speed_probe(models, v, burst)
                bar.update(1)
        for spec in v.policies:
            summaries = [metrics.summarize(r.log) for r in runs[spec]]
            factor = float(np.mean(factors[spec])) if v.speed_probes else None
            run_costs = cal.fit.cost_model(factor) if factor is not None else costs
            sim_metrics, sim_log = simulate_mean(requests, spec, run_costs, acceptance, engine, v.sim_seeds)
            rows.append(Row(load=name, policy=spec, speed_factor=factor, metrics={
                m: Compared(live=float(np.mean([s[m] for s in summaries])), sim=sim_metrics[m],
                            live_runs=tuple(s[m] for s in summaries) if v.repeats > 1 else ())
                for m in COMPARED}))
            cdf_logs.append((f"{name} {spec}", runs[spec][0].log, sim_log))
            if spec == v.policies[0]:  # the noise floor: two live runs of the same workload
                first, second = summaries[0], summaries[1] if v.repeats > 1 else again
                noise[name] = NoiseFloor(policy=spec, rel_diff={
                    m: second[m] / first[m] - 1 if first[m] else float("nan") for m in COMPARED})
    bar.close()
    result = Validation(rows=tuple(rows), noise=noise, calibration=cal, acceptance=acceptance,
                        ar_saturation_req_s=saturation, config=v, wall_s=time.perf_counter() - started)
    if out is not None:
        _write(out, result, cdf_logs, acceptance, cal_steps)
    return result


def format_report(result: Validation) -> str:
    lines = []
    for load in result.loads:
        lines.append(f"{load}  (live / sim / error)")
        header = f"  {'policy':34s}" + "".join(f"{m:>26s}" for m in BOUNDS) + f"{'acc. length':>22s}"
        lines.append(header)
        for row in result.at(load):
            parts = [f"  {row.policy:34s}"]
            for m in list(BOUNDS) + ["spec_decode_acceptance_length"]:
                c = row.metrics[m]
                parts.append(f"{c.live:>9.4g}/{c.sim:<9.4g}{c.rel_error * 100:+6.1f}%")
            lines.append("".join(parts))
        live, sim = result.ranking(load, "live"), result.ranking(load, "sim")
        lines.append(f"  ranking by mean e2el: live {live}  sim {sim}  ({'same' if live == sim else 'DIFFERENT'})")
        factors = [(r.policy, r.speed_factor) for r in result.at(load) if r.speed_factor is not None]
        if factors:
            lines.append("  machine speed around each live run vs calibration (step costs scaled by it): " + ", ".join(
                f"{spec} x{f:.3f}" for spec, f in factors))
        again = result.noise.get(load)
        if again:
            lines.append(f"  noise floor, {again.policy} served live twice: " + ", ".join(
                f"{m} {again.rel_diff[m] * 100:+.1f}%" for m in BOUNDS))
    return "\n".join(lines)


def _jsonable(x):
    if hasattr(x, "__dataclass_fields__"):
        return {k: _jsonable(getattr(x, k)) for k in x.__dataclass_fields__}
    if isinstance(x, (tuple, list)):
        return [_jsonable(i) for i in x]
    return x


def _write(out: Path, result: Validation, cdf_logs, acceptance: AcceptanceModel, cal_steps: pd.DataFrame) -> None:
    from matplotlib.figure import Figure

    out.mkdir(parents=True, exist_ok=True)
    acceptance_fit.save_acceptance(acceptance, out / "acceptance.json", fitted_to=LIVE_MODEL,
                                   source={"from": "simspec validate calibration run"})
    step_costs.save_step_costs(result.calibration.fit, out / "step_costs.json")
    write_atomic(out / "calibration_steps.parquet", lambda f: cal_steps.to_parquet(f, index=False))
    write_text(out / "validation.json", json.dumps(result.table_json(), indent=2, sort_keys=True) + "\n")
    write_text(out / "report.json", json.dumps(result.to_json(), indent=2, sort_keys=True, default=float) + "\n")
    cols = min(3, len(cdf_logs))
    rows = (len(cdf_logs) + cols - 1) // cols
    fig = Figure(figsize=(4.5 * cols, 3.2 * rows))
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax, (title, live_log, sim_log) in zip(axes.ravel(), cdf_logs):
        for log, style, label in ((live_log, "-", "live"), (sim_log, "--", "sim")):
            e2el = np.sort((log.table.finish_s - log.table.arrival_s) * 1e3)
            ax.plot(e2el, np.arange(1, len(e2el) + 1) / len(e2el), style, label=label)
        ax.set_title(title, fontsize=8)
        ax.set_xlabel("e2el (ms)", fontsize=8)
        ax.legend(fontsize=7)
    for ax in axes.ravel()[len(cdf_logs):]:
        ax.axis("off")
    fig.tight_layout()
    write_png(out / "latency_cdf.png", fig, dpi=90)
