"""simspec.vllm.logs on real vLLM output (tests/data/vllm/, see its README):
the three files of one server agree with each other and with vLLM's own
definitions; bad input is one line. No vLLM needed."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simspec.types import InputError
from simspec.vllm.logs import (
    SpecDecodeCounters,
    parse_bench,
    parse_metrics,
    parse_prometheus,
    parse_server_log,
    read_bench,
    read_metrics,
    read_server_log,
    spec_decode,
)

DATA = Path(__file__).parent / "data" / "vllm"
LOG, METRICS = DATA / "serve_ngram.log", DATA / "metrics_ngram.txt"
BENCHES = ("bench_ngram.json", "bench_draft_same.json", "bench_ar.json")
MODEL = "/work/scratch/vllm-models/m120/target"


@pytest.fixture(scope="module")
def log():
    return read_server_log(LOG)


@pytest.fixture(scope="module")
def metrics():
    return read_metrics(METRICS)


def bench(name: str):
    return read_bench(DATA / name)


def test_the_log_gives_every_engine_step_in_order_and_the_servers_settings(log):
    assert len(log.steps) == 77
    assert [s.index for s in log.steps] == list(range(77)) and {s.engine for s in log.steps} == {0}
    first = log.steps[0]
    assert (first.prefill_requests, first.prefill_tokens, first.decode_requests, first.decode_tokens) == (1, 64, 0, 0)
    assert first.elapsed_ms == 2336.46 and first.kv_cache_usage == pytest.approx(0.009)
    assert first.clock == "12-01 18:23:57" and not first.dummy
    assert LOG.read_text().splitlines()[first.line - 1].endswith("Iteration(0): 1 context requests, 64 context "
                                                                  "tokens, 0 generation requests, 0 generation "
                                                                  "tokens, iteration elapsed time: 2336.46 ms, CPU "
                                                                  "KV cache usage: 0.9%")
    assert (log.version, log.model, log.dtype) == ("0.32.0", MODEL, "torch.float32")
    assert (log.speculative_method, log.speculative_model, log.num_speculative_tokens) == ("ngram", None, 3)
    assert (log.prefix_caching, log.chunked_prefill, log.kv_cache_tokens, log.max_model_len) == (True, True, 14464,
                                                                                                 2048)


def test_the_log_metrics_and_bench_of_one_server_agree(log, metrics):
    steps, result = log.arrays(), bench("bench_ngram.json")
    counters = spec_decode(metrics)
    # every prompt token is prefilled once (no prefix shared: 64-token prompts, 128-token blocks)
    assert steps.prefill_tokens.sum() == result.summary["total_input_tokens"] == metrics.prompt_tokens == 1280
    assert steps.prefill_requests.sum() == result.num_prompts == 20
    # a generation request's tokens: its last token plus the draft tokens it verifies
    assert (steps.decode_tokens - steps.decode_requests).sum() == counters.draft_tokens == 723
    # each request's first token comes from its prefill, then every decode round emits accepted + 1,
    # less what the last round emits past max_tokens
    emitted = result.num_prompts + steps.decode_requests.sum() + counters.accepted_tokens
    assert 0 <= emitted - result.summary["total_output_tokens"] < result.num_prompts * (log.num_speculative_tokens + 1)
    assert steps.elapsed_ms.sum() / 1000 < result.summary["duration"]
    assert metrics.kv_cache_tokens == log.kv_cache_tokens and metrics.block_size_tokens == 128
    assert (metrics.generation_tokens, metrics.finished_requests, metrics.preemptions) == (1280, 20, 0)


def test_the_metrics_counters_are_what_the_bench_reports_for_a_fresh_server(metrics):
    counters, result = spec_decode(metrics), bench("bench_ngram.json")
    assert (counters.num_drafts, counters.draft_tokens, counters.accepted_tokens) == (272, 723, 549)
    assert counters == result.spec_decode  # the server was fresh: the run's difference is the total
    assert counters.acceptance_length == pytest.approx(result.summary["spec_decode_acceptance_length"], abs=1e-12)
    assert counters.acceptance_length == pytest.approx(1 + 549 / 272)
    assert sum(counters.accepted_per_position) == counters.accepted_tokens
    rates = json.loads((DATA / "bench_ngram.json").read_text())["spec_decode_per_position_acceptance_rates"]
    np.testing.assert_allclose(counters.per_position_rates, rates, rtol=1e-12)
    assert counters.minus(SpecDecodeCounters(num_drafts=0, draft_tokens=0, accepted_tokens=0,
                                             accepted_per_position=())) == counters


def test_the_identical_weight_draft_accepts_everything_and_no_speculation_has_no_counters():
    same, ar = bench("bench_draft_same.json").spec_decode, bench("bench_ar.json")
    assert same.draft_tokens == same.accepted_tokens == 3 * same.num_drafts
    assert same.per_position_rates == (1.0, 1.0, 1.0) and same.acceptance_length == 4.0
    assert ar.spec_decode is None and not [k for k in ar.summary if k.startswith("spec_decode")]


@pytest.mark.parametrize("name", BENCHES)
def test_the_per_request_arrays_give_back_the_summary_by_vllms_definitions(name):
    result = bench(name)
    r = result.requests
    assert len(r.start_s) == result.num_prompts == 20 and r.ok.all()
    assert (r.input_tokens == 64).all() and (r.output_tokens == 64).all()
    assert r.arrival_s[0] == 0 and (np.diff(r.start_s) > 0).all()
    assert result.model_id == MODEL and result.request_rate == 2.0 and result.burstiness == 1.0
    s = result.summary
    tpot = (r.e2el_s - r.ttft_s) / (r.output_tokens - 1)
    itl = np.concatenate(r.itl_s)
    for metric, values in (("ttft", r.ttft_s), ("e2el", r.e2el_s), ("tpot", tpot), ("itl", itl)):
        assert s[f"mean_{metric}_ms"] == pytest.approx(values.mean() * 1000, rel=1e-9), metric
        assert s[f"std_{metric}_ms"] == pytest.approx(values.std() * 1000, rel=1e-9), metric
        for p in (50, 90, 95, 99):
            assert s[f"p{p}_{metric}_ms"] == pytest.approx(np.percentile(values, p) * 1000, rel=1e-9), (metric, p)
    assert s["output_throughput"] == pytest.approx(r.output_tokens.sum() / s["duration"], rel=1e-9)
    # a streamed chunk may hold several tokens (speculation): chunks <= tokens
    assert all(len(gaps) <= n - 1 for gaps, n in zip(r.itl_s, r.output_tokens))


def test_a_result_saved_without_save_detailed_has_the_summary_but_no_requests():
    data = json.loads((DATA / "bench_ngram.json").read_text())
    for key in ("input_lens", "output_lens", "start_times", "ttfts", "itls", "generated_texts", "errors"):
        del data[key]  # what vllm bench serve leaves out without --save-detailed
    result = parse_bench(data, "b.json")
    assert result.requests is None and result.summary == bench("bench_ngram.json").summary


def test_the_log_parser_reads_the_optional_tails_of_an_iteration_line():
    head = "(APIServer pid=1) INFO 01-02 03:04:05 [loggers.py:199] "
    text = "\n".join([
        head + "Engine 001: Iteration(4): 0 context requests, 0 context tokens, 0 generation requests, "
               "0 generation tokens, iteration elapsed time: 0.00 ms (dummy), GPU KV cache usage: 0.0%",
        head + "Iteration(5): 2 context requests, 1200 context tokens, 3 generation requests, 12 generation "
               "tokens, iteration elapsed time: 41.50 ms, GPU KV cache usage: 12.5%, encoder inputs: 2, "
               "encoder output embeddings: 1152",
    ])
    dummy, mm = parse_server_log(text, "x.log").steps
    assert dummy.engine == 1 and dummy.dummy and dummy.index == 4
    assert (mm.engine, mm.encoder_inputs, mm.encoder_tokens, mm.kv_cache_usage, mm.line) == (0, 2, 1152, 0.125, 2)
    assert parse_server_log(text, "x.log").arrays().elapsed_ms.tolist() == [41.5]  # dummy steps left out
    assert parse_server_log(text, "x.log").speculative_method is None


def _lines(path: Path, keep) -> str:
    return "\n".join(line for line in path.read_text().splitlines() if keep(line))


@pytest.mark.parametrize(("text", "says"), [
    (_lines(LOG, lambda line: "Iteration(" not in line), "--enable-logging-iteration-details"),
    ("Engine 000: Iteration(3): 1 context requests, 64 context tokens\n", "line 1"),
    (_lines(LOG, lambda line: True) * 2, "more than one server run"),
], ids=["no-iteration-details", "cut-line", "two-runs"])
def test_a_bad_log_is_one_line(text, says):
    with pytest.raises(InputError, match="x.log") as err:
        parse_server_log(text, "x.log")
    assert says in str(err.value) and "\n" not in str(err.value)


def test_metrics_without_speculation_say_so_in_one_line():
    plain = parse_metrics(_lines(METRICS, lambda line: "spec_decode" not in line), "m.txt")
    assert plain.spec_decode is None and plain.prompt_tokens == 1280
    with pytest.raises(InputError, match=r"m.txt: no vllm:spec_decode_\* counters .*--speculative-config"):
        spec_decode(plain, "m.txt")


@pytest.mark.parametrize(("text", "says"), [
    ("# HELP x y\nprocess_cpu_seconds_total 1.5\n", "no vllm: metrics"),
    ('vllm:prompt_tokens_total{engine="0" 5\n', "line 1"),
    ("vllm:prompt_tokens_total 5\nvllm:generation_tokens_total lots\n", "line 2"),
], ids=["not-vllm", "open-brace", "bad-value"])
def test_bad_metrics_are_one_line(text, says):
    with pytest.raises(InputError, match=says):
        parse_metrics(text, "m.txt")


def test_prometheus_labels_with_commas_quotes_and_a_timestamp():
    (s,) = parse_prometheus('a:b_total{x="1,2",y="say \\"hi\\"",z=""} 3e+00 1700000000000\n')
    assert (s.name, s.value, s.label("x"), s.label("y"), s.label("z"), s.label("w")) == (
        "a:b_total", 3.0, "1,2", 'say \\"hi\\"', "", None)


def test_counters_that_went_down_mean_a_restart():
    after = spec_decode(read_metrics(METRICS))
    with pytest.raises(InputError, match="restarted"):
        SpecDecodeCounters(num_drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position=()).minus(after)


def test_a_bench_file_of_another_model_or_of_something_else_is_refused(tmp_path):
    with pytest.raises(InputError, match="a benchmark of model '/work/scratch/vllm-models/m120/target', not of 'x'"):
        read_bench(DATA / "bench_ar.json", model="x")
    (tmp_path / "t.json").write_text('{"model_id": "m", "duration": 1}')
    with pytest.raises(InputError, match=r"t.json: not a `vllm bench serve --save-result` file \(no num_prompts"):
        read_bench(tmp_path / "t.json")
    data = json.loads((DATA / "bench_ar.json").read_text())
    data["ttfts"] = data["ttfts"][:-1]
    with pytest.raises(InputError, match="ttfts has 19 entries, start_times 20"):
        parse_bench(data, "b.json")
    with pytest.raises(InputError, match="no such file"):
        read_bench(tmp_path / "none.json")


def test_reading_vllms_output_never_imports_vllm_or_torch():
    code = ("import sys, simspec.vllm.logs, simspec.vllm.models; "
            "print(sorted(m for m in ('vllm', 'torch', 'transformers', 'tokenizers') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


def test_the_benchmarks_lead_before_its_first_request_is_kept_in_the_replay():
    """vllm bench serve's duration starts before its first, drawn, sleep:
    the lead is the duration less the first send to the last completion,
    and the replay's arrivals start after it, so the simulated duration
    spans the benchmark's."""
    from simspec.vllm.calibrate import bench_requests

    data = json.loads((DATA / "bench_ngram.json").read_text())
    start, e2el = np.array(data["start_times"]), np.array(data["latencies"])
    span = float(np.max(start + e2el) - start.min())
    data["duration"] = span + 3.25
    result = parse_bench(data, "b.json")
    assert result.lead_s == pytest.approx(3.25, abs=1e-9)
    arrivals = sorted(r.arrival_s for r in bench_requests(result))
    assert arrivals[0] == pytest.approx(3.25, abs=1e-9)
    assert arrivals[-1] - arrivals[0] == pytest.approx(float(start.max() - start.min()), abs=1e-9)
    data["duration"] = span - 0.5  # never negative
    assert parse_bench(data, "b.json").lead_s == 0.0
