"""The one scheduler and acceptance estimate (simspec.serving), alone and
as the simulator and the live engine run it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from simspec.serving import estimate
from simspec.serving.estimate import Estimate
from simspec.serving.queues import Prefill
from simspec.serving.scheduler import Scheduler

REPO = Path(__file__).resolve().parents[1]


def scheduler(context, output, *, seqs=8, tokens=64, kv=10_000, reserve=1, visual=None) -> Scheduler:
    context = np.array(context)
    return Scheduler(context=context, visual=np.array(visual if visual is not None else [0] * len(context)),
                     output=np.array(output), max_num_seqs=seqs, max_num_batched_tokens=tokens,
                     kv_budget_tokens=kv, reserve_tokens=reserve)


def test_admission_is_fcfs_under_the_sequence_limit_and_the_kv_budget():
    s = scheduler([10, 10, 10, 10], [5] * 4, seqs=3, kv=25)
    for i in range(4):
        s.arrive(i)
    assert s.admit() == [0, 1]  # 11 + 11 fit 25; the third needs 11 more
    assert list(s.waiting) == [2, 3]
    s = scheduler([10, 10, 10, 10], [5] * 4, seqs=3)
    for i in range(4):
        s.arrive(i)
    assert s.admit() == [0, 1, 2] and s.admit() == []


def test_decode_rounds_come_first_and_prefill_chunks_fill_the_rest_of_the_budget():
    s = scheduler([30, 50, 40], [5] * 3, tokens=64)
    for i in range(3):
        s.arrive(i)
    s.admit()
    s.cache[0] = 30  # request 0 has prefilled and drafted 3 tokens last round
    s.drafted[0] = 3
    decode, _, _ = s.decode_batch()
    assert decode.tolist() == [0]
    assert s.prefill_chunks(decode) == [(1, 50), (2, 10)]  # 64 - (1 + 3) = 60 tokens, FCFS


def test_prefill_pairs_are_causal_and_the_vision_encoder_runs_on_a_prefill_start():
    s = scheduler([40, 30], [5, 5], visual=[16, 8])
    s.cache[0] = 10  # 10 of request 0's prompt already in its cache
    assert s.prefill([(0, 6), (1, 4)]) == Prefill(tokens=10, attn_pairs=6 * 10 + 21 + 10, kv_tokens=16 + 4,
                                                  requests=2, vision_tokens=8, max_context=10)


def test_the_newest_request_is_preempted_and_recomputes_what_it_emitted():
    s = scheduler([10, 10, 10], [20] * 3, kv=40, reserve=4)
    for i in range(3):
        s.arrive(i)
    assert s.admit() == [0, 1, 2]
    s.cache[:] = 12
    s.emitted[:] = 2
    decode, preempted, requeued = s.decode_batch()  # 3 x 12 + 3 x 4 = 48 > 40: request 2 goes
    assert preempted == [2] and requeued == [] and decode.tolist() == [0, 1]
    assert s.cache[2] == 0 and s.target[2] == 12 and list(s.waiting) == [2]


def test_a_request_sent_back_before_its_prefill_ran_is_not_a_preemption():
    s = scheduler([10, 10, 10], [20] * 3, kv=40, reserve=4)
    for i in range(3):
        s.arrive(i)
    s.admit()
    s.cache[:2] = 12  # 0 and 1 decode; 2 was admitted but nothing of it ran
    s.emitted[:2] = 2
    decode, preempted, requeued = s.decode_batch()  # 12 + 12 + 10 held + 2 x 4 = 42 > 40
    assert preempted == [] and requeued == [2] and decode.tolist() == [0, 1]


def test_vllm_admits_only_while_a_first_chunk_fits_the_token_budget():
    s = scheduler([30, 50, 40], [5] * 3, tokens=64)
    for i in range(3):
        s.arrive(i)
    assert s.admit(token_budget=60) == [0, 1]  # 60 - 30 = 30 > 0 admits 1; 30 - 50 < 0 stops
    assert s.admit(token_budget=80) == []  # 80 - (30 + 50) still to prefill = 0: no room for 2's first chunk
    assert s.admit(token_budget=81) == [2]


def test_completed_prefills_emit_their_first_token_and_finished_requests_retire():
    s = scheduler([8, 8], [1, 3])
    s.arrive(0)
    s.arrive(1)
    s.admit()
    assert s.complete_prefill([(0, 8), (1, 5)]) == [0]
    assert s.emitted.tolist() == [1, 0] and s.retire() == [0] and s.running == [1]


def test_the_estimate_moves_toward_each_round_and_relaxes_without_drafts():
    e = Estimate(2, top1=0.5)
    assert e.population[0] == 1.0  # p / (1 - p)
    e.start(0)
    e.after_round(0, drafted=3, accepted=1, depth=3)
    w = estimate.RECENT_WEIGHT
    assert e.recent[0] == pytest.approx((1 - w) * 1.0 + w * 1.0)
    e.after_round(0, drafted=3, accepted=3, depth=3)  # censored: at least 3, plus the estimate beyond
    assert e.recent[0] == pytest.approx((1 - w) * 1.0 + w * (3 + 1.0))
    before = e.recent[0]
    e.after_round(0, drafted=0, accepted=0, depth=0)
    r = estimate.RELAX_WEIGHT
    assert e.recent[0] == pytest.approx((1 - r) * before + r * e.population[0])


def test_the_scheduling_module_imports_neither_simpy_nor_torch():
    code = ("import sys, simspec.serving, simspec.acceptance.context; "
            "assert 'simpy' not in sys.modules and 'torch' not in sys.modules, sorted(sys.modules)")
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


# -- the simulator and the live engine decide alike -------------------------------------------

def _step_index(starts: np.ndarray, times: np.ndarray, side: str) -> list[int]:
    return (np.searchsorted(starts, times, side=side) - 1).tolist()


def _serve_both(requests, examples, *, live_config, engine):
    """The live engine's log and outputs, and the simulator's log, for one
    event sequence (every request at t=0, AR)."""
    torch = pytest.importorskip("torch")

    from simspec import costs, policies
    from simspec.acceptance import AcceptanceModel
    from simspec.live import LiveEngine
    from simspec.models.drafter import Drafter, DrafterConfig
    from simspec.models.train import load_target
    from simspec.sim import simulate

    torch.set_num_threads(1)
    target, _, _ = load_target(REPO / "checkpoints" / "target")
    drafter = Drafter(DrafterConfig(), target).eval()
    ticks = iter(range(1, 10**9))
    live = LiveEngine(target, drafter, policies.parse("ar"), costs.affine(1.0, 0.05), live_config).serve(
        requests, examples, realtime=False, clock=lambda: next(ticks) * 1e-6)
    sim = simulate(requests, policy=policies.parse("ar"), costs=costs.constant(10.0),
                   acceptance=AcceptanceModel.iid(0.5), engine=engine, kv_budget_tokens=engine.kv_cache_tokens, seed=0)
    return live, sim


def _same_decisions(live, sim) -> None:
    """The same decode batch every step, and every request admitted, given
    its first token and finished in the same step."""
    assert live.step_batch.tolist() == sim.step_batch.tolist()
    for name, side in (("admitted_s", "right"), ("first_token_s", "left"), ("finish_s", "left")):
        got = [_step_index(log.step_start_s, np.array([getattr(r, name) for r in log.requests]), side)
               for log in (live, sim)]
        assert got[0] == got[1], name
    assert len(set(_step_index(sim.step_start_s, np.array([r.first_token_s for r in sim.requests]), "left"))) > 3


def test_the_simulator_and_the_live_engine_make_the_same_scheduling_decisions():
    """Nine requests at t=0, AR, three running at most, a 40-token budget
    that chunks every prompt, through both engines."""
    pytest.importorskip("torch")
    from simspec.live import LiveConfig
    from simspec.live.engine import MAX_LEN
    from simspec.models.task import generate
    from simspec.sim import EngineConfig
    from simspec.types import Request

    examples = generate(5, 9)
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=len(e.prompt_ids), image_tokens=(16,),
                        output_tokens=3 + 2 * i) for i, e in enumerate(examples)]
    live, sim = _serve_both(requests, examples, live_config=LiveConfig(max_num_seqs=3, max_num_batched_tokens=40),
                            engine=EngineConfig(max_num_seqs=3, max_num_batched_tokens=40, kv_cache_tokens=3 * MAX_LEN))
    _same_decisions(live.log, sim)


def test_the_simulator_and_the_live_engine_decide_alike_with_prefix_caching_and_the_encoder_budget():
    """Nine requests over three distinct examples (a 16-token image and a
    prompt of 6, 5 and 5 text tokens; each example's requests share its
    image and first four text tokens as a prefix), KV blocks of 4 tokens,
    and a 46-token budget: the first step's chunks take requests 0 and 1
    whole (22 + 21 tokens, two images) and would start request 2 with 3
    tokens, but vLLM's encoder budget (max(46, 16) = 46 visual tokens, 14
    left) cannot take its image, so it waits. Both engines make the same
    decisions; the live engine, its prefix KV copied from the cache, still
    emits the target's greedy tokens."""
    pytest.importorskip("torch")
    from dataclasses import replace

    from simspec.live import LiveConfig
    from simspec.live.engine import MAX_LEN
    from simspec.models.task import generate
    from simspec.sim import EngineConfig, simulate
    from simspec import costs, policies
    from simspec.acceptance import AcceptanceModel
    from simspec.types import Request

    distinct = generate(5, 9)[3:6]
    assert [len(e.prompt_ids) for e in distinct] == [6, 5, 5]
    examples = [distinct[i % 3] for i in range(9)]
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=len(e.prompt_ids), image_tokens=(16,),
                        output_tokens=3 + 2 * i, prefix_id=i % 3, prefix_tokens=16 + 4) for i, e in enumerate(examples)]
    vllm_rules = dict(prefix_caching=True, block_size=4, encoder_budget="vllm")
    config = LiveConfig(max_num_seqs=3, max_num_batched_tokens=46, **vllm_rules)
    engine = EngineConfig(max_num_seqs=3, max_num_batched_tokens=46, kv_cache_tokens=3 * MAX_LEN, **vllm_rules)
    live, sim = _serve_both(requests, examples, live_config=config, engine=engine)
    _same_decisions(live.log, sim)
    assert live.log.table.cached_tokens.tolist() == sim.table.cached_tokens.tolist()
    assert (sim.table.cached_tokens[3:] == 20).all()  # the last six hit their example's prefix: 5 blocks of 4
    first = live.steps[0]
    assert (first.prefill_tokens, first.vision_tokens, first.prefill_requests) == (43, 32, 2)  # request 2 waits
    hits = [step.prefill_tokens for step in live.steps if step.prefill_requests == 1 and step.vision_tokens == 0]
    assert hits and max(hits) <= 2  # a hit leaves 1-2 text tokens of the 21-22 to compute
    # Each rule changes what the steps run (priced by their tokens, the
    # steps' durations show it), so the case tests both.
    def priced(engine):
        return simulate(requests, policy=policies.parse("ar"), costs=costs.affine(1.0, 0.05),
                        acceptance=AcceptanceModel.iid(0.5), engine=engine, kv_budget_tokens=engine.kv_cache_tokens,
                        seed=0).step_duration_s.tolist()
    for off in (dict(prefix_caching=False), dict(encoder_budget="none")):
        assert priced(replace(engine, **off)) != priced(engine), off
    plain, _ = _serve_both(requests, examples, live_config=LiveConfig(max_num_seqs=3, max_num_batched_tokens=46),
                           engine=replace(engine, prefix_caching=False, encoder_budget="none"))
    assert live.outputs == plain.outputs


def test_vllm_caps_decode_rounds_by_the_token_budget():
    """vllm/v1/core/sched/scheduler.py 0.33 l.839-848: a running request
    asks 1 + its draft tokens, min(that, the budget left); at 0 left the
    rest skip the step."""
    s = scheduler([10, 10, 10], [20] * 3, tokens=16)
    s.drafted[:] = [7, 7, 3]
    assert s.in_budget(np.array([0, 1, 2])).tolist() == [0, 1]  # 8 + 8 = 16; request 2 skips
    s.drafted[:] = [3, 3, 3]
    assert s.in_budget(np.array([0, 1, 2])).tolist() == [0, 1, 2]


def test_the_encoder_budget_splits_a_multi_image_prefill():
    """vLLM's encoder budget, max(max_num_batched_tokens, the largest image)
    = max(64, 40) = 64 visual tokens a step (encoder_cache_manager.py 0.33
    l.373-378). A prompt of three 40-token images, then 30 text tokens, and
    64 tokens a step: step 1's chunk [0, 64) reaches images 1 and 2; image 1
    is encoded (24 left), image 2 is not (40 > 24), so the chunk stops at
    its start, 40 tokens (scheduler.py l.2154-2174); step 2 likewise takes
    image 2 and stops at image 3 (80); step 3 takes image 3 and 64 tokens;
    step 4 the last 6."""
    s = Scheduler(context=np.array([150]), visual=np.array([120]), output=np.array([5]), max_num_seqs=4,
                  max_num_batched_tokens=64, kv_budget_tokens=10_000, reserve_tokens=1, images=[(40, 40, 40)])
    s.arrive(0)
    s.admit()
    steps = []
    while s.cache[0] < s.target[0]:
        chunks = s.prefill_chunks(np.zeros(0, np.int64))
        steps.append((chunks, s.prefill(chunks).vision_tokens))
        s.complete_prefill(chunks)
    # budget 64 tokens a step: [0, 40) with image 1; [40, 80) with image 2; [80, 144) with image 3; the rest
    assert steps == [([(0, 40)], 40), ([(0, 40)], 40), ([(0, 64)], 40), ([(0, 6)], 0)]
    plain = Scheduler(context=np.array([150]), visual=np.array([120]), output=np.array([5]), max_num_seqs=4,
                      max_num_batched_tokens=64, kv_budget_tokens=10_000, reserve_tokens=1)
    plain.arrive(0)
    plain.admit()
    chunks = plain.prefill_chunks(np.zeros(0, np.int64))
    assert chunks == [(0, 64)] and plain.prefill(chunks).vision_tokens == 120  # all at the prefill's start


def cached(context, output, prefix_id, prefix_tokens, *, kv=10_000, block=16, tokens=512, visual=None) -> Scheduler:
    context = np.array(context)
    visual = np.array(visual if visual is not None else [0] * len(context))
    return Scheduler(context=context, visual=visual, output=np.array(output),
                     max_num_seqs=8, max_num_batched_tokens=tokens, kv_budget_tokens=kv, reserve_tokens=1,
                     block_size=block, prefixes=(np.array(prefix_id), np.array(prefix_tokens)))


def run_prefill(s: Scheduler) -> Prefill:
    chunks = s.prefill_chunks(s.decode_batch()[0])
    work = s.prefill(chunks)
    s.complete_prefill(chunks)
    return work


def test_a_cached_prefix_is_computed_once_and_its_blocks_are_held_once():
    """Blocks of 16, a 40-token shared prefix: its 2 full blocks (32 tokens)
    are cached once request 0 has computed them; request 1, admitted later,
    starts with them computed and prefills only its other 68 tokens, as
    after a 32-token context; the two hold 32 + 64 + 80 - 32 = 144 tokens."""
    s = cached([60, 100, 50], [4, 4, 4], [7, 7, -1], [40, 40, 0])
    s.arrive(0)
    assert s.admit() == [0] and run_prefill(s).tokens == 60
    assert s.cached_prefixes == {7: (32, 1)} and s.shared[0] == 32
    s.arrive(1)
    assert s.admit() == [1] and s.cache[1] == 32 and s.cached_tokens[1] == 32
    work = run_prefill(s)
    assert (work.tokens, work.max_context) == (68, 32)
    assert work.attn_pairs == 68 * 32 + 68 * 69 // 2  # the chunk reads the cached prefix
    assert s.kv_used() == 32 + (64 - 32) + (112 - 32)  # 60 -> 64 and 100 -> 112 in blocks, less the shared 32
    s.arrive(2)
    s.admit()
    assert s.cache[2] == 0 and s.cached_tokens[2] == 0  # nothing shared


def test_a_hit_leaves_the_last_prompt_token_to_compute():
    """vLLM recomputes at least the prompt's last token (kv_cache_manager.py
    0.33 l.296-302): a 32-token prompt that is all a cached 32-token prefix
    finds only 16 (the full blocks within 31 = 32 - 1); a 33-token one all 32."""
    s = cached([40, 32, 33], [2, 2, 2], [1, 1, 1], [32, 32, 32])
    s.arrive(0)
    s.admit()
    run_prefill(s)
    s.arrive(1)
    s.arrive(2)
    s.admit()
    assert s.cache[1] == 16 and s.cache[2] == 32 and run_prefill(s).tokens == 16 + 1


def test_unused_prefixes_stay_cached_until_their_room_is_needed_least_recent_first():
    # Three prefixes of 32 tokens, each used by one 40-token request that
    # finishes (output 1): all three stay cached (free), newest last.
    s = cached([40, 40, 40, 40, 200], [1] * 5, [0, 1, 2, 0, -1], [32] * 4 + [0], kv=220)
    for i in range(3):
        s.arrive(i)
        s.admit()
        run_prefill(s)
        assert s.retire() == [i]
    assert list(s.cached_prefixes) == [0, 1, 2] and s.prefix_tokens_free == 96 and s.kv_used() == 0
    s.arrive(3)  # prefix 0 hits and becomes used again (and most recent)
    s.admit()
    assert s.cache[3] == 32 and list(s.cached_prefixes) == [1, 2, 0] and s.prefix_tokens_in_use == 32
    run_prefill(s)
    assert s.retire() == [3]
    # 208 tokens for request 4 (200 + 1, in blocks) leave 12 of 220: every free entry goes, oldest first
    s.arrive(4)
    s.admit()
    assert s.cached_prefixes == {} and s.prefix_tokens_free == 0


def test_the_newest_preempted_with_a_hit_recomputes_and_one_never_started_is_requeued():
    s = cached([40, 40], [8, 8], [3, 3], [32, 32], kv=10_000)
    s.arrive(0)
    s.admit()
    run_prefill(s)
    s.arrive(1)
    s.admit()  # a hit: 32 tokens computed, none prefilled yet
    s.kv_budget = 40  # shrink the cache: 1 cannot stay
    _, preempted, requeued = s.decode_batch()
    assert (preempted, requeued) == ([], [1])  # sent back before its prefill ran: not a preemption
    assert s.cached_prefixes[3] == (32, 1) and s.shared[1] == 0 and s.cache[1] == 0


def test_a_cached_image_is_not_encoded_again():
    """Two requests show the same 64-token image first (image_pool): the
    second finds its blocks cached and its prefill runs no vision encoder."""
    s = cached([80, 90], [2, 2], [5, 5], [64, 64], visual=[64, 64])
    s.arrive(0)
    s.admit()
    assert run_prefill(s).vision_tokens == 64
    s.arrive(1)
    s.admit()
    work = run_prefill(s)
    assert s.cached_tokens[1] == 64 and (work.tokens, work.vision_tokens) == (26, 0)


def test_the_live_engine_refuses_a_prefix_id_on_different_content():
    """Two requests named as sharing a prefix, with different images: the
    second's hit would read the first's KV, so the engine refuses it."""
    torch = pytest.importorskip("torch")
    from simspec import costs, policies
    from simspec.live import LiveConfig, LiveEngine
    from simspec.models.drafter import Drafter, DrafterConfig
    from simspec.models.task import generate
    from simspec.models.train import load_target
    from simspec.types import Request

    torch.set_num_threads(1)
    target, _, _ = load_target(REPO / "checkpoints" / "target")
    examples = generate(5, 2)
    requests = [Request(id=i, arrival_s=0.0, prompt_tokens=len(e.prompt_ids), image_tokens=(16,), output_tokens=2,
                        prefix_id=0, prefix_tokens=16) for i, e in enumerate(examples)]
    engine = LiveEngine(target, Drafter(DrafterConfig(), target).eval(), policies.parse("ar"), costs.affine(1.0, 0.05),
                        LiveConfig(max_num_seqs=1, prefix_caching=True))
    with pytest.raises(ValueError, match="request 1 shares prefix 0 with request 0, but their first 16 tokens differ"):
        engine.serve(requests, examples, realtime=False)


def test_a_transferred_prompt_arrives_computed_but_its_last_token():
    """The decode side of a disaggregated fleet: each request's prompt KV is
    in place at admission (all but the last token, which runs here, as
    after a prefix hit), in blocks of its own; a preempted one recomputes."""
    s = Scheduler(context=np.array([40, 30]), visual=np.array([16, 0]), output=np.array([5, 5]), max_num_seqs=4,
                  max_num_batched_tokens=64, kv_budget_tokens=10_000, reserve_tokens=1, transferred=True)
    s.arrive(0)
    s.arrive(1)
    assert s.admit() == [0, 1]
    assert s.cache.tolist() == [39, 29] and s.ready.tolist() == [0, 0]
    prefill = s.prefill(s.prefill_chunks(np.zeros(0, np.int64)))
    assert prefill.tokens == 2 and prefill.vision_tokens == 0  # the images were encoded on the prefill side
    tight = Scheduler(context=np.array([40]), visual=np.array([0]), output=np.array([5]), max_num_seqs=4,
                      max_num_batched_tokens=64, kv_budget_tokens=40, reserve_tokens=1, transferred=True)
    tight.arrive(0)
    assert tight.admit() == []  # 40 + 1 tokens of its own: the budget of 40 cannot hold it
    plain = scheduler([40, 30], [5, 5])
    plain.arrive(0)
    plain.admit()
    assert plain.cache[0] == 0  # without a transfer nothing arrives computed
    again = Scheduler(context=np.array([40, 40]), visual=np.array([0, 0]), output=np.array([9, 9]), max_num_seqs=4,
                      max_num_batched_tokens=64, kv_budget_tokens=85, reserve_tokens=4, transferred=True)
    again.arrive(0)
    again.arrive(1)
    assert again.admit() == [0, 1]
    again.cache[:] = 40
    again.emitted[:] = 1
    _, preempted, _ = again.decode_batch()  # 2 x 40 + 2 x 4 = 88 > 85: request 1 goes
    assert preempted == [1]
    assert again.admit() == [1] and again.cache[1] == 0  # its transferred KV is gone: it recomputes
