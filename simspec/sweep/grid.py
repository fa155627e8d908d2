"""The grid: axis values applied to the base scenario, scenario ids, and the
AR saturation rate each load is a multiple of."""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import tomllib
from dataclasses import replace

from simspec import acceptance, config as configuration, costs, experiment
from simspec.config import SimConfig
from simspec.sweep.records import _SATURATION_FREE, NAMED_AXES, Axis, Point, SweepConfig
from simspec.types import InputError, require
from simspec.workloads import WorkloadConfig, cv_to_burstiness


def calibration(sweep: SweepConfig) -> dict[tuple[str, str, str], str]:
    """{(model, device, cost model): "calibrated" | "partly calibrated" |
    "uncalibrated"} over the grid; checks on the way, before any work
    starts, that every model, device, cost model and acceptance exists and
    that every model fits its devices with every engine setting."""
    keys = ("model", "device", "cost_model", "acceptance")
    axes = [a for a in sweep.axes if a.name in keys or a.name.startswith("engine.")]
    out = {}
    for values in itertools.product(*(a.values for a in axes)):
        config = _apply(sweep.base, list(zip(axes, values)))
        try:
            model, gpu = experiment.model_of(config), costs.gpu_spec(config.device)
            built = costs.build(config.cost_model, model, gpu, engine=config.engine.kind)
            acceptance.build(config.acceptance, model.name, config.workload.temperature)
            config.engine.kv_budget_tokens(model, gpu)
        except InputError as err:
            raise InputError(f"sweep: {err}") from None
        out[(config.model, config.device, config.cost_model)] = built.calibration
    return out


def _apply(base: SimConfig, settings: list[tuple[Axis, object]]) -> SimConfig:
    """``base`` with the axis values set (``load`` is set later, from the
    saturation rate); validation runs on the final combination."""
    top: dict = {}
    tables: dict = {"workload": {}, "engine": {}}
    for axis, value in settings:
        if axis.name == "load":
            continue
        if axis.name == "cv":
            value = cv_to_burstiness(value)
        path = NAMED_AXES[axis.name][0] if axis.name in NAMED_AXES else tuple(axis.name.split("."))
        (top if len(path) == 1 else tables[path[0]])[path[-1]] = value
    if configuration.STOPS & tables["workload"].keys():
        for stop in configuration.STOPS:  # setting one ends the other's default
            tables["workload"].setdefault(stop, None)
    try:
        return replace(base, **top, **{name: replace(getattr(base, name), **values)
                                       for name, values in tables.items() if values})
    except TypeError as err:
        raise InputError(f"axes: {err}") from None


def size(sweep: SweepConfig) -> int:
    """Grid points (without seeds)."""
    return math.prod(len(a.values) for a in sweep.axes)


def canonical(config: SimConfig, *, drop: tuple[str, ...] = ()) -> dict:
    """The resolved config as plain TOML values, minus ``drop`` keys."""
    values = tomllib.loads(configuration.to_toml(config))
    for key in drop:
        values.pop(key, None)
    return values


def _digest(values: dict) -> str:
    return hashlib.sha256(json.dumps(values, sort_keys=True).encode()).hexdigest()[:12]


def scenario_id(config: SimConfig) -> str:
    """Stable id of a scenario: its resolved config without seed and policies."""
    return _digest(canonical(config, drop=("seed", "policies")))


def saturation_config(config: SimConfig) -> SimConfig:
    """What the AR saturation rate of ``config`` depends on: arrivals and
    policies set to fixed values, the rest (replica, mix, engine) kept."""
    fixed = {"arrival": "poisson", "rate_per_s": 1.0, "num_requests": 1, "duration_s": None}
    workload = replace(config.workload, **fixed, **{k: getattr(WorkloadConfig(), k) for k in _SATURATION_FREE
                                                     if k not in fixed})
    return replace(config, workload=workload, policies=("ar",), slo_ttft_ms=None, slo_tpot_ms=None, slo_e2el_ms=None)


def _saturation_key(config: SimConfig) -> str:
    return _digest(canonical(saturation_config(config), drop=("policies",)))


def _points(sweep: SweepConfig) -> list[tuple[SimConfig, dict]]:
    """Grid points in order: (config with the base rate, axis values)."""
    out = []
    for values in itertools.product(*(a.values for a in sweep.axes)):
        settings = list(zip(sweep.axes, values))
        try:
            config = _apply(sweep.base, settings)
        except InputError as err:
            where = ", ".join(f"{a.name}={v!r}" for a, v in settings)
            raise InputError(f"grid point {where}: {err}") from None
        out.append((config, {a.name: v for a, v in settings}))
    return out


def resolve(sweep: SweepConfig, saturation: dict[str, float] | None = None) -> list[Point]:
    """The grid's points in order (the first axis varies slowest), loads
    turned into rates (``saturation`` must hold every key a load needs)."""
    calibrated = calibration(sweep)
    points = []
    for index, (config, values) in enumerate(_points(sweep)):
        sat = None
        if "load" in values:
            sat = (saturation or {})[_saturation_key(config)]
            rate = experiment.rate_at_load(values["load"], sat)
            config = replace(config, workload=replace(config.workload, rate_per_s=rate))
        w = config.workload
        columns = {
            "load": values.get("load"),
            "rate_per_s": None if w.arrival == "trace" else w.rate_per_s,
            "cv": w.burstiness ** -0.5 if w.arrival == "gamma" else (1.0 if w.arrival == "poisson" else None),
            "multimodal_share": w.multimodal_share, "model": config.model, "device": config.device,
            "cost_model": config.cost_model, "acceptance": config.acceptance, "num_requests": w.num_requests,
            **{a.name: values[a.name] for a in sweep.axes if a.name not in NAMED_AXES},
            "saturation_per_s": sat,
            "cost_calibration": calibrated[(config.model, config.device, config.cost_model)],
        }
        points.append(Point(index=index, config=config, scenario_id=scenario_id(config), columns=columns))
    seen: dict[str, int] = {}
    for p in points:
        require(p.scenario_id not in seen, f"grid points {seen.get(p.scenario_id)} and {p.index} are the same "
                                           f"scenario (an axis has no effect there)")
        seen[p.scenario_id] = p.index
    return points
