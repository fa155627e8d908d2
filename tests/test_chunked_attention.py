"""Llama 4's chunked attention: which layers attend within chunks (read
from a config as transformers and vLLM read it), the keys and pairs a step
prices (the layers' mean, checked against attention counted layer by layer
and query by query), and what it changes in a simulation (nothing below a
chunk's length, cheaper steps above it)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from simspec import config as configuration
from simspec import costs, experiment
from simspec.costs.base import NO_LOCAL, LocalAttention, attended_context, attended_span
from simspec.costs.hfconfig import read_model_config
from simspec.types import InputError

DATA = Path(__file__).resolve().parent / "data" / "llmfam"


def layer_by_layer(chunked: list[bool], chunk: int, done: int, take: int) -> tuple[float, float]:
    """(keys read, query x key pairs) of ``take`` queries after ``done``
    cached tokens, counted query by query in every layer and averaged over
    the layers: a chunked layer's query at position t sees t // chunk x
    chunk .. t, a full layer's 0 .. t; a layer reads every key any of its
    queries sees."""
    keys = pairs = 0
    for local in chunked:
        seen = set()
        for t in range(done, done + take):
            first = t // chunk * chunk if local else 0
            pairs += t - first + 1
            seen.update(range(first, t + 1))
        keys += len(seen | (set(range(done)) if not local else set()))
    return keys / len(chunked), pairs / len(chunked)


@pytest.mark.parametrize("chunk, every", [(8, 4), (16, 2), (5, 3)])
def test_a_prefill_chunks_keys_and_pairs_are_the_layers_mean(chunk, every):
    chunked = [(i + 1) % every != 0 for i in range(12)]
    share = sum(chunked) / len(chunked)
    rng = np.random.default_rng(chunk)
    for done, take in [(0, 1), (0, 40), (7, 1), (8, 3), (13, 30), (31, 2), *rng.integers(0, 50, (8, 2))]:
        done, take = int(done), max(int(take), 1)
        keys, pairs = layer_by_layer(chunked, chunk, done, take)
        got = attended_span(LocalAttention(chunk, share), done, take)
        assert got[0] == pytest.approx(keys, abs=0.5) and got[1] == pytest.approx(pairs, abs=0.5)


@pytest.mark.parametrize("context", [0, 1, 7, 8, 9, 100, 8191, 8192, 8193, 30000])
def test_a_decode_query_attends_to_its_chunk_in_a_chunked_layer(context):
    # a query after ``context`` cached tokens pairs with them (its own key is not counted, as for full layers)
    chunked = [(i + 1) % 4 != 0 for i in range(48)]
    keys, pairs = layer_by_layer(chunked, 8192, context, 1)
    assert attended_context(LocalAttention(8192, 0.75), context) == pytest.approx(pairs - 1, abs=0.5)
    assert attended_context(NO_LOCAL, context) == context


def test_without_chunked_layers_a_span_is_the_full_causal_count():
    assert attended_span(NO_LOCAL, 100, 20) == (120, 20 * 100 + 20 * 21 // 2)


def scout_config(tmp_path: Path, **text) -> Path:
    config = json.loads((DATA / "llama4_scout.json").read_text())
    config["text_config"].update(text)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


def test_scout_attends_in_chunks_of_8192_in_three_layers_of_four(tmp_path):
    assert (costs.model_spec("Llama-4-Scout-17B-16E").attention_chunk,
            costs.model_spec("Llama-4-Scout-17B-16E").chunked_layers) == (8192, 36)
    spec = read_model_config(scout_config(tmp_path, attention_chunk_size=8192, no_rope_layers=[]))
    assert (spec.attention_chunk, spec.chunked_layers) == (8192, 36)


def test_a_config_may_name_its_chunked_layers_or_turn_chunking_off(tmp_path):
    rope = [1] * 40 + [0] * 8
    spec = read_model_config(scout_config(tmp_path, attention_chunk_size=4096, no_rope_layers=rope))
    assert (spec.attention_chunk, spec.chunked_layers) == (4096, 40)
    spec = read_model_config(scout_config(tmp_path, no_rope_layer_interval=2))
    assert (spec.attention_chunk, spec.chunked_layers) == (8192, 24)
    spec = read_model_config(scout_config(tmp_path, attention_chunk_size=None))
    assert (spec.attention_chunk, spec.chunked_layers) == (0, 0)


@pytest.mark.parametrize("rope", [[1] * 47, [2] * 48, "yes", [True] * 48])
def test_a_bad_no_rope_layers_is_one_line_naming_it(tmp_path, rope):
    with pytest.raises(InputError, match=r"text_config.no_rope_layers must list 0 or 1 for each of the 48 layers"):
        read_model_config(scout_config(tmp_path, no_rope_layers=rope))


def scout_run(prompt: int, local: bool) -> dict:
    """Scout at tp 4 on H100s, ar, 12 text requests of ``prompt`` tokens
    arriving at once, with its chunked layers priced or every layer priced
    as full attention."""
    flags = {"model": "Llama-4-Scout-17B-16E", "device": "h100-sxm", "tp": 4, "seed": 3, "policies": ["ar"],
             "workload": {"arrival": "poisson", "rate_per_s": 1e6, "num_requests": 12, "multimodal_share": 0.0,
                          "prompt_mean_tokens": prompt, "prompt_cv": 0.2, "output_mean_tokens": 64,
                          "output_cv": 0.2}}
    scenario = experiment.resolve(configuration.build({}, flags))
    assert scenario.costs.local == LocalAttention(8192, 0.75)
    if not local:
        scenario = dataclasses.replace(scenario, costs=dataclasses.replace(scenario.costs, local=NO_LOCAL))
    return experiment.run_scenario(scenario).metrics["ar"]


def test_chunked_layers_change_nothing_below_a_chunk_and_cut_step_time_above_it():
    assert scout_run(2000, True) == scout_run(2000, False)  # every context under 8,192 tokens
    chunked, full = scout_run(24000, True), scout_run(24000, False)
    assert chunked["mean_tpot_ms"] < full["mean_tpot_ms"]
    assert chunked["mean_ttft_ms"] < full["mean_ttft_ms"]
