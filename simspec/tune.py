"""``simspec tune``: the best parameters of each verification policy family
per load level and burstiness, for one objective, with stated confidence.

Imports: numpy, scipy.stats (lazily), tqdm, tomllib/tomli_w and simspec's config,
experiment, metrics, policies, sim and workloads; optuna only inside
:func:`_search` (``simspec --help`` stays fast). Issue 5; DESIGN.md
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

import csv
import io
import itertools
import math
import tomllib
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np
import tomli_w
from tqdm import tqdm

from simspec import __version__, config as configuration, experiment, metrics, policies, pool
from simspec.config import SimConfig
from simspec.files import read_toml
from simspec.sim import simulate
from simspec.types import InputError, RunLog, require
from simspec.workloads import arrival_cv, cv_to_burstiness

FORMAT = "simspec-tuned/1"
FAMILIES = ("linear", "tree", "truncate", "marginal")
FIXED = ("linear", "tree", "truncate")  # the fixed verification strategies marginal is compared with
OBJECTIVES = {"mean_e2el": ("mean_e2el_ms", "minimize"), "p95_e2el": ("p95_e2el_ms", "minimize"),
              "goodput": ("request_goodput", "maximize")}
SPACES: dict[str, dict[str, tuple]] = {  # each family's search space, values in order
    "linear": {"k": tuple(range(1, 9))},
    "tree": {"depth": tuple(range(2, 9)), "topk": tuple(range(2, 9)), "budget": (8, 16, 24, 32, 48, 64, 96)},
    "truncate": {"k_max": tuple(range(2, 11)), "threshold": tuple(round(0.05 * i, 2) for i in range(1, 19))},
    "marginal": {"depth": tuple(range(2, 11)), "topk": tuple(range(1, 11)), "max_nodes": (64, 128, 256, 512, 1024)},
}
LEVEL = 0.95  # confidence of every interval tune reports


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneConfig:
    """What to tune and how hard; the scenario itself is a SimConfig."""

    loads: tuple[float, ...] = (0.25, 0.5, 0.75)  # x the scenario's AR saturation rate
    rates_per_s: tuple[float, ...] = ()  # absolute request rates instead of loads
    cvs: tuple[float, ...] = ()  # inter-arrival CVs (1 = Poisson); empty: the scenario's
    objective: str = "mean_e2el"
    families: tuple[str, ...] = FAMILIES
    trials: int = 16  # per family and cell; a family with fewer settings is enumerated
    search_seeds: int = 2  # seeds every candidate is simulated on
    confirm_seeds: int = 8  # fresh seeds the top candidates are re-run on
    top: int = 2  # candidates per family re-run on the confirm seeds
    saturation_requests: int = 400  # requests of the AR saturation measurement
    jobs: int = 1  # cells tuned in parallel (processes)

    def __post_init__(self):
        require(self.objective in OBJECTIVES,
                f"objective must be one of {', '.join(OBJECTIVES)} (got {self.objective!r})")
        require(len(self.families) >= 1 and all(f in FAMILIES for f in self.families),
                f"families must be among {', '.join(FAMILIES)} (got {', '.join(self.families) or 'none'})")
        require(len(set(self.families)) == len(self.families), f"families must be distinct (got {self.families})")
        for name in ("loads", "rates_per_s", "cvs"):
            values = getattr(self, name)
            require(all(math.isfinite(v) and v > 0 for v in values), f"{name} must be > 0 (got {list(values)})")
            require(len(set(values)) == len(values), f"{name} must be distinct (got {list(values)})")
        require(len(self.loads) + len(self.rates_per_s) >= 1, "loads or rates_per_s must name a load level")
        require(all(v <= 1.5 for v in self.loads), f"loads must be <= 1.5 x saturation (got {list(self.loads)})")
        for name, low in (("trials", 1), ("search_seeds", 1), ("confirm_seeds", 2), ("top", 1),
                          ("saturation_requests", 50), ("jobs", 1)):
            require(getattr(self, name) >= low, f"{name} must be >= {low} (got {getattr(self, name)})")

    @property
    def metric(self) -> str:
        return OBJECTIVES[self.objective][0]

    @property
    def maximize(self) -> bool:
        return OBJECTIVES[self.objective][1] == "maximize"


# -- records ------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One candidate on one seed."""

    value: float  # the objective's metric
    score: float  # what is ranked, larger is better (see _score)
    batch: float  # time-weighted mean decode batch size
    slo_gap: float  # the median request's worst latency / SLO ratio (nan without SLOs)
    ar_share: float  # share of rounds planned without a draft


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A spec with its runs on the confirm seeds."""

    spec: str
    family: str
    values: tuple[float, ...]  # objective metric per confirm seed
    scores: tuple[float, ...]  # ranking score per confirm seed
    batch: float  # mean decode batch size over the confirm runs
    slo_gap: float  # mean over the confirm runs
    ar_share: float = math.nan  # share of rounds planned without a draft, over the confirm runs

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def score(self) -> float:
        return float(np.mean(self.scores))


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """Paired (CRN) t-interval of mean(a - b) over shared seeds."""

    diff: float
    low: float
    high: float

    @property
    def separable(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One load level x CV: each family's best, in ranking order overall."""

    load: float  # x AR saturation
    rate_per_s: float
    cv: float
    families: dict[str, Candidate]  # family -> its best spec
    best: Candidate
    runner_up: Candidate | None  # second best of all confirmed candidates
    meets_slo: bool | None  # goodput objective: did any candidate serve a request within the SLOs
    adaptive: tuple[float, ...] = ()  # the CV's staged policy, objective per confirm seed


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    min_batch: int
    spec: str
    load: float  # the cell it comes from


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """The load-adaptive policy of one CV: each cell's best from the decode
    batch size its load produced."""

    cv: float
    stages: tuple[Stage, ...]

    @property
    def policy(self) -> str:
        if len(self.stages) == 1:
            return self.stages[0].spec
        return "staged:stages=" + ";".join(f"{s.min_batch}:{s.spec}" for s in self.stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuned:
    """A tuned file: what :func:`tune` returns and :func:`load` reads."""

    objective: str
    scenario: SimConfig  # the scenario tuned (policies are not part of it)
    saturation_rate_per_s: float
    search_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    trials: int
    cells: tuple[Cell, ...]
    schedules: tuple[Schedule, ...]

    @property
    def maximize(self) -> bool:
        return OBJECTIVES[self.objective][1] == "maximize"


# -- statistics ---------------------------------------------------------------

def paired(a, b, level: float = LEVEL) -> Paired:
    """The t-interval of mean(a - b) over paired seeds."""
    from scipy import stats  # imported when needed: keeps `simspec --help` fast

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean = float(d.mean())
    if len(d) < 2:
        return Paired(diff=mean, low=-math.inf, high=math.inf)
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return Paired(diff=mean, low=mean - half, high=mean + half)


# -- evaluation -----------------------------------------------------------------

def cell_config(base: SimConfig, rate_per_s: float, cv: float) -> SimConfig:
    """The scenario at one load level and CV (Poisson for CV 1, else Gamma)."""
    arrival = {"arrival": "poisson"} if cv == 1 else {"arrival": "gamma", "burstiness": cv_to_burstiness(cv)}
    return replace(base, workload=replace(base.workload, rate_per_s=rate_per_s, **arrival))


def scenario_cv(config: SimConfig) -> float:
    w = config.workload
    require(w.arrival in ("poisson", "gamma"),
            f"tune sets arrivals per --cv (Poisson or Gamma); arrival {w.arrival!r} is not supported")
    return 1.0 if w.arrival == "poisson" else round(w.burstiness ** -0.5, 6)


def _mean_batch(log: RunLog) -> float:
    busy = log.step_batch > 0
    weight = log.step_duration_s[busy]
    return float(np.sum(log.step_batch[busy] * weight) / np.sum(weight)) if weight.sum() > 0 else 0.0


def _slo_gap(log: RunLog, config: SimConfig) -> float:
    """How far the median request is from the SLOs: its worst latency/SLO
    ratio (1 = just meets them)."""
    if config.slo_ttft_ms is None and config.slo_tpot_ms is None:
        return math.nan
    ratios = []
    for r in log.requests:
        if not math.isfinite(r.finish_s):
            continue
        worst = 0.0
        if config.slo_ttft_ms is not None:
            worst = max(worst, (r.first_token_s - r.arrival_s) * 1e3 / config.slo_ttft_ms)
        if config.slo_tpot_ms is not None and r.output_tokens > 1:
            worst = max(worst, (r.finish_s - r.first_token_s) * 1e3 / (r.output_tokens - 1) / config.slo_tpot_ms)
        ratios.append(worst)
    return float(np.median(ratios)) if ratios else math.inf


def _score(value: float, gap: float, maximize: bool) -> float:
    """Larger is better. For goodput, a candidate that serves no request
    within the SLOs ranks by how close its median request came."""
    if not maximize:
        return -value
    return value if value > 0 else -gap


class Bench:
    """Runs specs on one cell's scenario, one resolved scenario per seed,
    each (spec, seed) once."""

    def __init__(self, config: SimConfig, tc: TuneConfig, tick: Callable[[], None] | None = None):
        self.config, self.tc, self.tick = config, tc, tick
        self.scenarios: dict[int, experiment.Scenario] = {}
        self.runs: dict[tuple[str, int], Run] = {}

    def run(self, spec: str, seed: int) -> Run:
        key = (spec, seed)
        if key not in self.runs:
            if seed not in self.scenarios:
                self.scenarios[seed] = experiment.resolve(replace(self.config, seed=seed))
            s = self.scenarios[seed]
            log = simulate(s.requests, policy=policies.parse(spec), label=spec, costs=s.costs,
                           acceptance=s.acceptance, engine=self.config.engine, kv_budget_tokens=s.kv_budget_tokens,
                           seed=seed)
            summary = metrics.summarize(log, slo_ttft_ms=self.config.slo_ttft_ms, slo_tpot_ms=self.config.slo_tpot_ms)
            value, gap = float(summary[self.tc.metric]), _slo_gap(log, self.config)
            self.runs[key] = Run(value=value, score=_score(value, gap, self.tc.maximize), batch=_mean_batch(log),
                                 slo_gap=gap, ar_share=float(summary["plan_share_ar"]))
            if self.tick is not None:
                self.tick()
        return self.runs[key]

    def candidate(self, spec: str, family: str, seeds) -> Candidate:
        runs = [self.run(spec, s) for s in seeds]
        return Candidate(spec=spec, family=family, values=tuple(r.value for r in runs),
                         scores=tuple(r.score for r in runs), batch=float(np.mean([r.batch for r in runs])),
                         slo_gap=float(np.mean([r.slo_gap for r in runs])),
                         ar_share=float(np.mean([r.ar_share for r in runs])))

    def mean_score(self, spec: str, seeds) -> float:
        return float(np.mean([self.run(spec, s).score for s in seeds]))


def seeds_of(config: SimConfig, tc: TuneConfig) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Search seeds, then fresh confirm seeds."""
    search = tuple(config.seed + i for i in range(tc.search_seeds))
    return search, tuple(config.seed + tc.search_seeds + i for i in range(tc.confirm_seeds))


def _space_size(family: str) -> int:
    return math.prod(len(v) for v in SPACES[family].values())


def _spec(family: str, params: dict) -> str:
    return policies.make(family, params).label


def _search(bench: Bench, family: str, seeds, trials: int, sampler_seed: int) -> list[str]:
    """Candidate specs of one family, best search score first: the family's
    defaults plus Optuna's (or every setting when there are few)."""
    specs = [policies.parse(family).label]
    space = SPACES[family]
    if _space_size(family) <= trials:
        specs += [_spec(family, dict(zip(space, combo))) for combo in itertools.product(*space.values())]
    else:
        import optuna  # only when tuning: keeps `simspec --help` fast

        optuna.logging.set_verbosity(optuna.logging.WARNING)
        sampler = optuna.samplers.TPESampler(seed=sampler_seed, n_startup_trials=min(6, trials))
        study = optuna.create_study(direction="maximize", sampler=sampler)

        def objective(trial) -> float:
            spec = _spec(family, {name: values[trial.suggest_int(name, 0, len(values) - 1)]
                                  for name, values in space.items()})
            specs.append(spec)
            return bench.mean_score(spec, seeds)

        study.optimize(objective, n_trials=trials)
    unique = list(dict.fromkeys(specs))
    return sorted(unique, key=lambda s: -bench.mean_score(s, seeds))  # stable: ties keep proposal order


def _sampler_seed(config: SimConfig, cell_key: tuple[int, ...], family: str) -> int:
    ss = np.random.SeedSequence([config.seed, *cell_key, FAMILIES.index(family)])
    return int(ss.generate_state(1)[0])


def tune_cell(config: SimConfig, tc: TuneConfig, *, load: float, cv: float, cell_key: tuple[int, ...],
              tick: Callable[[], None] | None = None) -> Cell:
    """Tune every family of ``tc`` on one cell's scenario ``config``."""
    bench = Bench(config, tc, tick)
    search, confirm = seeds_of(config, tc)
    confirmed: list[Candidate] = []
    families: dict[str, Candidate] = {}
    for family in tc.families:
        ranked = _search(bench, family, search, tc.trials, _sampler_seed(config, cell_key, family))
        top = [bench.candidate(spec, family, confirm) for spec in ranked[:tc.top]]
        top.sort(key=lambda c: -c.score)
        families[family] = top[0]
        confirmed += top
    confirmed.sort(key=lambda c: -c.score)
    meets = None
    if tc.objective == "goodput":
        meets = any(v > 0 for c in confirmed for v in c.values)
    return Cell(load=load, rate_per_s=config.workload.rate_per_s, cv=cv, families=families, best=confirmed[0],
                runner_up=confirmed[1] if len(confirmed) > 1 else None, meets_slo=meets)


def _tune_cell_job(job, tick: Callable[[], None] | None = None) -> Cell:
    config, tc, load, cv, key = job
    return tune_cell(config, tc, load=load, cv=cv, cell_key=key, tick=tick)


def schedule_for(cells: list[Cell], cv: float) -> Schedule:
    """Each cell's best spec from the decode batch size its load produced:
    the boundary between neighbouring loads is the geometric mean of their
    mean decode batches. Neighbours with the same best merge."""
    ordered = sorted((c for c in cells if c.cv == cv), key=lambda c: c.rate_per_s)
    stages = [Stage(min_batch=1, spec=ordered[0].best.spec, load=ordered[0].load)]
    for low, high in zip(ordered, ordered[1:]):
        if high.best.spec == stages[-1].spec:
            continue
        start = int(math.ceil(math.sqrt(max(low.best.batch, 1.0) * max(high.best.batch, 1.0))))
        if start <= stages[-1].min_batch:
            continue  # its load did not raise the batch: the earlier stage keeps it
        stages.append(Stage(min_batch=start, spec=high.best.spec, load=high.load))
    return Schedule(cv=cv, stages=tuple(stages))


def tune(base: SimConfig, tc: TuneConfig, *, progress: bool = False) -> Tuned:
    """Tune ``base`` (its workload's rate and arrivals are replaced per
    cell) at every load level and CV of ``tc``."""
    own = scenario_cv(base)  # refuses traces and on/off arrivals before any work
    cvs = tc.cvs or (own,)
    saturation = experiment.saturation_rate(base, requests=tc.saturation_requests)
    levels = [(rate / saturation, rate) for rate in tc.rates_per_s] or [(x, x * saturation) for x in tc.loads]
    jobs = [(cell_config(base, rate, cv), tc, load, cv, (i, j))
            for j, cv in enumerate(cvs) for i, (load, rate) in enumerate(levels)]
    per_cell = sum(min(_space_size(f), tc.trials) + 1 for f in tc.families) * tc.search_seeds \
        + len(tc.families) * tc.top * tc.confirm_seeds  # at most: repeated proposals are not re-run
    total = len(jobs) * (per_cell + tc.confirm_seeds)
    with tqdm(total=total, unit="run", disable=not progress, leave=False, desc="tune") as bar:
        if tc.jobs == 1:
            cells = [_tune_cell_job(job, tick=bar.update) for job in jobs]
        else:
            workers = pool.Processes(min(tc.jobs, len(jobs)))
            cells: list = [None] * len(jobs)
            try:
                for i, cell in workers.imap(_tune_cell_job, jobs):
                    cells[i] = cell
                    bar.update(per_cell)
            finally:
                workers.close()
        schedules = tuple(schedule_for(cells, cv) for cv in cvs)
        search, confirm = seeds_of(base, tc)
        final = []
        for cell, job in zip(cells, jobs):
            policy = next(s.policy for s in schedules if s.cv == cell.cv)
            values = Bench(job[0], tc, tick=bar.update).candidate(policy, "staged", confirm).values
            final.append(replace(cell, adaptive=values))
    return Tuned(objective=tc.objective, scenario=base, saturation_rate_per_s=saturation, search_seeds=search,
                 confirm_seeds=confirm, trials=tc.trials, cells=tuple(final), schedules=schedules)


# -- the tuned file -----------------------------------------------------------

def _candidate_dict(c: Candidate) -> dict:
    return {"spec": c.spec, "mean": c.mean, "mean_decode_batch": c.batch, "ar_share": c.ar_share,
            "values": list(c.values),
            "scores": list(c.scores), **({"slo_gap": c.slo_gap} if math.isfinite(c.slo_gap) else {})}


def _scenario_dict(config: SimConfig) -> dict:
    data = tomllib.loads(configuration.to_toml(config))
    data.pop("policies", None)
    return data


def dumps(t: Tuned) -> str:
    """The tuned file's text: same Tuned, same bytes."""
    metric, direction = OBJECTIVES[t.objective]
    cells = []
    for c in t.cells:
        entry = {"load": c.load, "rate_per_s": c.rate_per_s, "cv": c.cv, "best": c.best.spec}
        if c.runner_up is not None:
            p = paired(c.best.values, c.runner_up.values)
            entry.update(runner_up=c.runner_up.spec, best_minus_runner_up=p.diff, ci95=[p.low, p.high],
                         separable=p.separable)
        if c.meets_slo is not None:
            entry["meets_slo"] = c.meets_slo
        entry["adaptive_values"] = list(c.adaptive)
        entry["families"] = {f: _candidate_dict(cand) for f, cand in c.families.items()}
        cells.append(entry)
    doc = {"format": FORMAT, "simspec_version": __version__, "objective": t.objective, "metric": metric,
           "direction": direction, "saturation_rate_per_s": t.saturation_rate_per_s,
           "search_seeds": list(t.search_seeds), "confirm_seeds": list(t.confirm_seeds), "trials": t.trials,
           "schedules": [{"cv": s.cv, "policy": s.policy,
                          "stages": [{"min_batch": st.min_batch, "spec": st.spec, "load": st.load}
                                     for st in s.stages]} for s in t.schedules],
           "scenario": _scenario_dict(t.scenario), "cells": cells}
    header = ("# simspec tuned policies (`simspec tune`). Load with `simspec simulate --policy-file FILE`,\n"
              "# or in the live engine: simspec.tune.adaptive_policy(simspec.tune.load(FILE)).\n")
    return header + tomli_w.dumps(doc)


def _get(table: dict, key: str, kind, where: str):
    value = table.get(key)
    ok = isinstance(value, kind) and not isinstance(value, bool) if kind is not bool else isinstance(value, bool)
    require(ok, f"{where}: {key} missing or not a {getattr(kind, '__name__', kind)}")
    return value


def _spec_ok(spec, where: str) -> str:
    require(isinstance(spec, str), f"{where}: policy spec must be a string (got {spec!r})")
    try:
        return policies.parse(spec).label
    except InputError as err:
        raise InputError(f"{where}: {err}") from None


def _candidate(table, family: str, where: str) -> Candidate:
    require(isinstance(table, dict), f"{where}: must be a table")
    values = tuple(float(v) for v in _get(table, "values", list, where))
    scores = tuple(float(v) for v in table.get("scores", [-v for v in values]))
    return Candidate(spec=_spec_ok(table.get("spec"), where), family=family, values=values, scores=scores,
                     batch=float(_get(table, "mean_decode_batch", (int, float), where)),
                     slo_gap=float(table.get("slo_gap", math.nan)), ar_share=float(table.get("ar_share", math.nan)))


def load(path: str | Path) -> Tuned:
    """Read and check a tuned file; bad files raise one-line InputErrors."""
    where = f"policy file {path}"
    data = read_toml(path, "policy file")
    require(data.get("format") == FORMAT,
            f"{where}: format must be {FORMAT!r} (got {data.get('format')!r}); write it with `simspec tune`")
    objective = _get(data, "objective", str, where)
    require(objective in OBJECTIVES, f"{where}: objective must be one of {', '.join(OBJECTIVES)} (got {objective!r})")
    scenario = configuration.build(_get(data, "scenario", dict, where))
    cells = []
    for i, entry in enumerate(_get(data, "cells", list, where)):
        at = f"{where} cells[{i}]"
        require(isinstance(entry, dict), f"{at}: must be a table")
        fams = _get(entry, "families", dict, at)
        require(len(fams) >= 1, f"{at}: families is empty")
        families = {f: _candidate(t, f, f"{at} families.{f}") for f, t in fams.items()}
        best = _spec_ok(entry.get("best"), at)
        if "runner_up" in entry:
            _spec_ok(entry["runner_up"], at)
        by_spec = {c.spec: c for c in families.values()}
        require(best in by_spec, f"{at}: best {best!r} is none of the families' specs")
        cells.append(Cell(load=float(_get(entry, "load", (int, float), at)),
                          rate_per_s=float(_get(entry, "rate_per_s", (int, float), at)),
                          cv=float(_get(entry, "cv", (int, float), at)), families=families, best=by_spec[best],
                          runner_up=None, meets_slo=entry.get("meets_slo"),
                          adaptive=tuple(float(v) for v in entry.get("adaptive_values", []))))
    require(cells, f"{where}: cells is empty")
    schedules = []
    for i, entry in enumerate(_get(data, "schedules", list, where)):
        at = f"{where} schedules[{i}]"
        require(isinstance(entry, dict), f"{at}: must be a table")
        stages = tuple(Stage(min_batch=int(_get(s, "min_batch", int, at)), spec=_spec_ok(s.get("spec"), at),
                             load=float(_get(s, "load", (int, float), at))) for s in _get(entry, "stages", list, at))
        require(stages and stages[0].min_batch == 1, f"{at}: stages must start at min_batch 1")
        sched = Schedule(cv=float(_get(entry, "cv", (int, float), at)), stages=stages)
        _spec_ok(sched.policy, at)
        schedules.append(sched)
    require(schedules, f"{where}: schedules is empty")
    return Tuned(objective=objective, scenario=scenario,
                 saturation_rate_per_s=float(_get(data, "saturation_rate_per_s", (int, float), where)),
                 search_seeds=tuple(data.get("search_seeds", ())), confirm_seeds=tuple(data.get("confirm_seeds", ())),
                 trials=int(data.get("trials", 0)), cells=tuple(cells), schedules=tuple(schedules))


def _nearest_cv(tuned: Tuned, cv: float) -> float:
    return min((s.cv for s in tuned.schedules), key=lambda c: (abs(math.log(c / cv)), c))


def adaptive_policy(tuned: Tuned, cv: float | None = None) -> policies.Policy:
    """The load-adaptive (staged) policy for traffic of inter-arrival ``cv``
    (default: the first tuned CV), as the simulator and the live engine take
    it: ``LiveEngine(..., adaptive_policy(load(FILE)), ...)``."""
    want = tuned.schedules[0].cv if cv is None else _nearest_cv(tuned, cv)
    return policies.parse(next(s.policy for s in tuned.schedules if s.cv == want))


def policies_for(tuned: Tuned, config: SimConfig) -> tuple[str, ...]:
    """What ``--policy-file`` adds to a run: the staged policy of the CV
    nearest the scenario's, then the best spec of each family at the tuned
    load nearest the scenario's rate."""
    w = config.workload
    want = _nearest_cv(tuned, arrival_cv(w))
    cells = [c for c in tuned.cells if c.cv == want] or list(tuned.cells)
    cell = min(cells, key=lambda c: (abs(math.log(c.rate_per_s / w.rate_per_s)), c.rate_per_s))
    staged = next(s.policy for s in tuned.schedules if s.cv == want)
    return tuple(dict.fromkeys([staged, *(c.spec for c in cell.families.values())]))


def with_policy_file(config: SimConfig, path: str | Path, *, keep: bool) -> SimConfig:
    """``config`` with the tuned policies of ``path`` added (after its own
    when ``keep``, else after ``ar``)."""
    added = policies_for(load(path), config)
    base = config.policies if keep else ("ar",)
    return replace(config, policies=tuple(dict.fromkeys([*base, *added])))


# -- the table ----------------------------------------------------------------

TABLE_COLUMNS = ("load", "rate_per_s", "cv", "best_fixed", "best_fixed_value", "marginal", "marginal_value",
                 "marginal_vs_fixed_pct", "ci95_low_pct", "ci95_high_pct", "verdict", "best", "adaptive_value",
                 "best_vs_runner_up_separable")


def table_rows(t: Tuned) -> list[dict]:
    """Per cell: the best fixed strategy (linear / tree / truncate) vs the
    tuned marginal policy, paired over the confirm seeds."""
    rows = []
    for c in t.cells:
        fixed = [c.families[f] for f in FIXED if f in c.families]
        row = {"load": round(c.load, 3), "rate_per_s": round(c.rate_per_s, 3), "cv": c.cv, "best": c.best.spec,
               "adaptive_value": float(np.mean(c.adaptive)) if c.adaptive else math.nan}
        if c.runner_up is not None:
            row["best_vs_runner_up_separable"] = paired(c.best.values, c.runner_up.values).separable
        if fixed:
            bf = max(fixed, key=lambda x: x.score)
            row.update(best_fixed=bf.spec, best_fixed_value=bf.mean)
        if "marginal" in c.families:
            m = c.families["marginal"]
            row.update(marginal=m.spec, marginal_value=m.mean)
            if fixed:
                p = paired(m.values, bf.values)
                scale = 100.0 / abs(bf.mean) if bf.mean else math.nan
                better = p.high < 0 if not t.maximize else p.low > 0
                worse = p.low > 0 if not t.maximize else p.high < 0
                row.update(marginal_vs_fixed_pct=p.diff * scale, ci95_low_pct=p.low * scale,
                           ci95_high_pct=p.high * scale,
                           verdict="marginal better" if better else "marginal worse" if worse else "not separable")
        rows.append(row)
    return rows


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return "-" if math.isnan(value) else f"{value:.4g}" if abs(value) < 1000 else f"{value:.0f}"
    return "-" if value is None else str(value)


def table_markdown(t: Tuned) -> str:
    rows = table_rows(t)
    lines = ["| " + " | ".join(TABLE_COLUMNS) + " |", "|" + "---|" * len(TABLE_COLUMNS)]
    lines += ["| " + " | ".join(f"{r[k]:+.2f}" if k.endswith("_pct") and k in r else _fmt(r.get(k))
                                for k in TABLE_COLUMNS) + " |" for r in rows]
    return "\n".join(lines) + "\n"


def table_csv(t: Tuned) -> str:
    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=TABLE_COLUMNS, lineterminator="\n")
    writer.writeheader()
    for r in table_rows(t):
        writer.writerow({k: _fmt(r.get(k)) if isinstance(r.get(k), bool) else r.get(k, "") for k in TABLE_COLUMNS})
    return out.getvalue()


def notes(t: Tuned) -> list[str]:
    """What a reader must know: unmet SLOs, inseparable winners."""
    metric = OBJECTIVES[t.objective][0]
    out = []
    for c in t.cells:
        at = f"load {c.load:.2f} (rate {c.rate_per_s:.3g}/s, CV {c.cv:g})"
        if c.meets_slo is False:
            out.append(f"{at}: no candidate meets the SLOs (goodput 0 for all); closest is {c.best.spec}, whose "
                       f"median request is at {c.best.slo_gap:.2f}x the SLO")
        if c.runner_up is not None:
            p = paired(c.best.values, c.runner_up.values)
            if not p.separable:
                out.append(f"{at}: best {c.best.spec} and runner-up {c.runner_up.spec} are not separable at 95% "
                           f"({metric} difference {p.diff:.4g}, CI [{p.low:.4g}, {p.high:.4g}] over "
                           f"{len(c.best.values)} seeds)")
    return out


# -- command line ---------------------------------------------------------------


__all__ = ["TuneConfig", "Tuned", "Cell", "Candidate", "Schedule", "Stage", "Paired", "tune", "tune_cell", "load",
           "dumps", "paired", "adaptive_policy", "policies_for", "with_policy_file", "table_rows",
           "table_markdown", "table_csv", "notes", "FAMILIES", "OBJECTIVES", "SPACES"]
