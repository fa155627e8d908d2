"""Bad input across every command, as a table: each row is a command line
(and the files it reads), and each must end with exit status 2, one
``simspec: error:`` line on stderr naming the field (or file and line),
and nothing written anywhere under the test's folder but the inputs.

Rows that name files get them from ``FILES`` (written to ``in/`` first);
``{in}`` in an argument is that folder. The command runs from ``work/``, so
whatever it might write lands there and is caught.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from conftest import invoke

REPO = Path(__file__).resolve().parents[1]
PROFILE = REPO / "profiles" / "cpu-intel-xeon-processor"
STEPS = REPO / "validation" / "cpu" / "step_costs.json"

LLM_CONFIGS = REPO / "tests" / "data" / "llmfam"


def _without(name: str, key: str, inside: str | None = None) -> str:
    """The config file ``name`` of tests/data/llmfam/ without ``key`` (in its ``inside`` object)."""
    config = json.loads((LLM_CONFIGS / name).read_text())
    del (config[inside] if inside else config)[key]
    return json.dumps(config)


def _with(name: str, key: str, value, inside: str | None = None) -> str:
    """The config file ``name`` of tests/data/llmfam/ with ``key`` (in its ``inside`` object) set to ``value``."""
    config = json.loads((LLM_CONFIGS / name).read_text())
    (config[inside] if inside else config)[key] = value
    return json.dumps(config)


AZURE = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"
AZURE_SIZED = "TIMESTAMP,NumImages,ContextTokens,GeneratedTokens,image_width,image_height\n"


@dataclass(frozen=True)
class Case:
    id: str
    argv: list[str]
    says: tuple[str, ...]  # what the error line must contain (the field, the range)
    files: dict[str, str | bytes] = field(default_factory=dict)


def case(id_: str, argv: str | list[str], *says: str, **files: str | bytes) -> Case:
    return Case(id_, argv.split() if isinstance(argv, str) else argv, says,
                {name.replace("__", "."): text for name, text in files.items()})


SIM = "simulate --num-requests 20 --quiet"
CLASS_RESPONSES = "".join(json.dumps({"index": i, "task": "chat" if i < 4 else "code", "prompt_tokens": 5,
                                      "completion_tokens": 9, "steps_accepted": [1, 2], "steps_drafted": [3, 3],
                                      "seconds": 0.1, "text": ""}) + "\n" for i in range(20))
"""A calibrate vllm-classes run's responses with 4 chat requests: too few to fit the class."""


def fleet_case(id_: str, toml: str, *says: str) -> Case:
    """``simulate --fleet`` of the fleet file ``toml``."""
    return case(id_, f"{SIM} --fleet {{in}}/f.toml", *says, f__toml=toml)
TOML_BAD_TYPES = [  # (key in the config file, bad value, what the line says)
    ("seed", "1.5", "seed must be an integer"),
    ("seed", "true", "seed must be an integer"),
    ("seed", "12345678901234567890", "seed must be an integer below 2^63"),
    ("model", '["a"]', "model must be a string"),
    ("slo_ttft_ms", '"fast"', "slo_ttft_ms must be a number"),
    ("policies", '"ar"', "policies must be a list"),
]
TOML_BAD_TABLE = [  # (table, key, value, says)
    ("workload", "num_requests", "50.5", "workload.num_requests must be an integer"),
    ("workload", "trace_path", "7", "workload.trace_path must be a string"),
    ("workload", "rate_per_s", "nan", "workload.rate_per_s must be a finite number"),
    ("workload", "multimodal_share", "inf", "workload.multimodal_share must be a finite number"),
    ("engine", "drafter_context", "8", "engine.drafter_context must be a string"),
    ("engine", "max_num_seqs", '"lots"', "engine.max_num_seqs must be an integer"),
]

CASES = [
    # --- simulate: flags -------------------------------------------------------------
    case("tune-engine-vllm", "tune --engine vllm --out t.toml", "only --engine simspec runs", "export"),
    case("rate-huge", f"{SIM} --rate 1e300", "rate_per_s", "[1e-06, 1e+06]"),
    case("prompt-mean-huge", f"{SIM} --prompt-mean 1e300", "prompt_mean_tokens", "2.14748e+09"),
    case("output-mean-huge", f"{SIM} --output-mean 1e12", "output_mean_tokens", "2.14748e+09"),
    case("burstiness-huge", f"{SIM} --burstiness 1e300", "burstiness", "[0.001, 1000]"),
    case("max-num-seqs-huge", f"{SIM} --max-num-seqs 99999999999", "max_num_seqs", "1..65536"),
    case("kv-cache-huge", f"{SIM} --kv-cache-tokens 1099511627777", "kv_cache_tokens", "1..1099511627776"),
    case("drafter-context-huge", f"{SIM} --drafter-context selected:99999999999", "drafter_context", "1..16384"),
    case("cost-model-nan", f"{SIM} --cost-model affine:nan,1", "cost_model", "[0, 1e+06]"),
    case("cost-model-inf", f"{SIM} --cost-model constant:inf", "cost_model", "[0, 1e+06]"),
    case("policy-empty-params", f"{SIM} --policy linear:", "policy linear", "nothing after"),
    case("out-empty", [*SIM.split(), "--out", ""], "--out", "empty"),
    case("sweep-ray-empty", ["sweep", "--rate", "2", "--ray", "", "--out", "r.parquet"], "--ray", "empty"),
    case("sweep-workers-huge", "sweep --rate 2 --workers 100000 --out r.parquet", "--workers", "1..1024"),
    case("train-target-unwritable", "train --target /proc/simspec-x --drafter d --quick", "--target", "cannot write"),
    case("rate-negative", f"{SIM} --rate -1", "rate_per_s", "[1e-06, 1e+06]"),
    case("rate-nan", f"{SIM} --rate nan", "rate_per_s", "finite"),
    case("rate-inf", f"{SIM} --rate inf", "rate_per_s", "finite"),
    case("num-requests-0", f"{SIM} --num-requests 0", "num_requests", "1..10,000,000"),
    case("num-requests-2e9", f"{SIM} --num-requests 2000000000", "num_requests", "1..10,000,000"),
    case("num-requests-float", f"{SIM} --num-requests 1e20", "--num-requests", "integer"),
    case("burstiness-0", f"{SIM} --burstiness 0", "burstiness", "[0.001, 1000]"),
    case("multimodal-share", f"{SIM} --multimodal-share 1.5", "multimodal_share", "[0, 1]"),
    case("images-min-over-max", f"{SIM} --images-min 3 --images-max 2", "images_min", "images_max"),
    case("prompt-mean", f"{SIM} --prompt-mean -5", "prompt_mean_tokens"),
    case("shared-prefixes-0", f"{SIM} --shared-prefixes 0", "shared_prefixes", "1..10000000"),
    case("shared-prefix-tokens", f"{SIM} --shared-prefix-tokens -3", "shared_prefix_tokens", "0..2147483648"),
    case("image-pool", f"{SIM} --image-pool -1", "image_pool", "0..10000000"),
    case("prefix-caching-word", f"{SIM} --prefix-caching yes", "--prefix-caching", "on or off"),
    case("output-mean", f"{SIM} --output-mean 0", "output_mean_tokens"),
    case("trace-speedup", f"{SIM} --trace-speedup 0", "trace_speedup", "[1e-06, 1e+06]"),
    case("on-s", f"{SIM} --arrival onoff --on-s -1", "on_s", "[1e-06, 1e+06]"),
    case("max-num-seqs", f"{SIM} --max-num-seqs 0", "max_num_seqs", "1..65536"),
    case("max-num-batched-tokens", f"{SIM} --max-num-batched-tokens 0", "max_num_batched_tokens", "16..16777216"),
    case("gpu-memory-utilization", f"{SIM} --gpu-memory-utilization 1.5", "gpu_memory_utilization"),
    case("mem-fraction-static", f"{SIM} --engine sglang --mem-fraction-static 0", "mem_fraction_static must be in"),
    case("kv-cache-tokens", f"{SIM} --kv-cache-tokens -1", "kv_cache_tokens"),
    case("drafter-context-k0", f"{SIM} --drafter-context selected:0", "drafter_context"),
    case("drafter-context-word", f"{SIM} --drafter-context bogus", "drafter_context", "full, none"),
    case("model", f"{SIM} --model NoSuchModel", "model", "LLaVA-1.5-7B", "config.json"),
    case("tp-3", f"{SIM} --tp 3", "tp must be one of 1, 2, 4, 8"),
    case("draft-tp-3", f"{SIM} --model Llama-3.1-70B --tp 4 --draft-tp 3", "draft_tp must be 1 or 4",
         "engine simspec at tp 4"),
    case("draft-tp-vllm", f"{SIM} --engine vllm --model Llama-3.1-70B --tp 4 --draft-tp 1", "draft_tp must be 4",
         "engine vllm"),
    case("image-size-0", f"{SIM} --image-size 0x448", "image_size", "each > 0"),
    case("image-size-word", f"{SIM} --image-size large", "image_size", "WIDTHxHEIGHT"),
    case("image-size-huge", f"{SIM} --model Qwen2.5-VL-7B --image-size 20000x500", "image_size", "1..16384"),
    case("image-sizes-weight-0", f"{SIM} --image-size 448x448:0,896x896:1", "image_size weights", "> 0"),
    case("image-sizes-weight-negative", f"{SIM} --image-size 448x448:-0.5,896x896:1.5", "image_size weights", "> 0"),
    case("image-sizes-weight-word", f"{SIM} --image-size 448x448:half,896x896:1", "image_size weights", "'half'"),
    case("image-sizes-side-0", f"{SIM} --image-size 448x448:0.5,0x448:0.5", "image_size", "each > 0", "'0x448'"),
    case("image-sizes-empty-entry", f"{SIM} --image-size 448x448:0.5,,896x896:0.5", "image_size", "empty entry"),
    case("image-sizes-some-weights", f"{SIM} --image-size 448x448:0.5,896x896", "image_size", "every size or to none"),
    case("image-sizes-twice", f"{SIM} --image-size 448x448:0.5,448x448:0.5", "image_size lists 448x448 twice"),
    case("image-sizes-huge", f"{SIM} --image-size 448x448:0.5,448x20000:0.5", "image_size", "1..16384"),
    case("image-sizes-toml-list", f"{SIM} --config {{in}}/c.toml", "c.toml", "workload.image_size",
         c__toml='[workload]\nimage_size = ["448x448:0.5", 7]\n'),
    case("trace-image-width-0", f"{SIM} --model Qwen2.5-VL-7B --arrival trace --trace {{in}}/t.csv", "t.csv",
         "image_width", "1..16384", "row 1", t__csv=AZURE_SIZED + "2024-10-15T12:00:00Z,1,300,20,0,448\n"),
    case("trace-image-height-word", f"{SIM} --model Qwen2.5-VL-7B --arrival trace --trace {{in}}/t.csv", "t.csv",
         "image_height", "row 2", t__csv=AZURE_SIZED + "2024-10-15T12:00:00Z,1,300,20,448,448\n"
                                                      "2024-10-15T12:00:01Z,1,300,20,448,tall\n"),
    case("trace-image-width-alone", f"{SIM} --model Qwen2.5-VL-7B --arrival trace --trace {{in}}/t.csv", "t.csv",
         "image_width without image_height", "row 1", t__csv=AZURE_SIZED + "2024-10-15T12:00:00Z,1,300,20,448,\n"),
    case("trace-image-size-form", f"{SIM} --model Qwen2.5-VL-7B --arrival trace --trace {{in}}/t.jsonl", "t.jsonl",
         "image_size", "WIDTHxHEIGHT", "line 1",
         t__jsonl='{"timestamp": 0, "input_length": 9, "output_length": 4, "num_images": 1, "image_size": "big"}\n'),
    case("tp-heads", f"{SIM} --model Qwen2-VL-7B --tp 8", "28 attention heads", "not divisible by tp 8"),
    case("tp-does-not-fit", f"{SIM} --model Llama-3.1-70B --multimodal-share 0", "does not fit", "try --tp 2"),
    case("model-config-missing", f"{SIM} --model {{in}}/none/config.json", "model config", "does not exist"),
    case("model-config-type", f"{SIM} --model {{in}}/config.json", "model_type", "llama, mistral, qwen2",
         config__json='{"model_type": "gpt_neox", "hidden_size": 512}'),
    case("model-config-not-read", f"{SIM} --model {{in}}/config.json", "deepseek_v2", "not read yet",
         config__json='{"model_type": "deepseek_v2", "n_routed_experts": 160}'),
    case("model-config-latent-field", f"{SIM} --model {{in}}/config.json --multimodal-share 0", "config.json",
         "missing field kv_lora_rank", config__json=_without("deepseek_v3.json", "kv_lora_rank")),
    case("model-config-llama4-field", f"{SIM} --model {{in}}/config.json", "config.json",
         "missing field text_config.interleave_moe_layer_step",
         config__json=_without("llama4_scout.json", "interleave_moe_layer_step", "text_config")),
    case("model-config-llama4-no-rope", f"{SIM} --model {{in}}/config.json", "config.json",
         "text_config.no_rope_layers must list 0 or 1 for each of the 48 layers",
         config__json=_with("llama4_scout.json", "no_rope_layers", [1, 0, 1], "text_config")),
    case("model-config-moe-field", f"{SIM} --model {{in}}/config.json", "missing field num_experts",
         config__json='{"model_type": "qwen3_moe", "hidden_size": 512, "num_attention_heads": 8, '
                      '"num_hidden_layers": 2, "intermediate_size": 1024, "vocab_size": 100, '
                      '"max_position_embeddings": 512}'),
    case("model-config-field", f"{SIM} --model {{in}}", "config.json", "missing field num_hidden_layers",
         config__json='{"model_type": "qwen2", "hidden_size": 512, "num_attention_heads": 8}'),
    case("model-config-not-int", f"{SIM} --model {{in}}/config.json", "num_hidden_layers", "integer >= 1",
         config__json='{"model_type": "qwen2", "hidden_size": 512, "num_attention_heads": 8, '
                      '"num_hidden_layers": 2.5}'),
    case("model-config-internvl-downsample", f"{SIM} --model {{in}}/config.json", "config.json",
         "missing field downsample_ratio",
         config__json='{"model_type": "internvl_chat", "llm_config": {"model_type": "qwen2"}, '
                      '"vision_config": {"image_size": 448, "patch_size": 14}}'),
    case("model-config-llava-next-pinpoints", f"{SIM} --model {{in}}/config.json", "config.json",
         "missing field image_grid_pinpoints",
         config__json='{"model_type": "llava_next", "text_config": {"model_type": "llama"}, '
                      '"vision_config": {"image_size": 336, "patch_size": 14}}'),
    case("model-config-json", f"{SIM} --model {{in}}/config.json", "config.json", "not valid JSON",
         config__json='{"model_type": '),
    case("device", f"{SIM} --device tpu-v9", "device", "h100-sxm"),
    case("cost-model-word", f"{SIM} --cost-model guess", "cost_model", "roofline"),
    case("cost-model-missing-profile", f"{SIM} --cost-model profile:{{in}}/none", "profile"),
    case("cost-model-constant", f"{SIM} --cost-model constant:-1", "constant"),
    case("acceptance-iid", f"{SIM} --acceptance iid:1.5", "iid"),
    case("acceptance-preset", f"{SIM} --acceptance nosuch", "acceptance", "preset"),
    case("policy-unknown", f"{SIM} --policy nosuch", "policy", "linear"),
    case("policy-duplicate-key", f"{SIM} --policy linear:k=3,k=4", "k", "twice"),
    case("policy-bad-value", f"{SIM} --policy linear:k=abc", "k"),
    case("policy-tree-budget", f"{SIM} --policy tree:budget=100000", "budget", "4096"),
    case("cv-and-burstiness", f"{SIM} --cv 2 --burstiness 0.5", "--cv", "--burstiness"),
    case("cv-negative", f"{SIM} --cv -1", "cv", "[0.03162, 31.62]"),
    case("seed-negative", f"{SIM} --seed -1", "seed", ">= 0"),
    case("slo", f"{SIM} --slo-ttft-ms -5", "slo_ttft_ms", "> 0"),
    case("arrival", f"{SIM} --arrival sometimes", "arrival", "poisson"),
    case("over-context", f"{SIM} --over-context shrug", "over_context", "clip"),
    case("policy-file-missing", f"{SIM} --policy-file {{in}}/none.toml", "policy file", "none.toml"),
    case("policy-file-garbage", f"{SIM} --policy-file {{in}}/t.toml", "t.toml", t__toml="format = 3\n"),
    case("out-under-a-file", f"{SIM} --out {{in}}/file/run", "--out", file="x"),
    # --- simulate: config files ------------------------------------------------------
    case("config-folder", f"{SIM} --config {{in}}", "--config", "folder"),
    case("config-missing", f"{SIM} --config {{in}}/none.toml", "--config", "no such file"),
    case("config-syntax", f"{SIM} --config {{in}}/c.toml", "c.toml", c__toml="seed = = 1\n"),
    case("config-unknown-key", f"{SIM} --config {{in}}/c.toml", "seeed", c__toml="seeed = 1\n"),
    case("config-deep", f"{SIM} --config {{in}}/c.toml", "c.toml", c__toml="x = " + "[" * 5000 + "]" * 5000 + "\n"),
    case("config-not-utf8", f"{SIM} --config {{in}}/c.toml", "c.toml", "UTF-8", c__toml=b"seed = 1 # \xff\xfe\n"),
    *[case(f"toml-{key}-{value[:8]}", f"{SIM} --config {{in}}/c.toml", says, c__toml=f"{key} = {value}\n")
      for key, value, says in TOML_BAD_TYPES],
    *[case(f"toml-{table}.{key}", f"{SIM} --config {{in}}/c.toml", says, c__toml=f"[{table}]\n{key} = {value}\n")
      for table, key, value, says in TOML_BAD_TABLE],
    # --- simulate: traces ------------------------------------------------------------
    case("trace-missing", f"{SIM} --arrival trace --trace {{in}}/none.csv", "none.csv"),
    case("trace-not-utf8", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "UTF-8",
         t__csv=AZURE.encode() + b"2023-11-16 18:15:46,\xff\xfe,44\n"),
    case("trace-1e20-tokens", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "row 2", "ContextTokens",
         t__csv=AZURE + ROW + "2023-11-16 18:15:47.0,1e20,44\n"),
    case("trace-extra-field", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "row 1", "4 fields, the header 3",
         t__csv=AZURE + "2023-11-16 18:15:46.6805900,374,44,9\n"),
    case("trace-bad-time", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "TIMESTAMP",
         t__csv=AZURE + "yesterday,374,44\n"),
    case("trace-zero-output", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "GeneratedTokens",
         t__csv=AZURE + "2023-11-16 18:15:46.6805900,374,0\n"),
    case("trace-unknown-columns", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", "schema",
         t__csv="when,tokens\n1,2\n"),
    case("trace-header-only", f"{SIM} --arrival trace --trace {{in}}/t.csv", "t.csv", t__csv=AZURE),
    case("trace-jsonl-deep", f"{SIM} --arrival trace --trace {{in}}/t.jsonl", "t.jsonl", "line 1",
         t__jsonl="[" * 100_000 + "]" * 100_000 + "\n"),
    case("trace-jsonl-missing-key", f"{SIM} --arrival trace --trace {{in}}/t.jsonl", "t.jsonl", "output_length",
         t__jsonl='{"timestamp": 0, "input_length": 10}\n'),
    case("trace-jsonl-float-count", f"{SIM} --arrival trace --trace {{in}}/t.jsonl", "t.jsonl", "input_length",
         t__jsonl='{"timestamp": 0, "input_length": 10.5, "output_length": 4}\n'),
    case("trace-over-context-error", f"{SIM} --arrival trace --trace {{in}}/t.jsonl --over-context error",
         "context", t__jsonl='{"timestamp": 0, "input_length": 10000000, "output_length": 4}\n'),
    # --- simulate: profiles and step costs ------------------------------------------
    case("profile-other-model", f"{SIM} --model Qwen2-VL-7B --device cpu-intel-xeon-processor --cost-model profile:{PROFILE}/LLaVA-1.5-7B", "profile",
         "Qwen2-VL-7B"),
    case("steps-other-model", f"{SIM} --model Qwen2-VL-7B --cost-model steps:{STEPS}", "step_costs.json",
         "Qwen2-VL-7B"),
    case("steps-not-json", f"{SIM} --cost-model steps:{{in}}/s.json", "s.json", s__json="{not json"),
    # --- sweep -----------------------------------------------------------------------
    case("sweep-load-word", "sweep --load 0.5,abc --out r.parquet", "--load", "numbers"),
    case("sweep-seeds-0", "sweep --rate 2 --seeds 0 --out r.parquet", "seeds", ">= 1"),
    case("sweep-workers-0", "sweep --rate 2 --workers 0 --out r.parquet", "--workers", "1..1024"),
    case("sweep-num-requests-float", "sweep --rate 2 --num-requests 1.5 --out r.parquet", "--num-requests"),
    case("sweep-too-big", "sweep --rate 1,2 --seeds 60000 --out r.parquet", "120,000 tasks", "--yes"),
    case("sweep-file-key", "sweep --config {in}/s.toml --out r.parquet", "laod", s__toml="[axes]\nlaod = [0.5]\n"),
    case("sweep-file-type", "sweep --config {in}/s.toml --out r.parquet", "seeds", s__toml='seeds = "many"\n'),
    case("sweep-out-under-a-file", "sweep --rate 2 --num-requests 20 --out {in}/file/r.parquet", "--out", file="x"),
    # --- tune ------------------------------------------------------------------------
    case("tune-load", "tune --load -1 --out t.toml", "--load", "> 0"),
    case("tune-trials", "tune --trials 0 --out t.toml", "trials", ">= 1"),
    case("tune-objective", "tune --objective fastest --out t.toml", "objective", "mean_e2el"),
    case("tune-families", "tune --families linear,magic --out t.toml", "magic", "linear"),
    case("tune-slo", "tune --objective goodput --slo soon:5 --out t.toml", "--slo", "ttft:MS"),
    case("tune-out-under-a-file", "tune --out {in}/file/t.toml", "--out", file="x"),
    # --- plan ------------------------------------------------------------------------
    case("plan-no-slo", "plan --out p", "at least one --slo"),
    case("plan-slo-metric", "plan --slo p99_speed_ms=5 --out p", "--slo", "{ttft,tpot,itl,e2el}_ms"),
    case("plan-slo-bound", "plan --slo p99_ttft_ms=0 --out p", "p99_ttft_ms", "positive"),
    case("plan-slo-share", "plan --slo goodput_share=1.5 --out p", "goodput_share", "(0, 1]"),
    case("plan-goodput-needs-slos", "plan --slo goodput_share=0.9 --out p", "goodput_share", "--slo-ttft-ms"),
    case("plan-growth", "plan --slo p99_ttft_ms=2000 --growth 0 --out p", "--growth", "(0,"),
    case("plan-device", "plan --slo p99_ttft_ms=2000 --devices h100,a100 --out p", "--devices", "h100-sxm"),
    case("plan-tp", "plan --slo p99_ttft_ms=2000 --tp 3 --out p", "--tp", "1, 2, 4, 8"),
    case("plan-price-missing", "plan --slo p99_ttft_ms=2000 --devices h100-sxm,a40 --prices {in}/p.toml --out p",
         "no price for a40", p__toml="[prices]\nh100-sxm = 2.5\n"),
    case("plan-price-gpu", "plan --slo p99_ttft_ms=2000 --prices {in}/p.toml --out p", "unknown GPU", "tpu",
         p__toml="[prices]\ntpu = 2.5\n"),
    case("plan-price-value", "plan --slo p99_ttft_ms=2000 --prices {in}/p.toml --out p", "h100-sxm", "positive",
         p__toml="[prices]\nh100-sxm = -1\n"),
    case("plan-none-fits", "plan --model Llama-3.1-70B --multimodal-share 0 --slo p99_ttft_ms=2000 --devices l40s --tp 1 --requests 50 "
         "--quiet --out p", "no candidate fits", "does not fit"),
    case("plan-router", "plan --slo p99_ttft_ms=2000 --router fastest --out p", "router"),
    case("plan-routers", "plan --slo p99_ttft_ms=2000 --routers round_robin,fastest --out p", "--routers", "'fastest'",
         "least_requests"),
    case("plan-splits", "plan --slo p99_ttft_ms=2000 --splits 1:3,0:2 --out p", "--splits", "PREFILL:DECODE", "1..32"),
    case("plan-splits-form", "plan --slo p99_ttft_ms=2000 --splits 1-3 --out p", "--splits", "PREFILL:DECODE", "1:1,1:3"),
    case("plan-kv-link", "plan --slo p99_ttft_ms=2000 --kv-link carrier-pigeon --out p", "kv_link", "ib-400g"),
    case("plan-prefill-alone", "plan --slo p99_ttft_ms=2000 --prefill-devices a100-80gb --out p", "--prefill-devices",
         "--splits"),
    case("plan-prefill-device", "plan --slo p99_ttft_ms=2000 --splits 1:1 --prefill-devices a100 --out p",
         "--prefill-devices", "'a100'", "a100-80gb"),
    case("plan-prefill-tp", "plan --slo p99_ttft_ms=2000 --splits 1:1 --prefill-tp 3 --out p", "--prefill-tp", "1, 2, 4, 8"),
    case("plan-engines", "plan --slo p99_ttft_ms=2000 --engines simspec,trt --out p", "--engines", "'trt'", "sglang"),
    case("plan-engine-policies", "plan --slo p99_ttft_ms=2000 --engines vllm --policies marginal --out p",
         "vllm can run none of marginal", "ar, linear, batch_table"),
    case("plan-ray", "plan --slo p99_ttft_ms=2000 --ray 127.0.0.1:1 --requests 50 --out p", "--ray 127.0.0.1:1",
         "nothing answers"),
    # --- export ----------------------------------------------------------------------
    case("export-missing", "export --format vllm {in}/none.toml", "none.toml"),
    case("export-format", "export --format tgi {in}/none.toml", "--format", "vllm"),
    case("export-garbage", "export --format vllm {in}/t.toml", "t.toml", t__toml='format = "simspec-tuned/1"\n'),
    # --- report ----------------------------------------------------------------------
    case("report-missing", "report {in}/none.parquet", "none.parquet"),
    case("report-not-parquet", "report {in}/r.parquet", "r.parquet", "Parquet", r__parquet="not a table"),
    # --- live, validate, train, profile-gpu, costs, dashboard --------------------------
    case("live-num-requests", "live --num-requests 0 --timing-only LLaVA-1.5-7B", "num_requests"),
    case("live-rate", "live --rate -1 --timing-only LLaVA-1.5-7B", "rate"),
    case("live-device", "live --device tpu", "--device", "cpu"),
    case("live-timing-only-model", "live --timing-only NoSuchModel", "NoSuchModel"),
    case("live-acceptance", "live --timing-only LLaVA-1.5-7B --acceptance iid:2", "iid"),
    case("live-traces-missing", "live --timing-only LLaVA-1.5-7B --traces {in}/none.jsonl", "none.jsonl"),
    case("live-step-costs-missing", "live --step-costs {in}/none.json", "none.json"),
    case("live-checkpoint-missing", "live --target {in}/none --drafter {in}/none", "none"),
    case("validate-repeats-0", "validate --repeats 0", "--repeats", "[1, 10]"),
    case("validate-repeats-11", "validate --repeats 11", "--repeats", "[1, 10]"),
    case("validate-load-unknown", "validate --against vllm --out v --load peak", "--load", "bursty"),
    case("train-steps-0", "train --steps 0 --target t --drafter d", "steps", ">= 1"),
    case("profile-gpu-import-missing", "profile-gpu --import-vidur {in}/none --out p", "none"),
    case("profile-gpu-model", "profile-gpu --device cpu --model NoSuchModel --out p", "NoSuchModel"),
    case("simulate-router", "simulate --replicas 2 --router least_loaded", "router", "round_robin, random"),
    case("simulate-replicas-zero", "simulate --replicas 0", "replicas", "1..1024"),
    case("plan-sensitivity", "plan --slo p99_ttft_ms=2000 --sensitivity 0.9 --out p", "--sensitivity", "(0, 0.5)"),
    case("sensitivity-range", f"{SIM} --sensitivity 0.7", "--sensitivity", "(0, 0.5)"),
    case("tune-sensitivity-range", "tune --num-requests 20 --sensitivity 0.6 --out t.toml", "--sensitivity",
         "(0, 0.5)"),
    case("sensitivity-text", f"{SIM} --sensitivity lots", "--sensitivity", "number"),
    case("trace-task", f"{SIM} --trace {{in}}/t.csv", "t.csv", "task is no class", "row 1", "poetry",
         t__csv="TIMESTAMP,ContextTokens,GeneratedTokens,task\n2023-11-16 18:15:46.6805900,374,44,poetry\n"),
    case("preset-drafter", f"{SIM} --acceptance EAGLE-3/Qwen3-8B --model Qwen3-8B --multimodal-share 0",
         "EAGLE-3/Qwen3-8B", "eagle3 drafter", "eagle1", "--drafter eagle3"),
    case("preset-drafter-config", f"{SIM} --config {{in}}/c.toml", "SpecVLM/LLaVA-1.5-7B", "eagle1 drafter", "ngram",
         c__toml='acceptance = "SpecVLM/LLaVA-1.5-7B"\ndrafter = "ngram"\n'),
    case("tune-preset-drafter", "tune --acceptance EAGLE-3/Qwen3-8B --out t", "eagle3 drafter", "--drafter eagle3"),
    case("mix-unknown-class", f"{SIM} --mix chat:0.5,poetry:0.5", "mix", "unknown class 'poetry'", "chat, translate"),
    case("mix-sum", f"{SIM} --mix chat:0.5,qa:0.4", "mix", "sum to 1"),
    case("mix-negative", f"{SIM} --mix chat:-0.5,qa:1.5", "mix", "in [0, 1]"),
    case("temperature-range", f"{SIM} --temperature 1.5", "temperature", "[0, 1]", "(got 1.5)"),
    case("temperature-file", f"{SIM} --acceptance {REPO}/validation/cpu/acceptance.json --temperature 0.7",
         "temperature 0.7", "acceptance.json", "greedy"),
    case("mix-config", f"{SIM} --config {{in}}/c.toml", "mix", "unknown class", c__toml='[workload]\nmix = "x:1"\n'),
    case("fleet-missing", f"{SIM} --fleet {{in}}/none.toml", "--fleet", "none.toml"),
    fleet_case("fleet-empty", 'router = "random"\n', "f.toml", "at least one [[group]]"),
    fleet_case("fleet-unknown-key", "[[group]]\nreplicas = 2\ngpus = 4\n", "group 1", "gpus", "allowed"),
    fleet_case("fleet-no-replicas", '[[group]]\ndevice = "a100-80gb"\n', "group 1", "replicas is missing"),
    fleet_case("fleet-replicas-zero", "[[group]]\nreplicas = 0\n", "replicas", "1..1024"),
    fleet_case("fleet-replicas-text", '[[group]]\nreplicas = "two"\n', "replicas must be an integer"),
    fleet_case("fleet-names-twice", '[[group]]\nname = "a"\nreplicas = 1\n[[group]]\nname = "a"\nreplicas = 1\n',
               "names must be distinct"),
    fleet_case("fleet-too-many", "[[group]]\nreplicas = 600\n[[group]]\nreplicas = 500\n", "1100 replicas", "1024"),
    fleet_case("fleet-device", '[[group]]\nreplicas = 1\ndevice = "tpu-v9"\n', "fleet group g0", "tpu-v9"),
    fleet_case("fleet-tp", "[[group]]\nreplicas = 1\ntp = 3\n", "fleet group g0", "tp must be one of"),
    fleet_case("fleet-policy", '[[group]]\nreplicas = 1\npolicy = "nosuch"\n', "fleet group g0", "nosuch"),
    fleet_case("fleet-engine-key", "[[group]]\nreplicas = 1\n[group.engine]\nmax_seqs = 4\n", "fleet group g0",
               "max_seqs"),
    fleet_case("fleet-router", 'router = "fastest"\n[[group]]\nreplicas = 2\n', "router", "round_robin, random"),
    fleet_case("fleet-role", '[[group]]\nreplicas = 1\nrole = "both"\n', "role must be prefill or decode"),
    fleet_case("fleet-one-side", '[[group]]\nreplicas = 1\nrole = "decode"\n[[group]]\nreplicas = 1\n',
               "prefill and decode groups"),
    fleet_case("fleet-prefill-policy", '[[group]]\nreplicas = 1\nrole = "prefill"\npolicy = "linear:k=3"\n'
               '[[group]]\nreplicas = 1\nrole = "decode"\n', "prefill group drafts nothing"),
    fleet_case("fleet-kv-link", 'kv_link = "carrier-pigeon"\n[[group]]\nreplicas = 1\n', "kv_link", "nvlink, ib-400g"),
    fleet_case("fleet-kv-link-zero", 'kv_link = "0:10"\n[[group]]\nreplicas = 1\n', "kv_link", "GB/s > 0"),
    case("fleet-and-replicas", f"{SIM} --replicas 2 --fleet {{in}}/f.toml", "replicas and fleet",
         f__toml="[[group]]\nreplicas = 2\n"),
    case("config-fleet-router-twice", f"{SIM} --config {{in}}/c.toml", "router is set twice",
         c__toml='router = "random"\n[fleet]\nrouter = "random"\n[[fleet.group]]\nreplicas = 2\n'),
    case("tune-fleet", "tune --fleet {in}/f.toml --out t", "tune", "--fleet", f__toml="[[group]]\nreplicas = 2\n"),
    case("plan-fleet", "plan --slo p99_ttft_ms=2000 --fleet {in}/f.toml --out p", "plan", "--fleet",
         f__toml="[[group]]\nreplicas = 2\n"),
    case("simulate-router-staleness", "simulate --replicas 2 --router least_requests --router-staleness-ms -5",
         "router_staleness_ms", "0..60000"),
    case("profile-gpu-workers-alone", "profile-gpu --device cpu --workers 2 --out p", "--workers", "--collectives"),
    case("profile-gpu-workers-degree", "profile-gpu --device cpu --collectives --workers 3 --out p", "--workers",
         "2, 4, 8"),
    case("profile-gpu-workers-text", "profile-gpu --collectives --workers two --out p", "--workers", "2, 4, 8"),
    case("profile-gpu-collectives-model", "profile-gpu --device cpu --collectives --model LLaVA-1.5-7B --out p",
         "--collectives", "--model"),
    case("costs-report-device", "costs report --device tpu-v9 --model LLaVA-1.5-7B", "tpu-v9"),
    case("dashboard-port-0", "dashboard --port 0", "--port", "1..65535"),
    case("dashboard-port-big", "dashboard --port 70000", "--port", "65535"),
    case("dashboard-port-word", "dashboard --port http", "--port"),
    case("vllm-models-not-ours", "vllm-models {in}", "not empty", "simspec-models.json", notes__txt="mine"),
    case("calibrate-vllm-log-without-iterations", "calibrate vllm --log {in}/serve.log --metrics {in}/serve.log "
         "--model Llama-2-7B --device h100-sxm --out cal", "serve.log", "--enable-logging-iteration-details",
         serve__log="(APIServer pid=1) INFO 12-01 18:23:42 [api_server.py:1] vLLM API server version 0.32.0\n"),
    case("classes-no-out", "calibrate vllm-classes --model {in}/m", "--out"),
    case("classes-no-model", "calibrate vllm-classes --out cal", "--model"),
    case("classes-model-not-a-folder", "calibrate vllm-classes --model {in}/nothing --out cal", "--model",
         "config.json"),
    case("classes-per-class-1", "calibrate vllm-classes --model {in} --out cal --per-class 1", "--per-class",
         "16..10000", config__json="{}"),
    case("classes-hold-out-every-1", "calibrate vllm-classes --model {in} --out cal --hold-out-every 1",
         "--hold-out-every", "2..10", config__json="{}"),
    case("classes-per-class-under-the-split", "calibrate vllm-classes --model {in} --out cal --per-class 20 "
         "--hold-out-every 4", "--per-class", "32..10000", "--hold-out-every 4", config__json="{}"),
    case("classes-fit-on-without-from", "calibrate vllm-classes --fit-on {in} --model {in} --out cal",
         "--fit-on", "--from", config__json="{}"),
    case("classes-fit-on-not-a-run", "calibrate vllm-classes --from {in} --fit-on {in}/nothing", "--fit-on",
         "responses.jsonl", responses__jsonl=CLASS_RESPONSES, prompts__jsonl="",
         run__json=json.dumps({"k": 3, "settings": {"fitted_to": "m"}})),
    case("classes-too-few-prompts", "calibrate vllm-classes --model {in} --out cal --prompts {in}/p.jsonl",
         "class chat", "at least 16", config__json="{}",
         p__jsonl="".join('{"task": "chat", "text": "hi %d"}\n' % i for i in range(5))),
    case("classes-unknown-class", "calibrate vllm-classes --model {in} --out cal --classes chat,poetry",
         "--classes", "poetry", config__json="{}"),
    case("classes-bad-speculation", ["calibrate", "vllm-classes", "--model", "{in}", "--out", "cal",
                                     "--speculative-config", "{ngram"], "--speculative-config", "JSON",
         config__json="{}"),
    case("classes-speculation-without-k", ["calibrate", "vllm-classes", "--model", "{in}", "--out", "cal",
                                           "--speculative-config", '{"method": "ngram"}'],
         "num_speculative_tokens", "1..16", config__json="{}"),
    case("classes-from-not-a-run", "calibrate vllm-classes --from {in}", "--from", "responses.jsonl",
         notes__txt="mine"),
    case("classes-too-few-requests", "calibrate vllm-classes --from {in}", "class chat", "needs at least 8",
         responses__jsonl=CLASS_RESPONSES, run__json=json.dumps({"k": 3, "settings": {"fitted_to": "m"}})),
]


def _written(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.mark.parametrize("row", CASES, ids=[c.id for c in CASES])
def test_bad_input_is_one_line_naming_the_field_exit_2_nothing_written(row: Case, tmp_path, monkeypatch):
    inputs, work = tmp_path / "in", tmp_path / "work"
    inputs.mkdir()
    work.mkdir()
    for name, text in row.files.items():
        (inputs / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    before = _written(inputs)
    monkeypatch.chdir(work)
    code, _, stderr = invoke([a.replace("{in}", str(inputs)) for a in row.argv])
    assert code == 2, f"exit {code}, stderr: {stderr!r}"
    assert stderr.startswith("simspec: error: ") and stderr.count("\n") == 1, stderr
    for text in row.says:
        assert text.lower() in stderr.lower(), f"{text!r} not in {stderr!r}"
    assert _written(work) == [], "written: " + ", ".join(_written(work))
    assert _written(inputs) == before, "inputs changed"


def test_the_table_is_long_enough_and_covers_every_command():
    import argparse

    from simspec import cli

    assert len(CASES) >= 60
    sub = next(a for a in cli.parser()._actions if isinstance(a, argparse._SubParsersAction))
    missing = set(sub.choices) - {"presets"} - {c.argv[0] for c in CASES}
    assert not missing, f"no bad input for {sorted(missing)}"
    assert len({c.id for c in CASES}) == len(CASES)
    assert os.sep not in "".join(c.id for c in CASES)
