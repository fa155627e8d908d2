"""Operator profiling: a tiny model profiled on the CPU writes every table
profiles/README.md documents, resumes where it stopped, records why a point
was skipped; Vidur's real profiles import unchanged; bad input raises one
InputError naming the flag or file."""

from __future__ import annotations

import argparse
import csv
import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import SHARED_DATA  # noqa: E402
from simspec.costs import GPUS, ModelSpec, model_spec  # noqa: E402
from simspec.cli.profile import add as add_cli  # noqa: E402
from simspec.profiling import grid, import_vidur, ops, runner, store  # noqa: E402
from simspec.profiling.grid import OPS, Grid  # noqa: E402
from simspec.types import InputError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
README = REPO / "profiles" / "README.md"
VIDUR = SHARED_DATA / "external_profiles"
VIDUR_FILES = ("vidur_h100_llama2_7b_mlp.csv", "vidur_a100_llama2_7b_mlp.csv")

TINY = ModelSpec(name="Tiny-VLM", layers=2, hidden=64, heads=4, kv_heads=2, mlp_hidden=96, vocab=128,
                 max_context_tokens=256, visual_tokens_per_image=16, vision_layers=2, vision_hidden=32,
                 vision_mlp_hidden=64, vision_patches_per_image=17)
TINY_GRID = Grid(name="tiny", tokens=(1, 7), prefill_tokens=(5,), prefill_contexts=(0, 11), contexts=(9, 33),
                 query_tokens=(1, 4), batches=(1, 3), requests=(1, 2), draft_tokens=(1, 3), kept_tokens=(0, 4),
                 visual_tokens=(16, 37), images=(1, 2))


@pytest.fixture(autouse=True)
def fast_timing(monkeypatch):
    """Tiny ops need no 50 ms of samples each."""
    monkeypatch.setattr(runner, "TARGET_MS", 1.0)
    torch.manual_seed(0)


def profile(out: Path, **kw) -> runner.ProfileRun:
    return runner.profile_model(TINY, device="cpu", grid=TINY_GRID, out=out, progress=False, **kw)


def read_rows(path: Path) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def expected_points(name: str) -> list[tuple[int, ...]]:
    return grid.points(OPS[name], TINY_GRID, TINY)


def readme_meta_keys() -> set[str]:
    block = re.search(r"```json\n(.*?)```", README.read_text(), re.S).group(1)
    return set(json.loads(block))


# --- the profile a run leaves ------------------------------------------------------------------

def test_readme_documents_every_operator_and_its_shape_columns():
    rows = re.findall(r"^\| `(\w+)` \| `([\w,]+)` \|", README.read_text(), re.M)
    assert {name: tuple(columns.split(",")) for name, columns in rows} == {op.name: op.columns for op in OPS.values()}


@pytest.mark.slow
@pytest.mark.parametrize("thp", [None, "1"], ids=["thp-unset", "thp-1"])
def test_tiny_profile_writes_every_table_and_meta(tmp_path, monkeypatch, thp):
    if thp is None:  # recorded as found, set or not
        monkeypatch.delenv("THP_MEM_ALLOC_ENABLE", raising=False)
    else:
        monkeypatch.setenv("THP_MEM_ALLOC_ENABLE", thp)
    threads = torch.get_num_threads()
    run = profile(tmp_path)
    assert torch.get_num_threads() == threads  # the profiler's one thread is not left behind
    folder = run.folder
    assert folder.parent.name.startswith("cpu-") and folder.name == TINY.name
    assert {p.name for p in folder.glob("*.csv")} == {f"{name}.csv" for name in OPS}
    for op in OPS.values():
        path = folder / f"{op.name}.csv"
        assert tuple(next(csv.reader(open(path)))) == op.columns + grid.TIMING_COLUMNS
        rows = read_rows(path)
        assert [tuple(int(r[c]) for c in op.columns) for r in rows] == expected_points(op.name)
        for r in rows:
            assert r["skipped"] == "" and int(r["samples"]) >= runner.MIN_SAMPLES, (op.name, r)
            assert 0 < float(r["p10_ms"]) <= float(r["median_ms"]) <= float(r["p90_ms"]), (op.name, r)
    assert run.measured_points == sum(len(expected_points(n)) for n in OPS) and run.skipped_points == 0
    meta = json.loads((folder / "meta.json").read_text())
    assert readme_meta_keys() | {"kernels", "notes"} == set(meta)
    assert meta["kind"] == "cpu" and meta["dtype"] == "float32" and meta["grid"] == "tiny"
    assert meta["model"] == TINY.name and meta["device_slug"] == folder.parent.name
    assert meta["torch"] == torch.__version__ and meta["memory_bytes"] > 0 and meta["licence"] is None
    assert meta["source"] == runner.SOURCE and meta["kernels"] == "simspec_kernels"
    assert meta["threads"] == runner.CPU_THREADS == 1 and meta["thp_mem_alloc_enable"] == thp
    assert 'impl="auto" runs its plain-PyTorch references on a CPU' in meta["notes"]


def test_a_text_only_model_has_no_vision_tables():
    text = ModelSpec(name="Tiny-LM", layers=2, hidden=64, heads=4, kv_heads=4, mlp_hidden=96, vocab=128,
                     max_context_tokens=256, visual_tokens_per_image=0)
    names = [op.name for op in grid.ops_for(text)]
    assert not {"vision_encoder", "select", "int8_quantize"} & set(names)
    assert {kept for _, kept in grid.points(OPS["drafter_step"], TINY_GRID, text)} == {0}


# --- resuming and skipping ------------------------------------------------------------------------

def counting_measure(monkeypatch) -> list:
    """The closures a run times, in order."""
    timed = []
    real = runner.measure_cpu

    def measure(fn):
        timed.append(fn)
        return real(fn)
    monkeypatch.setattr(runner, "measure_cpu", measure)
    return timed


@pytest.mark.slow
def test_a_rerun_measures_only_the_points_its_csvs_lack(tmp_path, monkeypatch):
    folder = profile(tmp_path).folder
    decode, head, act = (folder / f"{name}.csv" for name in ("attn_decode", "lm_head", "mlp_act"))
    lines = decode.read_text().splitlines(keepends=True)
    decode.write_text("".join(lines[:2] + lines[4:]))  # drop two measured rows
    lines = head.read_text().splitlines(keepends=True)
    head.write_text("".join(lines[:-1]))  # and one more
    act.write_text(act.read_text()[:-3])  # killed mid-row: the partial line is dropped and redone
    timed = counting_measure(monkeypatch)
    rerun = profile(tmp_path)
    assert len(timed) == rerun.measured_points == 4
    assert rerun.kept_points == sum(len(expected_points(n)) for n in OPS) - 4
    for name in ("attn_decode", "lm_head", "mlp_act"):
        points = [tuple(int(r[c]) for c in OPS[name].columns) for r in read_rows(folder / f"{name}.csv")]
        assert sorted(points) == sorted(expected_points(name)), name
    timed.clear()
    assert profile(tmp_path).measured_points == 0 and not timed


def test_a_point_over_the_size_guard_is_skipped_with_its_reason(tmp_path, monkeypatch):
    biggest = max(expected_points("attn_decode"))
    limit = ops.CASES["attn_decode"].nbytes(TINY, 4, *biggest) - 1
    run = profile(tmp_path, max_bytes=limit)
    rows = {tuple(int(r[c]) for c in OPS["attn_decode"].columns): r for r in read_rows(run.folder / "attn_decode.csv")}
    assert rows[biggest]["skipped"].startswith("size guard: needs") and rows[biggest]["median_ms"] == ""
    assert all(r["median_ms"] and not r["skipped"] for p, r in rows.items() if p != biggest)
    assert run.skipped_points >= 1
    timed = counting_measure(monkeypatch)
    assert profile(tmp_path, max_bytes=limit).measured_points == 0 and not timed  # skipped rows count as done


@pytest.mark.slow
def test_out_of_memory_skips_the_point_and_the_run_goes_on(tmp_path, monkeypatch):
    real = ops.CASES["mlp_act"]

    def setup(bench):
        make = real.setup(bench)

        def make_or_fail(tokens):
            if tokens == 7:
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            return make(tokens)
        return make_or_fail
    monkeypatch.setitem(ops.CASES, "mlp_act", ops.Case(setup, real.nbytes))
    run = profile(tmp_path)
    rows = read_rows(run.folder / "mlp_act.csv")
    assert [(r["tokens"], r["skipped"]) for r in rows] == [("1", ""), ("7", "out of memory")]
    assert run.skipped_points == 1 and (run.folder / "int8_quantize.csv").exists()


def test_an_error_that_is_not_out_of_memory_is_raised(tmp_path, monkeypatch):
    def setup(bench):
        raise RuntimeError("mat1 and mat2 shapes cannot be multiplied")
    monkeypatch.setitem(ops.CASES, "add", ops.Case(setup, ops.CASES["add"].nbytes))
    with pytest.raises(RuntimeError, match="shapes"):
        profile(tmp_path)


@pytest.mark.slow
def test_a_csv_with_other_columns_is_refused(tmp_path):
    folder = profile(tmp_path).folder
    (folder / "add.csv").write_text("tokens,time_ms\n1,0.5\n")
    with pytest.raises(InputError, match=r"add\.csv: columns tokens,time_ms"):
        profile(tmp_path)


# --- timing, grids, device names --------------------------------------------------------------------

def test_cpu_timing_reports_median_and_percentiles_of_enough_samples():
    import time
    t = runner.measure_cpu([lambda: time.sleep(0.002)])
    assert runner.MIN_SAMPLES <= t.samples <= runner.MAX_SAMPLES
    assert 2.0 <= t.p10_ms <= t.median_ms <= t.p90_ms


def test_cpu_timing_goes_round_the_copies_a_call_per_sample():
    ran = []
    t = runner.measure_cpu([lambda k=k: ran.append(k) for k in range(3)])
    assert ran[:3] == [0, 1, 2]  # warm-up touches every copy first
    assert t.samples >= runner.MIN_SAMPLES
    assert ran == [k % 3 for k in range(len(ran))]  # then strictly in turn: no copy twice in a row


@pytest.mark.slow
def test_per_layer_operators_are_timed_on_a_copy_of_their_tensors_per_layer(tmp_path, monkeypatch):
    timed = counting_measure(monkeypatch)
    profile(tmp_path)
    by_size = {len(calls) for calls in timed}
    assert by_size == {1, TINY.layers}
    per_layer = [calls for calls in timed if len(calls) == TINY.layers]
    assert len(per_layer) == sum(len(expected_points(name)) for name in ops.CASES if name in runner.PER_LAYER_OPS)
    assert runner.PER_LAYER_OPS >= {"mlp_up_proj", "attn_decode"}
    assert "lm_head" not in runner.PER_LAYER_OPS  # once per step, on the same weights
    assert runner.copies("attn_decode", 32, runner.ROTATE_BYTES // 5) == 5  # capped by bytes
    assert runner.copies("attn_decode", 32, 2 * runner.ROTATE_BYTES) == 1
    assert runner.copies("lm_head", 32, 1) == 1


def test_quick_grids_fit_the_cpu_and_the_full_grid_spans_the_ranges():
    assert max(grid.QUICK_CPU.tokens + grid.QUICK_CPU.prefill_tokens + grid.QUICK_CPU.draft_tokens) <= 512
    assert max(grid.QUICK_CPU.contexts + grid.QUICK_CPU.prefill_contexts) <= 4096
    full = grid.FULL
    assert (min(full.tokens), max(full.tokens)) == (1, 4096) and {48, 96, 192, 384, 768, 1536, 3072} <= set(full.tokens)
    assert (min(full.contexts), max(full.contexts)) == (128, 16384)
    assert full.query_tokens == (1, 8, 16, 32, 64) and full.batches == (1, 8, 32, 64)
    assert (min(full.visual_tokens), max(full.visual_tokens)) == (576, 2880)
    assert full.kept_tokens == (0, 8, 16, 32, 64) and full.images == (1, 2, 4)
    qwen = model_spec("Qwen2-VL-7B")  # a context long enough for every grid point
    for g in (grid.FULL, grid.QUICK_CUDA, grid.QUICK_CPU):
        sizes = {name: len(grid.points(op, g, qwen)) for name, op in OPS.items()}
        assert all(sizes.values())
        if g is not grid.FULL:
            assert all(sizes[n] <= len(grid.points(op, grid.FULL, qwen)) for n, op in OPS.items())


@pytest.mark.parametrize("model", ["simspec-tiny-vlm", "LLaVA-1.5-7B"])
def test_grid_points_fit_the_model_context(model):
    spec = model_spec(model)
    limit = spec.max_context_tokens
    for name, op in OPS.items():
        pts = grid.points(op, grid.QUICK_CPU, spec)
        assert pts and len(set(pts)) == len(pts), name
        for point in pts:
            shape = dict(zip(op.columns, point))
            if name == "attn_prefill":
                assert shape["tokens"] + shape["context_tokens"] <= limit
            elif name == "attn_tree_verify":
                assert shape["query_tokens"] + shape["context_tokens"] <= limit
            elif name == "attn_decode":
                assert shape["context_tokens"] <= limit
            elif "visual_tokens" in shape:
                assert shape["visual_tokens"] <= limit
    if spec.max_context_tokens < max(grid.QUICK_CPU.visual_tokens):  # a small model: one image measured too
        assert (spec.visual_tokens_per_image,) in grid.points(OPS["int8_quantize"], grid.QUICK_CPU, spec)


@pytest.mark.parametrize("name, slug", [
    ("NVIDIA H100 80GB HBM3", "h100-sxm"), ("NVIDIA H200", "h200"), ("NVIDIA A100-SXM4-80GB", "a100-80gb"),
    ("NVIDIA L40S", "l40s"), ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"), ("NVIDIA H100 PCIe", "h100-pcie"),
    ("NVIDIA GeForce RTX 4090", "geforce-rtx-4090"),
])
def test_gpu_names_map_to_the_known_slugs(name, slug):
    assert store.device_slug(name, "cuda") == slug


def test_every_known_gpu_and_a_cpu_get_their_slug():
    assert {store.gpu_slug(gpu.name) for gpu in GPUS.values()} == set(GPUS)
    assert store.device_slug("Intel(R) Xeon(R) Platinum 8480+", "cpu") == "cpu-intel-xeon-platinum-8480"


@pytest.mark.parametrize("model, layout", [("LLaVA-1.5-7B", (1, 577, 1)), ("LLaVA-1.6-13B", (5, 577, 1)),
                                           ("Qwen2-VL-7B", (1, 4096, 4))])
def test_vision_encoder_sequences_follow_the_model(model, layout):
    assert ops.vision_layout(model_spec(model)) == layout


# --- Vidur import ------------------------------------------------------------------------------------

needs_vidur = pytest.mark.skipif(not all((VIDUR / f).exists() for f in VIDUR_FILES),
                                 reason=f"needs {VIDUR}/{{{','.join(VIDUR_FILES)}}}: the shared data beside the "
                                        "repository (../shared/data) is absent")


def vidur_linear_layers(tmp_path: Path) -> Path:
    """A folder of the shared Vidur linear-layer CSVs and their licence
    (the attention samples beside them are imported on their own)."""
    source = tmp_path / "vidur"
    source.mkdir()
    for name in (*VIDUR_FILES, "LICENSE-vidur-MIT.txt"):
        shutil.copyfile(VIDUR / name, source / name)
    return source


@needs_vidur
def test_vidur_import_keeps_tensor_parallel_1_rows_with_their_medians(tmp_path):
    source = vidur_linear_layers(tmp_path)
    out = tmp_path / "profiles"
    folders = import_vidur(source, out)
    assert sorted(f.relative_to(out).as_posix() for f in folders) == ["a100-80gb/Llama-2-7B",
                                                                          "h100-sxm/Llama-2-7B"]
    for folder, source in zip(sorted(folders), sorted(VIDUR_FILES)):
        rows = [r for r in read_rows(VIDUR / source) if r["num_tensor_parallel_workers"] == "1"]
        assert (folder / "LICENSE-vidur-MIT.txt").read_bytes() == (VIDUR / "LICENSE-vidur-MIT.txt").read_bytes()
        assert {p.name for p in folder.glob("*.csv")} == {f"{op}.csv" for op in grid.VIDUR_OPS}
        for op in grid.VIDUR_OPS:
            got = read_rows(folder / f"{op}.csv")
            assert tuple(got[0]) == OPS[op].header
            want = sorted((int(r["num_tokens"]), float(r[f"time_stats.{op}.median"]), float(r[f"time_stats.{op}.min"]),
                           float(r[f"time_stats.{op}.max"])) for r in rows)
            assert sorted((int(r["tokens"]), float(r["median_ms"]), float(r["p10_ms"]), float(r["p90_ms"]))
                          for r in got) == want
            assert all(r["samples"] == "" and r["skipped"] == "" for r in got)
        meta = json.loads((folder / "meta.json").read_text())
        assert readme_meta_keys() | {"kernels", "notes"} == set(meta)
        assert meta["source"].startswith("Vidur (MIT licence)") and source in meta["source"]
        assert meta["licence"] == "LICENSE-vidur-MIT.txt" and "min and max" in meta["notes"]
        assert meta["device_slug"] == folder.parent.name and meta["model"] == "Llama-2-7B"


def vidur_folder(tmp_path: Path, name: str = "vidur_h100_llama2_7b_mlp.csv", text: str | None = None,
                 licence: bool = True) -> Path:
    src = tmp_path / "src"
    src.mkdir(exist_ok=True)
    if licence:
        (src / "LICENSE-vidur-MIT.txt").write_text("MIT\n")
    if text is not None:
        (src / name).write_text(text)
    return src


GOOD_HEADER = ("time_stats.add.min,time_stats.add.max,time_stats.add.median,n_embd,num_tokens,"
               "num_tensor_parallel_workers\n")


ROW = "0.1,0.2,0.15,4096,1,1\n"
MLP = "vidur_h100_llama2_7b_mlp.csv"
BAD_VIDUR = {  # case: (file name, its text, licence beside it, the error)
    "missing folder": (None, None, True, r"--import-vidur .*nowhere: no such folder"),
    "no csvs": (None, None, True, r"--import-vidur .*src: no Vidur CSVs"),
    "no licence": (MLP, GOOD_HEADER + ROW, False, r"no Vidur licence file"),
    "no num_tokens": (MLP, GOOD_HEADER.replace("num_tokens,", ""), True,
                      r"vidur_h100_llama2_7b_mlp\.csv: missing column\(s\) num_tokens"),
    "no timing columns": (MLP, "num_tokens,num_tensor_parallel_workers\n1,1\n", True,
                          r"vidur_h100_llama2_7b_mlp\.csv: no time_stats"),
    "unknown gpu": ("vidur_tpu_llama2_7b_mlp.csv", GOOD_HEADER + ROW, True,
                    r"vidur_tpu_llama2_7b_mlp\.csv: name must be vidur_<gpu>"),
    "unknown model": ("vidur_h100_gpt5_mlp.csv", GOOD_HEADER + ROW, True, r"vidur_h100_gpt5_mlp\.csv: model 'gpt5'"),
    "other shape": (MLP, GOOD_HEADER + ROW.replace("4096", "5120"), True,
                    r"vidur_h100_llama2_7b_mlp\.csv line 2: n_embd 5120 does not match Llama-2-7B"),
    "not a number": (MLP, GOOD_HEADER + ROW.replace("0.15", "fast"), True,
                     r"vidur_h100_llama2_7b_mlp\.csv line 2: time_stats\.add\.median must be a number"),
    "no tp1 rows": (MLP, GOOD_HEADER + ROW[:-2] + "2\n", True,
                    r"vidur_h100_llama2_7b_mlp\.csv: no rows with num_tensor_parallel_workers = 1"),
}


@pytest.mark.parametrize("case", BAD_VIDUR)
def test_vidur_import_refuses_bad_input_naming_it(tmp_path, case):
    name, text, licence, match = BAD_VIDUR[case]
    src = vidur_folder(tmp_path, name or MLP, text, licence=licence)
    if case == "missing folder":
        src = tmp_path / "nowhere"
    with pytest.raises(InputError, match=match):
        import_vidur(src, tmp_path / "out")
    assert not (tmp_path / "out").exists()  # nothing written half-way


def test_vidur_import_will_not_overwrite_a_measured_profile(tmp_path):
    src = vidur_folder(tmp_path, text=GOOD_HEADER + ROW)
    out = tmp_path / "out"
    (folder := out / "h100-sxm" / "Llama-2-7B").mkdir(parents=True)
    (folder / "meta.json").write_text(json.dumps({"source": runner.SOURCE}))
    with pytest.raises(InputError, match="refusing to overwrite"):
        import_vidur(src, out)
    (folder / "meta.json").write_text(json.dumps({"source": "Vidur (MIT licence): old.csv"}))
    assert import_vidur(src, out) == [folder]
    assert read_rows(folder / "add.csv") == [dict(tokens="1", median_ms="0.15", p10_ms="0.1", p90_ms="0.2",
                                                   samples="", skipped="")]


# --- the command ---------------------------------------------------------------------------------------

def invoke(argv: list[str]) -> int:
    top = argparse.ArgumentParser(prog="simspec")
    add_cli(top.add_subparsers(dest="command"))
    args = top.parse_args(argv)
    return args.handler(args)


@pytest.mark.parametrize("argv, match", [
    (["--device", "cpu", "--model", "GPT-5"], r"model must be one of .*GPT-5"),
    (["--import-vidur", "DIR", "--model", "LLaVA-1.5-7B"], r"--import-vidur takes no --model"),
    (["--import-vidur", "DIR", "--quick"], r"--import-vidur takes no --quick"),
    (["--device", "cpu", "--out", "FILE"], r"--out .*FILE: exists and is not a folder"),
], ids=["unknown model", "import with model", "import with quick", "out is a file"])
def test_profile_gpu_rejects_bad_flags(tmp_path, argv, match):
    (tmp_path / "FILE").write_text("")
    with pytest.raises(InputError, match=match):
        invoke(["profile-gpu", *(str(tmp_path / a) if a in ("FILE", "DIR") else a for a in argv)])


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a GPU")
@pytest.mark.parametrize("argv", [[], ["--device", "cuda"]], ids=["default device", "--device cuda"])
def test_profile_gpu_without_a_gpu_says_use_cpu(argv):
    with pytest.raises(InputError, match=r"^--device cuda: no CUDA device; use --device cpu$"):
        invoke(["profile-gpu", *argv])


def test_profile_gpu_calls_run_profile_with_the_flags(tmp_path, monkeypatch, capsys):
    seen = {}
    monkeypatch.setattr(runner, "run_profile", lambda **kw: seen.update(kw) or [tmp_path / "x"])
    assert invoke(["profile-gpu", "--device", "cpu", "--quick", "--quiet", "--out", str(tmp_path),
                   "--model", "llava-1.5-7b"]) == 0
    assert seen == dict(device="cpu", models=["LLaVA-1.5-7B"], quick=True, out=tmp_path, progress=False)
    invoke(["profile-gpu", "--device", "cpu"])
    assert seen["models"] == list(grid.DEFAULT_MODELS) and seen["out"] == REPO / "profiles" and not seen["quick"]
    assert f"profile {tmp_path / 'x'}" in capsys.readouterr().out


@needs_vidur
def test_profile_gpu_imports_vidur(tmp_path, capsys):
    source = vidur_linear_layers(tmp_path)
    assert invoke(["profile-gpu", "--import-vidur", str(source), "--out", str(tmp_path / "profiles")]) == 0
    assert capsys.readouterr().out.count("imported ") == 2


def test_importing_the_package_and_its_command_does_not_load_torch():
    code = ("import sys, simspec.profiling; from simspec.profiling import import_vidur; import simspec.cli.profile; "
            "assert 'torch' not in sys.modules, 'torch loaded'")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_run_profile_refuses_an_unknown_model_before_measuring(tmp_path):
    with pytest.raises(InputError, match="model must be one of"):
        runner.run_profile(device="cpu", models=["LLaVA-1.5-7B", "nope"], quick=True, out=tmp_path, progress=False)
    assert not any(tmp_path.iterdir())


def test_committed_profiles_follow_the_layout():
    for meta_path in (REPO / "profiles").glob("*/*/meta.json"):
        folder = meta_path.parent
        meta = json.loads(meta_path.read_text())
        assert meta["device_slug"] == folder.parent.name and meta["model"] == folder.name
        assert re.fullmatch(r"[a-z0-9-]+", folder.parent.name)
        for path in folder.glob("*.csv"):
            assert tuple(next(csv.reader(open(path)))) == OPS[path.stem].header, path
        if meta["licence"]:
            assert (folder / meta["licence"]).exists()
