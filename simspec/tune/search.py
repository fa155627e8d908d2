"""The search: every family's candidates on each cell's common random
numbers (Optuna's TPE, or every setting when there are few), the top ones
confirmed on fresh seeds, and the load-adaptive schedule of each CV."""

from __future__ import annotations

import itertools
import math
from dataclasses import replace
from typing import Callable

import numpy as np
from tqdm import tqdm

from simspec import experiment, metrics, policies, pool
from simspec.config import SimConfig
from simspec.fleet.run import simulate_fleet
from simspec.tune.records import FAMILIES, SPACES, Candidate, Cell, Run, Schedule, Stage, TuneConfig, Tuned
from simspec.types import RunLog, require
from simspec.workloads import cv_to_burstiness


def cell_config(base: SimConfig, rate_per_s: float, cv: float) -> SimConfig:
    """The scenario at one load level and CV (Poisson for CV 1, else Gamma)."""
    arrival = {"arrival": "poisson"} if cv == 1 else {"arrival": "gamma", "burstiness": cv_to_burstiness(cv)}
    return replace(base, workload=replace(base.workload, rate_per_s=rate_per_s, **arrival))


def scenario_cv(config: SimConfig) -> float:
    w = config.workload
    require(w.arrival in ("poisson", "gamma"),
            f"tune sets arrivals per --cv (Poisson or Gamma); arrival {w.arrival!r} is not supported")
    return 1.0 if w.arrival == "poisson" else round(w.burstiness ** -0.5, 6)


def _slo_gap(log: RunLog, config: SimConfig) -> float:
    """How far the median request is from the SLOs: its worst latency/SLO
    ratio (1 = just meets them)."""
    if config.slo_ttft_ms is None and config.slo_tpot_ms is None and config.slo_e2el_ms is None:
        return math.nan
    t = log.table
    done = np.isfinite(t.finish_s)
    worst = np.zeros(int(done.sum()))
    if config.slo_ttft_ms is not None:
        worst = np.maximum(worst, (t.first_token_s[done] - t.arrival_s[done]) * 1e3 / config.slo_ttft_ms)
    if config.slo_tpot_ms is not None:
        out = t.output_tokens[done]
        tpot = np.where(out > 1, (t.finish_s[done] - t.first_token_s[done]) * 1e3 / np.maximum(out - 1, 1), 0.0)
        worst = np.maximum(worst, np.where(out > 1, tpot / config.slo_tpot_ms, 0.0))
    if config.slo_e2el_ms is not None:
        worst = np.maximum(worst, (t.finish_s[done] - t.arrival_s[done]) * 1e3 / config.slo_e2el_ms)
    return float(np.median(worst)) if worst.size else math.inf


def _score(value: float, gap: float, maximize: bool) -> float:
    """Larger is better. For goodput, a candidate that serves no request
    within the SLOs ranks by how close its median request came."""
    if not maximize:
        return -value
    return value if value > 0 else -gap


class Bench:
    """Runs specs on one cell's scenario, one resolved scenario per seed,
    each (spec, seed) once."""

    def __init__(self, config: SimConfig, tc: TuneConfig, tick: Callable[[], None] | None = None,
                 top1_logit: float | None = None):
        self.config, self.tc, self.tick = config, tc, tick
        self.top1_logit = top1_logit  # the acceptance model's level moved there (sensitivity); None: its own
        self.scenarios: dict[int, experiment.Scenario] = {}
        self.runs: dict[tuple[str, int], Run] = {}

    def run(self, spec: str, seed: int) -> Run:
        key = (spec, seed)
        if key not in self.runs:
            if seed not in self.scenarios:
                scenario = experiment.resolve(replace(self.config, seed=seed))
                if self.top1_logit is not None:
                    scenario = replace(scenario, acceptance=scenario.acceptance.with_top1_logit(self.top1_logit))
                self.scenarios[seed] = scenario
            s = self.scenarios[seed]
            log = simulate_fleet(s.requests, replicas=self.config.replicas, router=self.config.router,
                                 staleness_s=self.config.router_staleness_ms / 1e3,
                                 policy=policies.parse(spec), label=spec, costs=s.costs, acceptance=s.acceptance,
                                 engine=self.config.engine, kv_budget_tokens=s.kv_budget_tokens, seed=seed).log
            summary = metrics.summarize(log, slo_ttft_ms=self.config.slo_ttft_ms, slo_tpot_ms=self.config.slo_tpot_ms,
                                        slo_e2el_ms=self.config.slo_e2el_ms)
            value, gap = float(summary[self.tc.metric]), _slo_gap(log, self.config)
            self.runs[key] = Run(value=value, score=_score(value, gap, self.tc.maximize), batch=metrics.mean_decode_batch(log),
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
    levels = ([(rate / saturation, rate) for rate in tc.rates_per_s]
              or [(x, experiment.rate_at_load(x, saturation)) for x in tc.loads])
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


def sensitivity(tuned: Tuned, tc: TuneConfig, spread: float) -> list[str]:
    """Does each cell's winner survive the acceptance model's uncertainty?
    Every family's tuned best of the cell serves the confirm seeds again
    with the acceptance length moved to (1 - spread) and (1 + spread) x the
    model's (simspec.sensitivity.shifted_logit); one line a cell: robust
    when the winner ranks first at both ends, else where another wins."""
    from simspec.sensitivity import shifted_logit

    from simspec import acceptance

    model = acceptance.build(tuned.scenario.acceptance, experiment.model_of(tuned.scenario).name,
                             tuned.scenario.workload.temperature)  # not a whole scenario
    ends = [(scale, shifted_logit(model, scale)) for scale in (1.0 - spread, 1.0 + spread)]
    lines = []
    for cell in tuned.cells:
        config = cell_config(tuned.scenario, cell.rate_per_s, cell.cv)
        where = f"load {cell.load:.2f} ({cell.rate_per_s:.3g} req/s), CV {cell.cv:g}"
        misses = []
        for scale, logit in ends:
            bench = Bench(config, tc, top1_logit=logit)
            ranked = sorted(cell.families.values(), key=lambda c: -bench.mean_score(c.spec, tuned.confirm_seeds))
            if ranked[0].spec != cell.best.spec:
                ours = float(np.mean([bench.run(cell.best.spec, s).value for s in tuned.confirm_seeds]))
                theirs = float(np.mean([bench.run(ranked[0].spec, s).value for s in tuned.confirm_seeds]))
                misses.append(f"at {scale:.2f}x the acceptance length {ranked[0].spec} wins ({tc.metric} {theirs:.4g} "
                              f"against {ours:.4g})")
        lines.append(f"sensitivity, {where}: " + (f"robust: {cell.best.spec} is best at {ends[0][0]:.2f}x, 1x and "
                                                  f"{ends[1][0]:.2f}x the acceptance length" if not misses
                                                  else f"not robust: {cell.best.spec} is best at 1x, but "
                                                  + "; ".join(misses)))
    return lines
