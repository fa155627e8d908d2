"""Running a sweep: the tasks, where they run, and the table rewritten as
they finish."""

from __future__ import annotations

import time
import tomllib
from dataclasses import replace
from pathlib import Path
from typing import Callable

from tqdm import tqdm

from simspec import config as configuration, experiment, pool
from simspec.config import SimConfig
from simspec.sweep.grid import _points, _saturation_key, resolve, saturation_config, size
from simspec.sweep.records import Outcome, Point, Runner, SweepConfig
from simspec.sweep.table import _existing, _table, _write
from simspec.types import InputError, require


def config_from_toml(text: str) -> SimConfig:
    """A config from a resolved config's TOML (``to_toml``'s output)."""
    return configuration.build(tomllib.loads(text))


def run_task(config_toml: str) -> dict[str, dict[str, float]]:
    """One task: every policy of the config on its requests -> {policy: metrics}."""
    return experiment.run(config_from_toml(config_toml)).metrics


def run_saturation(config_toml: str) -> float:
    return experiment.saturation_rate(config_from_toml(config_toml))


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
