"""Linear layers at tensor parallelism: Vidur's shards imported at every
degree, and the shape law (simspec.costs.shapes) fitted on small shapes and
judged on held-out big ones."""

from __future__ import annotations

import argparse
import csv
import re
import shutil
from collections import Counter
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from conftest import shared
from simspec.cli.costs import add as add_costs
from simspec.costs import MODELS, shapes
from simspec.profiling import import_vidur
from simspec.types import InputError

REPO = Path(__file__).resolve().parents[1]
LINEAR = ("attn_pre_proj", "attn_post_proj", "mlp_up_proj", "mlp_down_proj")


def rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def source(tmp_path: Path, *names: str) -> Path:
    folder = tmp_path / "vidur"
    folder.mkdir()
    for name in (*names, "LICENSE-vidur-MIT.txt"):
        shutil.copyfile(shared("external_profiles", name), folder / name)
    return folder


@pytest.mark.parametrize("name, folder", [("vidur_h100_llama2_70b_mlp.csv", "h100-sxm/Llama-2-70B"),
                                          ("vidur_a100_llama3_70b_mlp.csv", "a100-80gb/Llama-3-70B")])
def test_import_keeps_every_degree_with_its_rows(tmp_path, name, folder):
    out = tmp_path / "profiles"
    import_vidur(source(tmp_path, name), out)
    measured = rows(shared("external_profiles", name))
    want = Counter(int(r["num_tensor_parallel_workers"]) for r in measured)
    assert sorted(want) == [1, 2, 4, 8]
    for op in LINEAR:
        got = rows(out / folder / "tp" / f"{op}.csv")
        assert Counter(int(r["tp"]) for r in got) == want
        assert sorted((int(r["tp"]), int(r["tokens"]), float(r["median_ms"])) for r in got) == sorted(
            (int(r["num_tensor_parallel_workers"]), int(r["num_tokens"]), float(r[f"time_stats.{op}.median"]))
            for r in measured)
        one_gpu = rows(out / folder / f"{op}.csv")  # the one-GPU table: the degree-1 rows alone
        assert sorted((r["tokens"], r["median_ms"]) for r in one_gpu) == sorted(
            (r["tokens"], r["median_ms"]) for r in got if r["tp"] == "1")
        # what the repository ships is this import
        assert (REPO / "profiles" / folder / "tp" / f"{op}.csv").read_text() == (
            out / folder / "tp" / f"{op}.csv").read_text()


HEADER = ("time_stats.mlp_up_proj.min,time_stats.mlp_up_proj.max,time_stats.mlp_up_proj.median,n_embd,num_tokens,"
          "num_tensor_parallel_workers\n")


@pytest.mark.parametrize("text, match", [
    (HEADER + "0.1,0.2,0.15,4096,1,1\n0.1,0.2,0.15,4096,1,3\n",
     r"vidur_h100_llama2_7b_mlp\.csv line 3: num_tensor_parallel_workers must be one of 1, 2, 4, 8 \(got 3\)$"),
    (HEADER.replace(",num_tensor_parallel_workers", "") + "0.1,0.2,0.15,4096,1\n",
     r"vidur_h100_llama2_7b_mlp\.csv: missing column\(s\) num_tensor_parallel_workers"),
])
def test_import_refuses_a_bad_degree_or_a_missing_column_in_one_line(tmp_path, text, match):
    src = tmp_path / "src"
    src.mkdir()
    (src / "LICENSE-vidur-MIT.txt").write_text("MIT\n")
    (src / "vidur_h100_llama2_7b_mlp.csv").write_text(text)
    with pytest.raises(InputError, match=match) as err:
        import_vidur(src, tmp_path / "out")
    assert "\n" not in str(err.value)
    assert not (tmp_path / "out").exists()


def test_shape_law_refuses_a_table_without_the_degree(tmp_path):
    folder = tmp_path / "Llama-2-7B"
    (folder / "tp").mkdir(parents=True)
    for op in shapes.GROUPS["mlp"]:
        (folder / "tp" / f"{op}.csv").write_text("tokens,median_ms\n1,0.01\n")
    with pytest.raises(InputError, match=r"mlp_up_proj\.csv: missing column\(s\) tp$"):
        shapes.read_points(folder, MODELS["Llama-2-7B"], "mlp")


def test_shapes_follow_megatron_sharding():
    llama = MODELS["Llama-2-70B"]  # 64 heads of 128, 8 KV heads, MLP 28672
    assert shapes.gemm_shape("attn_pre_proj", llama, 1) == (8192, (64 + 16) * 128)
    assert shapes.gemm_shape("attn_pre_proj", llama, 8) == (8192, (8 + 2) * 128)
    assert shapes.gemm_shape("mlp_up_proj", llama, 4) == (8192, 2 * 7168)
    assert shapes.gemm_shape("mlp_down_proj", llama, 8) == (3584, 8192)
    assert shapes.gemm_shape("attn_post_proj", llama, 2) == (4096, 8192)


def test_law_grows_with_tokens_and_falls_with_degree_for_a_big_shape():
    law = shapes.fit_device(REPO / "profiles", "h100-sxm", "mlp", shapes.HELD_OUT["h100-sxm"][0])
    tokens = np.array([1, 16, 128, 1024, 4096])
    qwen = MODELS["Qwen-72B"]
    times = np.array([law.layer_seconds("mlp", replace(qwen, tensor_parallel=tp), tokens) for tp in (1, 2, 4, 8)])
    assert (np.diff(times, axis=1) > 0).all()  # more tokens, more time
    assert (np.diff(times, axis=0) < 0).all()  # more workers, less time a shard
    assert (times[0] / times[3] < 8).all()  # less than linearly: the launch term stays


def report(device: str, capsys) -> str:
    top = argparse.ArgumentParser(prog="simspec")
    add_costs(top.add_subparsers(dest="command"))
    args = top.parse_args(["costs", "report", "--device", device, "--held-out-shapes"])
    assert args.handler(args) == 0
    return capsys.readouterr().out


def independent_median(law: shapes.ShapeLaw, device: str, name: str, group: str, tp: int) -> tuple[float, int]:
    """The held-out median error recomputed from the CSVs, not through read_points."""
    model, errors = MODELS[name], []
    for op in shapes.GROUPS[group]:
        k, n = shapes.gemm_shape(op, model, tp)
        for r in rows(REPO / "profiles" / device / name / "tp" / f"{op}.csv"):
            if int(r["tp"]) == tp:
                m, t = float(r["tokens"]), float(r["median_ms"]) * 1e-3
                memory, compute = 2 * (k * n + m * k + m * n) / law.bytes_per_s, 2 * m * k * n / law.flops_per_s
                p = law.sharpness
                errors.append(abs((law.launch_s + (memory**p + compute**p) ** (1 / p)) / t - 1))
    return float(np.median(errors)), len(errors)


@pytest.mark.parametrize("device", sorted(shapes.HELD_OUT))
def test_report_prints_the_held_out_errors_of_the_fit(device, capsys):
    shared("external_profiles", "LICENSE-vidur-MIT.txt")
    printed = report(device, capsys)
    lines = re.findall(r"^\s+(attention|mlp)\s+(\S+)\s+(\d)\s+([\d.]+)%\s+(\d+)$", printed, re.M)
    fit_on, judged = shapes.HELD_OUT[device]
    assert len(lines) == len(shapes.GROUPS) * len(judged) * len(shapes.DEGREES)
    for group, name, tp, percent, points in lines:
        law = shapes.fit_device(REPO / "profiles", device, group, fit_on)
        median, count = independent_median(law, device, name, group, int(tp))
        assert f"{median:.1%}" == f"{percent}%" and count == int(points)
    for group in shapes.GROUPS:  # the target: 10% over each group's held-out points
        pooled = float(re.search(rf"{group}: .* held-out median error ([\d.]+)%", printed).group(1))
        assert pooled <= 10.0


def test_auto_prices_a_sharded_model_s_linear_layers_with_the_device_s_shape_law():
    from simspec import costs

    h100 = costs.gpu_spec("h100-sxm")
    spec = costs.model_spec("Llama-3.3-70B", "eagle1", 4)
    auto, prior = costs.build("auto", spec, h100), costs.build("roofline", spec, h100)
    assert auto.calibration == "partly calibrated" and "shape law fitted to Vidur's tensor-parallel GEMMs" in auto.label
    assert prior.calibration == "uncalibrated" and "shape law" not in prior.label  # --cost-model roofline stays the prior
    laws = shapes.device_laws(str(costs.profiles.default_root()), "h100-sxm")
    per_layer = (laws[0].layer_seconds("attention", spec, np.array([64.0]))
                 + laws[1].layer_seconds("mlp", spec, np.array([64.0])))
    assert auto.layers_s[64] > spec.layers * per_layer[0]  # the law's GEMMs, plus the kernels' nodes and all-reduces
    assert np.array_equal(auto.attention, prior.attention) and np.array_equal(auto.head_s, prior.head_s)  # GEMMs only
    l40s = costs.build("auto", costs.model_spec("Llama-3.3-70B", "eagle1", 8), costs.gpu_spec("l40s"))
    assert l40s.calibration == "uncalibrated"  # no tensor-parallel tables of that device
    moe = costs.build("auto", costs.model_spec("Qwen3-30B-A3B", "eagle1", 2), h100)
    assert "shape law" not in moe.label  # sparse layers keep the prior
