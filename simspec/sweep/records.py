"""A sweep's records and the names of its axes and table columns."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from simspec.config import SimConfig
from simspec.serving.config import EngineConfig
from simspec.types import require
from simspec.workloads import WorkloadConfig


SCHEMA_VERSION = 2  # 2: vLLM's spec-decode metrics and counters, engine fields in the scenario
"""Version of the results table's columns; another version is refused."""


META_KEY = b"simspec.sweep"
MAX_WORKERS = 1024  # local processes at most (each holds a simulator)
"""Parquet schema-metadata key holding the sweep's JSON description."""


NAMED_AXES = {  # axis -> (config field it sets, table column)
    "load": (None, "load"),  # x AR saturation; sets workload.rate_per_s
    "rate": (("workload", "rate_per_s"), "rate_per_s"),
    "cv": (("workload", "burstiness"), "cv"),
    "burstiness": (("workload", "burstiness"), "cv"),
    "multimodal_share": (("workload", "multimodal_share"), "multimodal_share"),
    "model": (("model",), "model"),
    "device": (("device",), "device"),
    "acceptance": (("acceptance",), "acceptance"),
    "cost_model": (("cost_model",), "cost_model"),
}


EXCLUSIVE = (("load", "rate"), ("cv", "burstiness"))


DIMS = ("load", "rate_per_s", "cv", "multimodal_share", "model", "device", "cost_model", "acceptance",
        "num_requests")
"""Columns that describe every row's scenario (besides generic axes)."""


_KEYS = ("schema_version", "scenario_id", "seed", "policy")


_INFO = ("saturation_per_s", "cost_calibration")


_TABLES = {"workload": WorkloadConfig, "engine": EngineConfig}


_SATURATION_FREE = ("arrival", "rate_per_s", "burstiness", "on_s", "off_s", "on_off_ratio", "num_requests",
                    "duration_s")  # workload fields the AR saturation rate does not depend on


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One dimension of the grid."""

    name: str  # a NAMED_AXES key, or "workload.FIELD" / "engine.FIELD"
    values: tuple  # in the order given; the first axis varies slowest


@dataclass(frozen=True, slots=True, kw_only=True)
class SweepConfig:
    """What to run: the base scenario (its ``policies`` are served in every
    task), the axes and the seeds (default: the base's seed)."""

    base: SimConfig = field(default_factory=SimConfig)
    axes: tuple[Axis, ...] = ()
    seeds: tuple[int, ...] | None = None

    def __post_init__(self):
        names = [a.name for a in self.axes]
        require(len(set(names)) == len(names), f"axes: an axis is given twice ({', '.join(names)})")
        for a, b in EXCLUSIVE:
            require(not (a in names and b in names), f"axes: give {a} or {b}, not both")
        for axis in self.axes:
            require(len(axis.values) >= 1, f"axes.{axis.name} must be a non-empty list (got none)")
            require(len(set(axis.values)) == len(axis.values), f"axes.{axis.name} has duplicate values "
                    f"({list(axis.values)})")
        if self.seeds is not None:
            require(len(self.seeds) >= 1, "seeds must be >= 1 or a non-empty list (got none)")
            require(all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in self.seeds),
                    f"seeds must be integers >= 0 (got {list(self.seeds)})")
            require(len(set(self.seeds)) == len(self.seeds), f"seeds has duplicates ({list(self.seeds)})")

    @property
    def seed_list(self) -> tuple[int, ...]:
        return self.seeds if self.seeds is not None else (self.base.seed,)


@dataclass(frozen=True, slots=True, kw_only=True)
class Runner:
    """Where and how the tasks run."""

    workers: int | None = None  # local processes; None = every core; 1 = serially in this process
    ray: str | None = None  # "local", "auto", HOST:PORT or ray://HOST:PORT: run on Ray instead
    flush_every_s: float = 2.0  # rewrite the table at most this often while tasks finish (and at the end)
    probe_timeout_s: float = 3.0  # TCP connect to a Ray address before ray.init
    connect_timeout_s: float = 30.0  # ray.init must return within this
    progress: bool = True

    def __post_init__(self):
        require(self.workers is None or 1 <= self.workers <= MAX_WORKERS,
                f"--workers must be in 1..{MAX_WORKERS} (got {self.workers})")
        require(self.flush_every_s >= 0, f"flush_every_s must be >= 0 (got {self.flush_every_s})")

    @property
    def processes(self) -> int:
        return self.workers or os.cpu_count() or 1


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """A grid point resolved into a scenario (base seed, every policy)."""

    index: int
    config: SimConfig
    scenario_id: str  # hash of the resolved config without seed and policies
    columns: dict  # DIMS + generic axes + _INFO, as table cells


@dataclass(frozen=True, slots=True, kw_only=True)
class Outcome:
    path: Path
    tasks_total: int
    tasks_run: int
    rows: int
    saturation_per_s: dict[str, float]  # cache key -> AR saturation, requests/s
