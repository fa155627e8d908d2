"""Tests of ``simspec sweep``: the grid a sweep file and flags make, bad
input (one line naming the key), the results table (one row per scenario x
seed x policy, re-simulatable from its stored config), the same bytes
serially, on a process pool and on Ray, resume after an interrupt, and the
refusal of tables from another sweep or schema version."""

from __future__ import annotations

import collections
import json
import threading

import pyarrow.parquet as pq
import pytest

from conftest import invoke
from simspec import experiment, metrics, pool, sweep
import simspec.sweep.execute  # noqa: F401 - sweep.execute, patched below
from simspec.types import InputError

POLICIES = ["ar", "linear:k=3"]
BASE = {"workload": {"num_requests": 60}}


def small(**axes) -> sweep.SweepConfig:
    """2 loads x 2 multimodal shares x 2 seeds of 60 requests, unless told."""
    axes = {"load": [0.5, 0.9], "multimodal_share": [0.0, 1.0], "policies": POLICIES, **axes}
    return sweep.from_values({**BASE, "seeds": 2}, axis_flags=axes)


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The small sweep, run serially: (path, Outcome)."""
    path = tmp_path_factory.mktemp("ref") / "serial.parquet"
    return path, sweep.run(small(), path, sweep.Runner(workers=1, progress=False))


# --- the grid -----------------------------------------------------------------------


def test_grid_order_seeds_and_policy_grid():
    spec = sweep.from_values({"base": BASE, "seeds": 3, "axes": {
        "rate": [2, 4], "device": ["h100-sxm", "a100-80gb"],
        "policies": ["ar", {"name": "linear", "k": [3, 5]}, {"name": "tree", "depth": 4, "topk": [2, 4]}]}})
    assert spec.seed_list == (0, 1, 2)
    assert spec.base.policies == ("ar", "linear:k=3", "linear:k=5", "tree:depth=4,topk=2", "tree:depth=4,topk=4")
    points = sweep.resolve(spec)
    assert [(p.columns["rate_per_s"], p.columns["device"]) for p in points] == [
        (2.0, "h100-sxm"), (2.0, "a100-80gb"), (4.0, "h100-sxm"), (4.0, "a100-80gb")]  # first axis slowest
    assert len({p.scenario_id for p in points}) == 4
    assert [p.config.workload.rate_per_s for p in points] == [2.0, 2.0, 4.0, 4.0]


def test_flags_replace_the_file_axis_and_its_alternative():
    data = {"base": BASE, "axes": {"rate": [2, 4], "cv": [1, 2]}, "seeds": [5, 7]}
    spec = sweep.from_values(data, axis_flags={"load": [0.5], "burstiness": [0.25]}, seeds=2)
    assert {a.name: a.values for a in spec.axes} == {"load": (0.5,), "burstiness": (0.25,)}
    assert spec.seed_list == (0, 1)
    assert sweep.from_values(data).seed_list == (5, 7)


def test_cv_sets_burstiness_and_top_level_base_keys_work():
    spec = sweep.from_values({"device": "h200", "workload": {"num_requests": 60}, "axes": {"cv": [1, 2]}})
    points = sweep.resolve(spec, {})
    assert [p.config.workload.burstiness for p in points] == [1.0, 0.25]
    assert [p.columns["cv"] for p in points] == [1.0, 2.0]
    assert {p.config.device for p in points} == {"h200"}


def test_a_load_becomes_a_rate_through_experiment_rate_at_load(monkeypatch):
    assert experiment.rate_at_load(0.5, 18.0) == 9.0 and experiment.rate_at_load(0.0, 18.0) == 0.0
    spec = sweep.from_values({"base": BASE, "axes": {"load": [0.5, 0.9]}})
    saturation = collections.defaultdict(lambda: 10.0, {"": 10.0})  # 10 req/s for every key (non-empty: truthy)
    assert [p.config.workload.rate_per_s for p in sweep.resolve(spec, saturation)] == [5.0, 9.0]
    monkeypatch.setattr(experiment, "rate_at_load", lambda load, sat: load + sat)  # the grid has no rule of its own
    assert [p.config.workload.rate_per_s for p in sweep.resolve(spec, saturation)] == [10.5, 10.9]


def test_generic_engine_axis():
    spec = sweep.from_values({"base": BASE, "axes": {"engine": {"max_num_seqs": [16, 64]}}})
    points = sweep.resolve(spec)
    assert [p.config.engine.max_num_seqs for p in points] == [16, 64]
    assert [p.columns["engine.max_num_seqs"] for p in points] == [16, 64]


BAD = [
    ({"axes": {"lod": [1]}}, "axes: unknown key 'lod'"),
    ({"axes": {"load": []}}, "axes.load must be a non-empty list"),
    ({"axes": {"load": 0.5}}, "axes.load must be a non-empty list"),
    ({"axes": {"load": [0.5, -1]}}, "axes.load values must be numbers > 0"),
    ({"axes": {"load": [0.5, 0.5]}}, "axes.load has duplicate values"),
    ({"axes": {"load": [0.5], "rate": [2]}}, "give load or rate, not both"),
    ({"axes": {"multimodal_share": [0.5, 1.5]}}, "axes.multimodal_share values must be numbers in [0, 1]"),
    ({"axes": {"device": ["h100-sxm", "tpu"]}}, "device must be one of"),
    ({"axes": {"model": ["GPT-9"]}}, "model must be one of"),
    ({"axes": {"acceptance": ["nope"]}}, "acceptance must be iid:P or a preset"),
    ({"axes": {"engine": {"max_num_seqs": [0]}}}, "axes.engine.max_num_seqs = 0: max_num_seqs must be in 1..65536"),
    ({"axes": {"workload": {"num_requestz": [1]}}}, "axes: unknown key 'workload.num_requestz'"),
    ({"axes": {"workload": {"rate_per_s": [1]}}}, "use the axis 'rate'"),
    ({"axes": {"seeds": [1, 2]}}, "seeds go at the top of the sweep file"),
    ({"axes": {"policies": []}}, "axes.policies must be a non-empty list"),
    ({"axes": {"policies": ["linear:k=99"]}}, "policy linear: k must be in 1..15"),
    ({"axes": {"policies": [{"name": "linear", "k": []}]}}, "linear.k is an empty list"),
    ({"axes": {"cv": [1]}, "base": {"workload": {"arrival": "poisson"}}}, "axes.cv needs arrival = 'gamma'"),
    ({"base": {"modle": "x"}}, "unknown key 'modle'"),
    ({"base": {"workload": {"rat": 1}}}, "[workload]: unknown key 'rat'"),
    ({"base": {}, "extra": 1}, "unknown key 'extra' next to [base]"),
    ({"seeds": 0}, "seeds must be >= 1"),
    ({"seeds": [1, 1]}, "seeds has duplicates"),
    ({"seeds": [-1]}, "seeds must be integers >= 0"),
]


@pytest.mark.parametrize("data, message", BAD, ids=[m.split(":")[0][:40] for _, m in BAD])
def test_bad_sweep_input_is_one_line_naming_the_key(data, message):
    with pytest.raises(InputError) as err:
        sweep.from_values(data, where="s.toml")
    assert message in str(err.value)
    assert "\n" not in str(err.value)


# --- the table --------------------------------------------------------------------


def test_table_rows_columns_and_stored_configs(reference):
    path, outcome = reference
    table = sweep.read_results(path)
    rows = table.to_pylist()
    assert (outcome.tasks_total, outcome.tasks_run, len(rows)) == (8, 8, 16)
    assert [(r["seed"], r["policy"]) for r in rows[:4]] == [(0, "ar"), (0, "linear:k=3"), (1, "ar"), (1, "linear:k=3")]
    assert {r["schema_version"] for r in rows} == {sweep.SCHEMA_VERSION}
    assert len({r["scenario_id"] for r in rows}) == 4
    meta = sweep.metadata(table)
    assert len(meta["saturation"]) == 2  # one AR saturation per multimodal share
    for r in rows:
        assert r["rate_per_s"] == pytest.approx(r["load"] * r["saturation_per_s"], rel=1e-12)
    # The stored config re-simulates its row exactly, and every summarize metric is a column.
    row = rows[5]
    again = experiment.run(sweep.config_from_toml(row["config_toml"]))
    fresh = again.metrics[row["policy"]]
    assert set(fresh) == set(metrics.summarize(again.logs[0]))
    assert all(row[k] == v or (v != v and row[k] != row[k]) for k, v in fresh.items())


def test_pool_gives_the_serial_bytes(reference, tmp_path):
    path, _ = reference
    pooled = tmp_path / "pool.parquet"
    sweep.run(small(), pooled, sweep.Runner(workers=2, progress=False))
    assert pooled.read_bytes() == path.read_bytes()
    assert sweep.same_rows(pooled, path)


@pytest.mark.slow
def test_ray_local_gives_the_serial_rows(reference, tmp_path):
    ray = pytest.importorskip("ray")
    path, _ = reference
    out = tmp_path / "ray.parquet"
    try:
        pool.connect("local", 2)
    except Exception as err:  # noqa: BLE001 - no Ray on this machine is a skip, not a failure
        pytest.skip(f"cannot start a local Ray: {err}")
    try:
        sweep.run(small(), out, sweep.Runner(ray="local", progress=False))
    finally:
        ray.shutdown()
    assert sweep.same_rows(out, path)


def test_interrupted_sweep_resumes_to_the_same_table(reference, tmp_path, monkeypatch):
    path, _ = reference
    out = tmp_path / "resumed.parquet"
    calls = []
    real = sweep.run_task

    def interrupted(config_toml):
        if len(calls) == 3:
            raise KeyboardInterrupt
        calls.append(config_toml)
        return real(config_toml)

    monkeypatch.setattr(sweep.execute, "run_task", interrupted)  # where sweep.run looks it up
    with pytest.raises(KeyboardInterrupt):
        sweep.run(small(), out, sweep.Runner(workers=1, progress=False, flush_every_s=60))
    assert pq.read_table(out).num_rows == 3 * len(POLICIES)  # what finished was written on the way out
    monkeypatch.undo()
    outcome = sweep.run(small(), out, sweep.Runner(workers=1, progress=False))
    assert (outcome.tasks_run, outcome.tasks_total) == (5, 8)
    assert out.read_bytes() == path.read_bytes()


def test_a_grown_grid_runs_only_what_is_new(reference, tmp_path):
    path, _ = reference
    out = tmp_path / "grown.parquet"
    out.write_bytes(path.read_bytes())
    grown = small(policies=[*POLICIES, "linear:k=5"])
    outcome = sweep.run(grown, out, sweep.Runner(workers=1, progress=False))
    assert outcome.tasks_run == 8  # every task, but only for the new policy
    rows = sweep.read_results(out).to_pylist()
    assert len(rows) == 24
    old = {(r["scenario_id"], r["seed"], r["policy"]): r["mean_e2el_ms"] for r in sweep.read_results(path).to_pylist()}
    assert all(r["mean_e2el_ms"] == old[(r["scenario_id"], r["seed"], r["policy"])]
               for r in rows if r["policy"] in POLICIES)
    assert sweep.run(grown, out, sweep.Runner(workers=1, progress=False)).tasks_run == 0


def test_another_sweeps_table_is_refused(reference, tmp_path):
    path, _ = reference
    out = tmp_path / "other.parquet"
    out.write_bytes(path.read_bytes())
    other = sweep.from_values({"workload": {"num_requests": 61}, "seeds": 2},
                              axis_flags={"load": [0.5, 0.9], "multimodal_share": [0.0, 1.0], "policies": POLICIES})
    with pytest.raises(InputError, match="not in this sweep's grid"):
        sweep.run(other, out, sweep.Runner(workers=1, progress=False))
    assert out.read_bytes() == path.read_bytes()


def test_another_schema_version_is_refused(reference, tmp_path):
    path, _ = reference
    table = pq.read_table(path)
    meta = {**sweep.metadata(table), "schema_version": 999}
    out = tmp_path / "v999.parquet"
    pq.write_table(table.replace_schema_metadata({sweep.META_KEY: json.dumps(meta).encode()}), out)
    with pytest.raises(InputError, match="schema version 999; this simspec reads version 2"):
        sweep.run(small(), out, sweep.Runner(workers=1, progress=False))
    (tmp_path / "junk.parquet").write_text("not parquet")
    with pytest.raises(InputError, match="not a Parquet file"):
        sweep.read_results(tmp_path / "junk.parquet")


def test_an_unanswered_ray_address_fails_with_a_clear_line():
    pytest.importorskip("ray")
    errors = []

    def attempt():
        try:
            pool.connect("127.0.0.1:1", 1, probe_timeout_s=1.0, connect_timeout_s=5.0)
        except InputError as err:
            errors.append(str(err))

    thread = threading.Thread(target=attempt, daemon=True)
    thread.start()
    thread.join(60)  # a liveness bound, far above the 1 s probe: connect must not hang
    assert not thread.is_alive(), "connect hung on an address nobody answers"
    assert errors and errors[0].startswith("--ray 127.0.0.1:1: nothing answers at 127.0.0.1:1")


# --- the command --------------------------------------------------------------------


def test_cli_end_to_end_and_rerun(tmp_path):
    out = tmp_path / "cli.parquet"
    argv = ["sweep", "--rate", "2,4", "--policy", "ar", "--policy", "linear:k=3", "--num-requests", 60,
            "--workers", 1, "--out", out, "--quiet"]
    code, stdout, stderr = invoke(argv)
    assert code == 0, stderr
    assert "2 grid points x 1 seed = 2 tasks of 60 requests, each serving ar, linear:k=3" in stdout
    rows = sweep.read_results(out).to_pylist()
    assert [(r["rate_per_s"], r["policy"]) for r in rows] == [(2.0, "ar"), (2.0, "linear:k=3"),
                                                             (4.0, "ar"), (4.0, "linear:k=3")]
    assert all(r["load"] is None and r["saturation_per_s"] is None for r in rows)
    code, stdout, _ = invoke(argv)
    assert code == 0 and "nothing to run: all 2 tasks are in" in stdout


@pytest.mark.parametrize("flags, message", [
    (["--load", "0.5,abc"], "--load must be a comma-separated list of numbers"),
    (["--cv", "0"], "axes.cv values must be numbers > 0"),
    (["--load", "0.5"], "--load and --rate: give one, not both"),
    (["--workers", "0"], "--workers must be in 1..1024"),
    (["--seeds", "0"], "seeds must be >= 1"),
    (["--device", "h100-sxm,,h200"], "--device: empty value"),
    (["--ray", "127.0.0.1:1"], "--ray 127.0.0.1:1: nothing answers"),
    (["--config", "missing.toml"], "--config missing.toml: no such file"),
    ([], "--out is required"),
], ids=lambda v: v[0] if isinstance(v, list) and v else None)
def test_cli_bad_input_is_one_line_and_exit_2(flags, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    if "--out" not in flags and message != "--out is required":
        flags = [*flags, "--out", "r.parquet"]
    code, _, stderr = invoke(["sweep", "--rate", "2", "--num-requests", 60, "--quiet", *flags])
    assert code == 2
    assert stderr.count("\n") == 1 and stderr.startswith("simspec: error: ") and message in stderr
    assert not (tmp_path / "r.parquet").exists()


def test_cli_sweep_file(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text('seeds = [3]\n[base]\nmodel = "LLaVA-1.5-7B"\n[base.workload]\nnum_requests = 60\n'
                    '[axes]\nrate = [3]\npolicies = ["ar", { name = "linear", k = [2, 4] }]\n')
    code, stdout, stderr = invoke(["sweep", "--config", path, "--out", tmp_path / "r.parquet", "--workers", 1,
                                   "--quiet"])
    assert code == 0, stderr
    rows = sweep.read_results(tmp_path / "r.parquet").to_pylist()
    assert [(r["seed"], r["policy"]) for r in rows] == [(3, "ar"), (3, "linear:k=2"), (3, "linear:k=4")]
    path.write_text('[axes]\nlaod = [0.5]\n')
    code, _, stderr = invoke(["sweep", "--config", path, "--out", tmp_path / "r.parquet"])
    assert code == 2 and "axes: unknown key 'laod'" in stderr


def test_dry_run_counts_tasks_and_estimates_time_from_a_timed_sample(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    code, stdout, stderr = invoke(["sweep", "--load", "0.5,0.9", "--seeds", 3, "--num-requests", 500,
                                   "--policy", "ar", "--workers", 2, "--dry-run"])
    assert code == 0, stderr
    assert "2 grid points x 3 seeds = 6 tasks of 500 requests" in stdout
    line = next(x for x in stdout.splitlines() if x.startswith("estimate: ~"))
    assert "on 2 processes for 6 tasks (one sample of 200 requests took" in line
    assert "a task of 500 requests" in line and "up to 1 AR saturation search" in line
    assert "--yes" not in stdout and not list(tmp_path.iterdir())


def test_estimate_scales_the_sample_by_requests_tasks_and_processes():
    from simspec.sweep.estimate import Estimate, duration

    e = Estimate(tasks=10, requests_per_task=1000, sample_requests=200, sample_s=2.0, mixes=3, saturation_s=1.0,
                 processes=4, ray=False)
    assert e.task_s == pytest.approx(10.0) and e.cpu_s == pytest.approx(103.0)
    assert e.wall_s == pytest.approx(103.0 / 4)
    assert [duration(s) for s in (0.042, 2.5, 30, 420, 3 * 3600 + 1200, 12 * 86400)] == \
        ["0.042 s", "2.5 s", "30 s", "7 min", "3 h 20 min", "12 days"]
    from dataclasses import replace

    assert "divide by the Ray cluster's CPUs" in replace(e, ray=True).lines()[0]


def test_a_sweep_of_more_than_100000_tasks_needs_yes(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    argv = ["sweep", "--rate", "1,2", "--seeds", 50_001, "--num-requests", 60, "--policy", "ar", "--out", "r.parquet"]
    code, _, stderr = invoke(argv)
    assert code == 2 and stderr.count("\n") == 1
    assert "100,002 tasks is more than 100,000" in stderr and "--yes" in stderr
    assert not list(tmp_path.iterdir())
    code, stdout, _ = invoke([*argv[:-2], "--dry-run"])
    assert code == 0 and "more than 100,000 tasks: running it needs --yes" in stdout
