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
