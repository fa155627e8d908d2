"""``simspec sweep``: a grid of scenarios, each served by every policy, into
one Parquet table that grows as tasks finish and resumes after an interrupt.

Imports: the standard library, tqdm, simspec.config, .experiment, .costs,
.acceptance, .policies, .pool, .files, .workloads, .types; pyarrow and ray
only inside the functions that need them, so ``simspec --help`` stays fast.
Modules: ``records`` (the sweep and its axes), ``spec`` (from its file and
flags), ``grid`` (points, scenario ids, saturation), ``table`` (the Parquet
results), ``execute`` (tasks and where they run). Implements DESIGN.md "Commands" (sweeps on a local
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

from simspec.sweep.execute import config_from_toml, run, run_saturation, run_task
from simspec.sweep.grid import calibration, canonical, resolve, saturation_config, scenario_id, size
from simspec.sweep.records import (DIMS, EXCLUSIVE, META_KEY, NAMED_AXES, SCHEMA_VERSION, Axis, Outcome, Point,
                                   Runner, SweepConfig)
from simspec.sweep.spec import describe, from_values, load
from simspec.sweep.table import metadata, read_results, same_rows

__all__ = ["Axis", "DIMS", "EXCLUSIVE", "META_KEY", "NAMED_AXES", "Outcome", "Point", "Runner", "SCHEMA_VERSION",
           "SweepConfig", "calibration", "canonical", "config_from_toml", "describe", "from_values", "load",
           "metadata", "read_results", "resolve", "run", "run_saturation", "run_task", "same_rows",
           "saturation_config", "scenario_id", "size"]
