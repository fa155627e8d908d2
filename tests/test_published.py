"""The table of published GPU measurements (validation/published/) and the
benchmark that predicts it (benchmarks/published.py)."""

from __future__ import annotations

import csv
import dataclasses
import hashlib
import math
import re
from pathlib import Path
from urllib.parse import urlparse

import pytest

from conftest import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
TABLE = ROOT / "validation" / "published" / "speculative_decoding.csv"
REPORT = ROOT / "benchmarks" / "reports" / "2026-12-03-published-tp-moe.md"
REQUIRED = ("id", "source_url", "where", "model", "gpu", "tp", "engine", "engine_version", "method", "draft", "batch",
            "temperature", "dataset", "acceptance_length", "speedup", "tpot_ms", "throughput_tok_s", "split", "notes")
POSITIVE = ("batch", "acceptance_length", "speedup", "tpot_ms", "ar_tpot_ms", "throughput_tok_s",
            "ar_throughput_tok_s")
METHODS = {"eagle1", "eagle2", "eagle3", "draft_model", "medusa", "ngram"}
TP_DEGREES = {"1", "2", "4", "8"}  # simspec's tensor-parallel degrees (simspec.costs.specs.TP_DEGREES)
SPLITS = {"fit", "held_out"}


@pytest.fixture(scope="module")
def records() -> list[dict[str, str]]:
    with open(TABLE, newline="", encoding="utf-8") as f:
        return list(csv.DictReader(f))


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("published")


def test_columns_and_size(records):
    assert set(REQUIRED) <= set(records[0])
    assert len(records) >= 30
    assert sum(bool(r["batch"]) and float(r["batch"]) > 1 for r in records) >= 10


def test_ids_unique_and_sourced(records):
    ids = [r["id"] for r in records]
    assert len(set(ids)) == len(ids)
    for r in records:
        assert r["source_url"].startswith("https://"), r["id"]
        assert r["where"].strip(), r["id"]
        assert r["method"] in METHODS, r["id"]


@pytest.mark.parametrize("column", POSITIVE)
def test_numbers_finite_positive_where_given(records, column):
    for r in records:
        if r[column].strip():
            value = float(r[column])
            assert math.isfinite(value) and value > 0, (r["id"], column, value)


def test_temperature_finite_nonnegative_where_given(records):
    # Greedy decoding is temperature 0, the one numeric field that may be 0.
    for r in records:
        if r["temperature"].strip():
            value = float(r["temperature"])
            assert math.isfinite(value) and value >= 0, r["id"]


def test_split_follows_the_stated_rule(records):
    """README: fit iff SHA-256 of the id is even; both parts hold batch > 1 rows."""
    for r in records:
        rule = "fit" if int(hashlib.sha256(r["id"].encode()).hexdigest(), 16) % 2 == 0 else "held_out"
        assert r["split"] == rule, r["id"]
    for split in ("fit", "held_out"):
        part = [r for r in records if r["split"] == split]
        assert len(part) >= 0.3 * len(records)
        assert any(r["batch"] and float(r["batch"]) > 1 for r in part), split


def test_every_tp_names_a_degree_simspec_has(records):
    """Empty (one GPU, the rows entered before the column) or 1, 2, 4, 8;
    the table holds rows above one GPU, and mixtures of experts among them."""
    for r in records:
        assert r["tp"] == "" or r["tp"] in TP_DEGREES, (r["id"], r["tp"])
    multi = [r for r in records if r["tp"] not in ("", "1")]
    assert len(multi) >= 10
    assert {"Qwen3-30B-A3B", "Llama-3.3-70B"} <= {r["model"] for r in multi}


def test_every_source_url_is_a_url(records):
    for r in records:
        url = urlparse(r["source_url"])
        assert url.scheme == "https" and "." in url.netloc and not any(c.isspace() for c in r["source_url"]), r["id"]


def test_split_values_are_fit_or_held_out(records):
    assert {r["split"] for r in records} == SPLITS


def _reported_held_out() -> list[str]:
    """The held-out ids the dated report lists between its two markers."""
    text = REPORT.read_text(encoding="utf-8")
    block = re.search(r"<!-- held-out ids -->(.*?)<!-- end held-out ids -->", text, re.S)
    assert block, f"{REPORT.name} has no held-out id list"
    return re.findall(r"`([\w.-]+)`", block.group(1))


def test_held_out_rows_of_the_report_stay_held_out(records):
    """The report of 2026-12-03 lists the held-out rows at tp > 1: each is
    still in the table and still held out, and no tp > 1 row became held
    out after the report."""
    by_id = {r["id"]: r for r in records}
    listed = _reported_held_out()
    assert len(listed) >= 5 and len(set(listed)) == len(listed)
    for row_id in listed:
        assert row_id in by_id and by_id[row_id]["split"] == "held_out", row_id
    now = {r["id"] for r in records if r["tp"] not in ("", "1") and r["split"] == "held_out"}
    assert now == set(listed)


def test_derived_speedups_match_their_numbers(records):
    for r in records:
        if r["speedup_derived"] != "yes":
            continue
        if r["speedup_metric"] == "tpot":
            ratio = float(r["ar_tpot_ms"]) / float(r["tpot_ms"])
        else:
            ratio = float(r["throughput_tok_s"]) / float(r["ar_throughput_tok_s"])
        assert float(r["speedup"]) == pytest.approx(ratio, abs=6e-4), r["id"]


def test_acceptance_proxies_point_at_reported_lengths(records):
    by_id = {r["id"]: r for r in records}
    for r in records:
        if r["acceptance_proxy"]:
            assert not r["acceptance_length"], r["id"]
            proxy = by_id[r["acceptance_proxy"]]
            assert proxy["acceptance_length"] and proxy["model"] == r["model"], r["id"]
            assert proxy["method"] == r["method"] and proxy["draft"] == r["draft"], r["id"]


def test_table_reads_into_rows(bench):
    rows = bench.read_rows(TABLE)
    assert len(rows) >= 30
    with open(TABLE, newline="", encoding="utf-8") as f:
        empty = {r["id"] for r in csv.DictReader(f) if not r["batch"].strip()}
    assert {r.id for r in rows if r.batch is None} == empty  # a batch the source does not give stays None
    assert all(isinstance(r.batch, float) for r in rows if r.id not in empty)
    assert {r.tp for r in rows} <= {None, 1, 2, 4, 8}


@pytest.mark.parametrize("tau,k", [(1.5, 1), (2.29, 3), (3.61, 5), (3.54, 7)])
def test_iid_alpha_inverts_the_closed_form(bench, tau, k):
    alpha = bench.iid_alpha(tau, k)
    assert 0 < alpha < 1
    assert bench.chain_tokens(alpha, k) == pytest.approx(tau, rel=1e-9)


def test_iid_alpha_refuses_unreachable_lengths(bench):
    with pytest.raises(ValueError):
        bench.iid_alpha(4.5, 3)


def _row(bench, **overrides):
    base = {"id": "t", "source_url": "https://example.org", "where": "test", "model": "Llama-2-7B",
            "gpu": "a100-80gb", "gpu_stated": "yes", "tp": None, "engine": "vllm", "engine_version": "", "method": "eagle1",
            "draft": "k=3", "batch": 1.0, "temperature": 0.0, "dataset": "mt-bench", "acceptance_length": 2.5,
            "acceptance_includes_bonus": "yes", "acceptance_proxy": "", "speedup": 1.5, "speedup_metric": "tpot",
            "speedup_derived": "no", "tpot_ms": None, "ar_tpot_ms": None, "throughput_tok_s": None,
            "ar_throughput_tok_s": None, "split": "fit", "notes": ""}
    return bench.Row(**{**base, **overrides})


def test_prediction_runs_on_two_small_rows(bench):
    rows = [_row(bench, id="vllm-b1"),
            _row(bench, id="sglang-b4", engine="sglang", batch=4.0, speedup_metric="throughput", gpu="h100-sxm")]
    predictions = bench.predict(rows, requests_per_seq=2, min_requests=4)
    assert [p.row.id for p in predictions] == ["vllm-b1", "sglang-b4"]
    for p in predictions:
        assert p.skipped is None
        assert math.isfinite(p.speedup) and p.speedup > 0
        assert math.isfinite(p.relative_error)


def test_higher_acceptance_predicts_a_higher_speedup(bench):
    low, high = bench.predict([_row(bench, id="low", acceptance_length=1.6),
                               _row(bench, id="high", acceptance_length=3.2)], min_requests=4)
    assert high.speedup > low.speedup


def test_rows_simspec_cannot_price_are_skipped_with_a_reason(bench):
    rows = [_row(bench, id="gpu", gpu="rtx3090"), _row(bench, id="model", model="Vicuna-13B"),
            _row(bench, id="lookahead", method="lookahead"), _row(bench, id="no-tau", acceptance_length=None),
            _row(bench, id="draft", method="draft_model", draft="draft=vicuna-1m", engine="paper/hf"),
            dataclasses.replace(_row(bench, id="proxy", acceptance_length=None), acceptance_proxy="absent")]
    for p in bench.predict(rows):
        assert p.speedup is None and p.skipped, p.row.id


def test_rows_without_a_batch_or_dataset_or_with_an_odd_tp_are_skipped(bench):
    rows = [_row(bench, id="no-batch", batch=None), _row(bench, id="no-dataset", dataset=""),
            _row(bench, id="tp3", tp=3)]
    got = bench.predict(rows)
    assert [p.skipped for p in got] == ["batch (requests in flight) not reported", "dataset not reported",
                                        "tp 3 is not one of simspec's degrees 1, 2, 4, 8"]
    assert all(p.speedup is None for p in got)
    assert "?" in bench.table_text(got)


def test_the_rows_tp_reaches_the_simulation(bench):
    """A row's tp is the scenario's; a 70B model that does not fit on one
    GPU is skipped with simspec's message, and runs at tp 4."""
    row = _row(bench, id="tp2", tp=2, gpu="h100-sxm", model="Qwen3-30B-A3B", engine="sglang")
    assert bench.scenario(row, 2.5, speculative=True, requests_per_seq=1, min_requests=2, seed=0,
                          cost_model="auto").config.tp == 2
    assert bench.is_moe(row) and not bench.is_moe(_row(bench))
    big = _row(bench, id="70b", model="Llama-3.1-70B", gpu="h100-sxm", acceptance_length=2.0)
    one, four = bench.predict([big, dataclasses.replace(big, id="70b-tp4", tp=4)], min_requests=2)
    assert one.speedup is None and "does not fit" in one.skipped
    assert four.skipped is None and math.isfinite(four.speedup) and four.speedup > 0


def test_other_drafters_are_predicted_with_their_kinds(bench):
    """Medusa, a separate draft model and prompt lookup are predicted (not
    skipped) with their drafter kinds, K from the row or the measuring
    code's default; at one acceptance length a 12-layer draft model
    predicts a lower speedup than a 2-layer one."""
    rows = {"medusa": _row(bench, id="medusa", method="medusa", draft="tree:nodes=63,depth=4", engine="paper/hf"),
            "sps": _row(bench, id="sps", method="draft_model", draft="draft=vicuna-68m", engine="paper/hf"),
            "sps160": _row(bench, id="sps160", method="draft_model", draft="draft=llama-160m", engine="paper/hf"),
            "pld": _row(bench, id="pld", method="ngram", draft="prompt lookup", engine="paper/hf",
                        acceptance_length=1.7)}
    assert [bench.drafter(r) for r in rows.values()] == ["medusa", "draft-model:Vicuna-68M",
                                                         "draft-model:Llama-160M", "ngram"]
    assert [bench.row_depth(r) for r in rows.values()] == [4, 5, 5, 10]
    got = {key: p for key, p in zip(rows, bench.predict(list(rows.values()), min_requests=4))}
    for p in got.values():
        assert p.skipped is None and math.isfinite(p.speedup) and p.speedup > 0, p.row.id
    assert got["sps160"].speedup < got["sps"].speedup


def test_the_table_rows_of_every_drafter_kind_are_predicted(bench):
    table = bench.read_rows(TABLE)
    by_id = {r.id: r for r in table}
    for row_id in ("sb-a100-medusa", "sb-a100-sps", "sb-a100-pld"):
        assert bench.skip_reason(by_id[row_id], by_id) is None, row_id


@pytest.mark.parametrize("draft,want", [("k=3", (3, 1, 3)), ("tree:nodes=63,depth=4", (4, 10, 63)),
                                        ("topk=8,steps=5,tokens=64", (5, 8, 63)),
                                        ("topk=1,steps=3,tokens=4", (3, 1, 3))])
def test_draft_shapes_become_chains_or_trees(bench, draft, want):
    setting = bench.draft_setting(_row(bench, draft=draft))
    assert (setting.depth, setting.topk, setting.budget) == want
    policy = bench.policy_of(setting)
    assert policy.startswith("linear:" if want[1] == 1 else "tree:")


@pytest.mark.parametrize("engine,version,method,ar,speculative", [
    ("vllm", "V1, main of July 2025", "eagle3", False, False),  # before async scheduling was the default
    ("vllm", "0.10.1", "eagle1", False, False),
    ("vllm", "0.33.0", "eagle3", True, True),  # today's default: async, also with EAGLE
    ("vllm", "0.33.0", "ngram", True, False),  # ... but not with other drafters (vllm#31998)
    ("sglang", "0.4.4", "eagle3", True, False),  # overlap for plain decoding, none with speculation
    ("paper/hf", "PyTorch 2.0.1", "medusa", False, False),
])
def test_each_run_overlaps_as_the_measured_version_did(bench, engine, version, method, ar, speculative):
    row = _row(bench, engine=engine, engine_version=version, method=method)
    assert (bench.overlapped(row, False), bench.overlapped(row, True)) == (ar, speculative)


def test_a_tree_emits_the_rows_acceptance_and_costs_more_than_a_chain_of_its_depth(bench):
    """A 63-node tree is matched to the row's tau and verifies all its nodes:
    at the same tau it predicts a lower speedup than a 4-chain would."""
    tree = _row(bench, id="tree", method="medusa", engine="paper/hf", draft="tree:nodes=63,depth=4",
                acceptance_length=2.3, gpu="h100-sxm", model="Vicuna-7B")
    chain = dataclasses.replace(tree, id="chain", draft="k=4")
    got = bench.predict([tree, chain], min_requests=8)
    assert got[0].simulated_acceptance_length == pytest.approx(2.3, rel=0.05)
    assert got[1].simulated_acceptance_length == pytest.approx(2.3, rel=0.05)
    assert got[0].speedup < got[1].speedup
