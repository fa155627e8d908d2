"""What the dashboard computes: one scenario served by every chosen policy at
the user's own rate and at several loads (multiples of the AR saturation
rate), and the calibration and validation status of a device profile.

Imports: stdlib, numpy, and simspec's public API (config, experiment, costs,
metrics, policies, sim, workloads, types). No Streamlit: the app caches
these calls, the benchmark and the tests call them directly.

Load levels are independent runs, so they go to a small process pool
(``spawn``: the Streamlit server is multithreaded, and a fresh interpreter
is safe where a fork may not be). The pool lives as long as the process, so
only the first what-if pays for starting it. Every level uses the config's
seed: levels share arrival shapes and lengths, and differ in load only.
A process fits a device's cost model once (``costs.build`` keeps it), not per run.
"""

from __future__ import annotations

import json
import math
import os
import threading
import time
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

import simspec
from simspec import costs, experiment, metrics, policies, pool
from simspec.config import DEFAULT_WORKLOAD, SimConfig
from simspec.costs import profiles
from simspec.models.config import LIVE_MODEL
from simspec.types import PLAN_KINDS, InputError, require
from simspec.workloads import read_trace

MAX_LOAD = 4.0  # load levels above 4x saturation only measure how fast a queue grows
MAX_LEVELS = 12
MAX_REQUESTS = 20_000  # per run; beyond this the dashboard stops being interactive
MAX_WORKERS = 16


@dataclass(frozen=True, slots=True, kw_only=True)
class DashboardConfig:
    """The dashboard's own defaults. Everything else (model, device,
    acceptance, workload shape, seed) defaults to :class:`SimConfig`'s."""

    policies: tuple[str, ...] = ("ar", "linear:k=3", "tree", "marginal")  # four of DEFAULT_POLICIES
    loads: tuple[float, ...] = (0.25, 0.5, 0.75, 1.0, 1.25, 1.5)  # x AR saturation rate
    # Requests per run. 300 keeps the default what-if (7 runs x 4 policies)
    # under 5 s on 2 cores, and is enough for stable means and p95s (p99 is
    # the 3rd-worst request: noisy); raise it for tails.
    num_requests: int = 300
    saturation_requests: int = 400  # requests of the AR burst that measures saturation
    time_bins: int = 40  # bins of the plan-mix-over-time chart
    workers: int = 2  # processes for load levels; 0 or 1 runs them in this process

    def __post_init__(self):
        require(1 <= len(self.policies), "policies must name at least one policy (got none)")
        require(1 <= len(self.loads) <= MAX_LEVELS,
                f"loads must have 1..{MAX_LEVELS} levels (got {len(self.loads)})")
        for load in self.loads:
            require(0 < load <= MAX_LOAD and math.isfinite(load),
                    f"loads must be in (0, {MAX_LOAD:g}] x saturation (got {load:g})")
        require(len(set(self.loads)) == len(self.loads), f"loads must be distinct (got {list(self.loads)})")
        require(1 <= self.num_requests <= MAX_REQUESTS,
                f"num_requests must be in 1..{MAX_REQUESTS} (got {self.num_requests})")
        require(10 <= self.saturation_requests <= MAX_REQUESTS,
                f"saturation_requests must be in 10..{MAX_REQUESTS} (got {self.saturation_requests})")
        require(2 <= self.time_bins <= 1000, f"time_bins must be in 2..1000 (got {self.time_bins})")
        require(0 <= self.workers <= MAX_WORKERS, f"workers must be in 0..{MAX_WORKERS} (got {self.workers})")
        for spec in self.policies:
            policies.parse(spec)


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """Every policy served at one request rate."""

    load: float | None  # x AR saturation; None for the user's own rate
    rate_per_s: float  # mean arrival rate of the run
    metrics: dict[str, dict[str, float]]  # {policy: {metric: value}}, vLLM names
    mix_time_s: np.ndarray  # [T] centres of the plan-mix time bins
    mix: dict[str, np.ndarray]  # {policy: [3, T] share of rounds planned AR / linear / tree}


@dataclass(frozen=True, slots=True, kw_only=True)
class WhatIf:
    config: SimConfig  # as served at the user's rate ("ar" added when it was missing)
    saturation_req_s: float  # requests/s the replica sustains with AR
    at_rate: Point  # the workload as given
    levels: tuple[Point, ...]  # the load curve, in increasing load
    cost_model: str  # experiment.cost_model_line
    calibration: str  # calibrated / partly calibrated / uncalibrated
    acceptance: str
    requests: int  # per run
    baseline_added: bool  # "ar" was not chosen, and runs anyway as the speedup baseline
    wall_s: float


# --------------------------------------------------------------------------
# Simulating one point


def simulate_point(config: SimConfig, load: float | None, time_bins: int) -> Point:
    """Run ``config`` (every policy) and keep what the dashboard shows."""
    results = experiment.run(config)
    start_s = min(log.start_s for log in results.logs)
    end_s = max(log.end_s for log in results.logs)
    if not (math.isfinite(start_s) and math.isfinite(end_s) and end_s > start_s):
        start_s, end_s = 0.0, 1.0
    edges = np.linspace(start_s, end_s, time_bins + 1)
    w = config.workload  # a synthetic workload's rate as set; a trace's as replayed
    rate_per_s = _rate(results.scenario.requests) if w.arrival == "trace" else w.rate_per_s
    return Point(load=load, rate_per_s=rate_per_s, metrics=results.metrics, mix_time_s=(edges[:-1] + edges[1:]) / 2,
                 mix={log.policy: metrics.plan_mix(log, edges) for log in results.logs})


def _rate(requests) -> float:
    """Mean arrival rate of a run: arrivals after the first over their span."""
    span_s = requests[-1].arrival_s - requests[0].arrival_s if requests else 0.0
    return (len(requests) - 1) / span_s if span_s > 0 else math.inf


def _point_job(job: tuple[SimConfig, float | None, int]) -> Point:
    return simulate_point(*job)


_POOL: dict[int, pool.Processes] = {}
_POOL_LOCK = threading.Lock()  # Streamlit runs each browser session's script in its own thread


def _pool(workers: int) -> pool.Processes:
    with _POOL_LOCK:
        if workers not in _POOL:
            _POOL[workers] = pool.Processes(workers)
        return _POOL[workers]


def _map(jobs: list, workers: int) -> list[Point]:
    if workers <= 1 or len(jobs) <= 1:
        return [_point_job(job) for job in jobs]
    try:
        return _pool(workers).map(_point_job, jobs)
    except BrokenProcessPool:  # a worker died (killed, out of memory): serve here; a new pool next time
        with _POOL_LOCK:
            broken = _POOL.pop(workers, None)
        if broken is not None:
            broken.close(ok=False)
        return [_point_job(job) for job in jobs]


def _warm() -> None:
    """Import simspec and load its compiled kernels in a worker."""
    config = SimConfig(policies=DashboardConfig().policies, workload=replace(DEFAULT_WORKLOAD, num_requests=5))
    simulate_point(config, None, 2)


def warm(workers: int) -> None:
    """Start the pool of ``workers`` processes now, so that the first
    what-if does not wait for them (returns at once)."""
    if workers > 1:
        for _ in range(workers):
            _pool(workers).submit(_warm)


def level_config(config: SimConfig, rate_per_s: float, native_rate_per_s: float) -> SimConfig:
    """``config`` at a mean arrival rate of ``rate_per_s``: a synthetic
    workload gets the rate, a trace is time-scaled (its native rate is
    ``native_rate_per_s`` at speedup 1)."""
    w = config.workload
    if w.arrival == "trace":
        return replace(config, workload=replace(w, trace_speedup=rate_per_s / native_rate_per_s))
    return replace(config, workload=replace(w, rate_per_s=rate_per_s))


def trace_rate(config: SimConfig) -> float:
    """Requests/s of the config's trace at speedup 1, over the requests it serves."""
    w = config.workload
    arrival_s = read_trace(w.trace_path).arrival_s
    if w.num_requests is not None:
        arrival_s = arrival_s[:w.num_requests]
    elif w.duration_s is not None:
        arrival_s = arrival_s[arrival_s / w.trace_speedup < w.duration_s]
    span_s = float(arrival_s[-1] - arrival_s[0]) if arrival_s.size else 0.0
    require(arrival_s.size >= 2 and span_s > 0,
            f"trace {w.trace_path}: needs at least two distinct arrival times to scale to a load "
            f"(got {arrival_s.size} requests over {span_s:g} s)")
    return (arrival_s.size - 1) / span_s


def what_if(config: SimConfig, dash: DashboardConfig = DashboardConfig()) -> WhatIf:
    """Serve ``config`` at its own rate and at ``dash.loads`` x its AR
    saturation rate. ``config.workload`` says how many requests a run has."""
    started = time.perf_counter()
    baseline_added = "ar" not in config.policies
    if baseline_added:
        config = replace(config, policies=("ar", *config.policies))
    scenario = experiment.resolve(config)  # validates model, device, acceptance, workload early
    saturation = experiment.saturation_rate(config, requests=dash.saturation_requests)
    native = trace_rate(config) if config.workload.arrival == "trace" else math.nan
    jobs = [(config, None, dash.time_bins)]
    jobs += [(level_config(config, experiment.rate_at_load(load, saturation), native), load, dash.time_bins)
             for load in sorted(dash.loads)]
    points = _map(jobs, dash.workers)
    return WhatIf(config=config, saturation_req_s=saturation, at_rate=points[0], levels=tuple(points[1:]),
                  cost_model=experiment.cost_model_line(scenario, width=None), calibration=scenario.costs.calibration,
                  acceptance=scenario.acceptance.name, requests=len(scenario.requests),
                  baseline_added=baseline_added, wall_s=time.perf_counter() - started)


def speedups(metrics: dict[str, dict[str, float]], metric: str = "mean_e2el_ms") -> dict[str, float]:
    """{policy: AR's ``metric`` / the policy's}: > 1 is faster than AR."""
    base = metrics["ar"][metric]
    return {p: base / m[metric] if m[metric] > 0 else math.nan for p, m in metrics.items()}


# --------------------------------------------------------------------------
# Profiles and validation


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileStatus:
    device: str
    model: str
    calibration: str  # calibrated / partly calibrated / uncalibrated / unavailable
    cost_model: str  # the cost model's label, or why there is none
    profiles: tuple[str, ...] = ()  # profile folders the fit uses
    validated: bool = False  # a live-vs-simulated validation exists for this device
    validation: str = "not validated on this device"  # its headline, or that


@dataclass(frozen=True, slots=True, kw_only=True)
class Validation:
    folder: Path
    device: str
    model: str
    policies: tuple[str, ...]
    loads: tuple[float, ...]
    e2el_errors: tuple[float, ...] = field(repr=False)  # mean e2el rel. error, every policy x load
    acceptance_max_error: float  # largest |rel. error| of acceptance length
    bound: float | None  # the validation's target for mean e2el (report.json "bounds")

    @property
    def headline(self) -> str:
        e = np.asarray(self.e2el_errors)
        text = (f"live vs simulated, {len(self.policies)} policies x {len(self.loads)} loads "
                f"({', '.join(f'{x:g}' for x in self.loads)} x saturation): mean e2el error median "
                f"{np.median(np.abs(e)):.0%}, from {e.min():+.0%} to {e.max():+.0%}")
        if self.bound is not None:
            met = bool(np.all(np.abs(e) <= self.bound))
            text += f" (target ±{self.bound:.0%}: {'met' if met else 'not met'})"
        return text + f"; acceptance length within {self.acceptance_max_error:.0%}"


def validation_root() -> Path:
    """``$SIMSPEC_VALIDATION``, else the repository's ``validation/`` folder."""
    env = os.environ.get("SIMSPEC_VALIDATION")
    return Path(env) if env else Path(simspec.__file__).resolve().parents[1] / "validation"


def devices(root: Path | None = None) -> list[str]:
    """Datasheet GPUs, then devices known only from their profiles."""
    folder = root or profiles.default_root()
    extra = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.lower() not in costs.GPUS) \
        if folder.is_dir() else []
    return [*costs.GPUS, *extra]


def _device_kind(device: str) -> str:
    """``cuda``, ``cpu``, ... from the device's profile meta.json (``cuda`` for datasheet GPUs)."""
    if device.lower() in costs.GPUS:
        return "cuda"
    for meta in sorted((profiles.default_root() / device).glob("*/meta.json")):
        try:
            return str(json.loads(meta.read_text()).get("kind", ""))
        except (OSError, json.JSONDecodeError):
            continue
    return ""


def validation_for(device: str, root: Path | None = None) -> Validation | None:
    """The validation run of ``device``: ``validation/<device>/``, or
    ``validation/cpu/`` for a CPU device (`simspec validate` runs the live
    engine on the machine's CPU and writes there)."""
    root = root or validation_root()
    names = [device] + (["cpu"] if _device_kind(device) == "cpu" else [])
    for name in names:
        folder = root / name
        try:
            table = json.loads((folder / "validation.json").read_text())
        except (OSError, json.JSONDecodeError):
            continue
        try:
            report = json.loads((folder / "report.json").read_text())
        except (OSError, json.JSONDecodeError):
            report = {}
        loads = tuple(float(k.partition("=")[2]) for k in table)
        e2el = [m["mean_e2el_ms"]["rel_error"] for level in table.values() for m in level.values()
                if "mean_e2el_ms" in m]
        accept = [abs(m["spec_decode_acceptance_length"]["rel_error"]) for level in table.values()
                  for m in level.values() if "spec_decode_acceptance_length" in m]
        if not e2el:
            continue
        bound = report.get("bounds", {}).get("mean_e2el_ms")
        return Validation(folder=folder, device=device, model=LIVE_MODEL,
                          policies=tuple(sorted({p for level in table.values() for p in level})), loads=loads,
                          e2el_errors=tuple(e2el), acceptance_max_error=max(accept, default=0.0),
                          bound=float(bound) if bound is not None else None)
    return None


def profile_status(device: str, model: str, tp: int = 1) -> ProfileStatus:
    """How the ``auto`` cost model of ``model`` (sharded over ``tp`` GPUs) on
    ``device`` is calibrated, and what validation says about the device."""
    try:
        spec = costs.model_spec(model, tp=tp)
        found = profiles.find(device, spec)
        cost_model = costs.build("auto", spec, costs.gpu_spec(device))
        calibration, label = cost_model.calibration, cost_model.label
    except InputError as err:
        found, calibration, label = [], "unavailable", str(err)
    v = validation_for(device)
    if v is None:
        validation = "not validated on this device"
    elif v.model == model:
        validation = v.headline
    else:
        validation = f"validated on this device with {v.model} (the live engine's model), not {model}: {v.headline}"
    return ProfileStatus(device=device, model=model, calibration=calibration, cost_model=label,
                         profiles=tuple(str(p.folder) for p in found), validated=v is not None,
                         validation=validation)


__all__ = ["DashboardConfig", "Point", "WhatIf", "what_if", "simulate_point", "warm",
           "speedups", "level_config", "trace_rate", "ProfileStatus", "Validation",
           "profile_status", "validation_for", "validation_root", "devices", "PLAN_KINDS", "MAX_LOAD", "MAX_REQUESTS"]
