"""Tests of simspec.config: defaults held once, TOML in (tables and policy
tables), flags over file, to_toml round trips, unknown keys and bad TOML as
InputError naming the key or file, and the num_requests / duration_s rule
(setting one clears the other's default; a trace with neither is replayed
whole)."""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path

import pytest

from simspec import config
from simspec.config import DEFAULT_POLICIES, DEFAULT_WORKLOAD, SimConfig
from simspec.sim import EngineConfig
from simspec.types import InputError


def write(tmp_path: Path, text: str, name: str = "sim.toml") -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def from_text(tmp_path: Path, text: str, flags: dict | None = None) -> SimConfig:
    return config.build(config.load(write(tmp_path, text)), flags)


# --- defaults and file values ---------------------------------------------


def test_defaults_are_the_dataclass_defaults():
    assert config.build() == SimConfig()
    assert config.build({}, {}) == SimConfig()
    assert SimConfig().policies == DEFAULT_POLICIES
    assert SimConfig().workload == DEFAULT_WORKLOAD
    assert SimConfig().engine == EngineConfig()


def _subcommand(name: str):
    from simspec import cli

    top = cli.parser(name)
    return next(a for a in top._actions if isinstance(a, argparse._SubParsersAction)).choices[name]


def test_one_default_workload_for_the_record_the_scenario_and_the_simulate_flags():
    from simspec.cli.scenario import scenario_config
    from simspec.workloads import WorkloadConfig

    assert SimConfig().workload == DEFAULT_WORKLOAD == WorkloadConfig()
    args = _subcommand("simulate").parse_args([])
    assert scenario_config(args).workload == WorkloadConfig()
    helps = {a.option_strings[0]: a.help for a in _subcommand("simulate")._actions if a.option_strings}
    for flag in config.FLAGS:
        if flag.path[0] == "workload":
            assert helps[flag.name].endswith(f"(default: {getattr(WorkloadConfig(), flag.path[1])})"), flag.name


def test_file_values_load(tmp_path):
    text = 'policies = ["ar", {name = "linear", k = 5}]\n\n[workload]\nrate_per_s = 3\n'
    cfg = from_text(tmp_path, text)
    assert cfg.workload.rate_per_s == 3
    assert cfg.policies == ("ar", "linear:k=5")
    # Everything the file leaves out keeps its default.
    expected = dataclasses.replace(
        SimConfig(), policies=("ar", "linear:k=5"), workload=dataclasses.replace(DEFAULT_WORKLOAD, rate_per_s=3.0)
    )
    assert cfg == expected


def test_policy_tables_without_parameters_are_bare_names(tmp_path):
    cfg = from_text(tmp_path, 'policies = [{name = "tree"}, {name = "truncate", k_max = 6, threshold = 0.5}]\n')
    assert cfg.policies == ("tree", "truncate:k_max=6,threshold=0.5")


def test_flags_override_file(tmp_path):
    text = (
        'seed = 7\nmodel = "LLaVA-1.5-13B"\n'
        "[workload]\nrate_per_s = 3\nmultimodal_share = 0.2\n"
        "[engine]\nmax_num_seqs = 64\n"
    )
    flags = {"seed": 9, "workload": {"rate_per_s": 5.0}, "engine": {"max_num_batched_tokens": 4096}}
    cfg = from_text(tmp_path, text, flags)
    assert cfg.seed == 9  # flag wins
    assert cfg.workload.rate_per_s == 5.0  # flag wins inside a table ...
    assert cfg.workload.multimodal_share == 0.2  # ... and the file's other keys in that table stay
    assert cfg.model == "LLaVA-1.5-13B"
    assert cfg.engine.max_num_seqs == 64
    assert cfg.engine.max_num_batched_tokens == 4096


# --- to_toml round trip -----------------------------------------------------

ROUND_TRIPS = {
    "defaults": {},
    "policies-seed-slo-affine": {
        "policies": ["tree:depth=4,topk=5,budget=20", "truncate:k_max=6,threshold=0.5", "batch_table:table=1:5,8:2"],
        "seed": 11,
        "slo_ttft_ms": 250.0,
        "slo_tpot_ms": 40.0,
        "cost_model": "affine:1.5,0.01",
    },
    "duration-poisson": {"workload": {"arrival": "poisson", "duration_s": 30.0, "rate_per_s": 1.5}},
    "trace-first-40": {"workload": {"trace_path": "traces/x.csv", "arrival": "trace", "num_requests": 40,
                                    "trace_speedup": 50.0}},
    "trace-whole": {"workload": {"trace_path": "traces/x.csv", "arrival": "trace"}},
    "onoff-engine": {
        "model": "LLaVA-1.6-7B",
        "device": "a100-80gb",
        "workload": {"arrival": "onoff", "on_s": 2.0, "off_s": 8.0, "images_min": 1, "images_max": 3},
        "engine": {"kv_cache_tokens": 50_000, "drafter_context": "pooled:16", "max_num_seqs": 32},
    },
}


@pytest.mark.parametrize("flags", ROUND_TRIPS.values(), ids=ROUND_TRIPS.keys())
def test_to_toml_round_trips(tmp_path, flags):
    cfg = config.build(None, flags)
    assert from_text(tmp_path, config.to_toml(cfg)) == cfg


# --- errors -----------------------------------------------------------------

UNKNOWN_KEYS = {
    "top-level": ("colour = 'red'\n", "colour"),
    "workload": ("[workload]\nrate = 3\n", "rate"),
    "engine": ("[engine]\nmax_seqs = 8\n", "max_seqs"),
}


@pytest.mark.parametrize("text,key", UNKNOWN_KEYS.values(), ids=UNKNOWN_KEYS.keys())
def test_unknown_key_is_named(tmp_path, text, key):
    with pytest.raises(InputError, match=repr(key)):
        config.load(write(tmp_path, text))


@pytest.mark.parametrize("text", ["seed = \n", "[workload\nrate_per_s = 3\n", "x = 'a' = 'b'\n"],
                         ids=["missing-value", "unclosed-table", "two-equals"])
def test_invalid_toml_names_the_file(tmp_path, text):
    path = write(tmp_path, text, "broken.toml")
    with pytest.raises(InputError, match="broken.toml"):
        config.load(path)


def test_missing_file_names_the_file(tmp_path):
    with pytest.raises(InputError, match="absent.toml"):
        config.load(tmp_path / "absent.toml")


# --- num_requests / duration_s ------------------------------------------------


def test_num_requests_clears_default_duration():
    # The default ends on num_requests; both settings below are alone valid.
    assert DEFAULT_WORKLOAD.num_requests is not None and DEFAULT_WORKLOAD.duration_s is None
    cfg = config.build(None, {"workload": {"num_requests": 40}})
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (40, None)


@pytest.mark.parametrize("source", ["flags", "file"])
def test_duration_clears_default_num_requests(tmp_path, source):
    if source == "flags":
        cfg = config.build(None, {"workload": {"duration_s": 30}})
    else:
        cfg = from_text(tmp_path, "[workload]\nduration_s = 30\n")
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == (None, 30)


@pytest.mark.parametrize(
    "workload,stops",
    [
        ({}, (None, None)),
        ({"num_requests": 40}, (40, None)),
        ({"duration_s": 12.5}, (None, 12.5)),
    ],
    ids=["whole-trace", "first-40", "first-12.5s"],
)
def test_trace_stops(workload, stops):
    cfg = config.build(None, {"workload": {"arrival": "trace", "trace_path": "t.csv", **workload}})
    assert (cfg.workload.num_requests, cfg.workload.duration_s) == stops


def test_both_stops_for_synthetic_arrivals_is_an_error():
    with pytest.raises(InputError, match="num_requests and duration_s"):
        config.build(None, {"workload": {"num_requests": 40, "duration_s": 30}})


@pytest.mark.parametrize("flags, expected", [
    ({}, "SpecVLM/LLaVA-1.5-7B"),
    ({"model": "Llama-3.3-70B", "tp": 4, "drafter": "eagle3"}, "EAGLE-3/Llama-3.3-70B"),
    ({"model": "llama-3.1-8b", "drafter": "eagle3"}, "EAGLE-3/Llama-3.1-8B"),
    ({"model": "DeepSeek-V3", "tp": 8}, "MTP/DeepSeek-V3"),  # its own drafter, mtp
    ({"model": "Qwen2.5-72B", "tp": 4, "drafter": "eagle3"}, "SpecVLM/LLaVA-1.5-7B"),  # no preset of its head
    ({"model": "Llama-3.3-70B", "tp": 4, "drafter": "eagle3", "acceptance": "iid:0.7"}, "iid:0.7"),
])
def test_a_run_without_an_acceptance_takes_the_preset_of_its_model_and_drafter(flags, expected):
    assert config.build({}, flags).acceptance == expected
