"""The results table: one Parquet file, one row per scenario x seed x policy,
with the sweep's description in its metadata."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

from simspec import __version__, config as configuration
from simspec.files import write_atomic
from simspec.sweep.grid import _saturation_key
from simspec.sweep.records import _INFO, _KEYS, DIMS, META_KEY, SCHEMA_VERSION, Point, SweepConfig
from simspec.types import InputError, require


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
