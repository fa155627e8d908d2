"""``simspec export``: a tuned schedule as vLLM / SGLang settings, the lines
saying what each engine cannot express, and the simulated cost of the
approximation (zero when the engine can express the schedule exactly)."""

from __future__ import annotations

import json

import pytest

from conftest import invoke
from simspec import config, export, tune

SCENARIO = config.build(flag_values={"cost_model": "affine:10,5", "acceptance": "iid:0.6", "workload": {
    "num_requests": 20, "multimodal_share": 0.0, "prompt_mean_tokens": 16, "output_mean_tokens": 48}})


def candidate(spec: str, family: str, value: float = 100.0) -> tune.Candidate:
    return tune.Candidate(spec=spec, family=family, values=(value, value + 1), scores=(-value, -value - 1),
                          batch=2.0, slo_gap=float("nan"))


def tuned_with(stages: list[tuple[int, str, float]], linear_k: dict[float, int], rates=None) -> tune.Tuned:
    """A tuned file whose schedule is ``stages`` (min batch, spec, load) and
    whose cells' tuned linear lengths are ``linear_k`` (load -> k)."""
    cells = []
    for load, k in linear_k.items():
        fams = {"linear": candidate(f"linear:k={k}", "linear")}
        for _, spec, at in stages:
            if at == load:
                fams[spec.partition(":")[0]] = candidate(spec, spec.partition(":")[0], 90.0)
        best = min(fams.values(), key=lambda c: c.mean)
        cells.append(tune.Cell(load=load, rate_per_s=(rates or {}).get(load, load * 4), cv=1.0, families=fams,
                               best=best, runner_up=None, meets_slo=None, adaptive=(1.0, 2.0)))
    schedule = tune.Schedule(cv=1.0, stages=tuple(tune.Stage(min_batch=b, spec=s, load=x) for b, s, x in stages))
    return tune.Tuned(objective="mean_e2el", scenario=SCENARIO, saturation_rate_per_s=4.0, search_seeds=(0,),
                      confirm_seeds=(1, 2, 3), trials=4, cells=tuple(cells), schedules=(schedule,))


MIXED = [(1, "tree:depth=4,topk=3,budget=10", 0.1), (4, "marginal:depth=5,topk=4,max_nodes=128", 0.3),
         (16, "linear:k=2", 0.6), (64, "ar", 0.9)]
MIXED_K = {0.1: 5, 0.3: 4, 0.6: 2, 0.9: 1}


def test_vllm_gets_a_draft_length_per_batch_range():
    e = export.build(tuned_with(MIXED, MIXED_K), "vllm")
    assert e.settings["num_speculative_tokens_per_batch_size"] == [[1, 3, 5], [4, 15, 4], [16, 63, 2], [64, 128, 0]]
    assert e.settings["num_speculative_tokens"] == 5
    assert e.approximation == "batch_table:table=1:5,4:4,16:2,64:0"
    assert [r.exact for r in e.ranges] == [False, False, True, True]
    cannot = "\n".join(e.cannot)
    assert "batch 1-3: a draft tree" in cannot and "batch 4-15: marginal's per-request" in cannot
    assert "per-request or per-round adaptivity" in cannot and "--speculative-config" in e.flags


def test_sglang_gets_steps_per_range_and_the_static_tree():
    e = export.build(tuned_with(MIXED, MIXED_K), "sglang")
    assert e.settings == {"1": {"candidate_steps": [5]}, "4": {"candidate_steps": [4]},
                          "16": {"candidate_steps": [2]}, "64": {"candidate_steps": [1]}}
    assert "--speculative-eagle-topk 1 --speculative-num-steps 5 --speculative-num-draft-tokens 6" in e.flags
    assert list(e.alternatives.values()) == ["tree:depth=4,topk=3,budget=10"]
    cannot = "\n".join(e.cannot)
    assert "batch 64-128: a batch-size range without speculation" in cannot
    assert "SGLang sets those three once per server" in cannot
    assert "--speculative-num-steps 4 --speculative-eagle-topk 3 --speculative-num-draft-tokens 11" in cannot


def test_neighbouring_ranges_with_one_length_merge():
    e = export.build(tuned_with([(1, "linear:k=3", 0.1), (8, "truncate:k_max=6,threshold=0.5", 0.5)],
                                {0.1: 3, 0.5: 3}), "vllm")
    assert e.settings["num_speculative_tokens_per_batch_size"] == [[1, 128, 3]]


def test_an_exact_export_loses_nothing():
    """A schedule of chains is what vLLM runs: on the same engine, the
    batch_table it exports serves every request exactly as the staged
    policy does."""
    t = tuned_with([(1, "linear:k=3", 0.2), (3, "linear:k=1", 0.7)], {0.2: 3, 0.7: 1}, rates={0.2: 0.6, 0.7: 2.1})
    e = export.build(t, "vllm")
    rows = export.losses(t, e, e.approximation, engine=t.scenario.engine)
    assert len(rows) == 2 and all(r.gap.diff == 0 and r.tuned == r.exported for r in rows)


def test_the_export_is_simulated_on_the_engine_it_targets():
    """By default the exported settings run on --engine vllm (vLLM 0.33's
    preset, the tuned batch limit): the same draft lengths, another engine,
    another latency; and a tuned tree is said to be beyond vLLM."""
    t = tuned_with([(1, "linear:k=3", 0.2), (3, "linear:k=1", 0.7)], {0.2: 3, 0.7: 1}, rates={0.2: 0.6, 0.7: 2.1})
    e = export.build(t, "vllm")
    engine = export.target_engine(t, "vllm")
    assert engine.kind == "vllm" and engine.async_scheduling and engine.max_num_seqs == t.scenario.engine.max_num_seqs
    rows = export.losses(t, e, e.approximation)
    assert all(r.tuned != r.exported for r in rows)
    trees = tuned_with([(1, "tree:depth=4,topk=4,budget=8", 0.2), (3, "linear:k=1", 0.7)], {0.2: 3, 0.7: 1},
                       rates={0.2: 0.6, 0.7: 2.1})
    assert any("vLLM 0.33 has none" in line for line in export.build(trees, "vllm").cannot)


@pytest.fixture(scope="module")
def tuned_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("export") / "tuned.toml"
    code, _, err = invoke(["tune", "--cost-model", "affine:10,5", "--acceptance", "iid:0.6", "--num-requests", "20",
                           "--multimodal-share", "0", "--prompt-mean", "16", "--output-mean", "48", "--cv", "2",
                           "--load", "0.2,0.7", "--families", "linear,tree", "--trials", "3", "--search-seeds", "1",
                           "--confirm-seeds", "3", "--top", "1", "--quiet", "--out", str(path)])
    assert code == 0, err
    return path


@pytest.mark.parametrize("fmt,key", [("vllm", "num_speculative_tokens_per_batch_size"), ("sglang", "1")])
def test_export_command(tuned_file, tmp_path, fmt, key):
    out = tmp_path / f"{fmt}.json"
    code, text, err = invoke(["export", "--format", fmt, str(tuned_file), "--out", str(out)])
    assert code == 0, err
    assert key in json.loads(out.read_text())
    assert "tuned policy: " in text and "exported vs tuned" in text and "mean change over the 2 loads" in text
    if any(s.spec.startswith("tree") for s in tune.load(tuned_file).schedules[0].stages):
        assert "cannot express" in text


def test_export_of_a_bad_file_is_one_line_and_exit_2(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('format = "simspec-tuned/1"\nobjective = "mean_e2el"\n')
    code, _, err = invoke(["export", "--format", "vllm", str(bad)])
    assert code == 2 and err.count("\n") == 1 and "scenario missing" in err
