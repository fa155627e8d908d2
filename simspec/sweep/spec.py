"""A sweep from its file and flags, checked before any work starts."""

from __future__ import annotations

import itertools
import math
from dataclasses import fields
from pathlib import Path

from simspec import config as configuration, policies
from simspec.config import SimConfig
from simspec.files import read_toml
from simspec.sweep.grid import _apply, calibration, size
from simspec.sweep.records import _TABLES, EXCLUSIVE, NAMED_AXES, Axis, SweepConfig
from simspec.types import InputError, require
from simspec.workloads import image_sizes


def load(path: str | Path) -> dict:
    """Read a sweep file into :func:`from_values`'s dict."""
    return read_toml(path, "--config")


def from_values(data: dict | None = None, *, base_flags: dict | None = None, axis_flags: dict | None = None,
                seeds=None, where: str = "sweep") -> SweepConfig:
    """A :class:`SweepConfig` from a sweep file's values (``[base]`` or
    top-level scenario keys, ``[axes]``, ``seeds``), overridden by flags:
    ``base_flags`` shaped like a config file, ``axis_flags`` {axis: list}
    (an axis replaces the file's axis of the same name or its alternative),
    ``seeds`` an int count or a list."""
    data = dict(data or {})
    axes_table = data.pop("axes", {})
    require(isinstance(axes_table, dict), f"{where}: [axes] must be a table")
    file_seeds = data.pop("seeds", None)
    if "base" in data:
        base_values = data.pop("base")
        require(isinstance(base_values, dict), f"{where}: [base] must be a table")
        for key in data:
            raise InputError(f"{where}: unknown key {key!r} next to [base] (allowed: base, axes, seeds)")
        base_values = _checked_base(base_values, f"{where} [base]")
    else:
        base_values = _checked_base(data, where)
    axes = _flat_axes(axes_table)
    for a, b in EXCLUSIVE:
        require(not {a, b} <= (axis_flags or {}).keys(), f"--{a} and --{b}: give one, not both")
    for name, values in (axis_flags or {}).items():
        for a, b in EXCLUSIVE:
            if name in (a, b):
                axes.pop(b if name == a else a, None)
        axes[name] = values
    if "policies" in axes:
        base_values["policies"] = _policy_grid(axes.pop("policies"))
    seeds = _seeds(seeds if seeds is not None else file_seeds)
    base = configuration.build(base_values, base_flags)
    sweep = SweepConfig(base=base, axes=tuple(_axis(name, values, base) for name, values in axes.items()),
                        seeds=seeds)
    calibration(sweep)
    return sweep


def _checked_base(values: dict, where: str) -> dict:
    """The base scenario's keys checked as ``config.load`` checks a file's."""
    configuration._checked(values, SimConfig, where)
    for name, record in _TABLES.items():
        if name in values:
            require(isinstance(values[name], dict), f"{where}: [{name}] must be a table")
            configuration._checked(values[name], record, f"{where} [{name}]")
    configuration._image_size_list(values, where)
    values = dict(values)
    if "policies" in values:
        require(isinstance(values["policies"], list), f"{where}: policies must be a list")
        values["policies"] = _policy_grid(values["policies"], where=f"{where}: policies")
    return values


def _flat_axes(table: dict) -> dict:
    """[axes] with ``engine.max_num_seqs = [...]`` (a nested TOML table) as
    the flat key "engine.max_num_seqs"."""
    flat = {}
    for key, value in table.items():
        if key in _TABLES and isinstance(value, dict):
            flat.update({f"{key}.{sub}": v for sub, v in value.items()})
        else:
            flat[key] = value
    return flat


def _policy_grid(entries, where: str = "axes.policies") -> list[str]:
    """Policy specs; a table whose parameters are lists stands for every
    combination: ``{name = "linear", k = [3, 5]}`` -> linear:k=3, linear:k=5."""
    require(isinstance(entries, list) and entries, f"{where} must be a non-empty list of policies (got {entries!r})")
    specs = []
    for entry in entries:
        if isinstance(entry, dict) and isinstance(entry.get("name"), str):
            params = {k: v if isinstance(v, list) else [v] for k, v in entry.items() if k != "name"}
            for k, v in params.items():
                require(v, f"{where}: {entry['name']}.{k} is an empty list")
            for combo in itertools.product(*params.values()):
                specs.append(configuration._policy_spec({"name": entry["name"], **dict(zip(params, combo))}))
        else:
            specs.append(configuration._policy_spec(entry))
    for spec in specs:
        policies.parse(spec)
    require(len(set(specs)) == len(specs), f"{where}: a policy is listed twice ({', '.join(specs)})")
    return specs


def _seeds(value) -> tuple[int, ...] | None:
    """``seeds = N`` (0..N-1) or a list, as a tuple (checked by SweepConfig)."""
    if value is None:
        return None
    if _kind(value) == "int":
        require(value >= 1, f"seeds must be >= 1 or a non-empty list (got {value})")
        return tuple(range(value))
    require(isinstance(value, list), f"seeds must be a count or a list of integers (got {value!r})")
    return tuple(value)


def _kind(value) -> str | None:
    """bool, int, float (finite) or str; None for anything else."""
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float" if math.isfinite(value) else None
    return "str" if isinstance(value, str) else None


def _is_number(value) -> bool:
    return _kind(value) in ("int", "float")


def _axis(name: str, values, base: SimConfig) -> Axis:
    """Check one axis's name and values (each value alone, on the base)."""
    allowed = [*NAMED_AXES, "policies", "workload.FIELD", "engine.FIELD"]
    table, _, sub = name.partition(".")
    if name not in NAMED_AXES:
        require(name != "seeds", "axes.seeds: seeds go at the top of the sweep file (seeds = N or a list)")
        require(table in _TABLES and sub in [f.name for f in fields(_TABLES[table])],
                f"axes: unknown key {name!r} (allowed: {', '.join(allowed)})")
        named = next((n for n, (path, _) in NAMED_AXES.items() if path == (table, sub)), None)
        require(named is None, f"axes.{name}: use the axis {named!r}")
    require(isinstance(values, list) and values, f"axes.{name} must be a non-empty list (got {values!r})")
    if name in ("load", "rate", "cv", "burstiness"):
        require(all(_is_number(v) and v > 0 for v in values), f"axes.{name} values must be numbers > 0 (got {values})")
        values = [float(v) for v in values]
        if name in ("load", "rate"):
            require(base.workload.arrival != "trace", f"axes.{name} needs a synthetic arrival process "
                                                      f"(the base replays a trace)")
        else:
            require(base.workload.arrival == "gamma", f"axes.{name} needs arrival = 'gamma' "
                                                      f"(the base has {base.workload.arrival!r})")
    elif name == "multimodal_share":
        require(all(_is_number(v) and 0 <= v <= 1 for v in values),
                f"axes.multimodal_share values must be numbers in [0, 1] (got {values})")
        values = [float(v) for v in values]
    elif name in NAMED_AXES:
        require(all(isinstance(v, str) and v for v in values), f"axes.{name} values must be names (got {values})")
    else:
        kinds = {_kind(v) for v in values}
        require(len(kinds) == 1 and None not in kinds,
                f"axes.{name} values must all be numbers, all strings or all booleans (got {values})")
        if kinds == {"float"}:
            values = [float(v) for v in values]
    axis = Axis(name=name, values=tuple(values))
    for value in axis.values:
        try:
            _apply(base, [(axis, value)])
        except InputError as err:
            raise InputError(f"axes.{name} = {value!r}: {err}") from None
    return axis


def describe(sweep: SweepConfig) -> list[str]:
    """The header lines ``simspec sweep`` prints."""
    points, seeds = size(sweep), len(sweep.seed_list)
    w = sweep.base.workload
    stop = f"{w.num_requests:,} requests" if w.num_requests else f"{w.duration_s:g} s of arrivals"
    axes = " | ".join(f"{a.name} {'/'.join(f'{v:g}' if isinstance(v, float) else str(v) for v in a.values)}"
                      for a in sweep.axes) or "none (one point: the base)"
    return [f"sweep: {points} grid point{'s' * (points != 1)} x {seeds} seed{'s' * (seeds != 1)} = "
            f"{points * seeds} tasks of {stop}, each serving {', '.join(sweep.base.policies)}",
            f"axes: {axes}; seeds {_seed_text(sweep.seed_list)}"
            + (f"; images {image_sizes(w.image_size).describe()}" if w.image_size is not None else "")]


def _seed_text(seeds) -> str:
    """'0, 1, 2', '0..1999' (a range), or the first few and how many."""
    seeds = list(seeds)
    if len(seeds) <= 8:
        return ", ".join(map(str, seeds))
    if seeds == list(range(seeds[0], seeds[0] + len(seeds))):
        return f"{seeds[0]}..{seeds[-1]}"
    return f"{', '.join(map(str, seeds[:4]))}, ... ({len(seeds):,} seeds)"
