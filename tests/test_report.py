"""Tests of ``simspec report``: the PNGs and the text summary it writes from
a small sweep table, the t-interval, the best-policy verdict (separable or
within noise) on hand-made tables, and bad input."""

from __future__ import annotations

import json
import math

import pandas as pd
import pyarrow.parquet as pq
import pytest

from conftest import invoke
from simspec import report, sweep

PNG = b"\x89PNG\r\n\x1a\n"


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    """2 loads x 2 devices x 2 seeds of 60 requests, ar and linear:k=3."""
    path = tmp_path_factory.mktemp("sweep") / "results.parquet"
    spec = sweep.from_values({"workload": {"num_requests": 60}, "seeds": 2}, axis_flags={
        "load": [0.5, 0.9], "device": ["h100-sxm", "a100-80gb"], "policies": ["ar", "linear:k=3"]})
    sweep.run(spec, path, sweep.Runner(workers=1, progress=False))
    return path


def test_report_writes_the_plots_and_the_summary(results, tmp_path):
    out = tmp_path / "rep"
    code, stdout, stderr = invoke(["report", results, "--out", out])
    assert code == 0, stderr
    for name in report.PLOTS:
        assert (out / name).read_bytes().startswith(PNG), name
    assert (out / "summary.txt").read_text() == stdout
    assert "4 scenarios x seeds 0, 1, 16 rows; policies ar, linear:k=3" in stdout
    assert "varied: load 0.5/0.9 | device a100-80gb/h100-sxm" in stdout
    lines = stdout.splitlines()
    header = lines.index(next(line for line in lines if line.startswith("load \\ device")))
    assert [line.split()[0] for line in lines[header + 2:header + 4]] == ["0.5", "0.9"]
    assert "re-simulated" in stdout and "warning" not in stdout  # the stored config reproduces its rows
    again = tmp_path / "again"
    assert invoke(["report", results, "--out", again])[0] == 0
    for name in report.PLOTS:  # same table, same bytes
        assert (again / name).read_bytes() == (out / name).read_bytes(), name
    assert (again / "summary.txt").read_text().replace(str(again), str(out)) == stdout


def test_report_options(results, tmp_path):
    out = tmp_path / "rep"
    code, stdout, stderr = invoke(["report", results, "--out", out, "--rows", "device", "--cols", "load",
                                   "--where", "device=a100-80gb", "--baseline", "tree", "--metric",
                                   "output_throughput"])
    assert code == 0, stderr
    assert "device \\ load" in stdout and "h100-sxm" not in stdout.split("best policy")[1]
    assert "(higher is better)" in stdout
    assert "no speedup plot" in stdout and not (out / "speedup_vs_load.png").exists()


@pytest.mark.parametrize("argv, message", [
    (["--rows", "colour"], "--rows colour: not an axis"),
    (["--where", "device=tpu"], "--where device=tpu: no rows match"),
    (["--where", "device"], "--where must be KEY=VALUE"),
    (["--scenario", "zzz"], "--scenario zzz: no such scenario"),
    (["--metric", "mean_fun_ms"], "--metric mean_fun_ms: no such metric"),
], ids=lambda v: v[0] if isinstance(v, list) else None)
def test_report_bad_input_is_one_line(results, tmp_path, argv, message):
    code, _, stderr = invoke(["report", results, "--out", tmp_path / "rep", *argv])
    assert code == 2
    assert stderr.count("\n") == 1 and message in stderr
    assert not (tmp_path / "rep").exists()  # checked before anything is written


def test_report_refuses_another_schema_version(results, tmp_path):
    table = pq.read_table(results)
    other = sweep.SCHEMA_VERSION + 1
    meta = {**sweep.metadata(table), "schema_version": other}
    path = tmp_path / f"v{other}.parquet"
    pq.write_table(table.replace_schema_metadata({sweep.META_KEY: json.dumps(meta).encode()}), path)
    code, _, stderr = invoke(["report", path, "--out", tmp_path / "rep"])
    assert code == 2 and f"results schema version {other}; this simspec reads version {sweep.SCHEMA_VERSION}" in stderr
    assert not (tmp_path / "rep").exists()


def test_t_interval_closed_form():
    mean, half = report.interval([1.0, 2.0, 3.0], 0.95)
    assert mean == 2.0
    assert half == pytest.approx(4.302652729911275 / math.sqrt(3))  # t(0.975, 2) * s / sqrt(n), s = 1
    assert math.isnan(report.interval([5.0], 0.95)[1])


def frame(values: dict[str, list[float]]) -> pd.DataFrame:
    """Seeds x policies of one scenario."""
    return pd.DataFrame([{"scenario_id": "s", "seed": seed, "policy": policy, "m_ms": v, "tput": v}
                         for policy, vs in values.items() for seed, v in enumerate(vs)])


@pytest.mark.parametrize("values, best, runner_up, separable", [
    ({"a": [10, 11, 12, 10], "b": [15, 16, 18, 15]}, "a", "b", True),  # b is 40-60% worse every seed
    ({"a": [10, 12, 10, 12], "b": [12, 10, 12, 10.5]}, "a", "b", False),  # sign flips: within noise
    ({"a": [10], "b": [20]}, "a", "b", False),  # one sample cannot separate
    ({"a": [10, 11, 12], "b": [20, 21, 22], "c": [10.5, 10.5, 12.5]}, "a", "c", False),
], ids=["separable", "noise", "one-seed", "three-policies"])
def test_best_cell_verdict(values, best, runner_up, separable):
    cell = report.best_cell(frame(values), "m_ms", 0.95)
    assert (cell.best, cell.runner_up, cell.separable) == (best, runner_up, separable)
    assert cell.samples == len(next(iter(values.values())))
    higher = report.best_cell(frame(values), "tput", 0.95)  # not an _ms metric: higher is better
    assert higher.best == max(values, key=lambda p: sum(values[p]))


def test_text_table_marks_within_noise():
    data = pd.concat([frame({"a": [10, 11, 12], "b": [20, 21, 22]}).assign(load=0.5, scenario_id="x"),
                      frame({"a": [10, 12, 10], "b": [12, 10, 12]}).assign(load=0.9, scenario_id="y")])
    grid = report.best_grid(data, "load", None, report.ReportConfig(metric="m_ms"))
    text = report.text_table(grid, "load", None).splitlines()
    assert text[2].split() == ["0.5", "a", "(next", "b", "+91%)"]
    assert "≈" in text[3]
