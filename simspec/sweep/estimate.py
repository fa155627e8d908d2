"""How long a sweep will take, before it runs: the grid's size and one
timed sample of its first task, scaled by the requests a task serves.

The sample serves the first grid point's requests (first seed, every
policy), at most :data:`SAMPLE_REQUESTS` of them, after an untimed warm-up
that loads the step kernels. A task's time grows about linearly with its
requests, and a point's load changes it by a small factor, so the figure is
an estimate to decide by (minutes or days), not a schedule. A ``load`` axis
adds one AR saturation search per request mix (timed on the first).
"""

from __future__ import annotations

import itertools
import math
import time
from dataclasses import dataclass, replace

from simspec import experiment
from simspec.config import SimConfig
from simspec.sweep.grid import _apply, saturation_config, size
from simspec.sweep.records import _SATURATION_FREE, Runner, SweepConfig

SAMPLE_REQUESTS = 200
"""Requests the timed sample serves (fewer if a task serves fewer)."""

CONFIRM_ABOVE = 100_000
"""A sweep of more tasks runs only with ``--yes``."""

_RATE_AXES = {"load", "rate", "cv", "burstiness"}  # axes the AR saturation rate does not depend on


@dataclass(frozen=True, slots=True, kw_only=True)
class Estimate:
    tasks: int
    requests_per_task: int  # of the first task (the others differ where an axis changes the arrivals)
    sample_requests: int
    sample_s: float  # wall time of the sample
    mixes: int  # AR saturation searches a load axis needs (at most)
    saturation_s: float  # wall time of one
    processes: int
    ray: bool

    @property
    def task_s(self) -> float:
        return self.sample_s / self.sample_requests * self.requests_per_task

    @property
    def cpu_s(self) -> float:
        """Core-seconds of the whole sweep."""
        return self.tasks * self.task_s + self.mixes * self.saturation_s

    @property
    def wall_s(self) -> float:
        return self.cpu_s / max(1, min(self.processes, self.tasks))

    def lines(self) -> list[str]:
        sample = (f"one sample of {self.sample_requests} requests took {self.sample_s:.2f} s, so a task of "
                  f"{self.requests_per_task:,} requests ~{duration(self.task_s)}")
        if self.mixes:
            sample += f"; up to {self.mixes} AR saturation search{'es' * (self.mixes != 1)} ~{duration(self.saturation_s)} each"
        where = ("core-time (divide by the Ray cluster's CPUs)" if self.ray
                 else f"on {min(self.processes, self.tasks)} process{'es' * (min(self.processes, self.tasks) != 1)}")
        total = duration(self.cpu_s) if self.ray else duration(self.wall_s)
        lines = [f"estimate: ~{total} {where} for {self.tasks:,} tasks ({sample})"]
        if self.tasks > CONFIRM_ABOVE:
            lines.append(f"more than {CONFIRM_ABOVE:,} tasks: running it needs --yes")
        return lines


def duration(seconds: float) -> str:
    """A time for people: '0.04 s', '2.5 s', '12 s', '7 min', '3 h 20 min', '12 days'."""
    if seconds < 1:
        return f"{seconds:.2g} s"
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    if seconds < 48 * 3600:
        hours, minutes = divmod(round(seconds / 60), 60)
        return f"{hours} h {minutes} min" if minutes else f"{hours} h"
    return f"{seconds / 86400:.0f} days"


def first_point(sweep: SweepConfig) -> tuple[SimConfig, dict]:
    """The grid's first point (the whole grid is not built: it may be huge)."""
    values = next(itertools.product(*(a.values for a in sweep.axes)))
    settings = list(zip(sweep.axes, values))
    return _apply(sweep.base, settings), {a.name: v for a, v in settings}


def estimate(sweep: SweepConfig, runner: Runner, *, sample_requests: int = SAMPLE_REQUESTS) -> Estimate:
    """Time a sample of the first task (see the module docstring)."""
    config, values = first_point(sweep)
    config = replace(config, seed=sweep.seed_list[0])
    warm = replace(config, workload=replace(config.workload, num_requests=20, duration_s=None))
    experiment.run(warm)  # untimed: loads (or compiles) the step kernels
    has_load = "load" in values
    saturation_s, mixes = 0.0, 0
    if has_load:
        mixes = math.prod(len(a.values) for a in sweep.axes if a.name not in _RATE_AXES
                          and not (a.name.startswith("workload.") and a.name.split(".", 1)[1] in _SATURATION_FREE))
        started = time.perf_counter()
        saturation = experiment.saturation_rate(saturation_config(config))
        saturation_s = time.perf_counter() - started
        rate = experiment.rate_at_load(values["load"], saturation)
        config = replace(config, workload=replace(config.workload, rate_per_s=rate))
    requests = len(experiment.resolve(config).requests)
    n = max(1, min(requests, sample_requests))
    sample = replace(config, workload=replace(config.workload, num_requests=n, duration_s=None))
    started = time.perf_counter()
    experiment.run(sample)
    sample_s = time.perf_counter() - started
    return Estimate(tasks=size(sweep) * len(sweep.seed_list), requests_per_task=max(requests, 1), sample_requests=n,
                    sample_s=sample_s, mixes=mixes, saturation_s=saturation_s, processes=runner.processes,
                    ray=bool(runner.ray))


__all__ = ["CONFIRM_ABOVE", "Estimate", "SAMPLE_REQUESTS", "duration", "estimate", "first_point"]
