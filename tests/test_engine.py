"""The live engine, the drafter and calibration from live runs."""

from __future__ import annotations

import json
from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simspec import policies  # noqa: E402
from simspec.acceptance import fit as acceptance_fit
from simspec.costs import steps as step_costs
from simspec.acceptance import AcceptanceModel, DraftContext  # noqa: E402
from simspec.costs import affine  # noqa: E402
from simspec.live import LiveConfig, LiveEngine  # noqa: E402
from simspec.live.run import live_workload  # noqa: E402
from simspec.models.drafter import Drafter, DrafterConfig, chain_attention, select_visual, unrolled_losses  # noqa: E402
from simspec.models.drafter_train import load_drafter, train_drafter  # noqa: E402
from simspec.models.task import generate  # noqa: E402
from simspec.models.train import batch_tensors, load_target  # noqa: E402
from simspec.types import InputError, Request  # noqa: E402
from simspec.workloads import WorkloadConfig  # noqa: E402

TARGET = "checkpoints/target"


@pytest.fixture(scope="module")
def target():
    torch.set_num_threads(1)
    model, vocab, _ = load_target(TARGET)
    return model, vocab


@pytest.fixture(scope="module")
def drafter(target):
    torch.manual_seed(0)
    return Drafter(DrafterConfig(), target[0]).eval()  # untrained: losslessness must not depend on it


@pytest.fixture(scope="module")
def workload(target):
    model, _ = target
    examples = generate(11, 9)
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=len(e.prompt_ids), image_tokens=(16,),
                        output_tokens=6 + 3 * i) for i, e in enumerate(examples)]
    greedy = {r.id: model.generate(torch.from_numpy(e.image), e.prompt_ids, r.output_tokens, eos_id=None)
              for r, e in zip(requests, examples)}
    return requests, examples, greedy


# -- the target's ragged tree forward ----------------------------------------------

def test_tree_forward_of_a_chain_equals_the_plain_forward(target):
    model, vocab = target
    example = generate(3, 1)[0]
    images, tokens, _ = batch_tensors([example], vocab)
    with torch.no_grad():
        plain = model(images, tokens)
        visual = model.encode_image(images)
        x = torch.cat([visual, model.embed(tokens)], 1)  # [1, N+T, C]
        n = x.shape[1]
        empty = [torch.zeros(1, 0, model.config.heads, model.config.width // model.config.heads)] * len(model.blocks)
        out = model.tree_forward(x, torch.arange(n)[None], torch.arange(-1, n - 1)[None], torch.tensor([n]),
                                 empty, empty, torch.tensor([0]), impl="reference")
    torch.testing.assert_close(out.hidden[:, visual.shape[1]:], plain.hidden, atol=1e-5, rtol=1e-5)


def test_tree_forward_sibling_branches_do_not_see_each_other(target):
    model, _ = target
    torch.manual_seed(1)
    c = model.config.width
    x = torch.randn(1, 3, c)
    heads, dim = model.config.heads, c // model.config.heads
    cache = [torch.randn(1, 5, heads, dim) for _ in model.blocks]
    with torch.no_grad():
        tree = model.tree_forward(x, torch.tensor([[5, 6, 6]]), torch.tensor([[-1, 0, 0]]), torch.tensor([3]),
                                  cache, cache, torch.tensor([5]), impl="reference")
        # node 2 alone on its path (root, node 2) must match the two-node chain
        chain = model.tree_forward(x[:, [0, 2]], torch.tensor([[5, 6]]), torch.tensor([[-1, 0]]), torch.tensor([2]),
                                   cache, cache, torch.tensor([5]), impl="reference")
    torch.testing.assert_close(tree.hidden[:, 2], chain.hidden[:, 1], atol=1e-5, rtol=1e-5)


# -- lossless serving ------------------------------------------------------------

@pytest.mark.parametrize("spec", ["ar", "linear:k=3", "tree:depth=3,topk=3,budget=10", "truncate", "marginal",
                                  "goodput", "batch_table"])
def test_every_policy_is_lossless(target, drafter, workload, spec):
    model, _ = target
    requests, examples, greedy = workload
    engine = LiveEngine(model, drafter, policies.parse(spec), affine(1.0, 0.05),
                        LiveConfig(max_num_seqs=4, max_num_batched_tokens=40))
    result = engine.serve(requests, examples, realtime=False)
    for r in requests:
        assert result.outputs[r.id] == greedy[r.id], f"request {r.id} under {spec}"
    assert result.log.complete
    assert sum(result.log.chunk_tokens) == sum(r.output_tokens for r in requests)
    if spec != "ar":
        assert len(result.log.round_accepted) > 0 and result.traces


@pytest.mark.parametrize("context", ["none", "selected:4", "pooled:4", "full"])
def test_lossless_with_every_visual_context(target, drafter, workload, context):
    model, _ = target
    requests, examples, greedy = workload
    engine = LiveEngine(model, drafter, policies.parse("linear:k=2"), affine(1.0, 0.05),
                        LiveConfig(max_num_seqs=3, drafter_context=context))
    result = engine.serve(requests[:4], examples[:4], realtime=False)
    assert all(result.outputs[r.id] == greedy[r.id] for r in requests[:4])


def test_steps_record_the_simulators_accounting(target, drafter, workload):
    model, _ = target
    requests, examples, _ = workload
    engine = LiveEngine(model, drafter, policies.parse("linear:k=3"), affine(1.0, 0.05), LiveConfig(max_num_seqs=4))
    result = engine.serve(requests, examples, realtime=False)
    decode_only = [s for s in result.steps if s.batch > 0 and s.vision_tokens == 0]
    assert decode_only
    for s in decode_only:  # linear:k=3: three calls; the first absorbs what each request accepted, then one row each
        assert s.draft_level_tokens[1:] == (s.batch,) * 2 and s.draft_level_tokens[0] >= s.batch
        assert s.forward_tokens >= 4 * s.batch - 3 * s.batch  # root + drafts, fewer near the end
        assert s.padded_kv_tokens % s.batch == 0 and s.padded_kv_tokens >= s.kv_read_tokens  # rows x the longest
        assert s.duration_s > 0
    # Every token a request committed before its last round is absorbed once:
    # its prompt, then each round's accepted tokens and bonus token (the
    # first output token is the prefill's, the last round's are never run).
    last = {int(i): int(n) for i, n in zip(result.log.chunk_request, result.log.chunk_tokens)}
    expected = sum(r.prompt_tokens + r.output_tokens - 1 - last[r.id] for r in requests)
    assert sum(s.draft_level_tokens[0] for s in result.steps if s.draft_level_tokens) == expected


def test_too_long_requests_are_rejected_and_the_rest_served(target, drafter, workload):
    model, _ = target
    requests, examples, greedy = workload
    long = Request(id=7, arrival_s=0.0, prompt_tokens=8, image_tokens=(16,), output_tokens=5000)
    mixed = [requests[0], long, requests[2]]
    engine = LiveEngine(model, drafter, policies.parse("linear:k=2"), affine(1.0, 0.05))
    result = engine.serve(mixed, [examples[0], examples[1], examples[2]], realtime=False)
    assert any(note.startswith("request 7 rejected") for note in result.log.notes)
    assert not result.log.complete
    assert result.outputs[requests[0].id] == greedy[requests[0].id]
    assert result.outputs[requests[2].id] == greedy[requests[2].id]


def test_an_image_of_the_wrong_size_is_refused_before_serving(target, drafter, workload):
    model, _ = target
    requests, examples, _ = workload
    big = examples[0].__class__(image=np.zeros((64, 64, 3), np.uint8), scene=examples[0].scene,
                                question=examples[0].question, prompt_ids=examples[0].prompt_ids,
                                answer_ids=examples[0].answer_ids, grounded=examples[0].grounded)
    engine = LiveEngine(model, drafter, policies.parse("ar"), affine(1.0, 0.05))
    with pytest.raises(InputError, match=r"request 0: image is \[64, 64, 3\]"):
        engine.serve(requests[:1], [big], realtime=False)


def test_ctrl_c_keeps_what_was_measured(target, drafter, workload):
    model, _ = target
    requests, examples, _ = workload
    calls = {"n": 0}

    def clock():  # the 40th reading of the clock raises, as a Ctrl-C would mid-run
        calls["n"] += 1
        if calls["n"] == 40:
            raise KeyboardInterrupt
        return calls["n"] * 1e-3

    engine = LiveEngine(model, drafter, policies.parse("linear:k=2"), affine(1.0, 0.05), LiveConfig(max_num_seqs=2))
    result = engine.serve(requests, examples, clock=clock, realtime=False)
    assert not result.log.complete and any("interrupted" in n for n in result.log.notes)
    assert 0 < len(result.steps) and sum(result.log.chunk_tokens) < sum(r.output_tokens for r in requests)


# -- drafter ----------------------------------------------------------------------

def test_drafter_gate_zero_equals_no_visual_context(target, drafter):
    model, vocab = target
    images, tokens, _ = batch_tensors(generate(4, 3), vocab)
    with torch.no_grad():
        trace = model.trace(images, tokens)
        valid = tokens != 0
        saved = drafter.cross_gate.data.clone()
        drafter.cross_gate.data.zero_()
        full, _, _ = unrolled_losses(drafter, trace, tokens, valid, DraftContext.parse("full"), 2)
        none, _, _ = unrolled_losses(drafter, trace, tokens, valid, DraftContext.parse("none"), 2)
        drafter.cross_gate.data.copy_(saved)
    torch.testing.assert_close(full, none)


def test_select_visual_keeps_k_of_the_images_tokens(target):
    model, vocab = target
    images, tokens, _ = batch_tensors(generate(4, 2), vocab)
    with torch.no_grad():
        trace = model.trace(images, tokens)
    for spec, k in (("selected:4", 4), ("pooled:4", 4), ("full", 16), ("none", 0), ("selected:32", 16)):
        kept, lengths = select_visual(DraftContext.parse(spec), trace.visual_hidden, trace.queries[:, :, -1],
                                      trace.visual_keys, impl="reference")
        assert kept.shape[1] == k and lengths.tolist() == [k, k]
    kept, _ = select_visual(DraftContext.parse("selected:4"), trace.visual_hidden, trace.queries[:, :, -1],
                            trace.visual_keys, impl="reference")
    rows = [[int(torch.nonzero((trace.visual_hidden[b] == kept[b, j]).all(-1))[0]) for j in range(4)] for b in range(2)]
    assert all(r == sorted(set(r)) for r in rows)  # distinct visual tokens, ascending as selection returns them


def test_chain_attention_with_no_chain_context_is_attention_over_the_cache():
    torch.manual_seed(2)
    q = torch.randn(1, 1, 2, 4)
    k = torch.randn(1, 3, 2, 4)
    v = torch.randn(1, 3, 2, 4)
    own_k, own_v = k[:, 2:3, None], v[:, 2:3, None]  # the node itself is the last key
    got = chain_attention(q, k[:, :2], v[:, :2], torch.tensor([2]), own_k, own_v)
    want = torch.nn.functional.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
    torch.testing.assert_close(got, want.transpose(1, 2), atol=1e-6, rtol=1e-6)


@pytest.mark.slow
def test_quick_drafter_training_is_reproducible_and_loads(tmp_path):
    metas = [train_drafter(tmp_path / name, TARGET, quick=True, progress=False) for name in ("a", "b")]
    assert (tmp_path / "a" / "drafter.pt").read_bytes() == (tmp_path / "b" / "drafter.pt").read_bytes()
    assert metas[0].loss_last < metas[0].loss_first
    model, _, _ = load_target(TARGET)
    load_drafter(tmp_path / "a", model, TARGET)
    (tmp_path / "a" / "drafter.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(InputError, match="drafter.pt"):
        load_drafter(tmp_path / "a", model)


def test_shipped_drafter_loads_and_beats_chance():
    model, _, _ = load_target(TARGET)
    drafter, meta = load_drafter("checkpoints/drafter", model, TARGET)
    acc = meta.acceptance_teacher_forced
    assert acc["selected:8"]["acceptance_length_linear"]["4"] > 2.0
    assert 0.5 < meta.selected8_share_of_full <= 1.2


# -- calibration --------------------------------------------------------------------

@pytest.mark.slow
def test_acceptance_fit_recovers_a_known_model(tmp_path):
    truth = AcceptanceModel(name="truth", top1_logit=1.2, depth_decay_logit=0.2, request_sigma=0.6, token_sigma=1.0,
                            confidence_sigma=0.4, tail_mass=0.5, tail_decay=0.4, visual_share=0.0)
    traces = acceptance_fit._model_traces(truth, 300, 10, 5, rng_seed=7)
    fitted = acceptance_fit.fit_acceptance(traces, depth=5)
    assert abs(fitted.top1_logit - truth.top1_logit) < 0.35
    live = acceptance_fit._trace_stats(traces, 5, np.array([0, 0.5, 1.01]))["rate"]
    sim = acceptance_fit._trace_stats(acceptance_fit._model_traces(fitted, 300, 10, 5, rng_seed=8), 5,
                                   np.array([0, 0.5, 1.01]))["rate"]
    assert np.max(np.abs(live - sim)) < 0.04
    path = tmp_path / "acc.json"
    acceptance_fit.save_acceptance(fitted, path, fitted_to="simspec-tiny-vlm")
    assert acceptance_fit.load_acceptance(path) == fitted == acceptance_fit.load_acceptance(path, "simspec-tiny-vlm")
    with pytest.raises(InputError, match="fitted to simspec-tiny-vlm's drafter; the run is of LLaVA-1.5-7B"):
        acceptance_fit.load_acceptance(path, "LLaVA-1.5-7B")
    path.write_text(json.dumps({"format": "other"}))
    with pytest.raises(InputError, match="format"):
        acceptance_fit.load_acceptance(path)


@pytest.mark.slow
def test_confidence_shape_is_fitted_apart_from_the_rank_tail():
    """A drafter whose second candidate gets 36% of the leftover confidence
    while the target's token is rank 2 in 72% of misses: the fitted model's
    confidences follow the former, its true ranks the latter."""
    truth = AcceptanceModel(name="truth", top1_logit=1.2, depth_decay_logit=0.2, request_sigma=0.6, token_sigma=1.0,
                            confidence_sigma=0.4, tail_mass=0.9, tail_decay=0.2, visual_share=0.0,
                            conf_tail_mass=0.45, conf_tail_decay=0.2)
    traces = acceptance_fit._model_traces(truth, 300, 10, 5, rng_seed=7)
    fitted = acceptance_fit.fit_acceptance(traces, depth=5)
    assert fitted.conf_tail[0] == pytest.approx(truth.conf_tail[0], abs=0.03)
    assert fitted.conf_tail[1] == pytest.approx(truth.conf_tail[1], abs=0.03)
    assert abs(fitted.tail[0] - truth.tail[0]) < 0.1 and fitted.tail[0] - fitted.conf_tail[0] > 0.25


def _steps(n: int, wake_s: float = 0.0, wake_tau_s: float = 1.0, seed: int = 0) -> list:
    """Step records of known costs (2 ms a step, 0.1 ms a token, 0.5 ms a
    drafter call, 20 us a drafter row), one run after another; with
    ``wake_s``, every tenth step follows an idle spell and it and the next
    step pay 80% and 20% of the wake cost."""
    from simspec.live.engine import StepRecord

    rng = np.random.default_rng(seed)
    steps, t, owed = [], 0.0, 0.0
    for k in range(n):
        b = int(rng.integers(1, 12))
        levels = tuple([b] * int(rng.integers(0, 4)))
        tokens = b * (1 + len(levels))
        idle = float(rng.uniform(0.01, 3.0)) if wake_s and k % 10 == 5 else 0.0
        wake = wake_s * -np.expm1(-idle / wake_tau_s)
        duration = 0.002 + 1e-4 * tokens + 5e-4 * len(levels) + 2e-5 * sum(levels) + 0.8 * wake + owed
        owed = 0.2 * wake
        t += idle
        steps.append(StepRecord(start_s=t, duration_s=duration, idle_s=idle, forward_tokens=tokens, kv_read_tokens=0,
                                attn_pairs=0, attn_requests=b, logit_tokens=tokens, vision_tokens=0,
                                draft_level_tokens=levels, draft_kept_visual_tokens=0, select_requests=0,
                                select_visual_tokens=0, batch=b, plans=(0, 0, 0)))
        t += duration
    return steps


def test_step_cost_fit_recovers_coefficients(tmp_path):
    model, report = step_costs.fit_step_costs(_steps(200), "test", model="simspec-tiny-vlm", device="cpu-test")
    assert report.median_abs_pct_error < 1.0
    assert model.calibrated and model.wake_s == 0.0  # no idle spell, no wake cost
    step_costs.save_step_costs(report, tmp_path / "c.json")
    again = step_costs.load_step_costs(tmp_path / "c.json")
    assert again.overhead_s == pytest.approx(model.overhead_s)


def test_step_cost_fit_takes_the_wake_cost_from_steps_after_idle_spells(tmp_path):
    steps = _steps(400, wake_s=0.08, wake_tau_s=0.5)
    model, report = step_costs.fit_step_costs(steps, "test", model="simspec-tiny-vlm", device="cpu-test")
    assert report.wake.steps == 40
    assert (model.wake_s, model.wake_tau_s, model.wake_next_share) == pytest.approx((0.08, 0.5, 0.2), rel=0.02)
    assert model.overhead_s == pytest.approx(0.002, rel=0.02)  # the spells did not leak into the per-step cost
    assert report.median_abs_pct_error < 1.0 and abs(report.total_time_error_pct) < 1.0
    step_costs.save_step_costs(report, tmp_path / "c.json")
    again = step_costs.load_step_costs(tmp_path / "c.json")
    assert again.wake_cost_s(1.0) == pytest.approx(model.wake_cost_s(1.0)) and model.wake_cost_s(1.0) > 0.06


def test_steps_record_how_long_the_engine_sat_idle_before_them(target, drafter, workload):
    model, _ = target
    requests, examples, _ = workload
    pair = [replace(requests[0], arrival_s=0.0), replace(requests[1], arrival_s=5.0)]
    ticks = {"n": 0}

    def clock():  # 1 ms a reading: the same run every time
        ticks["n"] += 1
        return ticks["n"] * 1e-3

    engine = LiveEngine(model, drafter, policies.parse("ar"), affine(1.0, 0.05), LiveConfig(max_num_seqs=2))
    result = engine.serve(pair, examples[:2], clock=clock)
    woke = [s for s in result.steps if s.idle_s > 0]
    assert len(woke) == 2 and woke[0] is result.steps[0]  # the first step, and B's prefill after A finished
    a_done = result.log.requests[0].finish_s
    assert woke[1].start_s >= 5.0 and woke[1].vision_tokens == 16
    assert woke[1].idle_s == pytest.approx(woke[1].start_s - a_done, abs=0.005)


def test_live_workload_is_deterministic_and_fits_the_model():
    cfg = WorkloadConfig(arrival="gamma", rate_per_s=5.0, num_requests=20)
    a, ea = live_workload(cfg, 3)
    b, eb = live_workload(cfg, 3)
    assert a == b and [e.prompt_ids for e in ea] == [e.prompt_ids for e in eb]
    assert all(r.prompt_tokens == len(e.prompt_ids) and r.visual_tokens == 16 for r, e in zip(a, ea))
    c, _ = live_workload(cfg, 4)
    assert [r.arrival_s for r in a] != [r.arrival_s for r in c]


def test_auto_serves_with_the_reference_kernels_on_a_cpu(target, drafter):
    model, _ = target
    engine = LiveEngine(model, drafter, policies.parse("ar"), affine(1.0, 0.05), LiveConfig(impl="auto"))
    assert engine.config.impl == "reference"  # never the Triton interpreter the kernel tests switch on
