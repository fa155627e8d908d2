"""The tuned file: written by ``simspec tune``, read back by ``--policy-file``,
the live engine and ``simspec export``."""

from __future__ import annotations

import math
import tomllib
from dataclasses import replace
from pathlib import Path

import tomli_w

from simspec import __version__, config as configuration, policies
from simspec.config import SimConfig
from simspec.files import read_toml
from simspec.tune.records import FORMAT, OBJECTIVES, Candidate, Cell, Schedule, Stage, Tuned, paired
from simspec.types import InputError, require
from simspec.workloads import arrival_cv


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


def nearest_cv(tuned: Tuned, cv: float) -> float:
    return min((s.cv for s in tuned.schedules), key=lambda c: (abs(math.log(c / cv)), c))


def adaptive_policy(tuned: Tuned, cv: float | None = None) -> policies.Policy:
    """The load-adaptive (staged) policy for traffic of inter-arrival ``cv``
    (default: the first tuned CV), as the simulator and the live engine take
    it: ``LiveEngine(..., adaptive_policy(load(FILE)), ...)``."""
    want = tuned.schedules[0].cv if cv is None else nearest_cv(tuned, cv)
    return policies.parse(next(s.policy for s in tuned.schedules if s.cv == want))


def policies_for(tuned: Tuned, config: SimConfig) -> tuple[str, ...]:
    """What ``--policy-file`` adds to a run: the staged policy of the CV
    nearest the scenario's, then the best spec of each family at the tuned
    load nearest the scenario's rate."""
    w = config.workload
    want = nearest_cv(tuned, arrival_cv(w))
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
