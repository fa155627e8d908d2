"""``simspec tune``, the tuned file, ``simulate --policy-file`` and the
``staged`` policy the tuned file carries: the tuner finds a parameter known
to be best, is byte-for-byte deterministic, and every bad input ends in one
``simspec: error:`` line with exit status 2."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from conftest import invoke, requests_at, run
from simspec import cli, config, costs, policies, tune
from simspec.cli.scenario import scenario_config
from simspec.policies import ReplicaView
from simspec.types import InputError

TINY = ["--cost-model", "affine:10,5", "--acceptance", "iid:0.6", "--num-requests", "20", "--multimodal-share", "0",
        "--prompt-mean", "16", "--output-mean", "48"]
FAST_TUNE = ["--families", "linear,truncate", "--trials", "3", "--search-seeds", "1", "--confirm-seeds", "3",
             "--top", "1", "--quiet"]


@pytest.fixture(scope="module")
def tuned_file(tmp_path_factory):
    path = tmp_path_factory.mktemp("tune") / "tuned.toml"
    code, out, err = invoke(["tune", *TINY, *FAST_TUNE, "--load", "0.2,0.7", "--cv", "1,2", "--out", str(path)])
    assert code == 0, err
    return path, out


# -- the staged policy ----------------------------------------------------------

def view(batch: int, depth: int = 8, ranks: int = 10) -> ReplicaView:
    rng = np.random.default_rng(batch)
    conf = np.sort(rng.uniform(0.01, 0.9, (batch, depth, ranks)), axis=2)[:, :, ::-1].copy()
    return ReplicaView(context_tokens=np.full(batch, 300), visual_tokens=np.zeros(batch, int),
                       kept_visual_tokens=np.zeros(batch, int), remaining_tokens=np.full(batch, 50),
                       recent_accepted=np.full(batch, 2.0), conf=conf, prefill_tokens=0, prefill_attn_pairs=0,
                       prefill_kv_tokens=0, prefill_requests=0, vision_tokens=0,
                       costs=costs.build("affine:10,0.1", costs.model_spec("LLaVA-1.5-7B"), costs.gpu_spec("h100-sxm")))


@pytest.mark.parametrize("batch,stage", [(1, "tree:depth=4,topk=3,budget=10"), (7, "tree:depth=4,topk=3,budget=10"),
                                         (8, "linear:k=2"), (31, "linear:k=2"), (32, "ar")])
def test_staged_plans_as_the_stage_of_the_batch_size(batch, stage):
    staged = policies.parse("staged:stages=1:tree:depth=4,topk=3,budget=10;8:linear:k=2;32:ar")
    v = view(batch)
    mine, theirs = staged.plan(v), policies.parse(stage).plan(v)
    assert np.array_equal(mine.num_nodes, theirs.num_nodes) and np.array_equal(mine.kind, theirs.kind)
    assert np.array_equal(np.sort(mine.codes, axis=1), np.sort(theirs.codes, axis=1))


def test_one_stage_serves_exactly_as_its_policy():
    reqs = requests_at(np.arange(30) * 0.05, output=40)
    a, b = run(reqs, policies.parse("staged:stages=1:linear:k=3")), run(reqs, policies.parse("linear:k=3"))
    assert np.array_equal(a.chunk_time_s, b.chunk_time_s) and np.array_equal(a.chunk_tokens, b.chunk_tokens)


@pytest.mark.parametrize("spec,needle", [("staged:stages=2:linear:k=3", "start at batch size 1"),
                                         ("staged:stages=1:linear:k=3;1:ar", "must increase"),
                                         ("staged:stages=1:oracle", "a stage must be one of"),
                                         ("staged:stages=1:staged:stages=1:ar", "a stage must be one of"),
                                         ("staged:stages=x:ar", "stages look like"),
                                         ("staged:1:ar", "parameters look like")])
def test_bad_staged_specs_name_the_problem(spec, needle):
    with pytest.raises(InputError, match=needle):
        policies.parse(spec)


def test_staged_label_round_trips():
    spec = "staged:stages=1:tree:depth=4,topk=3,budget=10;8:linear:k=2"
    assert policies.parse(policies.parse(spec).label).params().tolist() == policies.parse(spec).params().tolist()


# -- statistics -------------------------------------------------------------------

def test_paired_interval_is_the_t_interval_of_differences():
    p = tune.paired([10.0, 12.0, 11.0, 13.0], [9.0, 10.0, 10.5, 11.5])  # d = 1, 2, .5, 1.5
    d = np.array([1.0, 2.0, 0.5, 1.5])
    half = 3.182446305284263 * d.std(ddof=1) / 2  # t(0.975, 3)
    assert p.diff == pytest.approx(1.25) and p.low == pytest.approx(1.25 - half) and p.separable
    assert not tune.paired([1.0, 2.0, 3.0], [2.0, 1.0, 3.0]).separable


# -- the tuner ----------------------------------------------------------------------

@pytest.mark.parametrize("cost_model,accept,best", [
    ("affine:10,5", "iid:0.5", 1),  # dear tokens: (10 + 5(1+k)) / E[tokens] is least at k=1 (k=2: +7%)
    ("constant:10", "iid:0.9", 8),  # free tokens: the longest draft wins (k=7: +8%)
])
def test_tuner_finds_the_best_linear_length(cost_model, accept, best):
    base = config.build(flag_values={"cost_model": cost_model, "acceptance": accept, "workload": {
        "num_requests": 20, "multimodal_share": 0.0, "prompt_mean_tokens": 16, "output_mean_tokens": 64}})
    tc = tune.TuneConfig(rates_per_s=(0.05,), cvs=(1.0,), families=("linear",), trials=8, search_seeds=1,
                         confirm_seeds=2, top=1, saturation_requests=50)
    cell = tune.tune(base, tc).cells[0]
    assert cell.best.spec == f"linear:k={best}"


def test_tune_is_deterministic(tuned_file, tmp_path):
    path, out = tuned_file
    again = tmp_path / "again.toml"
    code, out2, _ = invoke(["tune", *TINY, *FAST_TUNE, "--load", "0.2,0.7", "--cv", "1,2", "--out", str(again)])
    assert code == 0
    for suffix in (".toml", ".csv", ".md"):
        assert path.with_suffix(suffix).read_bytes() == again.with_suffix(suffix).read_bytes()
    assert out.replace(str(path.with_suffix("")), "X") == out2.replace(str(again.with_suffix("")), "X")


def test_tuned_file_reads_back(tuned_file):
    path, out = tuned_file
    t = tune.load(path)
    assert [(c.load, c.cv) for c in t.cells] == [(0.2, 1.0), (0.7, 1.0), (0.2, 2.0), (0.7, 2.0)]
    assert [s.cv for s in t.schedules] == [1.0, 2.0]
    for c in t.cells:
        assert set(c.families) == {"linear", "truncate"} and len(c.best.values) == 3 and len(c.adaptive) == 3
        assert c.best.spec in {f.spec for f in c.families.values()}
    assert "| load |" in out and "adaptive (CV 2)" in out
    assert path.with_suffix(".csv").read_text().splitlines()[0].startswith("load,rate_per_s,cv,best_fixed")


# -- loading it: simulate --policy-file and the live engine -----------------------

def test_policy_file_adds_the_tuned_policies_to_simulate(tuned_file, tmp_path):
    path, _ = tuned_file
    t = tune.load(path)
    code, out, err = invoke(["simulate", *TINY, "--rate", "0.3", "--cv", "2", "--policy-file", str(path),
                             "--out", str(tmp_path / "run"), "--quiet"])
    assert code == 0, err
    ran = json.loads((tmp_path / "run" / "simspec-run.json").read_text())["policies"]
    assert set(json.loads((tmp_path / "run" / "metrics.json").read_text())) == set(ran)
    cell = min((c for c in t.cells if c.cv == 2.0), key=lambda c: abs(math.log(c.rate_per_s / 0.3)))
    assert ran[0] == "ar" and ran[1] == next(s.policy for s in t.schedules if s.cv == 2.0)
    assert set(ran[2:]) == {c.spec for c in cell.families.values()}


def test_policy_file_keeps_the_policies_asked_for(tuned_file):
    path, _ = tuned_file
    args = cli.parser().parse_args(["simulate", *TINY, "--policy", "linear:k=5", "--policy-file", str(path)])
    cfg = scenario_config(args)
    assert cfg.policies[0] == "linear:k=5" and "ar" not in cfg.policies and len(cfg.policies) >= 2


def test_live_engine_loads_the_tuned_policy(tuned_file):
    """The live engine takes a Policy and calls ``plan(ReplicaView)``
    (LiveEngine(target, drafter, policy, ...)); check that path."""
    path, _ = tuned_file
    policy = tune.adaptive_policy(tune.load(path), cv=2.0)
    assert isinstance(policy, policies.Policy)
    assert policies.parse(policy.label).label == policy.label
    for batch in (1, 24):
        plan = policy.plan(view(batch))
        assert plan.num_nodes.shape == (batch,)


# -- bad input ----------------------------------------------------------------------

@pytest.mark.parametrize("extra,needle", [
    (["--objective", "median"], "objective must be one of"),
    (["--objective", "goodput"], "needs an SLO"),
    (["--slo", "ttft=5"], "--slo must look like"),
    (["--load", "0.5", "--rates", "3"], "not both"),
    (["--families", "linear,beam"], "families must be among"),
    (["--policy", "ar"], "--families"),
    (["--load", "0"], "loads (--load) must be > 0"),
    (["--arrival", "onoff"], "not supported"),
])
def test_bad_tune_input_is_one_line_and_exit_2(extra, needle, tmp_path):
    code, out, err = invoke(["tune", *TINY, *FAST_TUNE, "--out", str(tmp_path / "t.toml"), *extra])
    assert code == 2 and needle in err and err.count("\n") == 1 and err.startswith("simspec: error:")
    assert not (tmp_path / "t.toml").exists()


@pytest.mark.parametrize("text,needle", [("not toml [", "not valid TOML"), ('format = "x"', "format must be"),
                                         (None, "best 'linear:k=15'"), (None, "policy linear: unknown parameter")])
def test_bad_policy_files_are_one_line_and_exit_2(tuned_file, tmp_path, text, needle):
    good = tuned_file[0].read_text()
    if text is None and "best" in needle:
        text = good.replace('best = "', 'best = "linear:k=15" #', 1)
    elif text is None:
        text = good.replace('spec = "linear:k=', 'spec = "linear:q=', 1)
    bad = tmp_path / "bad.toml"
    bad.write_text(text)
    code, _, err = invoke(["simulate", *TINY, "--policy-file", str(bad), "--quiet"])
    assert code == 2 and needle in err and err.count("\n") == 1
    code, _, err = invoke(["simulate", *TINY, "--policy-file", str(tmp_path / "none.toml"), "--quiet"])
    assert code == 2 and "no such file" in err


def test_slos_no_candidate_meets_name_the_closest(tmp_path):
    path = tmp_path / "slo.toml"
    code, out, err = invoke(["tune", *TINY, *FAST_TUNE, "--load", "0.5", "--cv", "1", "--objective", "goodput",
                             "--slo", "ttft:0.01", "--slo", "tpot:0.01", "--out", str(path)])
    assert code == 0, err
    assert "no candidate meets the SLOs" in out and "closest is" in out
    cell = tune.load(path).cells[0]
    assert cell.meets_slo is False
    gaps = {f: c.slo_gap for f, c in cell.families.items()}
    assert cell.best.slo_gap == min(gaps.values()) and cell.best.slo_gap > 1


def test_simspec_live_serves_the_tuned_policy(tuned_file, tmp_path):
    """``simspec live --policy-file`` adds the tuned load-adaptive policy to
    what the live engine serves (here a timing-only run at the tiny shape)."""
    pytest.importorskip("torch")
    path, _ = tuned_file
    out = tmp_path / "live"
    code, stdout, err = invoke(["live", "--timing-only", "simspec-tiny-vlm", "--acceptance", "iid:0.7",
                                "--policy", "ar", "--policy-file", path, "--num-requests", "4", "--rate", "200",
                                "--quiet", "--out", out])
    assert code == 0, err
    served = json.loads((out / "metrics.json").read_text())
    # The live workload's arrivals are Gamma of shape 0.25 (CV 2): the file's CV 2 schedule, not its CV 1 one.
    tuned = tune.adaptive_policy(tune.load(path), cv=2.0).label
    assert tuned != tune.adaptive_policy(tune.load(path), cv=1.0).label  # so the choice is tested
    assert list(served) == ["ar", tuned]  # the tuned schedule itself, after --policy
    assert served["ar"]["completed"] == served[tuned]["completed"] == 4
    assert served["ar"]["spec_decode_acceptance_length"] == pytest.approx(1.0)
