"""Metrics on tiny hand-built logs (values computed by hand), and run folders.

Times are dyadic fractions so every latency is exact in floating point and
SLO boundaries (<=) are tested without rounding luck.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os

import numpy as np
import pytest

from simspec.metrics import (
    LATENCIES,
    STATS,
    acceptance_by_depth,
    per_position_acceptance,
    summarize,
    summarize_full,
)
from simspec import __version__
from simspec.runfolder import MARKER, RunMeta, check_target, format_table, is_complete, write_run
from simspec.logs import LogBuilder
from simspec.types import InputError, RequestRecord, RequestTable, RunLog

REL = 1e-12


def request(id, arrival_s, admitted_s, first_token_s, finish_s, output_tokens, **kw):
    return RequestRecord(
        id=id,
        arrival_s=arrival_s,
        admitted_s=admitted_s,
        first_token_s=first_token_s,
        finish_s=finish_s,
        prompt_tokens=kw.pop("prompt_tokens", 10),
        output_tokens=output_tokens,
        images=kw.pop("images", 1),
        visual_tokens=kw.pop("visual_tokens", 576),
        **kw,
    )


def build_log(*, policy, requests, chunk_request, chunk_time_s, chunk_tokens, round_accepted, round_depth,
              round_drafted, step_start_s, step_duration_s, step_plans, step_batch, start_s, end_s,
              rounds_total=0, complete=True) -> RunLog:
    """A RunLog made as the engines make theirs (simspec.logs.LogBuilder),
    from chunks in any order (fed in time order)."""
    ids = np.array([r.id for r in requests], dtype=np.int64)
    builder = LogBuilder(ids)
    index = np.searchsorted(ids, chunk_request) if len(ids) else np.zeros(0, np.int64)
    order = np.argsort(chunk_time_s, kind="stable")
    builder.chunks(index[order], np.asarray(chunk_time_s, float)[order], np.asarray(chunk_tokens)[order])
    builder.rounds(np.asarray(round_accepted), np.asarray(round_depth), np.asarray(round_drafted))
    builder.steps(np.asarray(step_start_s, float), np.asarray(step_duration_s, float), np.asarray(step_batch),
                  np.asarray(step_plans).reshape(-1, 3), np.zeros(len(step_batch), np.int64))
    log = builder.finish(policy=policy, table=RequestTable.of(requests), complete=complete)
    return dataclasses.replace(log, start_s=start_s, end_s=end_s, rounds_total=rounds_total)


def make_log(**overrides) -> RunLog:
    """Two requests.

    r0: arrives 0, admitted 0.125, chunks at 0.5 (1 tok), 0.75 (2), 1.5 (2):
        ttft 500 ms, e2el 1500 ms, tpot (1500 - 500) / 4 = 250 ms, itl 250, 750.
    r1: arrives 0.25, admitted 0.25, one chunk at 1.0 (1 tok):
        ttft 750 ms, e2el 750 ms, no tpot, no itl.
    Drafted rounds (accepted / depth / drafted): 2/3/3, 0/2/2, 3/3/5 (tree),
    1/1/1; 6 rounds in all, so two were AR.
    """
    fields = dict(
        policy="linear-3",
        requests=(
            request(0, 0.0, 0.125, 0.5, 1.5, 5, prompt_tokens=10, preemptions=1),
            request(1, 0.25, 0.25, 1.0, 1.0, 1, prompt_tokens=20, preemptions=2),
        ),
        # interleaved across requests, as a replica emits them
        chunk_request=np.array([0, 0, 1, 0]),
        chunk_time_s=np.array([0.5, 0.75, 1.0, 1.5]),
        chunk_tokens=np.array([1, 2, 1, 2]),
        round_accepted=np.array([2, 0, 3, 1]),
        round_depth=np.array([3, 2, 3, 1]),
        round_drafted=np.array([3, 2, 5, 1]),
        step_start_s=np.array([0.25, 0.5, 1.0]),
        step_duration_s=np.array([0.25, 0.25, 0.25]),
        step_plans=np.array([[1, 1, 0], [0, 2, 0], [1, 0, 1]]),
        step_batch=np.array([1, 2, 2]),
        start_s=0.0,
        end_s=1.5,
        rounds_total=6,
    )
    fields.update(overrides)
    return build_log(**fields)


def empty_log(**overrides) -> RunLog:
    ints, floats = np.zeros(0, dtype=np.int64), np.zeros(0)
    fields = dict(
        policy="ar",
        requests=(),
        chunk_request=ints,
        chunk_time_s=floats,
        chunk_tokens=ints,
        round_accepted=ints,
        round_depth=ints,
        round_drafted=ints,
        step_start_s=floats,
        step_duration_s=floats,
        step_plans=np.zeros((0, 3), dtype=np.int64),
        step_batch=ints,
        start_s=0.0,
        end_s=0.0,
    )
    fields.update(overrides)
    return build_log(**fields)


# mean, median, std (ddof=0), p90, p95, p99 of each population, in ms
EXPECTED_LATENCIES = {
    "ttft": (625.0, 625.0, 125.0, 725.0, 737.5, 747.5),  # [500, 750]
    "tpot": (250.0, 250.0, 0.0, 250.0, 250.0, 250.0),  # [250]
    "itl": (500.0, 500.0, 250.0, 700.0, 725.0, 745.0),  # [250, 750]
    "e2el": (1125.0, 1125.0, 375.0, 1425.0, 1462.5, 1492.5),  # [1500, 750]
}


@pytest.mark.parametrize("name", LATENCIES)
def test_latency_stats_match_hand_computation(name):
    summary = summarize(make_log())
    got = [summary[f"{stat}_{name}_ms"] for stat in STATS]
    assert got == pytest.approx(EXPECTED_LATENCIES[name], rel=REL, abs=1e-9)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_itl_does_not_depend_on_chunk_order(seed):
    """Chunks handed over in any order give the same pooled gaps as emission order."""
    log = make_log()
    order = np.random.default_rng(seed).permutation(log.chunk_request.size)
    shuffled = make_log(chunk_request=log.chunk_request[order], chunk_time_s=log.chunk_time_s[order],
                        chunk_tokens=log.chunk_tokens[order])
    want = summarize(log)
    got = summarize(shuffled)
    assert [got[f"{s}_itl_ms"] for s in STATS] == pytest.approx(
        [want[f"{s}_itl_ms"] for s in STATS], rel=REL
    )


def test_throughput_counts_and_system_metrics():
    s = summarize(make_log())
    expected = {
        "completed": 2,
        "duration_s": 1.5,
        "request_throughput": 2 / 1.5,
        "output_throughput": 6 / 1.5,
        # the server's prompt tokens: text 10 + 20 and 576 visual placeholders each
        # (vllm/benchmarks/serve.py 0.33 l.653 and 781; usage prompt_tokens, endpoint_request_func.py 296-297)
        "total_token_throughput": (30 + 2 * 576 + 6) / 1.5,
        "mean_queue_delay_ms": 62.5,  # (125 + 0) / 2
        "gpu_busy_fraction": 0.75 / 1.5,
        "plan_share_ar": 2 / 6,
        "plan_share_linear": 3 / 6,
        "plan_share_tree": 1 / 6,
        "preemptions": 3,
    }
    assert {k: s[k] for k in expected} == pytest.approx(expected, rel=REL)
    assert "request_goodput" not in s


def test_acceptance_metrics_follow_vllm_bench_serve():
    s = summarize(make_log())
    # vllm/benchmarks/serve.py 0.33: 4 drafts (rounds that drafted; the 2 AR
    # rounds are none), 11 draft tokens, 6 accepted.
    assert (s["spec_decode_num_drafts"], s["spec_decode_draft_tokens"], s["spec_decode_accepted_tokens"]) == (4, 11, 6)
    assert s["spec_decode_acceptance_length"] == pytest.approx(1 + 6 / 4, rel=REL)  # l.1161-1163: 1 + accepted / drafts
    assert s["spec_decode_acceptance_rate"] == pytest.approx(6 / 11 * 100, rel=REL)  # l.1160: percent
    # simspec's own: tokens per verification round, AR rounds included
    assert s["tokens_per_round"] == pytest.approx(1 + 6 / 6, rel=REL)


@pytest.mark.parametrize(
    "max_depth, expected",
    [
        # accepted >= j over depth >= j: 3/4, 2/3, 1/2
        (None, [3 / 4, 2 / 3, 1 / 2]),
        (2, [3 / 4, 2 / 3]),
        (4, [3 / 4, 2 / 3, 1 / 2, math.nan]),  # nothing planned 4 deep
        (0, []),
    ],
    ids=["deepest", "truncated", "deeper-than-planned", "zero"],
)
def test_acceptance_by_depth(max_depth, expected):
    got = acceptance_by_depth(make_log(), max_depth)
    assert got == pytest.approx(expected, rel=REL, nan_ok=True)


def test_per_position_rates_are_vllms_over_all_drafts():
    # serve.py 0.33 l.1157: accepted at position j / num_drafts. Accepted
    # lengths 2, 0, 3, 1 reach positions 1, 2, 3 in 3, 2, 1 of 4 drafts.
    assert per_position_acceptance(make_log()) == pytest.approx([3 / 4, 2 / 4, 1 / 4], rel=REL)
    assert per_position_acceptance(make_log(), 4) == pytest.approx([3 / 4, 2 / 4, 1 / 4, 0.0], rel=REL)


def test_summarize_full_adds_per_position_rates_and_summarize_stays_scalar():
    full = summarize_full(make_log())
    assert full["spec_decode_per_position_acceptance_rates"] == pytest.approx([3 / 4, 2 / 4, 1 / 4], rel=REL)
    assert full["draft_acceptance_by_depth"] == pytest.approx([3 / 4, 2 / 3, 1 / 2], rel=REL)
    plain = summarize(make_log())
    assert all(isinstance(v, (int, float)) for v in plain.values())
    assert set(full) - set(plain) == {"spec_decode_per_position_acceptance_rates", "draft_acceptance_by_depth"}


@pytest.mark.parametrize(
    "slo, good",
    [
        (dict(slo_ttft_ms=625.0), 1),  # r1 ttft 750 misses
        (dict(slo_ttft_ms=750.0), 2),  # the bound is inclusive
        (dict(slo_tpot_ms=250.0), 2),  # r1 has one token: tpot 0 (vLLM)
        (dict(slo_tpot_ms=200.0), 1),  # r0 tpot 250 misses
        (dict(slo_ttft_ms=750.0, slo_tpot_ms=200.0), 1),
        (dict(slo_ttft_ms=625.0, slo_tpot_ms=200.0), 0),  # each misses one
        (dict(slo_e2el_ms=1000.0), 1),  # r0 e2el 1500 misses (serve.py 0.33 l.669-691: ttft, tpot, e2el)
        (dict(slo_e2el_ms=1500.0), 2),
    ],
    ids=["ttft-miss", "ttft-edge", "tpot-edge", "tpot-miss", "both-one", "both-none", "e2el-miss", "e2el-edge"],
)
def test_request_goodput(slo, good):
    assert summarize(make_log(), **slo)["request_goodput"] == pytest.approx(good / 1.5, rel=REL)


@pytest.mark.parametrize("slo", [dict(slo_ttft_ms=0.0), dict(slo_tpot_ms=-1.0),
                                 dict(slo_ttft_ms=math.nan)])  # fmt: skip
def test_bad_slo_is_input_error(slo):
    with pytest.raises(InputError, match=next(iter(slo))):
        summarize(make_log(), **slo)


def test_empty_log_gives_nan_not_errors():
    s = summarize_full(empty_log())
    nan_keys = [f"{stat}_{name}_ms" for name in LATENCIES for stat in STATS] + [
        "request_throughput", "output_throughput", "total_token_throughput",
        "spec_decode_acceptance_rate", "mean_queue_delay_ms",
        "gpu_busy_fraction", "plan_share_ar", "plan_share_linear", "plan_share_tree",
    ]  # fmt: skip
    assert [k for k in nan_keys if not math.isnan(s[k])] == []
    assert s["completed"] == 0
    assert s["preemptions"] == 0
    assert s["spec_decode_acceptance_length"] == 1.0  # nothing drafted
    assert s["spec_decode_per_position_acceptance_rates"] == []


def test_empty_populations_give_zero_as_vllm_bench_serve_does():
    """vllm/benchmarks/serve.py 0.33 l.782-806: ``np.mean(ttfts or 0)`` and
    the like, so an empty population reports 0 (empty_as_zero, the vllm
    engine mode); a population that is not empty is unchanged."""
    s = summarize(empty_log(), empty_as_zero=True)
    assert [k for name in LATENCIES for stat in STATS if s[(k := f"{stat}_{name}_ms")] != 0.0] == []
    single = make_log(requests=(make_log().requests[1],), chunk_request=np.array([1]), chunk_time_s=np.array([1.0]),
                      chunk_tokens=np.array([1]))
    vllm, own = summarize(single, empty_as_zero=True), summarize(single)
    assert vllm["mean_tpot_ms"] == 0.0 and vllm["p99_itl_ms"] == 0.0 and math.isnan(own["mean_tpot_ms"])
    assert vllm["mean_ttft_ms"] == own["mean_ttft_ms"] == 750.0


def test_single_token_requests_have_no_tpot_or_itl():
    log = make_log(
        requests=(make_log().requests[1],),
        chunk_request=np.array([1]),
        chunk_time_s=np.array([1.0]),
        chunk_tokens=np.array([1]),
    )
    s = summarize(log)
    assert all(math.isnan(s[f"{stat}_{name}_ms"]) for name in ("tpot", "itl") for stat in STATS)
    assert s["mean_ttft_ms"] == 750.0


def test_unfinished_requests_are_not_completed():
    """An interrupted run logs r0 without a finish: only r1 counts, and r0's
    chunks stay out of the itl population."""
    r0, r1 = make_log().requests
    log = make_log(requests=(dataclasses.replace(r0, finish_s=math.nan), r1), complete=False)
    s = summarize(log)
    assert s["completed"] == 1
    assert s["mean_e2el_ms"] == 750.0
    assert math.isnan(s["mean_itl_ms"])
    assert s["output_throughput"] == pytest.approx(1 / 1.5, rel=REL)


def test_rounds_total_must_cover_drafted_rounds():
    with pytest.raises(ValueError, match="rounds_total"):
        summarize(make_log(rounds_total=3))


# --- run folders --------------------------------------------------------------


def test_a_missing_folder_is_checked_writable_and_not_created(tmp_path):
    assert check_target(tmp_path / "a" / "run") is None
    assert not (tmp_path / "a").exists()


@pytest.mark.parametrize("contents", [{}, {MARKER: "{}", "metrics.json": "{}"}],
                         ids=["empty", "run-folder"])  # fmt: skip
def test_an_empty_or_run_folder_is_accepted(tmp_path, contents):
    for name, text in contents.items():
        (tmp_path / name).write_text(text)
    note = check_target(tmp_path)
    assert note == (f"replacing the run folder {tmp_path} (incomplete: it lacks some files)" if contents else None)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(contents)  # nothing removed


@pytest.mark.parametrize("kind", ["folder", "file", "under-a-file"])
def test_a_foreign_path_is_refused(tmp_path, kind):
    target = tmp_path / "out"
    if kind == "folder":
        target.mkdir()
        (target / "thesis.tex").write_text("keep me")
        match = f"is not a simspec run folder \\(no {MARKER}\\)"
    elif kind == "file":
        target.write_text("keep me")
        match = f"is not a simspec run folder \\(no {MARKER}\\)"
    else:
        target.write_text("keep me")
        target = target / "run"
        match = "is a file, not a folder"
    with pytest.raises(InputError, match=match):
        check_target(target)


def test_a_read_only_parent_is_refused_before_any_work(tmp_path):
    parent = tmp_path / "ro"
    parent.mkdir()
    parent.chmod(0o500)
    try:
        if os.access(parent, os.W_OK):
            pytest.skip("running as a user whom permissions do not stop (root)")
        with pytest.raises(InputError, match="cannot write in"):
            check_target(parent / "run")
    finally:
        parent.chmod(0o700)


def test_the_marker_is_written_last_and_lists_every_file(tmp_path):
    write_example(tmp_path / "run")
    marker = json.loads((tmp_path / "run" / MARKER).read_text())
    assert marker["complete"] is True and is_complete(tmp_path / "run")
    assert set(marker["files"]) == {p.name for p in (tmp_path / "run").iterdir()} - {MARKER}
    (tmp_path / "run" / "plan_mix.png").unlink()
    assert not is_complete(tmp_path / "run")


@pytest.mark.parametrize("when", ["config.toml", "requests.csv", "plan_mix.png"])
def test_an_interrupted_write_leaves_the_old_folder_whole(tmp_path, monkeypatch, when):
    from simspec import runfolder

    out = tmp_path / "run"
    write_example(out)
    before = {p.name: p.read_bytes() for p in out.iterdir()}

    def interrupt(*args, **kwargs):
        raise KeyboardInterrupt

    if when == "config.toml":
        monkeypatch.setattr(runfolder, "write_text", interrupt)
    elif when == "requests.csv":
        monkeypatch.setattr(runfolder, "write_requests_csv", interrupt)
    else:
        calls = []

        def second_png(path, figure, dpi=100):
            calls.append(path)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return original_png(path, figure, dpi)

        original_png = runfolder.write_png
        monkeypatch.setattr(runfolder, "write_png", second_png)
    with pytest.raises(KeyboardInterrupt):
        write_example(out)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")], "a staging folder was left behind"


def write_example(folder):
    logs = [make_log(), make_log(policy="ar")]
    metrics = {log.policy: summarize(log) for log in logs}
    meta = RunMeta(kind="simulate", seed=7, policies=("linear-3", "ar"), cost_model="roofline prior",
                   calibrated=False)
    write_run(folder, logs=logs, metrics=metrics, config_toml="seed = 7\n", meta=meta)
    return metrics, {"kind": "simulate", "seed": 7, "policies": ["linear-3", "ar"], "simspec_version": __version__,
                     "cost_model": "roofline prior", "calibrated": False}


def test_write_run_writes_every_file(tmp_path):
    metrics, meta = write_example(tmp_path)
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {MARKER, "config.toml", "metrics.json", "requests.csv",
                     "latency_cdf.png", "plan_mix.png", "throughput.png"}  # fmt: skip
    files = sorted(names - {MARKER})
    assert json.loads((tmp_path / MARKER).read_text()) == {**meta, "complete": True, "files": files}
    assert (tmp_path / "config.toml").read_text() == "seed = 7\n"
    for png in ("latency_cdf.png", "plan_mix.png", "throughput.png"):
        assert (tmp_path / png).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_metrics_json_round_trips_with_nan_as_null(tmp_path):
    metrics, _ = write_example(tmp_path)
    loaded = json.loads((tmp_path / "metrics.json").read_text())
    assert set(loaded) == set(metrics)
    lists = ("draft_acceptance_by_depth", "spec_decode_per_position_acceptance_rates")
    for policy, values in metrics.items():
        assert list(loaded[policy]) == sorted([*values, *lists])
        nan = [k for k, v in values.items() if isinstance(v, float) and math.isnan(v)]
        assert {k: v for k, v in loaded[policy].items() if k not in lists} == {**values, **dict.fromkeys(nan)}
        assert all(isinstance(loaded[policy][k], list) for k in lists)


def test_requests_csv_is_byte_identical_and_has_a_row_per_request(tmp_path):
    write_example(tmp_path / "one")
    write_example(tmp_path / "two")
    first = (tmp_path / "one" / "requests.csv").read_bytes()
    assert first == (tmp_path / "two" / "requests.csv").read_bytes()
    lines = first.decode().splitlines()
    assert lines[0] == (
        "id,policy,arrival_s,admitted_s,first_token_s,finish_s,"
        "prompt_tokens,output_tokens,images,visual_tokens,preemptions,cached_tokens"
    )
    assert lines[1] == "0,linear-3,0.000000000,0.125000000,0.500000000,1.500000000,10,5,1,576,1,0"
    assert len(lines) == 1 + 2 * 2  # two requests, two policies


def test_write_run_overwrites_its_own_folder(tmp_path):
    write_example(tmp_path)
    write_run(tmp_path, logs=[make_log()], metrics={"x": {"completed": 1}},
              config_toml="", meta=RunMeta(kind="simulate", seed=8, policies=("x",)))  # fmt: skip
    assert json.loads((tmp_path / "metrics.json").read_text()) == {"x": {"completed": 1}}
    assert not [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]


def test_format_table():
    rate = "spec_decode_acceptance_rate"
    metrics = {
        "ar": {"completed": 2, "mean_ttft_ms": 625.0, rate: math.nan},
        "tree-8": {"completed": 12, "mean_ttft_ms": 12.345, rate: 0.61234},
    }
    table = format_table(metrics, ["completed", "mean_ttft_ms", rate])
    assert table.splitlines() == [
        "policy  completed  mean_ttft_ms  spec_decode_acceptance_rate",
        "------  ---------  ------------  ---------------------------",
        "ar              2        625.00                          nan",
        "tree-8         12         12.35                       0.6123",
    ]


def test_format_table_unknown_column_is_input_error():
    with pytest.raises(InputError, match="mean_ttf_ms"):
        format_table({"ar": {"mean_ttft_ms": 1.0}}, ["mean_ttf_ms"])


@pytest.mark.parametrize("high", [1, 7, 1 << 16, 1 << 20, 1 << 32, 1 << 40])
def test_stable_order_is_numpys_stable_argsort(high):
    from simspec.logs import stable_order
    rng = np.random.default_rng(high % 1000)
    for n in (0, 1, 5, 1000, 100_000):
        keys = rng.integers(0, high, n)
        assert stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()
    keys = rng.integers(-3, 3, 1000)  # negative keys: numpy's own sort
    assert stable_order(keys).tolist() == np.argsort(keys, kind="stable").tolist()
