"""Request classes (simspec.acceptance.classes): a mix draws each request's
class, each class moves its acceptance level as fitted to Spec-Bench's
per-category speedups, long contexts lower acceptance where the model says so."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simspec import config, experiment
from simspec.acceptance import AcceptanceModel, classes, load_acceptance, presets, save_acceptance
from simspec.types import InputError

AT_ONE = {"policies": ["linear:k=3"], "workload": {"arrival": "poisson", "rate_per_s": 0.2, "num_requests": 120,
                                                   "output_mean_tokens": 200.0, "multimodal_share": 0.0}}


def _length(mix: str | None) -> float:
    values = {**AT_ONE, "workload": {**AT_ONE["workload"], **({"mix": mix} if mix else {})}}
    return experiment.run(config.build({}, values)).metrics["linear:k=3"]["spec_decode_acceptance_length"]


def test_the_mix_parses_and_refuses_what_is_not_a_mix():
    assert classes.parse_mix("code:0.3,chat:0.5,summarize:0.2").shares == (
        ("chat", 0.5), ("summarize", 0.2), ("code", 0.3))
    assert classes.parse_mix("spec-bench") == classes.UNIFORM
    for text, says in [("chat:0.5,poetry:0.5", "unknown class 'poetry'"), ("chat:0.5,qa:0.4", "sum to 1"),
                       ("chat:-0.5,qa:1.5", "in [0, 1]"), ("chat", "look like"), ("chat:x", "must be a number"),
                       ("chat:0.5,chat:0.5", "given twice")]:
        with pytest.raises(InputError, match=says.replace("[", r"\[").replace("]", r"\]")):
            classes.parse_mix(text)


def test_the_shipped_class_levels_reproduce_the_class_lengths():
    p = presets.PRESETS[presets.DEFAULT_PRESET.lower()]
    model = presets.preset(p.name)
    for name, length in presets.class_lengths(p.name).items():
        shifted = model.with_top1_logit(model.top1_logit + model.class_offset(name))
        assert presets.expected_length(shifted, p.draft) == pytest.approx(length, abs=0.01), name


@pytest.mark.slow
def test_the_class_levels_refit_to_the_shipped_table():
    for name in (presets.DEFAULT_PRESET, "EAGLE-2/Qwen2.5-VL-7B"):
        fitted = presets.fit_class_logits(name)
        assert fitted == pytest.approx(presets.FITTED_CLASS_LOGIT[name], abs=2e-3)


def test_a_class_mix_moves_acceptance_as_its_categories_rank():
    lengths = {mix: _length(mix) for mix in ("chat:1", "summarize:1", "translate:1")}
    assert lengths["chat:1"] > lengths["summarize:1"] > lengths["translate:1"]
    assert lengths["translate:1"] / lengths["chat:1"] < 0.85  # Spec-Bench: 1.99x against 2.67x


def test_a_model_without_class_levels_serves_a_mix_as_no_mix():
    # iid acceptance has no class levels; the mix draws from its own stream, so nothing else moves either
    def length(mix):
        workload = {**AT_ONE["workload"], **({"mix": mix} if mix else {})}
        values = {**AT_ONE, "acceptance": "iid:0.6", "workload": workload}
        return experiment.run(config.build({}, values)).metrics["linear:k=3"]["spec_decode_acceptance_length"]
    assert length("code:1") == length(None)


def test_code_speculates_best():
    # HumanEval over MT-Bench for one EAGLE-3 head (vLLM PR 32628), on top of Spec-Bench's chat level
    assert classes.length_ratio("code") == pytest.approx(classes.length_ratio("chat") * 3.04 / 2.57)
    assert _length("code:1") > _length("chat:1")


def test_the_mix_draws_each_request_a_class_in_its_shares():
    values = {"workload": {"num_requests": 6000, "mix": "chat:0.5,code:0.3,rag:0.2"}}
    tasks = [r.task for r in experiment.resolve(config.build({}, values)).requests]
    shares = {name: tasks.count(name) / len(tasks) for name in ("chat", "code", "rag")}
    assert shares == pytest.approx({"chat": 0.5, "code": 0.3, "rag": 0.2}, abs=0.02)
    plain = experiment.resolve(config.build({}, {"workload": {"num_requests": 6000}})).requests
    assert [r.arrival_s for r in plain] == [r.arrival_s for r in experiment.resolve(
        config.build({}, values)).requests]  # the other streams do not move


def test_long_contexts_lower_acceptance_by_the_fitted_rule(tmp_path):
    model = AcceptanceModel(name="t", top1_logit=1.0, request_sigma=0.0, context_decay_logit=0.25,
                            context_knee_tokens=2000)
    rng = np.random.default_rng(0)
    logits = model.request_logits(rng, 4, context_tokens=[512, 2000, 4000, 18000])
    assert logits.tolist() == pytest.approx([1.0, 1.0, 0.5, -3.0])
    path = tmp_path / "a.json"
    save_acceptance(model, path, fitted_to="LLaVA-1.5-7B")
    assert load_acceptance(path) == model
    shifted = AcceptanceModel(name="c", top1_logit=0.5, class_logit=(("chat", 0.5), ("qa", -0.25)))
    save_acceptance(shifted, path, fitted_to="LLaVA-1.5-7B")
    assert load_acceptance(path) == shifted and json.loads(path.read_text())["model"]["class_logit"][0] == ["chat", 0.5]


@pytest.mark.parametrize("context, published", [(2048, 2.295), (8192, 1.687), (16384, 1.090)])
def test_the_eagle3_preset_follows_its_published_context_curve(context, published):
    # vllm-project/speculators PR 684: EAGLE-3 on Qwen3-8B, longbench-v2 truncated to each length. The preset's
    # fitted rule is within 0.10 of every point (0.10 at 8k, its worst); the simulator, serving 150 requests one
    # at a time, adds their sampling error (request spread 0.5 logit: about 0.03 in length at 2 s.e.): 0.13 in all
    values = {"model": "Qwen3-8B", "acceptance": "EAGLE-3/Qwen3-8B", "drafter": "eagle3", "policies": ["linear:k=3"],
              "workload": {"arrival": "poisson", "rate_per_s": 0.1, "num_requests": 150, "multimodal_share": 0.0,
                           "prompt_mean_tokens": float(context), "prompt_cv": 0.0, "output_mean_tokens": 128.0,
                           "output_cv": 0.0}}
    simulated = experiment.run(config.build({}, values)).metrics["linear:k=3"]["spec_decode_acceptance_length"]
    assert simulated == pytest.approx(published, abs=0.13)


def test_a_trace_column_gives_each_request_its_class(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("TIMESTAMP,ContextTokens,GeneratedTokens,task\n"
                    + "".join(f"2023-11-16 18:15:{40 + i:02d}.0000000,{100 + i},20,{c}\n"
                              for i, c in enumerate(["code", "", "translate", ""])))
    as_given = experiment.resolve(config.build({}, {"workload": {"arrival": "trace", "trace_path": str(path),
                                                                 "multimodal_share": 0.0}})).requests
    assert [r.task for r in as_given] == ["code", "", "translate", ""]
    mixed = experiment.resolve(config.build({}, {"workload": {"arrival": "trace", "trace_path": str(path),
                                                              "multimodal_share": 0.0, "mix": "qa:1"}})).requests
    assert [r.task for r in mixed] == ["code", "qa", "translate", "qa"]  # the mix fills the rows that give none


def test_a_fitted_depth_profile_reproduces_the_published_per_position_rates():
    # vllm-project/vllm PR 32628: a vanilla EAGLE-3 head at K=8; the simulator, serving one request at a time with
    # an 8-token chain, gives them back in spec_decode_per_position_acceptance_rates (the run folder's metrics)
    published = presets.POSITION_RATES["EAGLE-3/gpt-oss-120b"]
    values = {"acceptance": "EAGLE-3/gpt-oss-120b", "drafter": "eagle3", "policies": ["linear:k=8"],
              "workload": {"arrival": "poisson", "rate_per_s": 0.1, "num_requests": 150, "multimodal_share": 0.0,
                           "output_mean_tokens": 200.0}}
    results = experiment.run(config.build({}, values))
    from simspec.metrics import per_position_acceptance

    simulated = per_position_acceptance(results.logs[0])
    assert len(simulated) == 8
    assert simulated == pytest.approx(list(published), abs=0.025)


def test_the_depth_profile_refits_to_the_shipped_one():
    refit = presets.fit_preset("EAGLE-3/gpt-oss-120b")
    assert refit.top1_logit == pytest.approx(presets.FITTED_TOP1_LOGIT["EAGLE-3/gpt-oss-120b"], abs=1e-3)
    assert refit.depth_profile == pytest.approx(presets.DEPTH_PROFILES["EAGLE-3/gpt-oss-120b"], abs=2e-3)
    default = presets.preset(presets.DEFAULT_PRESET)
    assert default.depth_profile == () and default.fall[:3].tolist() == [0.0, 0.1, 0.2]  # depth_decay_logit x d
