"""``simspec sweep``: a grid of scenarios, each served by every policy, into
one Parquet table that grows as tasks finish and resumes after an interrupt.

Imports: the standard library, tqdm, simspec.config, .experiment, .costs,
.acceptance, .policies, .workloads, .types, .runfolder (atomic writes);
pyarrow and ray only inside the functions that need them, so ``simspec
--help`` stays fast. Implements DESIGN.md "Commands" (sweeps on a local
process pool by default, on a Ray cluster when asked) and "Bad input"
(interrupted sweeps resume from what was saved).

A sweep is a base scenario (a ``simulate`` config) and axes, lists of values
whose product is the grid, times seeds. One task = one grid point x one
seed: one :func:`simspec.experiment.run` serving every policy on the same
requests (common random numbers), giving one row per policy. A ``load`` axis
is a multiple of the AR saturation rate of the point's replica and mix,
found by :func:`simspec.experiment.saturation_rate` (base seed) once per
(model, device, cost model, acceptance, request mix, engine) and cached in
the table's metadata, so a resumed sweep reuses it.

The table has one row per scenario x seed x policy; rows are kept in grid
order (point, seed, policy) and the file is rewritten atomically (temporary
file + rename) as tasks finish, so it is readable whenever the sweep stops.
A row depends only on its scenario, seed and policy, so the same sweep run
serially, on a process pool or on Ray gives the same rows, and a rerun into
the same ``--out`` runs only the missing (scenario, seed, policy) rows. A
table whose rows are not all in the new grid (another base, fewer axis
values) is refused, as is one of another schema version.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import time
import tomllib
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path

from tqdm import tqdm

from simspec import __version__, acceptance, costs, experiment, policies, pool
from simspec import config as configuration
from simspec.config import SimConfig
from simspec.files import read_toml, write_atomic
from simspec.sim import EngineConfig
from simspec.types import InputError, require
from simspec.workloads import WorkloadConfig, cv_to_burstiness

SCHEMA_VERSION = 1
"""Version of the results table's columns; another version is refused."""
META_KEY = b"simspec.sweep"
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
        require(self.workers is None or self.workers >= 1, f"--workers must be >= 1 (got {self.workers})")
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


# --- the sweep file and flags ---------------------------------------------------


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
            model, gpu = costs.model_spec(config.model), costs.gpu_spec(config.device)
            built = costs.build(config.cost_model, model, gpu)
            acceptance.build(config.acceptance)
            config.engine.kv_budget_tokens(model, gpu)
        except InputError as err:
            raise InputError(f"sweep: {err}") from None
        out[(config.model, config.device, config.cost_model)] = built.calibration
    return out


# --- the grid ---------------------------------------------------------------------


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
    return replace(config, workload=workload, policies=("ar",), slo_ttft_ms=None, slo_tpot_ms=None)


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
            config = replace(config, workload=replace(config.workload, rate_per_s=values["load"] * sat))
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


# --- tasks (run in workers: module-level, picklable by reference) ----------------


def config_from_toml(text: str) -> SimConfig:
    """A config from a resolved config's TOML (``to_toml``'s output)."""
    return configuration.build(tomllib.loads(text))


def run_task(config_toml: str) -> dict[str, dict[str, float]]:
    """One task: every policy of the config on its requests -> {policy: metrics}."""
    return experiment.run(config_from_toml(config_toml)).metrics


def run_saturation(config_toml: str) -> float:
    return experiment.saturation_rate(config_from_toml(config_toml))


# --- the results table -----------------------------------------------------------------


def read_results(path: str | Path, *, flag: str = "RESULTS"):
    """The results table at ``path`` (a ``pyarrow.Table``), checked to be a
    sweep table of this schema version."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = Path(path)
    require(path.is_file(), f"{flag} {path}: no such file")
    try:
        table = pq.read_table(path)
    except (pa.ArrowInvalid, OSError) as err:
        raise InputError(f"{flag} {path}: not a Parquet file ({str(err).splitlines()[0]})") from None
    meta = (table.schema.metadata or {}).get(META_KEY)
    require(meta is not None, f"{flag} {path}: not a simspec sweep table (no {META_KEY.decode()} metadata)")
    version = json.loads(meta).get("schema_version")
    require(version == SCHEMA_VERSION, f"{flag} {path}: results schema version {version}; this simspec reads "
                                       f"version {SCHEMA_VERSION} (re-run the sweep into a new file)")
    return table


def same_rows(a: str | Path, b: str | Path) -> bool:
    """Whether two results tables hold the same rows, in any order (NaN
    equal to NaN)."""
    frames = [read_results(p).to_pandas().sort_values(list(_KEYS[1:])).reset_index(drop=True) for p in (a, b)]
    return frames[0].equals(frames[1])


def metadata(table) -> dict:
    """The sweep description stored with a results table."""
    return json.loads(table.schema.metadata[META_KEY])


def _existing(path: Path) -> tuple[dict, dict]:
    """Rows already at ``path``: {(scenario_id, seed, policy): metrics} and
    the cached saturation rates; nothing if the file does not exist."""
    if not path.exists():
        return {}, {}
    require(not path.is_dir(), f"--out {path} is a folder; give a .parquet file name")
    table = read_results(path, flag="--out")
    meta_columns = set(_KEYS) | set(DIMS) | set(_INFO) | {"config_toml"} | set(metadata(table)["axes"])
    rows = {}
    for row in table.to_pylist():
        key = (row["scenario_id"], row["seed"], row["policy"])
        rows[key] = {k: v for k, v in row.items() if k not in meta_columns and v is not None}
    return rows, dict(metadata(table).get("saturation", {}))


def _column(name: str, values: list, inferred: set[str]):
    """One table column: the scenario's numbers with fixed types, strings
    and generic axes inferred, metrics int64 when every value is an int."""
    import pyarrow as pa

    if name in ("schema_version", "seed", "num_requests"):
        return pa.array(values, type=pa.int64())
    if name in ("load", "rate_per_s", "cv", "multimodal_share", "saturation_per_s"):
        return pa.array(values, type=pa.float64())
    if name in inferred:
        return pa.array(values)
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values if v is not None)
    return pa.array(values, type=pa.int64() if ints and any(v is not None for v in values) else pa.float64())


def _table(sweep: SweepConfig, points: list[Point], done: dict, saturation: dict, rows: dict):
    """The table of every finished row, in grid order, with its metadata.
    ``rows`` memoizes the rows already built (their config TOML is costly)."""
    import pyarrow as pa

    records = []
    for point in points:
        for seed in sweep.seed_list:
            for policy in sweep.base.policies:
                key = (point.scenario_id, seed, policy)
                if key in done and key not in rows:
                    config = replace(point.config, seed=seed, policies=(policy,))
                    rows[key] = {"schema_version": SCHEMA_VERSION, "scenario_id": point.scenario_id, "seed": seed,
                                 "policy": policy, **point.columns, **done[key],
                                 "config_toml": configuration.to_toml(config)}
                if key in rows:
                    records.append(rows[key])
    names: dict[str, None] = {}
    for record in records:
        names.update(dict.fromkeys(k for k in record if k != "config_toml"))
    names["config_toml"] = None
    inferred = {*_KEYS, *DIMS, *_INFO, "config_toml", *(a.name for a in sweep.axes)}
    columns = {name: _column(name, [r.get(name) for r in records], inferred) for name in names}
    used = {_saturation_key(p.config) for p in points if p.columns["load"] is not None}
    meta = {"schema_version": SCHEMA_VERSION, "simspec_version": __version__,
            "axes": [a.name for a in sweep.axes], "policies": list(sweep.base.policies),
            "seeds": list(sweep.seed_list), "points": len(points),
            "saturation": {k: v for k, v in sorted(saturation.items()) if k in used}}
    table = pa.table(columns)
    return table.replace_schema_metadata({META_KEY: json.dumps(meta, sort_keys=True).encode()})


def _write(path: Path, table) -> None:
    import pyarrow.parquet as pq

    write_atomic(path, lambda f: pq.write_table(table, f))


# --- the run -----------------------------------------------------------------------------


def run(sweep: SweepConfig, out: str | Path, runner: Runner = Runner(), *,
        log: Callable[[str], None] = lambda line: None) -> Outcome:
    """Run every task of ``sweep`` not already in ``out`` and write the
    table there as tasks finish (see the module docstring). Ctrl-C keeps
    what finished and raises KeyboardInterrupt."""
    out = Path(out)
    require(out.parent.is_dir(), f"--out {out}: folder {out.parent} does not exist")
    done, saturation = _existing(out)
    total = size(sweep) * len(sweep.seed_list)
    executor = _executor(runner, total)
    try:
        if any(a.name == "load" for a in sweep.axes):
            _saturate(sweep, saturation, executor, runner.progress)
        points = resolve(sweep, saturation)
        if any(a.name == "load" for a in sweep.axes):
            log(_saturation_line(points))
        tasks = _plan(sweep, points, done, out)
        where = f"on Ray ({runner.ray})" if runner.ray else _where(executor)
        log(f"results: {out} ({total - len(tasks)} of {total} tasks there; {len(tasks)} to run {where})")
        interrupted = _serve(sweep, points, tasks, done, saturation, out, executor, runner)
    except BaseException:
        executor.close(ok=False)
        raise
    executor.close(ok=not interrupted)  # an interrupted pool is ended, its running tasks abandoned
    if interrupted:
        raise KeyboardInterrupt
    return Outcome(path=out, tasks_total=total, tasks_run=len(tasks), rows=len(done), saturation_per_s=saturation)


def _serve(sweep, points, tasks, done: dict, saturation: dict, out: Path, executor, runner: Runner) -> bool:
    """Run ``tasks``, adding their metrics to ``done`` and rewriting the
    table as they finish; True if Ctrl-C stopped it (what finished is written)."""
    rows: dict = {}

    def flush() -> float:
        started = time.monotonic()
        _write(out, _table(sweep, points, done, saturation, rows))
        # A big table takes a while to write: keep that under a fifth of the time.
        return time.monotonic() + max(runner.flush_every_s, 4 * (time.monotonic() - started))

    next_flush_s, dirty, interrupted = time.monotonic() + runner.flush_every_s, False, False
    results = executor.imap(run_task, [config_toml for *_, config_toml in tasks])
    try:
        with tqdm(total=len(tasks), desc="sweep", unit="task", disable=not runner.progress or not tasks) as bar:
            for i, metrics in results:
                point, seed, _ = tasks[i]
                done.update({(point.scenario_id, seed, policy): m for policy, m in metrics.items()})
                dirty = True
                bar.update()
                if time.monotonic() >= next_flush_s:
                    next_flush_s, dirty = flush(), False
    except KeyboardInterrupt:
        interrupted = True
    finally:
        results.close()
        if dirty:  # on success, error or Ctrl-C: what finished is kept
            flush()
    return interrupted


def _saturate(sweep: SweepConfig, cache: dict[str, float], executor, progress: bool) -> None:
    """Add the AR saturation rate of every mix of the grid missing from ``cache``."""
    needed: dict[str, SimConfig] = {}
    for config, _ in _points(sweep):
        needed.setdefault(_saturation_key(config), saturation_config(config))
    todo = [key for key in needed if key not in cache]
    with tqdm(total=len(todo), desc="AR saturation", unit="mix", disable=not progress or not todo) as bar:
        for i, rate in executor.imap(run_saturation, [configuration.to_toml(needed[k]) for k in todo]):
            cache[todo[i]] = rate
            bar.update()


def _plan(sweep: SweepConfig, points: list[Point], done: dict, out: Path) -> list[tuple[Point, int, str]]:
    """The tasks still to run: (point, seed, config TOML with the missing
    policies). Refuses rows of ``done`` that are not in the grid."""
    expected = {(p.scenario_id, seed, policy) for p in points for seed in sweep.seed_list
                for policy in sweep.base.policies}
    stale = [key for key in done if key not in expected]
    if stale:
        raise InputError(f"--out {out} holds {len(stale)} row(s) that are not in this sweep's grid (e.g. scenario "
                         f"{stale[0][0]} seed {stale[0][1]} policy {stale[0][2]}): another base config or fewer "
                         f"axis values or policies; choose another --out or delete it")
    tasks = []
    for p in points:
        for seed in sweep.seed_list:
            missing = tuple(q for q in sweep.base.policies if (p.scenario_id, seed, q) not in done)
            if missing:
                tasks.append((p, seed, configuration.to_toml(replace(p.config, seed=seed, policies=missing))))
    return tasks


def _saturation_line(points: list[Point]) -> str:
    rates = {}
    for p in points:
        c = p.columns
        rates[f"{c['model']} on {c['device']}, {c['multimodal_share']:.0%} multimodal"] = c["saturation_per_s"]
    if len(rates) > 6:
        return (f"AR saturation: {min(rates.values()):.3g}-{max(rates.values()):.3g} req/s over {len(rates)} "
                f"replica/mix combinations (column saturation_per_s)")
    return "AR saturation: " + "; ".join(f"{k} {v:.3g} req/s" for k, v in rates.items())


def _executor(runner: Runner, jobs: int):
    if runner.ray:
        return pool.Ray(runner.ray, runner.processes, runner.probe_timeout_s, runner.connect_timeout_s)
    return pool.executor(runner.processes, jobs)


def _where(executor) -> str:
    return f"on {executor.processes} processes" if isinstance(executor, pool.Processes) else "in this process"


# --- the command -------------------------------------------------------------------------


def describe(sweep: SweepConfig) -> list[str]:
    """The header lines ``simspec sweep`` prints."""
    points, seeds = size(sweep), len(sweep.seed_list)
    w = sweep.base.workload
    stop = f"{w.num_requests:,} requests" if w.num_requests else f"{w.duration_s:g} s of arrivals"
    axes = " | ".join(f"{a.name} {'/'.join(f'{v:g}' if isinstance(v, float) else str(v) for v in a.values)}"
                      for a in sweep.axes) or "none (one point: the base)"
    return [f"sweep: {points} grid point{'s' * (points != 1)} x {seeds} seed{'s' * (seeds != 1)} = "
            f"{points * seeds} tasks of {stop}, each serving {', '.join(sweep.base.policies)}",
            f"axes: {axes}; seeds {', '.join(map(str, sweep.seed_list))}"]


