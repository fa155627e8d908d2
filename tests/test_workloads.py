"""Tests of simspec.workloads: arrival statistics against closed forms with
stated confidence (4 sigma, i.e. a false alarm about once in 16,000 runs for a
fixed seed that passes once, never), common random numbers, trace readers on
the real Azure trace and on small files written here, input errors, and
context clipping."""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import shared
from simspec.types import InputError
from simspec.workloads import (
    WorkloadConfig,
    WorkloadStreams,
    arrival_times,
    cv_to_burstiness,
    make_requests,
    read_trace,
)

CONV = ("traces", "azure_llm_2023_conv.csv")  # in the shared data (conftest.shared)
SIGMAS = 4.0


def rng(seed: int = 0) -> np.random.Generator:
    return np.random.default_rng(seed)


def streams(seed: int = 0) -> WorkloadStreams:
    return WorkloadStreams.from_seed_sequence(np.random.SeedSequence(seed))


def build(cfg: WorkloadConfig, *, seed: int = 0, per_image: int = 576, max_context: int = 1 << 20):
    return make_requests(
        cfg, streams(seed), visual_tokens_per_image=per_image, max_context_tokens=max_context
    )


# --------------------------------------------------------------------------
# Arrival processes


def test_poisson_mean_rate():
    n, rate = 20_000, 3.0
    t = arrival_times(WorkloadConfig(arrival="poisson", rate_per_s=rate, num_requests=n), rng())
    assert t[0] == 0.0 and np.all(np.diff(t) >= 0) and t.dtype == np.float64 and t.size == n
    # (n - 1) exponential gaps: the rate estimate has relative sd 1/sqrt(n - 1).
    assert abs((n - 1) / t[-1] / rate - 1) < SIGMAS / math.sqrt(n - 1)


@pytest.mark.parametrize("shape", [0.25, 1.0, 4.0])
def test_gamma_interarrival_cv(shape):
    n, rate = 20_000, 2.0
    gaps = np.diff(arrival_times(WorkloadConfig(arrival="gamma", rate_per_s=rate, burstiness=shape,
                                                num_requests=n + 1), rng(1)))
    cv = gaps.std() / gaps.mean()
    # Delta method for Gamma(k) gaps: var(log CV_hat) ~= (1 + 1/k) / (2n).
    assert abs(math.log(cv * math.sqrt(shape))) < SIGMAS * math.sqrt((1 + 1 / shape) / (2 * n))
    # Mean gap 1/rate; its relative sd is CV / sqrt(n).
    assert abs(gaps.mean() * rate - 1) < SIGMAS / math.sqrt(shape * n)


def test_onoff_long_run_rate_and_burstiness():
    n = 100_000
    cfg = WorkloadConfig(
        arrival="onoff", rate_per_s=2.0, on_s=5.0, off_s=15.0, on_off_ratio=10.0, num_requests=n
    )
    t = arrival_times(cfg, rng(2))
    gaps = np.diff(t)
    # Index of dispersion of a two-state MMPP (switching rates a, b):
    # 1 + 2 pi_on pi_off (rate_on - rate_off)^2 / (rate (a + b)); the rate
    # estimate from n arrivals has relative variance about IDC / n.
    rate_off = cfg.rate_per_s * (cfg.on_s + cfg.off_s) / (cfg.on_off_ratio * cfg.on_s + cfg.off_s)
    rate_on = cfg.on_off_ratio * rate_off
    pi_on = cfg.on_s / (cfg.on_s + cfg.off_s)
    switching_per_s = 1 / cfg.on_s + 1 / cfg.off_s
    idc = 1 + 2 * pi_on * (1 - pi_on) * (rate_on - rate_off) ** 2 / (cfg.rate_per_s * switching_per_s)
    assert abs((n - 1) / t[-1] / cfg.rate_per_s - 1) < SIGMAS * math.sqrt(idc / n)
    assert gaps.std() / gaps.mean() > 1.2


@pytest.mark.parametrize("arrival", ["poisson", "gamma", "onoff"])
def test_duration_stops_arrivals(arrival):
    duration_s, rate = 2_000.0, 2.0
    t = arrival_times(WorkloadConfig(arrival=arrival, rate_per_s=rate, num_requests=None,
                                     duration_s=duration_s), rng(3))
    assert t[0] == 0.0 and t[-1] < duration_s and np.all(np.diff(t) >= 0)
    # Loose on purpose (Gamma CV 2 and on/off counts are overdispersed): the
    # count must be of the right size, not a chunk's worth too many or few.
    assert 0.7 < t.size / (rate * duration_s) < 1.3


def test_cv_to_burstiness():
    assert cv_to_burstiness(2.0) == 0.25
    assert WorkloadConfig.cv_to_burstiness(0.5) == 4.0


# --------------------------------------------------------------------------
# Request mix and common random numbers


def test_same_seed_same_requests():
    cfg = WorkloadConfig(num_requests=300, images_max=3)
    assert build(cfg, seed=7) == build(cfg, seed=7)
    assert build(cfg, seed=7) != build(cfg, seed=8)
    assert [r.id for r in build(cfg)] == list(range(300))


def test_image_share_changes_only_images():
    low, high = (
        build(WorkloadConfig(num_requests=2_000, multimodal_share=s, images_max=4)) for s in (0.2, 0.8)
    )
    assert [r.arrival_s for r in low] == [r.arrival_s for r in high]
    lengths = [[(r.prompt_tokens, r.output_tokens) for r in reqs] for reqs in (low, high)]
    assert lengths[0] == lengths[1]
    # One uniform per request decides: a request with images at 0.2 keeps them at 0.8.
    assert all(h.images == lo.images for lo, h in zip(low, high) if lo.images)


def test_shared_prefixes_and_repeated_images_change_nothing_else():
    plain = build(WorkloadConfig(num_requests=2_000, multimodal_share=0.4))
    shared = build(WorkloadConfig(num_requests=2_000, multimodal_share=0.4, shared_prefix_tokens=100,
                                  shared_prefixes=3, image_pool=5))
    strip = lambda reqs: [(r.arrival_s, r.image_tokens, r.output_tokens) for r in reqs]  # noqa: E731
    assert strip(plain) == strip(shared)
    # the system prompt comes before each text request's own prompt
    assert [s.prompt_tokens - p.prompt_tokens for p, s in zip(plain, shared)] == [0 if p.images else 100 for p in plain]
    assert all(r.prefix_id == -1 and r.prefix_tokens == 0 for r in plain)
    text = [r for r in shared if not r.images]
    assert all(0 <= r.prefix_id < 3 and r.prefix_tokens == 100 for r in text)
    assert {r.prefix_id for r in text} == {0, 1, 2}
    shown = [r for r in shared if r.images]
    assert all(3 <= r.prefix_id < 8 and r.prefix_tokens == 576 for r in shown)  # the first image, at the start
    counts = np.bincount([r.prefix_id - 3 for r in shown], minlength=5)
    assert counts.min() > len(shown) / 5 - SIGMAS * math.sqrt(len(shown) / 5)  # uniform over the pool


@pytest.mark.parametrize("share,images_min,images_max", [(0.0, 1, 1), (0.3, 1, 1), (0.7, 2, 5), (1.0, 3, 3)])
def test_image_mix(share, images_min, images_max):
    n = 10_000
    reqs = build(WorkloadConfig(num_requests=n, multimodal_share=share, images_min=images_min,
                                images_max=images_max), per_image=144)
    counts = np.array([r.images for r in reqs])
    with_images = counts[counts > 0]
    assert abs(with_images.size / n - share) <= SIGMAS * math.sqrt(share * (1 - share) / n)
    if with_images.size:
        assert set(with_images.tolist()) == set(range(images_min, images_max + 1))
    assert all(r.image_tokens == (144,) * r.images for r in reqs)


@pytest.mark.parametrize("mean,cv", [(256.0, 1.0), (200.0, 0.8), (64.0, 0.0)])
def test_prompt_lengths_lognormal(mean, cv):
    n = 20_000
    reqs = build(WorkloadConfig(num_requests=n, prompt_mean_tokens=mean, prompt_cv=cv, multimodal_share=0.0))
    prompt = np.array([r.prompt_tokens for r in reqs])
    assert prompt.min() >= 1
    # Rounding to integers moves the mean by well under a token.
    assert abs(prompt.mean() - mean) <= SIGMAS * cv * mean / math.sqrt(n) + 0.5
    assert abs(prompt.std() / prompt.mean() - cv) < 0.1 * cv + 0.01


# --------------------------------------------------------------------------
# Traces


def test_read_azure_conv_trace():
    trace = read_trace(shared(*CONV))
    assert trace.source == "azure-llm-2023" and trace.images is None
    assert trace.arrival_s.size == trace.prompt_tokens.size == trace.output_tokens.size == 19_366
    assert trace.arrival_s[0] == 0.0 and np.all(np.diff(trace.arrival_s) >= 0)
    assert 3_400 < trace.arrival_s[-1] < 3_700  # about an hour
    assert (trace.prompt_tokens[0], trace.output_tokens[0]) == (374, 44)
    assert trace.prompt_tokens.min() >= 1 and trace.output_tokens.min() >= 1


def test_trace_replay_speedup_and_limits():
    base = dict(arrival="trace", trace_path=str(shared(*CONV)), multimodal_share=0.0)
    whole = build(WorkloadConfig(**base, num_requests=None))
    fast = build(WorkloadConfig(**base, num_requests=None, trace_speedup=2.0))
    assert len(whole) == len(fast) == 19_366
    assert fast[-1].arrival_s == pytest.approx(whole[-1].arrival_s / 2)
    assert [r.arrival_s for r in build(WorkloadConfig(**base, num_requests=100))] == [
        r.arrival_s for r in whole[:100]
    ]
    first_minute = build(WorkloadConfig(**base, num_requests=None, duration_s=60.0))
    assert first_minute == whole[: len(first_minute)] and whole[len(first_minute)].arrival_s >= 60.0


LMM_CSV = """TIMESTAMP,NumImages,ContextTokens,GeneratedTokens
2024-10-15T12:00:05.819Z,2,120,30
2024-10-15T12:00:04.500Z,0,80,10
2024-10-15T12:00:07Z,1,60,5
"""
MOONCAKE = """\
{"timestamp": 1500, "input_length": 700, "output_length": 20, "hash_ids": [1, 2], "num_images": 1}
{"timestamp": 0, "input_length": 300, "output_length": 40, "hash_ids": [3]}

{"timestamp": 250, "input_length": 100, "output_length": 8, "images": 3}
"""


@pytest.mark.parametrize(
    "name,text,source,arrival_s,prompt,output,images",
    [
        ("lmm.csv", LMM_CSV, "azure-lmm-2025", [0.0, 1.319, 2.5], [80, 120, 60], [10, 30, 5], [0, 2, 1]),
        ("mc.jsonl", MOONCAKE, "mooncake-jsonl", [0.0, 0.25, 1.5], [300, 100, 700], [40, 8, 20], [0, 3, 1]),
        ("mc.txt", MOONCAKE.replace("\"images\"", "\"x\""), "mooncake-jsonl", [0.0, 0.25, 1.5],
         [300, 100, 700], [40, 8, 20], [0, 0, 1]),
    ],
    ids=["azure-lmm-2025", "mooncake", "mooncake-by-content"],
)
def test_read_small_traces(tmp_path, name, text, source, arrival_s, prompt, output, images):
    path = tmp_path / name
    path.write_text(text)
    trace = read_trace(path)
    assert trace.source == source
    np.testing.assert_allclose(trace.arrival_s, arrival_s)
    assert trace.prompt_tokens.tolist() == prompt and trace.output_tokens.tolist() == output
    assert trace.images.tolist() == images

    reqs = build(WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None), per_image=10)
    assert [r.image_tokens for r in reqs] == [(10,) * k for k in images]


def test_text_only_trace_draws_images_from_share(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens\n" + "2023-11-16 18:15:46.6805900,10,5\n" * 2000)
    reqs = build(WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None,
                                multimodal_share=0.5, images_max=2))
    share = np.mean([r.images > 0 for r in reqs])
    assert abs(share - 0.5) <= SIGMAS * math.sqrt(0.25 / 2000)


# --------------------------------------------------------------------------
# Bad input: one clear line naming the file, field or column


HEADER = "TIMESTAMP,ContextTokens,GeneratedTokens\n"
ROW = "2023-11-16 18:15:46.6805900,374,44\n"


@pytest.mark.parametrize(
    "name,text,expected",
    [
        ("x.csv", "time,in,out\n1,2,3\n", "expected TIMESTAMP,ContextTokens,GeneratedTokens or"),
        ("x.csv", "TIMESTAMP,ContextTokens\n2023-11-16 18:15:46,3\n", "expected TIMESTAMP,ContextTokens"),
        ("x.csv", HEADER + ROW + "yesterday,1,2\n", "TIMESTAMP is not a date-time (row 2 has 'yesterday')"),
        ("x.csv", HEADER + ROW + "2023-11-16 18:15:47,-5,2\n", "ContextTokens must be in 1..2,147,483,648 (row 2 has -5)"),
        ("x.csv", HEADER + ROW + "2023-11-16 18:15:47,5,2.5\n", "GeneratedTokens must be an integer (row 2"),
        ("x.csv", HEADER + "2023-11-16 18:15:47,lots,2\n", "ContextTokens must be a finite number (row 1"),
        ("x.csv", HEADER + ROW * 16 + "2023-11-16 18:15:47,5,0\n",
         "GeneratedTokens must be in 1..2,147,483,648 (row 17 has 0)"),
        ("x.csv", "", "empty"),
        ("x.csv", HEADER, "no rows"),
        ("x.csv", LMM_CSV + "2024-10-15T12:00:08Z,-1,5,5\n", "NumImages must be in 0..2,147,483,648 (row 4 has -1)"),
        ("x.jsonl", MOONCAKE.replace('"images": 3}', '"images": 3'), "line 4 is not valid JSON"),
        ("x.jsonl", '{"timestamp": 0, "input_length": 3}\n', "line 1 lacks output_length"),
        ("x.jsonl", '{"timestamp": 0, "input_length": 3, "output_length": 0}\n',
         "output_length must be in 1..2,147,483,648 (line 1"),
        ("x.jsonl", '{"timestamp": "noon", "input_length": 3, "output_length": 1}\n',
         "timestamp must be a finite number"),
        ("x.jsonl", "[1, 2]\n", "line 1 is not a JSON object"),
    ],
    ids=["wrong-columns", "missing-column", "bad-timestamp", "negative-tokens", "fractional-tokens",
         "text-tokens", "zero-output", "empty-file", "header-only", "negative-images", "bad-json",
         "json-missing-key", "json-zero-output", "json-bad-timestamp", "json-not-object"],
)
def test_bad_trace_files(tmp_path, name, text, expected):
    path = tmp_path / name
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_trace(path)
    message = str(err.value)
    assert expected in message and str(path) in message and "\n" not in message


def test_missing_trace_file(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_trace(tmp_path / "nope.csv")


BAD_CONFIGS = [
    (lambda: WorkloadConfig(rate_per_s=-1.0), "rate_per_s must be in [1e-06, 1e+06] (got -1.0)"),
    (lambda: WorkloadConfig(rate_per_s=0.0), "rate_per_s must be in [1e-06, 1e+06] (got 0.0)"),
    (lambda: WorkloadConfig(burstiness=0), "burstiness must be in [0.001, 1000] (got 0.0)"),
    (lambda: cv_to_burstiness(0), "cv must be in [0.03162, 31.62] (got 0)"),
    (lambda: cv_to_burstiness(-2.0), "cv must be in [0.03162, 31.62] (got -2.0)"),
    (lambda: WorkloadConfig(prompt_cv=-0.1), "prompt_cv must be in [0, 100] (got -0.1)"),
    (lambda: WorkloadConfig(output_mean_tokens=0.5), "output_mean_tokens must be in [1, 2.14748e+09] (got 0.5)"),
    (lambda: WorkloadConfig(prompt_mean_tokens=0), "prompt_mean_tokens must be in [1, 2.14748e+09]"),
    (lambda: WorkloadConfig(multimodal_share=1.5), "multimodal_share must be in [0, 1] (got 1.5)"),
    (lambda: WorkloadConfig(images_min=0), "images_min must be >= 1 (got 0)"),
    (lambda: WorkloadConfig(images_min=3, images_max=2), "images_max must be >= images_min"),
    (lambda: WorkloadConfig(on_off_ratio=0.5), "on_off_ratio must be in [1, 1e+06]"),
    (lambda: WorkloadConfig(arrival="x"),
     "arrival must be one of poisson, gamma, onoff, trace (got 'x')"),
    (lambda: WorkloadConfig(arrival="trace"), "trace_path must be set"),
    (lambda: WorkloadConfig(arrival="trace", trace_path="t.csv", duration_s=1.0), "set at most one"),
    (lambda: WorkloadConfig(trace_speedup=0.0), "trace_speedup must be in [1e-06, 1e+06]"),
    (lambda: WorkloadConfig(num_requests=0), "num_requests must be in 1..10,000,000 (got 0)"),
    (lambda: WorkloadConfig(num_requests=None), "set exactly one (got None and None)"),
    (lambda: WorkloadConfig(num_requests=500, duration_s=10.0), "set exactly one (got 500 and 10.0)"),
    (lambda: build(WorkloadConfig(), per_image=-1), "visual_tokens_per_image must be >= 0"),
    (lambda: build(WorkloadConfig(), max_context=1), "max_context_tokens must be >= 2"),
]


@pytest.mark.parametrize("make,expected", BAD_CONFIGS, ids=[expected for _, expected in BAD_CONFIGS])
def test_bad_config(make, expected):
    with pytest.raises(InputError) as err:
        make()
    assert expected in str(err.value)


@pytest.mark.parametrize(
    "trace_text,expected",
    [(None, "multimodal_share must be 0 for a text-only model"),
     (HEADER + ROW, "multimodal_share must be 0 for a text-only model"),
     (LMM_CSV, "NumImages must be 0 for a text-only model")],
    ids=["synthetic", "text-trace", "image-trace"],
)
def test_images_on_text_only_model(tmp_path, trace_text, expected):
    cfg = WorkloadConfig(multimodal_share=0.5)
    if trace_text is not None:
        path = tmp_path / "t.csv"
        path.write_text(trace_text)
        cfg = WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None, multimodal_share=0.5)
    with pytest.raises(InputError, match=expected):
        build(cfg, per_image=0)


def test_text_only_model_accepts_text_workloads(tmp_path):
    assert all(r.images == 0 for r in build(WorkloadConfig(multimodal_share=0.0), per_image=0))
    path = tmp_path / "t.csv"
    path.write_text(LMM_CSV.replace(",2,", ",0,").replace(",1,", ",0,"))
    cfg = WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None)
    assert len(build(cfg, per_image=0)) == 3


# --------------------------------------------------------------------------
# Context clipping


@pytest.mark.parametrize(
    "max_context,prompt,output",
    [(8192, 3000, 500),  # fits: untouched
     (4096, 2444, 500),  # prompt shrinks first: 4096 - 1152 visual - 500
     (1500, 1, 347)],  # prompt at 1 token, then output: 1500 - 1152 - 1
)
def test_context_clipping_golden(max_context, prompt, output):
    cfg = WorkloadConfig(num_requests=5, multimodal_share=1.0, images_min=2, images_max=2,
                         prompt_mean_tokens=3000, prompt_cv=0.0, output_mean_tokens=500, output_cv=0.0)
    reqs = build(cfg, max_context=max_context)
    assert {(r.prompt_tokens, r.visual_tokens, r.output_tokens) for r in reqs} == {(prompt, 1152, output)}


@pytest.mark.parametrize("source", ["synthetic", "azure-conv"])
def test_no_request_exceeds_context(source):
    if source == "synthetic":
        cfg = WorkloadConfig(num_requests=5_000, images_max=3, prompt_mean_tokens=2_000, prompt_cv=1.5,
                             output_mean_tokens=800, output_cv=1.5)
    else:
        cfg = WorkloadConfig(arrival="trace", trace_path=str(shared(*CONV)), num_requests=None, images_max=2)
    reqs = build(cfg, max_context=2048)
    assert max(r.context_tokens + r.output_tokens for r in reqs) <= 2048
    assert min(min(r.prompt_tokens, r.output_tokens) for r in reqs) >= 1


def test_images_larger_than_context(tmp_path):
    # Decided by the config, even when no request happens to draw 4 images.
    cfg = WorkloadConfig(num_requests=1, multimodal_share=0.01, images_max=4)
    with pytest.raises(InputError, match=r"images_max must be <= 3 for this model \(4 images x 576 visual"):
        build(cfg, max_context=2048)
    path = tmp_path / "t.csv"
    path.write_text(LMM_CSV.replace(",2,120", ",4,120"))
    with pytest.raises(InputError, match=r"NumImages: trace request 1 has 4 images x 576 visual tokens"):
        build(WorkloadConfig(arrival="trace", trace_path=str(path), num_requests=None), max_context=2048)


@pytest.mark.parametrize("arrival,burstiness", [("gamma", 0.25), ("gamma", 4.0), ("poisson", 1.0)])
def test_vllm_rescaled_arrivals_follow_vllm_bench_serve_line_by_line(arrival, burstiness):
    """vllm/benchmarks/serve.py 0.33, get_request: per request a gamma draw
    with shape burstiness and scale 1 / (rate x burstiness) (l.504-508; burstiness 1
    is Poisson), summed (l.511-512), then scaled so the last request arrives
    at num_requests / rate (l.513-526)."""
    n, rate = 50, 4.0
    cfg = WorkloadConfig(arrival=arrival, rate_per_s=rate, burstiness=burstiness, num_requests=n,
                         arrival_rescale="vllm")
    got = arrival_times(cfg, np.random.default_rng(3))
    rng = np.random.default_rng(3)
    delay_ts = []
    for _ in range(n):
        if arrival == "poisson":
            delay_ts.append(rng.exponential(1.0 / rate))
        else:
            theta = 1.0 / (rate * burstiness)
            delay_ts.append(rng.gamma(shape=burstiness, scale=theta))
    for i in range(1, len(delay_ts)):
        delay_ts[i] += delay_ts[i - 1]
    target_total_delay_s = n / rate
    normalize_factor = target_total_delay_s / delay_ts[-1]
    want = [delay * normalize_factor for delay in delay_ts]
    assert got.tolist() == pytest.approx(want, rel=1e-12)
    assert got[-1] == pytest.approx(n / rate, rel=1e-12) and got[0] > 0


def test_vllm_rescale_needs_a_request_count_and_renewal_arrivals():
    with pytest.raises(InputError, match="arrival_rescale vllm rescales poisson or gamma"):
        WorkloadConfig(arrival="onoff", num_requests=10, arrival_rescale="vllm")
    with pytest.raises(InputError, match="arrival_rescale must be one of none, vllm"):
        WorkloadConfig(arrival_rescale="yes")


@pytest.mark.parametrize("stamps", [
    ["2023-11-16 18:15:46.6805900", "2023-11-16 18:15:46", "2024-02-29 23:59:59.999999999"],
    ["2024-10-15T12:00:05.819Z", "2024-10-15 12:00:06.1", "2024-10-15T12:00:07Z"],
], ids=["naive", "utc-and-naive"])
def test_plain_stamps_are_read_without_pandas_as_pandas_reads_them(stamps):
    import pandas as pd

    from simspec.workloads.traces import _plain_stamps_ns

    raw = np.array(stamps, dtype=object)
    by_pandas = pd.to_datetime(pd.Series(raw), format="ISO8601", utc=True).dt.tz_localize(None)
    assert _plain_stamps_ns(raw).tolist() == by_pandas.to_numpy("datetime64[ns]").astype(np.int64).tolist()


@pytest.mark.parametrize("stamp", ["2023-02-30 00:00:00", "2023-11-16 24:00:00", "2023-11-16T18:15:46+01:00",
                                   "1500-01-01 00:00:00", "now", "2023-11-16"])
def test_other_stamps_are_left_to_pandas(stamp):
    from simspec.workloads.traces import _plain_stamps_ns

    assert _plain_stamps_ns(np.array([stamp], dtype=object)) is None
