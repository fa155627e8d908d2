"""``simspec calibrate vllm`` on the committed vLLM fixtures (tests/data/vllm/,
no vLLM needed): the step fit's held-out error, the acceptance file against
the counters, the folder used by ``simspec simulate``, determinism, bad input."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from conftest import invoke
from simspec.acceptance import load_acceptance
from simspec.costs.steps import fit_iteration_costs
from simspec.vllm.logs import read_metrics, read_server_log

DATA = Path(__file__).resolve().parent / "data" / "vllm"
LOG, METRICS = DATA / "serve_ngram.log", DATA / "metrics_ngram.txt"
BENCHES = [DATA / "bench_ngram.json", DATA / "bench_ar.json"]
DEVICE = "cpu-amd-epyc"  # the fixtures' machine (AMD EPYC, 2 vCPUs); simspec knows it from a profile meta.json only
STAND_IN = "Llama-2-7B"  # a text-only spec whose 4096-token context holds the fixtures' 128-token requests


@pytest.fixture
def device(tmp_path, monkeypatch):
    """The fixtures' CPU as simspec knows a device without a datasheet: a
    profiles folder with its meta.json (name and memory; the KV cache is the
    server's own, --kv-cache-tokens)."""
    root = tmp_path / "profiles"
    (root / DEVICE / STAND_IN).mkdir(parents=True)
    (root / DEVICE / STAND_IN / "meta.json").write_text(json.dumps(
        {"device": "AMD EPYC", "device_slug": DEVICE, "memory_bytes": 25275990016, "model": STAND_IN}))
    monkeypatch.setenv("SIMSPEC_PROFILES", str(root))
    return DEVICE


def calibrate(out: Path, *extra) -> tuple[int, str, str]:
    argv = ["calibrate", "vllm", "--log", LOG, "--metrics", METRICS, "--model", STAND_IN, "--device", DEVICE,
            "--out", out, "--sim-seeds", "1", *extra]
    return invoke(argv + [a for b in BENCHES for a in ("--bench", b)])


def test_the_fit_recovers_its_own_terms_exactly():
    rng = np.random.default_rng(0)
    tokens, requests = rng.integers(1, 400, 60), rng.integers(1, 30, 60)
    elapsed = 0.04 + 0.0035 * tokens + 0.001 * requests
    _, fit, held = fit_iteration_costs(tokens, requests, elapsed, "synthetic", model="m", device="d")
    for name, want in (("overhead", 0.04), ("target_token", 0.0035), ("attn_request", 0.001)):
        assert fit.coefficients_s[name] == pytest.approx(want, rel=1e-9)
    assert held.held_out_steps == 12 and held.median_pct < 1e-6


def test_the_fit_prices_right_tailed_steps_unbiased_in_total():
    """Steps of one shape with a right tail (a slow step now and then, as
    on a shared CPU): the relative-error fit alone sits near their median
    and prices their sum short; the fitted level prices the sum."""
    rng = np.random.default_rng(1)
    tokens, requests = rng.integers(1, 400, 2000), rng.integers(1, 30, 2000)
    typical = 0.04 + 0.0035 * tokens + 0.001 * requests
    slow = rng.random(2000) < 0.05  # one step in 20 takes twice as long
    elapsed = typical * np.where(slow, 2.0, 1.0) * rng.lognormal(0.0, 0.03, 2000)
    _, fit, held = fit_iteration_costs(tokens, requests, elapsed, "tailed", model="m", device="d")
    x = np.stack([np.ones(2000), tokens, requests], axis=1)
    c = fit.coefficients_s
    predicted = x @ np.array([c["overhead"], c["target_token"], c["attn_request"]])
    fitted = np.arange(2000) % 5 != 4
    assert predicted[fitted].sum() == pytest.approx(elapsed[fitted].sum(), rel=1e-9)
    assert predicted[~fitted].sum() == pytest.approx(elapsed[~fitted].sum(), rel=0.02)  # the held-out steps too
    assert np.median(predicted / typical) > 1.03  # the price of the tail: typical steps priced above their median


def test_held_out_error_is_printed_stored_and_within_what_the_log_allows(tmp_path, device):
    code, out, err = calibrate(tmp_path / "cal")
    assert code == 0, err
    stored = json.loads((tmp_path / "cal" / "calibration.json").read_text())["step_fit"]["held_out"]
    printed = re.search(r"held-out error: median ([\d.]+)%, p90 ([\d.]+)%", out)
    assert printed and float(printed[1]) == pytest.approx(stored["median_pct"], abs=0.05)
    assert float(printed[2]) == pytest.approx(stored["p90_pct"], abs=0.05)
    assert json.loads((tmp_path / "cal" / "step_costs.json").read_text())["held_out"] == stored
    # What the data allows: steps of one shape (tokens, sequences) differ by this much among themselves ...
    a = read_server_log(LOG).arrays()
    shape = list(zip((a.prefill_tokens + a.decode_tokens)[1:], (a.prefill_requests + a.decode_requests)[1:]))
    ms = a.elapsed_ms[1:]
    spread = [abs(m / np.median([x for s, x in zip(shape, ms) if s == key]) - 1) * 100
              for key, m in zip(shape, ms) if shape.count(key) > 1]
    floor = float(np.median(spread))
    # ... and pricing every held-out step at the fitted steps' median time errs by this much.
    held = np.arange(len(ms)) % 5 == 4
    constant = float(np.median(np.abs(np.median(ms[~held]) / ms[held] - 1)) * 100)
    assert stored["held_out_steps"] == held.sum() and stored["fitted_steps"] == (~held).sum()
    assert stored["median_pct"] < constant / 2, (stored, constant)  # 7.6% vs 22.9% here
    assert stored["median_pct"] < 3 * floor + 2, (stored, floor)  # same-shape steps: a median 2.8% apart
    assert stored["p90_pct"] >= stored["median_pct"]


def test_the_acceptance_file_holds_the_counters_ratios(tmp_path, device):
    assert calibrate(tmp_path / "cal")[0] == 0
    counters = read_metrics(METRICS).spec_decode
    record = json.loads((tmp_path / "cal" / "acceptance.json").read_text())
    ratios = [a / counters.num_drafts for a in counters.accepted_per_position]
    assert record["source"]["per_position_rates"] == ratios
    assert record["source"]["draft_tokens_per_draft"] == counters.draft_tokens / counters.num_drafts
    assert record["source"]["acceptance_length"] == 1 + counters.accepted_tokens / counters.num_drafts
    # The model's own chain rates (checked by drawing from it, not by the fit's formula) are the counters' ratios.
    model = load_acceptance(tmp_path / "cal" / "acceptance.json", STAND_IN)
    rng = np.random.default_rng(1)
    z = model.top1_logit + model.request_sigma * rng.standard_normal(200_000)
    p = 1 / (1 + np.exp(-(z[:, None] - model.depth_decay_logit * np.arange(3))))
    chains = np.cumprod(rng.random(p.shape) < p, axis=1).mean(axis=0)
    assert np.max(np.abs(chains - ratios)) < 0.02, (chains, ratios)


def test_the_folder_runs_in_simulate(tmp_path, device):
    code, out, err = calibrate(tmp_path / "cal")
    assert code == 0, err
    line = re.search(r"use it: simspec (simulate .*)", out)[1]
    code, sim_out, sim_err = invoke(line.split() + ["--num-requests", "30", "--rate", "1", "--quiet"])
    assert code == 0, sim_err
    assert "fitted to vLLM 0.32.0 iteration log" in sim_out and "calibrated:vllm-ngram" in sim_out
    assert re.search(r"linear:k=3 .* 2\.\d\d ", sim_out), sim_out


def test_same_inputs_same_bytes(tmp_path, device):
    out = tmp_path / "cal"
    assert calibrate(out)[0] == 0
    first = {p.name: p.read_bytes() for p in out.iterdir()}
    assert calibrate(out)[0] == 0
    assert {p.name: p.read_bytes() for p in out.iterdir()} == first
    assert sorted(first) == ["acceptance.json", "calibration.json", "simspec-run.json", "step_costs.json"]


def test_bad_input_is_one_line_and_writes_nothing(tmp_path, device):
    no_spec = tmp_path / "metrics.txt"
    no_spec.write_text("\n".join(line for line in METRICS.read_text().splitlines() if "spec_decode" not in line))
    other = tmp_path / "bench.json"
    other.write_text(json.dumps({**json.loads(BENCHES[0].read_text()), "model_id": "another/model"}))
    for argv, says in ((["--metrics", no_spec], "no vllm:spec_decode_* counters"),
                       (["--bench", other], "a benchmark of model 'another/model'")):
        args = ["calibrate", "vllm", "--log", LOG, "--metrics", METRICS, "--model", STAND_IN, "--device", DEVICE,
                "--out", tmp_path / "cal", *argv]
        code, _, err = invoke(args)
        assert code == 2 and err.startswith("simspec: error: ") and err.count("\n") == 1 and says in err, err
        assert not (tmp_path / "cal").exists()


@pytest.mark.parametrize("rates", [(0.831, 0.658, 0.529),  # the fixture's ngram counters
                                   (0.20, 0.19, 0.18)])  # a draft that copies whole runs or nothing (bimodal)
def test_the_simulator_reproduces_the_counters_it_was_fitted_to(rates):
    """vLLM's per-position rates are averaged over drafts, and a request that
    accepts little drafts more often: the mapping must weight difficulties as
    the simulator's rounds do, so a simulation with the fitted model reports
    the counters' rates back."""
    from simspec import metrics, policies
    from simspec.serving import modes
    from simspec.vllm.acceptance import fit_chain_acceptance
    from simspec.costs.steps import FEATURES, cost_model_from
    from simspec.serving.config import EngineConfig
    from simspec.sim import simulate
    from simspec.types import Request
    from simspec.vllm.logs import SpecDecodeCounters

    drafts = 10_000
    per_position = tuple(round(r * drafts) for r in rates)
    counters = SpecDecodeCounters(num_drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=sum(per_position),
                                  accepted_per_position=per_position)
    chain = fit_chain_acceptance(counters, 3, "test")
    requests = [Request(id=i, arrival_s=0.5 * i, prompt_tokens=64, output_tokens=200) for i in range(300)]
    costs = cost_model_from(dict.fromkeys(FEATURES, 0.0) | {"overhead": 0.01}, "10 ms a step")
    engine = EngineConfig(**modes.preset("vllm", "cpu"), kv_cache_tokens=1 << 20)
    log = simulate(requests, policy=policies.parse("linear:k=3"), costs=costs, acceptance=chain.model, engine=engine,
                   kv_budget_tokens=1 << 20, seed=0)
    simulated = metrics.summarize_full(log)
    assert simulated["spec_decode_per_position_acceptance_rates"][:3] == pytest.approx(rates, abs=0.02)
    assert simulated["spec_decode_acceptance_length"] == pytest.approx(counters.acceptance_length, rel=0.02)


def _simulated_rounds(model, requests: int = 300, output: int = 64):
    """Each simulated request's tokens a round after its first token (one chunk a round)."""
    from simspec import policies
    from simspec.serving import modes
    from simspec.costs.steps import FEATURES, cost_model_from
    from simspec.serving.config import EngineConfig
    from simspec.sim import simulate
    from simspec.types import Request

    reqs = [Request(id=i, arrival_s=0.5 * i, prompt_tokens=64, output_tokens=output) for i in range(requests)]
    costs = cost_model_from(dict.fromkeys(FEATURES, 0.0) | {"overhead": 0.01}, "10 ms a step")
    engine = EngineConfig(**modes.preset("vllm", "cpu"), kv_cache_tokens=1 << 20)
    log = simulate(reqs, policy=policies.parse("linear:k=3"), costs=costs, acceptance=model, engine=engine,
                   kv_budget_tokens=1 << 20, seed=0)
    chunks = np.bincount(log.chunk_request, minlength=requests) - 1  # the first chunk is the prefill's token
    return (output - 1) / chunks, log


def test_the_round_term_reproduces_the_requests_spread_it_was_fitted_to():
    """vLLM's flat per-position rates (a draft that copies the target's runs)
    fit either a huge per-request spread (requests that accept everything or
    nothing) or rounds that are all or nothing; the benchmark's per-request
    chunks tell them apart. Fitted to rates and a spread of tokens a round,
    a simulation must report both back, and the fit without the spread must
    miss the spread (the test can tell the two apart)."""
    from simspec import metrics
    from simspec.vllm.acceptance import RequestRounds, fit_chain_acceptance
    from simspec.vllm.logs import SpecDecodeCounters

    rates, spread = (0.22, 0.195, 0.17), 0.64  # the first vLLM validation's distilled draft
    drafts = 10_000
    per_position = tuple(round(r * drafts) for r in rates)
    counters = SpecDecodeCounters(num_drafts=drafts, draft_tokens=3 * drafts, accepted_tokens=sum(per_position),
                                  accepted_per_position=per_position)
    after = np.full(100, 63.0)
    z = np.linspace(-1.0, 1.0, 100)
    per_round = 1.0 + sum(rates) + spread * z / z.std(ddof=1)
    per_round *= counters.acceptance_length / (after.sum() / (after / per_round).sum())  # pooled as the counters
    rounds = RequestRounds(tokens_per_round=per_round, tokens_after_first=after)
    chain = fit_chain_acceptance(counters, 3, "test", rounds)
    assert chain.spread_unused is None and chain.model.round_sigma > 1.0
    assert chain.spread[1] == pytest.approx(rounds.spread, rel=0.02)
    simulated, log = _simulated_rounds(chain.model)
    assert simulated.std(ddof=1) == pytest.approx(rounds.spread, rel=0.12)
    summary = metrics.summarize_full(log)
    assert summary["spec_decode_per_position_acceptance_rates"][:3] == pytest.approx(rates, abs=0.02)
    without = fit_chain_acceptance(counters, 3, "test")
    assert without.model.round_sigma == 0.0
    assert _simulated_rounds(without.model)[0].std(ddof=1) > 1.5 * rounds.spread


def test_the_spread_is_left_out_where_rounds_are_not_drafts():
    """ngram drafts fewer than K tokens and some rounds none: the chunks'
    tokens a round are not the counters' acceptance length, so the spread
    must not shape the fit (and the model has no round term)."""
    from simspec.vllm.acceptance import RequestRounds, fit_chain_acceptance
    from simspec.vllm.logs import SpecDecodeCounters

    counters = SpecDecodeCounters(num_drafts=1000, draft_tokens=2620, accepted_tokens=1019,
                                  accepted_per_position=(552, 282, 185))
    rounds = RequestRounds(tokens_per_round=np.linspace(1.2, 2.4, 50), tokens_after_first=np.full(50, 63.0))
    chain = fit_chain_acceptance(counters, 3, "test", rounds)
    assert chain.model.round_sigma == 0.0 and "2.62 of 3 tokens" in chain.spread_unused
    full = SpecDecodeCounters(num_drafts=1000, draft_tokens=3000, accepted_tokens=1019,
                              accepted_per_position=(552, 282, 185))
    chain = fit_chain_acceptance(full, 3, "test", rounds)
    assert chain.model.round_sigma == 0.0 and "differ from the counters' acceptance length" in chain.spread_unused


def test_saturated_benchmarks_give_the_engines_time_outside_the_logged_steps(tmp_path, device):
    """calibrate vllm places each saturated benchmark in the log by the
    clock (its end date less its duration) and fits the engine's time
    outside the logged steps to them: the same steps and the same gap as
    validate, which recorded each run's iteration range while serving."""
    from simspec.validation import vllm as vv
    from simspec.vllm.logs import steps_during

    quick = Path(__file__).parent / "data" / "vllm" / "validate_quick"
    _, runs, logs, _ = vv.load_runs(quick)
    for r in runs:  # the recorded steps, and at most a few more of the seconds at either end (tiny steps: ms)
        if r.phase != "warmup":
            window, recorded = [s.index for s in steps_during(logs[r.method], r.bench)], [s.index for s in r.steps]
            assert set(recorded) <= set(window) and len(window) - len(recorded) <= 3, r.bench.path
    recorded = vv.fit_gap([r for r in runs if r.method == "none" and r.phase == "calibration"])
    benches = [str(quick / "none" / f"{name}.json") for name in ("cal-sat4", "cal-sat16", "cal-light", "low-r0")]
    code, out, err = invoke(["calibrate", "vllm", "--log", str(quick / "none" / "server.log"),
                             "--metrics", str(quick / "none" / "low-r0.metrics.after.txt"), "--model", STAND_IN,
                             "--device", device, "--out", str(tmp_path / "cal"), "--sim-seeds", "1"]
                            + [a for b in benches for a in ("--bench", b)])
    assert code == 0, err
    assert "outside the logged steps (scheduling" in out
    stored = json.loads((tmp_path / "cal" / "step_costs.json").read_text())["outside_elapsed"]
    assert stored["runs"] == ["cal-sat4.json", "cal-sat16.json"]  # the saturated ones only
    assert stored["per_step_s"] == pytest.approx(recorded.per_step_s, rel=1e-9)
    assert stored["per_sequence_s"] == pytest.approx(recorded.per_sequence_s, rel=1e-9)
    fit = json.loads((tmp_path / "cal" / "calibration.json").read_text())["step_fit"]["coefficients_s"]
    costs = json.loads((tmp_path / "cal" / "step_costs.json").read_text())["coefficients_s"]
    assert costs["overhead"] == pytest.approx(fit["overhead"] + recorded.per_step_s, rel=1e-9)


def test_the_pooled_tokens_a_rounds_standard_error_is_how_far_other_prompts_move_it():
    """RequestRounds.relative_se from one set of requests must predict how
    far the pooled tokens a round of other sets of the same size, drawn
    from the same population, scatter around the population's."""
    from simspec.vllm.acceptance import RequestRounds

    rng = np.random.default_rng(5)
    population_rate = rng.gamma(4.0, 0.4, 200_000) + 1.0  # tokens a round per request, skewed as copying drafts are
    population_after = rng.integers(24, 72, 200_000).astype(float)
    pooled, predicted = [], []
    for _ in range(2000):
        pick = rng.integers(0, len(population_rate), 24)
        rounds = RequestRounds(tokens_per_round=population_rate[pick], tokens_after_first=population_after[pick])
        pooled.append(rounds.pooled)
        predicted.append(rounds.relative_se)
    scatter = np.std(pooled, ddof=1) / np.mean(pooled)
    assert np.mean(predicted) == pytest.approx(scatter, rel=0.1)
    assert 0.02 < scatter < 0.2  # a real spread: the test could tell a wrong formula (a factor sqrt(n)) apart
