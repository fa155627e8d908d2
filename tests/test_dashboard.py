"""The what-if dashboard: its computations, every page driven through
Streamlit's AppTest (widgets changed, outputs updated, bad input shown as
one st.error), `simspec dashboard` flags, and an end-to-end run of the real
server rendered in headless Chromium (skipped where Chromium is missing).

Runs are small (40 requests, two load levels, in-process) so that the whole
file takes about a minute on 2 cores.
"""

from __future__ import annotations

import base64
import json
import math
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from simspec import cli, config as configuration
from simspec.serving import modes
from simspec.cli import dashboard as command
from simspec.types import InputError
from simspec_dashboard import whatif
from simspec_dashboard.whatif import DashboardConfig

APP = Path(command.app_path())
SMALL = {"num_requests": 40, "loads": "0.5, 1", "workers": 0}  # widget keys -> test-sized values
CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").is_file() else None)


def small_config(**workload) -> configuration.SimConfig:
    return configuration.build(flag_values={"policies": ["linear:k=3", "marginal"],
                                            "workload": {"num_requests": 40, **workload}})


def mooncake(n: int = 30, gap_ms: int = 100) -> bytes:
    return "".join(json.dumps({"timestamp": i * gap_ms, "input_length": 100 + i, "output_length": 50,
                               "num_images": i % 2}) + "\n" for i in range(n)).encode()


# --------------------------------------------------------------------------
# Computations (no Streamlit)


def test_dashboard_defaults_come_from_simspec():
    dash = DashboardConfig()
    assert set(dash.policies) <= set(configuration.DEFAULT_POLICIES)
    assert "ar" in dash.policies and len(dash.policies) == 4 and len(dash.loads) == 6


@pytest.mark.parametrize("field, value, message", [
    ("loads", (0.0,), "loads must be in (0, 4]"),
    ("loads", (0.5, 5.0), "loads must be in (0, 4]"),
    ("loads", (), "loads must have 1..12 levels"),
    ("loads", (1.0, 1.0), "loads must be distinct"),
    ("num_requests", 0, "num_requests must be in 1..20000"),
    ("workers", -1, "workers must be in 0..16"),
], ids=lambda x: str(x)[:24])
def test_dashboard_config_refuses_out_of_range(field, value, message):
    with pytest.raises(InputError, match=re.escape(message)):
        DashboardConfig(**{field: value})


def test_what_if_serves_each_load_as_a_multiple_of_saturation():
    result = whatif.what_if(small_config(), DashboardConfig(loads=(1.0, 0.5), workers=0, saturation_requests=100))
    assert result.baseline_added and result.config.policies[0] == "ar"
    assert [p.load for p in result.levels] == [0.5, 1.0]  # sorted
    for level in result.levels:
        assert level.rate_per_s == pytest.approx(level.load * result.saturation_req_s)
        assert set(level.metrics) == {"ar", "linear:k=3", "marginal"}
        assert whatif.speedups(level.metrics)["ar"] == 1.0
    assert result.at_rate.load is None and result.at_rate.rate_per_s == configuration.DEFAULT_WORKLOAD.rate_per_s
    for shares in result.at_rate.mix.values():  # [3, T]: each bin sums to 1, or 0 when idle
        sums = shares.sum(axis=0)
        assert shares.shape == (3, 40) and np.all(np.isclose(sums, 1) | (sums == 0))
    assert result.at_rate.mix["ar"][1:].sum() == 0  # AR never drafts
    # More load, more queueing: AR's mean latency grows.
    assert result.levels[1].metrics["ar"]["mean_e2el_ms"] > result.levels[0].metrics["ar"]["mean_e2el_ms"]


@pytest.mark.slow
def test_what_if_is_deterministic_and_the_process_pool_changes_nothing():
    dash = DashboardConfig(loads=(0.5, 1.5), workers=0, saturation_requests=100)
    here = whatif.what_if(small_config(), dash)
    pooled = whatif.what_if(small_config(), replace(dash, workers=2))
    assert here.saturation_req_s == pooled.saturation_req_s
    for a, b in zip((here.at_rate, *here.levels), (pooled.at_rate, *pooled.levels)):
        np.testing.assert_equal(a.metrics, b.metrics)  # exactly; NaN (AR's draft acceptance rate) equals NaN


def test_what_if_time_scales_an_uploaded_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    trace.write_bytes(mooncake(30, gap_ms=100))  # 10 requests/s at speedup 1
    config = small_config(arrival="trace", trace_path=str(trace), num_requests=30)
    assert whatif.trace_rate(config) == pytest.approx(10.0)
    result = whatif.what_if(config, DashboardConfig(loads=(0.5,), workers=0, saturation_requests=100))
    assert result.at_rate.rate_per_s == pytest.approx(10.0)
    assert result.levels[0].rate_per_s == pytest.approx(0.5 * result.saturation_req_s)


def test_a_device_without_datasheet_or_profile_is_refused_by_name():
    config = replace(small_config(), device="cpu-intel-xeon-processor", model="Qwen2-VL-7B")
    with pytest.raises(InputError, match="no datasheet for a roofline prior and no profile of Qwen2-VL-7B"):
        whatif.what_if(config, DashboardConfig(loads=(0.5,), workers=0))
    assert whatif.profile_status("cpu-intel-xeon-processor", "Qwen2-VL-7B").calibration == "unavailable"


@pytest.mark.slow
def test_validation_headline(tmp_path, monkeypatch):
    folder = tmp_path / "cpu"
    folder.mkdir()
    rows = {"load=0.25": {"ar": {"mean_e2el_ms": {"rel_error": -0.10},
                                 "spec_decode_acceptance_length": {"rel_error": 0.0}},
                          "marginal": {"mean_e2el_ms": {"rel_error": 0.04},
                                       "spec_decode_acceptance_length": {"rel_error": -0.03}}},
            "load=0.5": {"ar": {"mean_e2el_ms": {"rel_error": -0.30}}}}
    (folder / "validation.json").write_text(json.dumps(rows))
    (folder / "report.json").write_text(json.dumps({"bounds": {"mean_e2el_ms": 0.05}}))
    monkeypatch.setenv("SIMSPEC_VALIDATION", str(tmp_path))
    v = whatif.validation_for("cpu-intel-xeon-processor")  # a CPU device reads validation/cpu/
    assert v.loads == (0.25, 0.5) and v.policies == ("ar", "marginal")
    assert v.headline == ("live vs simulated, 2 policies x 2 loads (0.25, 0.5 x saturation): mean e2el error "
                          "median 10%, from -30% to +4% (target ±5%: not met); acceptance length within 3%")
    assert whatif.validation_for("h100-sxm") is None
    status = whatif.profile_status("cpu-intel-xeon-processor", "simspec-tiny-vlm")
    assert status.calibration == "calibrated" and status.validated and status.validation == v.headline
    assert "not LLaVA-1.5-7B" in whatif.profile_status("cpu-intel-xeon-processor", "LLaVA-1.5-7B").validation
    assert whatif.profile_status("h200", "LLaVA-1.5-7B").validation == "not validated on this device"


# --------------------------------------------------------------------------
# The pages, through AppTest


@pytest.fixture
def app():
    from streamlit.testing.v1 import AppTest

    at = AppTest.from_file(str(APP), default_timeout=120)
    for key, value in SMALL.items():
        at.session_state[key] = value
    return at.run()


def ok(at) -> None:
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]


def metric(at, label: str) -> str:
    return next(m.value for m in at.metric if m.label.startswith(label))


@pytest.mark.slow
def test_what_if_page_shows_every_output(app):
    ok(app)
    assert app.title[0].value == "simspec what-if"
    table = app.dataframe[0].value
    assert list(table.index) == list(DashboardConfig().policies)
    assert table.loc["ar", "speedup vs AR"] == 1.0 and table.loc["marginal", "accept length"] > 1.5
    assert {"mean E2EL", "p95 E2EL", "p99 E2EL", "mean TTFT", "mean TPOT", "tree rounds"} <= set(table.columns)
    assert [h.value for h in app.subheader] == ["Latency per policy at your rate", "Latency vs load",
                                                "Speedup over AR (mean E2EL)", "Acceptance length",
                                                "Plan mix over time"]
    assert list(app.dataframe[1].value.columns) == ["0.5x", "1x"]  # acceptance length per load
    assert "partly calibrated" in app.warning[0].value  # H100 + LLaVA-1.5-7B: Vidur's GEMMs + the prior
    assert "not validated on this device" in app.warning[1].value
    assert metric(app, "Your rate") == f"{configuration.DEFAULT_WORKLOAD.rate_per_s:.2f} req/s"
    assert any("40 requests per run, 3 runs x 4 policies" in c.value for c in app.caption)


@pytest.mark.slow
def test_widgets_update_the_outputs(app):
    saturation = metric(app, "AR saturation")
    app.number_input(key="rate").set_value(12.0).run()
    ok(app)
    assert metric(app, "Your rate") == "12.00 req/s" and metric(app, "AR saturation") == saturation
    app.text_area(key="policies").set_value("linear:k=5\ntruncate:k_max=4").run()
    ok(app)
    assert list(app.dataframe[0].value.index) == ["ar", "linear:k=5", "truncate:k_max=4"]
    assert any("`ar` was added" in c.value for c in app.caption)
    app.selectbox(key="model").set_value("simspec-tiny-vlm").run()
    app.selectbox(key="device").set_value("cpu-intel-xeon-processor").run()
    ok(app)
    assert "calibrated" in app.success[0].value and "live vs simulated" in app.info[0].value
    assert metric(app, "AR saturation") != saturation
    app.selectbox(key="mix_at").select_index(2).run()  # plan mix at the second load level
    ok(app)


def test_the_tp_widget_serves_a_70b_model_on_four_gpus(app):
    app.selectbox(key="model").set_value("Llama-3.1-70B").run()
    app.slider(key="multimodal_share").set_value(0.0).run()
    assert any("try --tp 2 or more" in e.value for e in app.error)  # one GPU cannot hold it
    app.selectbox(key="tp").set_value(4).run()
    assert not app.exception
    assert not app.error, [e.value for e in app.error]  # partly calibrated: the linear layers from the shape law
    status = [w.value for w in app.warning if "tensor parallel 4" in w.value]
    assert status and "all-reduce measured" in status[0] and "shape law" in status[0], status
    assert list(app.dataframe[0].value.index)[:2] == ["ar", "linear:k=3"]


def test_the_fleet_widgets_serve_a_fleet_and_scale_the_saturation(app):
    one = float(metric(app, "AR saturation").split()[0])
    app.number_input(key="replicas").set_value(3).run()
    app.selectbox(key="router").set_value("least_requests").run()
    ok(app)
    assert any("fleet: 3 replicas behind least_requests" in c.value for c in app.caption)
    assert float(metric(app, "AR saturation").split()[0]) == pytest.approx(3 * one, rel=0.01)
    app.number_input(key="replicas").set_value(1).run()
    app.text_area(key="fleet").set_value('[[group]]\nname = "h"\nreplicas = 2\n'
                                        '[[group]]\nname = "a"\nreplicas = 1\ndevice = "a100-80gb"\n').run()
    ok(app)
    assert any("fleet behind least_requests: h x2; a x1 (device a100-80gb)" in c.value for c in app.caption)
    grouped = float(metric(app, "AR saturation").split()[0])
    assert 2 * one < grouped < 3 * one  # an A100 sustains less than an H100
    expected = whatif.what_if(configuration.build(
        {"fleet": {"group": [{"name": "h", "replicas": 2}, {"name": "a", "replicas": 1, "device": "a100-80gb"}]}},
        {"policies": list(DashboardConfig().policies), "router": "least_requests", "workload": {"num_requests": 40}}),
        DashboardConfig(loads=(0.5, 1.0), num_requests=40, workers=0))
    shown = app.dataframe[0].value
    assert shown.loc["linear:k=3", "mean E2EL"] == round(expected.at_rate.metrics["linear:k=3"]["mean_e2el_ms"])


@pytest.mark.parametrize("value, message", [
    ("[[group]\n", "fleet: not valid TOML"),
    ("[[group]]\nreplicas = 0\n", "replicas must be in 1..1024"),
    ('[[group]]\nreplicas = 1\nrole = "prefill"\n', "prefill and decode groups"),
])
def test_a_bad_fleet_is_one_clear_error(app, value, message):
    app.text_area(key="fleet").set_value(value).run()
    assert not app.exception
    assert len(app.error) == 1 and message in app.error[0].value, [e.value for e in app.error]


def test_a_model_from_its_config_file(app, tmp_path):
    from test_hfconfig import LLAVA_15_7B  # llava-hf/llava-1.5-7b-hf's config.json: the catalog model's shape

    (tmp_path / "llava").mkdir()
    (tmp_path / "llava" / "config.json").write_text(json.dumps(LLAVA_15_7B))
    catalog = app.dataframe[0].value
    app.text_input(key="model_config").set_value(str(tmp_path / "llava")).run()
    ok(app)
    assert app.dataframe[0].value.equals(catalog)  # the same shape serves the same numbers
    assert any(c.value.startswith(str(tmp_path / "llava")) for c in app.caption)
    app.text_input(key="model_config").set_value(str(tmp_path / "none")).run()
    assert not app.exception and any("does not exist" in e.value for e in app.error), [e.value for e in app.error]


@pytest.mark.slow
def test_the_engine_widget_runs_the_engines_preset_and_its_policies(app):
    assert any(c.value.startswith("engine: simspec") for c in app.caption)
    app.selectbox(key="engine").set_value("vllm").run()
    ok(app)
    assert list(app.dataframe[0].value.index) == list(modes.DEFAULT_POLICIES["vllm"])
    assert any(c.value.startswith("engine: vllm 0.33.0 | async") for c in app.caption)
    app.text_area(key="policies").set_value("ar\ntree").run()
    assert not app.exception and len(app.error) == 1
    assert "engine vllm cannot run it" in app.error[0].value and "--engine simspec" in app.error[0].value


@pytest.mark.parametrize("kind, key, value, message", [
    ("text_area", "policies", "ar\nlinear:k=0", "policy linear: k must be in 1..15 (got 0)"),
    ("text_area", "policies", "ar\nbeam", "policy must be one of"),
    ("text_area", "policies", "ar\nlinear:k", "policy linear: parameters look like key=value"),
    ("number_input", "rate", -1.0, "rate_per_s must be in [1e-06, 1e+06] (got -1.0)"),
    ("number_input", "cv", 0.0, "Inter-arrival CV: cv must be in [0.03162, 31.62]"),
    ("number_input", "num_requests", 0, "num_requests must be in 1..20000 (got 0)"),
    ("number_input", "images_max", 9, "images_max must be <= 7 for this model"),
    ("text_input", "loads", "0.5, 9", "loads must be in (0, 4] x saturation (got 9)"),
    ("text_input", "loads", "half", "loads must be numbers separated by commas (got 'half')"),
], ids=lambda x: str(x)[:20])
def test_bad_input_is_one_clear_error(app, kind, key, value, message):
    getattr(app, kind)(key=key).set_value(value).run()
    assert not app.exception
    assert len(app.error) == 1 and message in app.error[0].value, [e.value for e in app.error]


def test_a_custom_acceptance_model(app):
    length = app.dataframe[0].value.loc["linear:k=3", "accept length"]
    app.selectbox(key="acceptance").select_index(len(app.selectbox(key="acceptance").options) - 1).run()
    app.text_input(key="acceptance_custom").set_value("iid:1.5").run()
    assert not app.exception and "acceptance probability P must be in (0, 1) (got 1.5)" in app.error[0].value
    app.text_input(key="acceptance_custom").set_value("iid:0.3").run()
    ok(app)
    assert app.dataframe[0].value.loc["linear:k=3", "accept length"] < length


def test_a_device_without_a_cost_model_is_an_error_not_a_traceback(app):
    app.selectbox(key="model").set_value("Qwen2-VL-7B").run()
    app.selectbox(key="device").set_value("cpu-intel-xeon-processor").run()
    assert not app.exception
    assert "no datasheet for a roofline prior" in app.error[0].value


@pytest.mark.parametrize("name, data, message", [
    ("bad.csv", b"foo,bar\n1,2\n", "uploaded trace bad.csv: columns foo,bar match no known schema"),
    ("bad.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,10,5\n", "TIMESTAMP is not a date-time"),
    ("bad.jsonl", b'{"timestamp": 0, "input_length": 10}\n', "line 1 lacks output_length"),
    ("bad.jsonl", b'{"timestamp": 0, "input_length": 10, "output_length": 5}\nnot json\n', "line 2 is not valid JSON"),
    ("bad.csv", b"\xff\xfe\x00\x01", "uploaded trace bad.csv"),
    ("deep.jsonl", b"[" * 100_000 + b"\n", "uploaded trace deep.jsonl: line 1 is not valid JSON (nested too deeply)"),
    ("huge.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,1e20,5\n",
     "ContextTokens must be in 1..2,147,483,648 (row 1 has 100000000000000000000)"),
    ("one.csv", b"TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,10,5\n",
     "uploaded trace one.csv: needs at least two distinct arrival times"),
], ids=["schema", "timestamp", "missing-key", "json", "binary", "deep-json", "beyond-int64", "one-row"])
def test_a_malformed_upload_is_one_clear_error(app, name, data, message):
    app.radio(key="source").set_value("uploaded trace").run()
    assert not app.exception and "upload a trace" in app.info[0].value
    app.file_uploader(key="trace").set_value((name, data, "text/plain")).run()
    assert not app.exception
    assert len(app.error) == 1 and message in app.error[0].value, [e.value for e in app.error]
    assert tempfile.gettempdir() not in app.error[0].value  # names the upload, not the saved copy


def test_uploads_go_to_a_private_folder_of_the_session(app):
    app.radio(key="source").set_value("uploaded trace").run()
    app.file_uploader(key="trace").set_value(("t.jsonl", mooncake(30, gap_ms=100), "application/json")).run()
    ok(app)
    folder = Path(app.session_state["_upload_folder"])
    assert folder.is_dir() and stat.S_IMODE(folder.stat().st_mode) == 0o700
    assert folder.name.startswith("simspec-upload-") and [p.suffix for p in folder.iterdir()] == [".jsonl"]


def test_an_uploaded_trace_is_served(app):
    app.radio(key="source").set_value("uploaded trace").run()
    app.file_uploader(key="trace").set_value(("t.jsonl", mooncake(30, gap_ms=100), "application/json")).run()
    ok(app)
    assert metric(app, "Your rate") == "10.00 req/s"
    app.number_input(key="trace_speedup").set_value(2.0).run()
    ok(app)
    assert metric(app, "Your rate") == "20.00 req/s"


def test_profiles_page(app):
    app.switch_page("page_profiles.py").run()
    ok(app)
    table = app.dataframe[0].value
    assert table.loc["cpu-intel-xeon-processor", "cost model"] == "calibrated"
    assert table.loc["h200", "cost model"] == "uncalibrated" and table.loc["h200", "validated"] == "no"
    app.selectbox(key="profiles_model").set_value("Qwen2-VL-7B").run()
    ok(app)
    assert app.dataframe[0].value.loc["cpu-intel-xeon-processor", "cost model"] == "unavailable"


# --------------------------------------------------------------------------
# The planning page

PLAN_SMALL = {"plan_requests": 100, "plan_confirm_seeds": 1, "plan_finalists": 2, "plan_jobs": 1,
              "plan_tps": [1, 2]}


def _types(node) -> list[str]:
    """The element types under ``node``, depth first."""
    out = []
    for child in getattr(node, "children", {}).values():
        out += [getattr(child, "type", "")] + _types(child)
    return out


@pytest.fixture
def plan_page(app):
    app.switch_page("page_plan.py")
    for key, value in PLAN_SMALL.items():
        app.session_state[key] = value
    return app.run()


def test_the_planning_page_waits_for_the_button_then_shows_the_plan(plan_page):
    from simspec import plan as planning

    ok(plan_page)
    assert plan_page.title[0].value == "Capacity plan"
    assert "press **Plan**" in plan_page.info[0].value and not plan_page.dataframe
    plan_page.button(key="plan_run").click().run()
    ok(plan_page)
    # the same search run here from the same settings, without the page
    base = configuration.from_flags({"arrival": "gamma", "rate": configuration.DEFAULT_WORKLOAD.rate_per_s,
                                     "cv": configuration.DEFAULT_WORKLOAD.burstiness ** -0.5})
    pc = planning.PlanConfig(slos=(planning.parse_slo("p99_ttft_ms=2000"), planning.parse_slo("p99_tpot_ms=50")),
                             tps=(1, 2), requests=100, confirm_seeds=1, finalists=2, jobs=1)
    expected = planning.plan(base, pc)
    shown = plan_page.dataframe[0].value
    assert list(shown["device"]) == [r.candidate.device for r in expected.rows]
    assert list(shown["replicas"].fillna(0)) == [r.replicas for r in expected.rows]
    w = expected.winner
    assert w is not None and plan_page.success[0].value == planning.verdict(expected)
    assert metric(plan_page, "Cost") == f"${w.usd_per_hour:,.2f}/h"
    assert f"--tensor-parallel-size {w.candidate.tp}" in plan_page.code[0].value
    assert "image" in _types(plan_page.main), "the Pareto plot is shown"
    plan_page.number_input(key="plan_p99_tpot_ms").set_value(1.0).run()  # a changed input waits for the button
    assert "press **Plan**" in plan_page.info[0].value
    plan_page.button(key="plan_run").click().run()
    ok(plan_page)
    assert not plan_page.success and plan_page.warning[0].value.startswith("no candidate meets every SLO")


def test_the_planning_page_searches_the_routers_chosen(plan_page):
    plan_page.multiselect(key="plan_routers").set_value(["round_robin", "least_requests"]).run()
    plan_page.button(key="plan_run").click().run()
    ok(plan_page)
    shown = plan_page.dataframe[0].value
    assert set(shown["router"]) == {"round_robin", "least_requests"}
    assert len(shown) == 2 * len({tuple(r) for r in shown[["device", "tp", "max_num_seqs", "policy"]].values})


@pytest.mark.parametrize("kind, key, value, message", [
    ("number_input", "plan_p99_ttft_ms", 0.0, "SLOs: give at least one bound"),
    ("multiselect", "plan_devices", [], "GPUs (devices): choose at least one"),
    ("number_input", "plan_growth", 0.0, "--growth must be in (0,"),
    ("text_input", "plan_policies", "ar,beam", "policy must be one of"),
    ("text_input", "plan_batch_limits", "many", "max_num_seqs must be numbers"),
    ("text_input", "plan_splits", "1-3", "splits must be PREFILL:DECODE"),
    ("text_input", "plan_splits", "0:3", "--splits: each is PREFILL:DECODE"),
    ("multiselect", "plan_prefill_devices", ["a100-80gb"], "--prefill-devices and --prefill-tp set the prefill side"),
    ("number_input", "plan_requests", 10, "--requests must be in 50..100000"),
], ids=lambda x: str(x)[:20])
def test_the_planning_page_refuses_bad_input_in_one_line(plan_page, kind, key, value, message):
    if key == "plan_p99_ttft_ms":
        plan_page.number_input(key="plan_p99_tpot_ms").set_value(0.0)
    getattr(plan_page, kind)(key=key).set_value(value).run()
    assert not plan_page.exception
    assert len(plan_page.error) == 1 and message in plan_page.error[0].value, [e.value for e in plan_page.error]


# --------------------------------------------------------------------------
# `simspec dashboard`


@pytest.mark.parametrize("port", ["abc", "0", "70000", "-5"])
def test_bad_port_is_one_line_and_exit_2(port, capsys):
    assert cli.main(["dashboard", "--port", port]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--port must be an integer in 1..65535" in err


def test_busy_port_is_refused(capsys):
    with socket.socket() as busy:
        busy.bind(("localhost", 0))
        busy.listen()
        assert cli.main(["dashboard", "--port", str(busy.getsockname()[1])]) == 2
    assert "choose another port" in capsys.readouterr().err


def test_the_command_runs_the_shipped_app_headless():
    line = command.command(8765)
    assert line[1:4] == ["-m", "streamlit", "run"] and Path(line[4]) == APP
    flags = dict(zip(line[5::2], line[6::2]))
    assert flags == {"--server.headless": "true", "--server.address": "localhost", "--server.port": "8765",
                     "--browser.gatherUsageStats": "false"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("localhost", 0))
        return s.getsockname()[1]


def _wait(deadline: float, what: str, ready) -> None:
    while not ready():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.3)


def _descendants(pid: int) -> set[int]:
    """Every live process below ``pid`` (from /proc)."""
    parents = {}
    for stat_file in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat_file.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parents[int(stat_file.parent.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {child for child, parent in parents.items() if parent in frontier} - found
        found |= frontier
    return found


def _listening(port: int) -> bool:
    with socket.socket() as probe:
        return probe.connect_ex(("localhost", port)) == 0


def _interruptible() -> None:
    """In the child: SIGINT as a terminal delivers it, even where the tests run in a background job
    (a non-interactive shell starts those with SIGINT ignored, and Python then keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.skipif(not Path("/proc").is_dir(), reason="reads the process tree from /proc")
@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT, signal.SIGHUP], ids=lambda s: s.name)
def test_stopping_the_launcher_stops_the_server(signum):
    port = _free_port()
    launcher = subprocess.Popen([sys.executable, "-m", "simspec.cli", "dashboard", "--port", str(port)],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, preexec_fn=_interruptible)
    try:
        _wait(time.monotonic() + 90, "the dashboard's port", lambda: _listening(port))
        children = _descendants(launcher.pid)
        assert children, "the launcher started no server"
        launcher.send_signal(signum)
        launcher.wait(timeout=30)
        _wait(time.monotonic() + 15, "every child to end", lambda: not (_descendants(launcher.pid) | {
            c for c in children if Path(f"/proc/{c}").exists() and "zombie" not in _state(c)}))
        assert not _listening(port), "the server still holds its port"
    finally:
        if launcher.poll() is None:
            launcher.kill()


def _state(pid: int) -> str:
    try:
        return {"Z": "zombie"}.get(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0], "alive")
    except OSError:
        return "gone"


def render(url: str, folder: Path, expect: list[str], timeout_s: float) -> tuple[str, bytes]:
    """Open ``url`` in headless Chromium, wait until every text of ``expect``
    shows and the charts are drawn, and return the page's text and a PNG.
    Drives Chromium over the DevTools protocol with ``websockets`` (a
    Streamlit dependency): Streamlit renders with JavaScript over a
    websocket, which ``--dump-dom`` does not wait for."""
    from websockets.sync.client import connect

    log = folder / "chromium.log"
    with log.open("w") as sink:
        browser = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             f"--user-data-dir={folder / 'profile'}", "--remote-debugging-port=0", "--window-size=1400,3000", url],
            stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + timeout_s
        _wait(deadline, "Chromium's DevTools port", lambda: "DevTools listening" in log.read_text())
        port = re.search(r"DevTools listening on ws://[^:]+:(\d+)/", log.read_text()).group(1)
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        with connect(page["webSocketDebuggerUrl"], max_size=None, open_timeout=10) as ws:
            ids = iter(range(1, 1 << 30))

            def call(method: str, **params) -> dict:
                n = next(ids)
                ws.send(json.dumps({"id": n, "method": method, "params": params}))
                while True:  # skip events until our answer
                    message = json.loads(ws.recv(timeout=30))
                    if message.get("id") == n:
                        return message.get("result", {})

            def value(expression: str):
                return call("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")

            charts = ("Array.from(document.querySelectorAll('[data-testid=stVegaLiteChart]'))"
                      ".filter(chart => chart.querySelector('canvas, svg')).length")  # drawn charts
            text = ""

            def ready() -> bool:
                nonlocal text
                text = value("document.body ? document.body.innerText : ''") or ""
                return all(e in text for e in expect) and value(charts) >= 7

            try:
                _wait(deadline, f"{expect} and 7 charts", ready)
            finally:
                (folder / "page.txt").write_text(text)
            return text, base64.b64decode(call("Page.captureScreenshot", format="png")["data"])
    finally:
        os.killpg(browser.pid, signal.SIGKILL)
        browser.wait()


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Chromium (Debian: apt-get install chromium)")
def test_end_to_end_in_headless_chromium(tmp_path):
    port = _free_port()
    script = Path(sys.executable).with_name("simspec")  # the console script, where pip put it
    simspec = [str(script)] if script.is_file() else [sys.executable, "-m", "simspec.cli"]
    server = subprocess.Popen([*simspec, "dashboard", "--port", str(port)],
                              stdout=(tmp_path / "server.log").open("w"), stderr=subprocess.STDOUT,
                              cwd=tmp_path, start_new_session=True)
    try:
        def healthy() -> bool:
            assert server.poll() is None, (tmp_path / "server.log").read_text()
            try:
                return urllib.request.urlopen(f"http://localhost:{port}/_stcore/health", timeout=2).read() == b"ok"
            except OSError:
                return False

        _wait(time.monotonic() + 60, "the dashboard server", healthy)
        text, png = render(f"http://localhost:{port}/", tmp_path, ["simspec what-if", "Latency per policy at "
                           "your rate", "Lowest mean E2EL at your rate", "results are cached"], timeout_s=150)
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        try:
            server.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(server.pid, signal.SIGKILL)
            server.wait()
    assert "Traceback" not in text
    assert "Cost model: partly calibrated" in text and "marginal" in text
    assert png.startswith(b"\x89PNG") and len(png) > 50_000
    (tmp_path / "dashboard.png").write_bytes(png)
    if os.environ.get("SIMSPEC_DASHBOARD_SCREENSHOT"):  # refresh docs/dashboard.md's copy: dashboard/screenshot.png
        Path(os.environ["SIMSPEC_DASHBOARD_SCREENSHOT"]).write_bytes(png)


def test_speedup_helper_guards_zero():
    assert math.isnan(whatif.speedups({"ar": {"mean_e2el_ms": 1.0}, "x": {"mean_e2el_ms": 0.0}})["x"])
