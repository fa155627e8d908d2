"""Does the answer survive (simspec.sensitivity): the run's policies again at
the acceptance range's ends, "robust" or the end where another policy wins."""

from __future__ import annotations

import pytest

from conftest import invoke
from simspec import config, experiment, sensitivity
from simspec.acceptance import presets


def _results(**values):
    return experiment.run(config.build({}, {"workload": {"num_requests": 200}, **values}))


def test_the_ends_are_the_stated_share_of_the_acceptance_length():
    model = presets.preset(presets.DEFAULT_PRESET)
    draft = presets.PRESETS[presets.DEFAULT_PRESET.lower()].draft
    own = presets.expected_length(model, draft)
    for scale in (0.9, 1.1):
        moved = model.with_top1_logit(sensitivity.shifted_logit(model, scale))
        assert presets.expected_length(moved, draft) == pytest.approx(own * scale, abs=0.01)


def test_a_clear_winner_is_robust():
    result = sensitivity.check(_results(policies=["ar", "linear:k=3", "marginal"]))
    assert result.robust and result.best == "marginal" and all(end.best == "marginal" for end in result.ends)
    assert result.line().startswith("sensitivity: robust: marginal")


def test_a_close_call_names_the_end_where_another_policy_wins():
    # i.i.d. acceptance 0.3: AR beats a 2-token chain at the model's level, and loses to it at 1.3x
    result = sensitivity.check(_results(acceptance="iid:0.3", policies=["ar", "linear:k=2"]), spread=0.3)
    assert not result.robust and result.best == "ar"
    low, high = result.ends
    assert low.best == "ar" and high.best == "linear:k=2"
    assert "at 1.30x the acceptance length linear:k=2 wins" in result.line()


def test_cli_prints_the_sensitivity_line():
    code, out, err = invoke(["simulate", "--num-requests", "100", "--policy", "ar", "--policy", "linear:k=3",
                             "--quiet", "--sensitivity"])
    assert code == 0, err
    assert "sensitivity: robust: linear:k=3" in out and "0.90x, 1x and 1.10x" in out


def _tuned(cost_model: str, accept: str):
    from simspec import tune

    base = config.build(flag_values={"cost_model": cost_model, "acceptance": accept, "workload": {
        "num_requests": 20, "multimodal_share": 0.0, "prompt_mean_tokens": 16, "output_mean_tokens": 64}})
    tc = tune.TuneConfig(rates_per_s=(0.05,), cvs=(1.0,), families=("linear", "truncate"), trials=4, search_seeds=1,
                         confirm_seeds=2, top=1, saturation_requests=50)
    return tune.tune(base, tc), tc


def test_tune_sensitivity_keeps_a_clear_winner_and_moves_the_acceptance():
    from simspec.tune.search import Bench, cell_config, sensitivity

    tuned, tc = _tuned("constant:10", "iid:0.8")  # free tokens: the longest chain wins at any acceptance
    cell = tuned.cells[0]
    lines = sensitivity(tuned, tc, 0.2)
    assert len(lines) == 1 and lines[0].startswith("sensitivity, load ") and "robust: " + cell.best.spec in lines[0]
    assert "0.80x, 1x and 1.20x" in lines[0]
    config_ = cell_config(tuned.scenario, cell.rate_per_s, cell.cv)
    seed = tuned.confirm_seeds[0]
    own = Bench(config_, tc).run(cell.best.spec, seed).value
    level = experiment.resolve(tuned.scenario).acceptance.top1_logit
    lower = Bench(config_, tc, top1_logit=level - 1.0).run(cell.best.spec, seed).value
    assert lower > own  # less acceptance, longer latency: the ends are really served at another level


def test_cli_tune_prints_a_sensitivity_line_a_cell(tmp_path):
    code, out, err = invoke(["tune", "--num-requests", "20", "--cost-model", "constant:10", "--acceptance", "iid:0.8",
                             "--rates", "0.05", "--families", "linear", "--trials", "2", "--search-seeds", "1",
                             "--confirm-seeds", "2", "--top", "1", "--quiet", "--sensitivity", "--out",
                             str(tmp_path / "t.toml")])
    assert code == 0, err
    assert sum(line.startswith("sensitivity, load ") for line in out.splitlines()) == 1
