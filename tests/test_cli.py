"""Tests of the ``simspec`` command, run in-process through ``cli.main``
(plus one real subprocess): the run folder a simulation leaves, seeded
determinism, the printed table, trace replay, ``presets``, and bad input,
which must end in one ``simspec: error:`` line, a non-zero exit, no
traceback and no half-written run folder."""

from __future__ import annotations

import argparse
import csv
import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import invoke, shared
from simspec import config
from simspec.acceptance import PRESETS
from simspec.config import DEFAULT_POLICIES

REPO = Path(__file__).resolve().parents[1]

FAST = ["--cost-model", "constant:5", "--quiet"]
METRICS = ("mean_ttft_ms", "p99_e2el_ms", "request_throughput", "output_throughput",
           "spec_decode_acceptance_length")
HEADER = ("mean_ttft_ms", "median_tpot_ms", "p95_itl_ms", "p99_e2el_ms", "request_throughput",
          "output_throughput", "spec_decode_acceptance_length")
PNGS = ("latency_cdf.png", "plan_mix.png", "throughput.png")


def table(stdout: str) -> tuple[list[str], list[str]]:
    """The printed table's header cells and its policy column."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("policy "))
    assert set(lines[start + 1]) <= {"-", " "}, "a rule follows the header"
    rows = []
    for line in lines[start + 2:]:
        if not line.strip():
            break
        rows.append(line.split()[0])
    return lines[start].split(), rows


def requests_rows(folder: Path) -> list[dict[str, str]]:
    with open(folder / "requests.csv", newline="") as f:
        return list(csv.DictReader(f))


# --- one run, inspected from several sides -------------------------------------

TWO_POLICIES = ("ar", "linear:k=3")


@pytest.fixture(scope="module")
def two_policy_run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("run") / "out"
    argv = ["simulate", "--num-requests", 30, "--out", folder, "--quiet"]
    for policy in TWO_POLICIES:
        argv += ["--policy", policy]
    code, out, err = invoke(argv)
    return folder, code, out, err


def test_run_prints_the_metrics_it_writes(two_policy_run):
    """Exit 0, and each policy's table row shows what metrics.json holds:
    its mean TTFT, mean E2EL and E2EL relative to ar; the lowest mean E2EL
    is the one starred."""
    folder, code, out, err = two_policy_run
    assert code == 0, err
    assert f"run folder: {folder}" in out
    metrics = json.loads((folder / "metrics.json").read_text())
    best = min(metrics, key=lambda p: metrics[p]["mean_e2el_ms"])
    for policy, values in metrics.items():
        row = next(line.split() for line in out.splitlines() if line.split()[:1] == [policy])
        cells = [c for c in row[1:] if c != "*"]
        assert float(cells[0]) == pytest.approx(values["mean_ttft_ms"], abs=0.005)
        assert float(cells[3]) == pytest.approx(values["mean_e2el_ms"], abs=0.005)
        ratio = values["mean_e2el_ms"] / metrics["ar"]["mean_e2el_ms"]
        assert cells[-1] == f"{ratio:.2f}x"
        assert ("*" in row) == (policy == best)


def test_metrics_json(two_policy_run):
    folder = two_policy_run[0]
    metrics = json.loads((folder / "metrics.json").read_text())
    assert list(metrics) == list(TWO_POLICIES)
    for policy, values in metrics.items():
        missing = [m for m in METRICS if m not in values]
        assert not missing, f"{policy} lacks {missing}"
        assert values["request_throughput"] > 0 and values["mean_ttft_ms"] > 0
    assert metrics["ar"]["spec_decode_acceptance_length"] == pytest.approx(1.0)
    assert metrics["linear:k=3"]["spec_decode_acceptance_length"] > 1.0


def test_requests_csv_has_every_request_per_policy(two_policy_run):
    rows = requests_rows(two_policy_run[0])
    assert Counter(r["policy"] for r in rows) == {p: 30 for p in TWO_POLICIES}
    for policy in TWO_POLICIES:
        assert sorted(int(r["id"]) for r in rows if r["policy"] == policy) == list(range(30))


def test_config_toml_reads_back(two_policy_run):
    folder = two_policy_run[0]
    expected = config.build(None, {"policies": list(TWO_POLICIES), "workload": {"num_requests": 30}})
    assert config.build(config.load(folder / "config.toml")) == expected


@pytest.mark.parametrize("name", PNGS)
def test_plot_is_a_png(two_policy_run, name):
    data = (two_policy_run[0] / name).read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n") and len(data) > 1000


def test_marker_has_seed_and_calibration(two_policy_run):
    folder, _, out, _ = two_policy_run
    meta = json.loads((folder / "simspec-run.json").read_text())
    assert meta["seed"] == 0
    assert isinstance(meta["calibrated"], bool)
    assert meta["policies"] == list(TWO_POLICIES)
    # The marker and the printed cost-model line agree: the line starts with its status word.
    assert cost_line(out).startswith(f"{meta['calibration'].upper()} cost model: ")
    assert meta["calibrated"] == (meta["calibration"] == "calibrated")


def cost_line(stdout: str) -> str:
    return next(line for line in stdout.splitlines() if " cost model: " in line)


def test_the_main_table_is_compact_and_fits_120_columns(two_policy_run):
    _, _, out, _ = two_policy_run
    header, policies = table(out)
    assert " ".join(header) == ("policy mean TTFT p99 TTFT mean TPOT mean E2EL p95 E2EL p99 E2EL out tok/s accept len "
                                "E2EL vs ar")
    assert policies == list(TWO_POLICIES)
    assert max(len(line) for line in out.splitlines()) <= 120
    rows = {line.split()[0]: line for line in out.splitlines() if line.split() and line.split()[0] in TWO_POLICIES}
    assert rows["ar"].endswith("1.00x")
    best = next(p for p, line in rows.items() if line.split()[1] == "*")
    ratio = next(line for line in out.splitlines() if line.startswith("at this load the best policy is"))
    assert ratio.startswith(f"at this load the best policy is {best}")


def test_all_columns_prints_every_statistic(tmp_path):
    code, out, err = invoke(["simulate", "--num-requests", 30, "--all-columns", "--quiet",
                             *(a for p in TWO_POLICIES for a in ("--policy", p))])
    assert code == 0, err
    header, policies = table(out)
    missing = [m for m in HEADER if m not in header]
    assert not missing, f"header lacks {missing}"
    assert policies == list(TWO_POLICIES)


# --- determinism ----------------------------------------------------------------


def test_same_seed_same_bytes_other_seed_other_requests(tmp_path):
    def run(name: str, seed: int) -> Path:
        folder = tmp_path / name
        code, _, err = invoke(["simulate", "--num-requests", 25, "--policy", "ar", "--policy", "tree",
                               "--seed", seed, "--out", folder, *FAST])
        assert code == 0, err
        return folder

    first, again, other = run("first", 5), run("again", 5), run("other", 6)
    for name in ("requests.csv", "metrics.json"):
        assert (first / name).read_bytes() == (again / name).read_bytes(), name
    assert (first / "requests.csv").read_bytes() != (other / "requests.csv").read_bytes()


# --- subprocess, trace, presets ---------------------------------------------------


def test_module_entry_point_defaults():
    done = subprocess.run([sys.executable, "-m", "simspec.cli", "simulate", "--num-requests", "20", "--quiet"],
                          cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # The default H100 model: its linear layers are measured (the imported
    # Vidur profile) when profiles/h100-sxm exists, the rest a roofline prior.
    expected = "PARTLY CALIBRATED" if (REPO / "profiles" / "h100-sxm").is_dir() else "UNCALIBRATED"
    assert cost_line(done.stdout).startswith(f"{expected} cost model: ")
    assert "roofline" in done.stdout.split("acceptance:")[0]
    assert table(done.stdout)[1] == list(DEFAULT_POLICIES)


def _registered(parser) -> list[str]:
    import argparse

    return list(next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction)).choices)


def test_each_command_module_registers_exactly_its_commands():
    from simspec import cli

    assert _registered(cli.parser()) == list(cli.COMMANDS)
    for command, module in cli.COMMANDS.items():
        assert _registered(cli.parser(command)) == [c for c, m in cli.COMMANDS.items() if m == module], command


def test_a_command_imports_no_other_command_module():
    from simspec import cli

    code = ("import json, sys; from simspec import cli; cli.parser('simulate'); "
            "print(json.dumps(sorted(m for m in sys.modules if m.startswith('simspec.cli.'))))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    imported = set(json.loads(done.stdout))
    assert "simspec.cli.simulate" in imported
    assert not imported & {f"simspec.cli.{m}" for m in cli.COMMANDS.values() if m != "simulate"}


def test_trace_replay(tmp_path):
    conv = shared("traces", "azure_llm_2023_conv.csv")
    folder = tmp_path / "trace"
    code, out, err = invoke(["simulate", "--trace", conv, "--trace-speedup", 50, "--num-requests", 40,
                             "--policy", "ar", "--out", folder, "--quiet"])
    assert code == 0, err
    assert "40 requests" in out
    assert table(out)[1] == ["ar"]
    # Arrivals are the trace's first 40 (in time order), 50 times faster.
    stamps = pd.to_datetime(pd.read_csv(conv, usecols=["TIMESTAMP"])["TIMESTAMP"], format="ISO8601")
    seconds = np.sort(((stamps - stamps.min()) / pd.Timedelta(seconds=1)).to_numpy())[:40]
    rows = requests_rows(folder)
    assert len(rows) == 40
    np.testing.assert_allclose([float(r["arrival_s"]) for r in rows], seconds / 50, atol=1e-6)


def test_presets_lists_names():
    code, out, _ = invoke(["presets"])
    assert code == 0
    assert "SpecVLM/LLaVA-1.5-7B" in out
    missing = [p.name for p in PRESETS.values() if p.name not in out]
    assert not missing, f"presets output lacks {missing}"


# --- bad input ------------------------------------------------------------------

GOOD_HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
TRACES = {
    "wrong-columns.csv": "time,prompt,output\n2023-11-16 18:15:46,374,44\n",
    "bad-timestamp.csv": GOOD_HEADER + "2023-11-16 18:15:46,374,44\nyesterday noon,396,109\n",
    "negative-tokens.csv": GOOD_HEADER + "2023-11-16 18:15:46,374,44\n2023-11-16 18:15:47,-5,109\n",
    "empty.csv": "",
}
UNKNOWN_KEY_TOML = "[workload]\nrate_per_s = 3\nwarp_factor = 9\n"

# id: (extra argv, a word the message must contain); "{tmp}" is the test's tmp_path.
BAD_INPUT = {
    "rate-0": (["--rate", "0"], "rate"),
    "rate-negative": (["--rate", "-1"], "rate"),
    "cv-0": (["--cv", "0"], "cv"),
    "cv-negative": (["--cv", "-2"], "cv"),
    "burstiness-0": (["--burstiness", "0"], "burstiness"),
    "policy-unknown": (["--policy", "nosuch"], "nosuch"),
    "policy-unknown-parameter": (["--policy", "linear:q=3"], "q"),
    "policy-k-0": (["--policy", "linear:k=0"], "k"),
    "policy-tree-depth-99": (["--policy", "tree:depth=99"], "depth"),
    "trace-wrong-columns": (["--trace", "{tmp}/wrong-columns.csv"], "wrong-columns.csv"),
    "trace-bad-timestamp": (["--trace", "{tmp}/bad-timestamp.csv"], "TIMESTAMP"),
    "trace-negative-tokens": (["--trace", "{tmp}/negative-tokens.csv"], "ContextTokens"),
    "trace-empty": (["--trace", "{tmp}/empty.csv"], "empty.csv"),
    "config-unknown-key": (["--config", "{tmp}/unknown.toml"], "warp_factor"),
    "output-mean-0": (["--output-mean", "0"], "output_mean"),
    "images-on-text-only-model": (["--model", "Vicuna-7B"], "multimodal_share"),
    "model-unknown": (["--model", "nosuch"], "nosuch"),
    "device-unknown": (["--device", "nosuch"], "nosuch"),
    "cost-model-negative": (["--cost-model", "constant:-1"], "cost_model"),
    "cost-model-affine-one-number": (["--cost-model", "affine:1"], "affine"),
    "acceptance-unknown": (["--acceptance", "nosuch"], "nosuch"),
    "kv-cache-too-small": (["--kv-cache-tokens", "10"], "kv_cache_tokens"),
}


@pytest.fixture
def bad_files(tmp_path) -> Path:
    for name, text in TRACES.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "unknown.toml").write_text(UNKNOWN_KEY_TOML)
    return tmp_path


def assert_one_error_line(code: int, out: str, err: str) -> str:
    assert code != 0, f"exit 0; stdout:\n{out}"
    assert "Traceback" not in out + err
    lines = err.strip().splitlines()
    assert len(lines) == 1, f"stderr has {len(lines)} lines:\n{err}"
    assert lines[0].startswith("simspec: error: ") and lines[0] != "simspec: error: ", lines[0]
    return lines[0]


@pytest.mark.parametrize("extra,word", BAD_INPUT.values(), ids=BAD_INPUT.keys())
def test_bad_input_is_one_line_and_writes_nothing(bad_files, extra, word):
    out_dir = bad_files / "out"
    argv = ["simulate", "--num-requests", 20, "--policy", "ar", *FAST, "--out", out_dir,
            *(a.format(tmp=bad_files) for a in extra)]
    code, out, err = invoke(argv)
    line = assert_one_error_line(code, out, err)
    assert word in line, f"message does not name {word!r}: {line}"
    assert not (out_dir / "metrics.json").exists(), "a failed run left metrics.json"
    assert not out_dir.exists() or not any(out_dir.iterdir()), f"a failed run left {sorted(out_dir.iterdir())}"


def test_out_refuses_a_foreign_folder(tmp_path):
    keep = tmp_path / "mine"
    keep.mkdir()
    (keep / "notes.txt").write_text("do not touch\n")
    code, out, err = invoke(["simulate", "--num-requests", 20, "--policy", "ar", *FAST, "--out", keep])
    line = assert_one_error_line(code, out, err)
    assert str(keep) in line
    assert sorted(p.name for p in keep.iterdir()) == ["notes.txt"]
    assert (keep / "notes.txt").read_text() == "do not touch\n"


@pytest.mark.parametrize("flag,value", [("--rate", "fast"), ("--num-requests", "2.5"), ("--seed", "x")],
                         ids=["rate-not-a-number", "num-requests-not-an-integer", "seed-not-an-integer"])
def test_usage_errors_name_the_flag(tmp_path, flag, value):
    out_dir = tmp_path / "out"
    code, _, err = invoke(["simulate", flag, value, "--out", out_dir, "--quiet"])
    assert code == 2
    assert "Traceback" not in err
    assert flag in err.strip().splitlines()[-1]
    assert not out_dir.exists()


@pytest.mark.parametrize("value", ["0", "11", "two"])
def test_validate_repeats_out_of_range_is_a_one_line_error(value):
    code, out, err = invoke(["validate", "--repeats", value])
    assert code != 0 and not out and "Traceback" not in err
    assert "--repeats must be" in err.strip().splitlines()[-1]


def test_the_live_flags_default_to_the_live_engine_config():
    from simspec import cli
    from simspec.cli.live import live_config
    from simspec.live import LiveConfig

    top = cli.parser("live")
    live = next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices["live"]
    assert live_config(live.parse_args([])) == LiveConfig()


# -- the first run says it is compiling -----------------------------------------------

def test_the_compile_note_is_said_only_when_the_kernels_are_not_cached(monkeypatch):
    from simspec import compiled, experiment

    said = []
    monkeypatch.setattr(compiled, "cached", lambda module, function: False)
    assert experiment.compile_note(said.append) is True
    assert len(said) == 1 and said[0].startswith("compiling the step kernels once")
    assert str(compiled.CACHE_DIR) in said[0] or not compiled.CACHING
    monkeypatch.setattr(compiled, "cached", lambda module, function: (module, function) == ("steps", "run_steps"))
    assert experiment.compile_note(said.append) is False and len(said) == 1


def test_the_cache_check_finds_the_serving_loop_once_it_has_run():
    from simspec import compiled

    code, _, err = invoke(["simulate", "--num-requests", 3, "--policy", "ar", "--quiet"])
    assert code == 0, err
    assert compiled.cached("steps", "run_steps") == compiled.CACHING
    assert not compiled.cached("steps", "no_such_function")


@pytest.mark.slow
def test_a_fresh_cache_prints_the_compile_note_before_the_bar_and_a_warm_one_does_not(tmp_path):
    env = {**os.environ, "SIMSPEC_CACHE_DIR": str(tmp_path / "cache")}
    cmd = [sys.executable, "-m", "simspec.cli", "simulate", "--num-requests", "5", "--policy", "ar",
           "--out", str(tmp_path / "run")]
    first = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr.lstrip().startswith("compiling the step kernels once"), first.stderr[:300]
    assert str(tmp_path / "cache") in first.stderr
    second = subprocess.run(cmd[:-1] + [str(tmp_path / "run2")], capture_output=True, text=True, env=env,
                            cwd=tmp_path)
    assert second.returncode == 0, second.stderr
    assert "compiling the step kernels" not in second.stderr
