"""``simspec tune``: the best parameters of each verification policy family
per load level and burstiness, for one objective, with stated confidence.

Imports: numpy, scipy.stats (lazily), tqdm, tomllib/tomli_w and simspec's
config, experiment, metrics, policies, pool, sim and workloads; optuna only
inside the search (``simspec --help`` stays fast). Modules: ``records``,
``search``, ``file`` (the tuned file), ``table``. DESIGN.md
"Commands" (``sweep / tune``).

For each cell (load level x inter-arrival CV) and family (linear, tree,
truncate, marginal) an Optuna TPE sampler, seeded from the run's seed and
the cell, proposes parameters; a family with no more settings than trials is
enumerated instead. Every candidate is simulated on the same *search seeds*
(common random numbers: the seed fixes arrivals, lengths and acceptance
draws). The ``top`` best of each family are then re-run on fresh *confirm
seeds*, which rank them and give paired (CRN) t-intervals of differences.

The result is a tuned file (TOML, :func:`write`): per cell the best spec of
every family with its per-seed values, the overall best, the runner-up and
the 95% interval of their difference; per CV a ``staged`` policy (see
simspec.policies) that switches to each cell's best spec at the decode batch
size that cell's load produced. ``simspec simulate --policy-file`` and the
live engine load it through :func:`load` and :func:`policies_for` /
:func:`adaptive_policy`.
"""

from __future__ import annotations

from simspec.tune.file import adaptive_policy, dumps, load, nearest_cv, policies_for, with_policy_file
from simspec.tune.records import (FAMILIES, FIXED, FORMAT, OBJECTIVES, SPACES, Candidate, Cell, Paired, Run, Schedule,
                                  Stage, TuneConfig, Tuned, paired)
from simspec.tune.search import Bench, cell_config, schedule_for, scenario_cv, seeds_of, tune, tune_cell
from simspec.tune.table import TABLE_COLUMNS, notes, table_csv, table_markdown, table_rows

__all__ = ["TuneConfig", "Tuned", "Cell", "Candidate", "Run", "Schedule", "Stage", "Paired", "Bench", "tune",
           "tune_cell", "load", "dumps", "paired", "adaptive_policy", "policies_for", "with_policy_file",
           "nearest_cv", "cell_config", "scenario_cv", "schedule_for", "seeds_of", "table_rows", "table_markdown",
           "table_csv", "notes", "FAMILIES", "FIXED", "FORMAT", "OBJECTIVES", "SPACES", "TABLE_COLUMNS"]
