"""Distributions of image sizes and traces' image-size columns: each image
draws its size (or takes its trace row's), and the model's rule turns it
into that image's visual tokens. Statistical checks use 5 sigma (a false
alarm about once in 1.7 million runs of a seed that passes once: never)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from conftest import invoke
from simspec import config, costs, experiment, seeds
from simspec.types import InputError
from simspec.workloads import WorkloadConfig, WorkloadStreams, image_sizes, make_requests

QWEN = "Qwen2.5-VL-7B"
SIGMAS = 5.0


def tokens_of(model: str, width: int, height: int) -> int:
    return costs.model_spec(model).at_image_size(width, height).visual_tokens_per_image


def requests(cfg: WorkloadConfig, model: str = QWEN, seed: int = 0):
    spec = costs.model_spec(model)
    streams = WorkloadStreams.from_seed_sequence(seeds.stream(seed, "workload"))
    return make_requests(cfg, streams, visual_tokens_per_image=spec.visual_tokens_per_image,
                         max_context_tokens=spec.max_context_tokens, image_tokens=experiment.image_rule(spec))


@pytest.mark.parametrize("text, sizes, weights", [
    ("448x448", ((448, 448),), (1.0,)),
    ("448x448:3", ((448, 448),), (1.0,)),
    ("448x448:1,1920x1080:3", ((448, 448), (1920, 1080)), (0.25, 0.75)),
    (" 448X448 , 896x896 ", ((448, 448), (896, 896)), (0.5, 0.5)),  # no weights: equal shares
])
def test_a_list_of_sizes_reads_with_normalised_weights(text, sizes, weights):
    got = image_sizes(text)
    assert got.sizes == sizes and got.weights == pytest.approx(weights) and math.fsum(got.weights) == 1.0


def test_draw_frequencies_follow_the_weights():
    weights = {(448, 448): 0.5, (1280, 720): 0.3, (1920, 1080): 0.2}
    n = 20_000
    cfg = WorkloadConfig(num_requests=n, multimodal_share=1.0, images_min=1, images_max=3,
                         image_size=",".join(f"{w}x{h}:{p}" for (w, h), p in weights.items()))
    drawn = [t for r in requests(cfg) for t in r.image_tokens]
    by_tokens = {tokens_of(QWEN, *size): p for size, p in weights.items()}
    assert len(by_tokens) == 3  # three sizes, three token counts: the counts name the sizes
    m = len(drawn)
    assert m > 2 * n
    for tokens, p in by_tokens.items():
        count = drawn.count(tokens)
        assert abs(count - m * p) <= SIGMAS * math.sqrt(m * p * (1 - p)), (tokens, count, m * p)
    assert set(drawn) == set(by_tokens)


def test_the_draws_differ_between_images_of_one_request():
    cfg = WorkloadConfig(num_requests=500, multimodal_share=1.0, images_min=2, images_max=2,
                         image_size="448x448:0.5,1920x1080:0.5")
    mixed = sum(len(set(r.image_tokens)) == 2 for r in requests(cfg))
    assert abs(mixed - 250) <= SIGMAS * math.sqrt(500 * 0.25)  # P(two sizes) = 1/2


def test_a_pool_image_has_one_size():
    cfg = WorkloadConfig(num_requests=2000, multimodal_share=1.0, image_pool=5, image_size="448x448,1920x1080")
    first = {}
    for r in requests(cfg):
        assert r.prefix_tokens == r.image_tokens[0]
        first.setdefault(r.prefix_id, set()).add(r.image_tokens[0])
    assert len(first) == 5 and all(len(v) == 1 for v in first.values())
    assert len({next(iter(v)) for v in first.values()}) == 2  # both sizes among the pool's five images


def run_folder(tmp_path: Path, name: str, *argv) -> dict[str, bytes]:
    out = tmp_path / name
    code, stdout, err = invoke(["simulate", "--num-requests", "100", "--policy", "ar", "--policy", "linear:k=3",
                                "--multimodal-share", "1", "--quiet", "--out", out, *argv])
    assert code == 0, err
    files = {p.name: p.read_bytes() for p in out.iterdir() if p.suffix in (".json", ".csv")}
    files["table"] = "\n".join(line for line in stdout.splitlines()
                               if not line.startswith(("simulated in", "run folder"))).encode()
    return files


def outputs(files: dict[str, bytes]) -> dict[str, bytes]:
    """The simulated results: metrics and per-request records."""
    assert {"metrics.json", "requests.csv"} <= files.keys()
    return {k: files[k] for k in ("metrics.json", "requests.csv")}


def test_one_size_as_a_list_is_the_single_size_run_byte_for_byte(tmp_path):
    single = run_folder(tmp_path, "single", "--model", QWEN, "--image-size", "448x448")
    listed = run_folder(tmp_path, "listed", "--model", QWEN, "--image-size", "448x448:0.7")
    default = run_folder(tmp_path, "default", "--model", QWEN)
    assert outputs(single) == outputs(listed)
    assert outputs(single) != outputs(default)  # the comparison can fail: 448 x 448 is not the default size


def mean_ttft(tmp_path: Path, name: str, *argv) -> float:
    metrics = json.loads(run_folder(tmp_path, name, *argv)["metrics.json"])
    return metrics["ar"]["mean_ttft_ms"] if "ar" in metrics else metrics["policies"]["ar"]["mean_ttft_ms"]


def test_a_mix_of_sizes_lies_between_its_sizes(tmp_path):
    small = mean_ttft(tmp_path, "small", "--model", QWEN, "--image-size", "448x448")
    large = mean_ttft(tmp_path, "large", "--model", QWEN, "--image-size", "1920x1080")
    mixed = mean_ttft(tmp_path, "mixed", "--model", QWEN, "--image-size", "448x448:0.5,1920x1080:0.5")
    assert small < mixed < large


def test_a_fixed_size_model_ignores_the_distribution(tmp_path):
    plain = run_folder(tmp_path, "plain", "--model", "LLaVA-1.5-7B")
    mixed = run_folder(tmp_path, "mixed", "--model", "LLaVA-1.5-7B", "--image-size", "448x448:0.5,1920x1080:0.5")
    assert outputs(plain) == outputs(mixed)
    assert b"images 448x448 50% / 1920x1080 50%" in mixed["table"]  # the run says which sizes it drew from


def test_same_seed_same_bytes(tmp_path):
    argv = ("--model", QWEN, "--image-size", "448x448:0.5,1280x720:0.3,1920x1080:0.2")
    first, again = run_folder(tmp_path, "a", *argv), run_folder(tmp_path, "b", *argv)
    other = run_folder(tmp_path, "c", *argv, "--seed", "1")
    assert outputs(first) == outputs(again) and first["table"] == again["table"]
    assert outputs(first) != outputs(other)


def test_the_distribution_changes_only_the_images():
    base = WorkloadConfig(num_requests=300, multimodal_share=0.5)
    plain, mixed = requests(base), requests(WorkloadConfig(num_requests=300, multimodal_share=0.5,
                                                           image_size="448x448:0.5,1920x1080:0.5"))
    assert [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.images) for r in plain] == \
           [(r.arrival_s, r.prompt_tokens, r.output_tokens, r.images) for r in mixed]
    assert {t for r in mixed for t in r.image_tokens} == {256, 2691}


def test_a_toml_list_is_the_string(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[workload]\nimage_size = ["448x448:0.5", "1920x1080:0.5"]\n')
    listed = config.from_flags({}, path)
    assert listed.workload.image_size == "448x448:0.5,1920x1080:0.5"
    assert config.to_toml(config.from_flags({}, _written(tmp_path, config.to_toml(listed)))) == config.to_toml(listed)
    assert "image_size" not in config.to_toml(config.from_flags({}))  # a run without it writes nothing of it


def _written(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "back.toml"
    path.write_text(text)
    return path


LMM = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens,{}\n"


@pytest.mark.parametrize("columns, rows", [
    ("image_width,image_height", ["448,448", "1920,1080", ",", "1344,896"]),
    ("image_size", ["448x448", "1920x1080", "", "1344x896"]),
])
def test_a_trace_gives_each_request_its_size(tmp_path, columns, rows):
    path = tmp_path / "t.csv"
    path.write_text(LMM.format(columns) + "".join(
        f"2024-10-15T12:00:0{i}Z,{images},100,10,{size}\n" for i, (images, size) in enumerate(zip((1, 2, 1, 1), rows))))
    cfg = WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None)
    got = [r.image_tokens for r in requests(cfg)]
    assert got == [(256,), (2691, 2691), (1024,), (1536,)]  # the empty row: the model's default size
    fallback = WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None, image_size="448x448")
    assert [r.image_tokens for r in requests(fallback)][2] == (256,)  # ... or the workload's size


def test_a_jsonl_trace_gives_each_request_its_size(tmp_path):
    path = tmp_path / "t.jsonl"
    lines = [{"timestamp": 0, "input_length": 50, "output_length": 5, "num_images": 1, "image_size": "1920x1080"},
             {"timestamp": 10, "input_length": 50, "output_length": 5, "num_images": 1},
             {"timestamp": 20, "input_length": 50, "output_length": 5, "num_images": 1, "image_size": "448x448"}]
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    got = [r.image_tokens for r in requests(WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None))]
    assert got == [(2691,), (1024,), (256,)]


def test_a_bad_trace_size_names_the_row(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text(LMM.format("image_width,image_height") + "2024-10-15T12:00:00Z,1,100,10,448,448\n"
                    "2024-10-15T12:00:01Z,1,100,10,448,20000\n")
    with pytest.raises(InputError, match=r"t.csv: image_height must be an integer in 1..16384 .*row 2 has '20000'"):
        requests(WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None))
