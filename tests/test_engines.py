"""Engine modes (simspec.serving.modes): presets, refusals, and hand-worked step
timelines for each rule that differs between modes. vLLM facts are from
its 0.33.0 source (the wheel's vllm/ tree), SGLang's from 0.5.23; file and
line are cited where each rule is checked."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from conftest import invoke
from simspec import config as configuration, costs, experiment, policies
from simspec.serving import modes
from simspec.acceptance import AcceptanceModel
from simspec.costs.base import CostModel, TOKENS, frozen_table
from simspec.serving.config import EngineConfig
from simspec.sim import simulate
from simspec.sim import steps
from simspec.sim.replica import capture_sizes
from simspec.types import InputError, Request

VLLM_H100 = configuration.build({}, {"engine": {"kind": "vllm"}}).engine


def test_vllm_preset_is_what_vllm_sets_for_an_api_server():
    # vllm/engine/arg_utils.py 0.33 l.2983-2996: >= 70 GiB, not A100: 1024 seqs, 8192 tokens
    e = VLLM_H100
    assert (e.kind, e.max_num_seqs, e.max_num_batched_tokens) == ("vllm", 1024, 8192)
    assert e.async_scheduling and e.cudagraph_mode == "full_and_piecewise" and e.max_cudagraph_capture_size == 512
    a100 = configuration.build({"device": "a100-80gb"}, {"engine": {"kind": "vllm"}}).engine
    assert (a100.max_num_seqs, a100.max_num_batched_tokens) == (256, 2048)  # l.2997-3006
    mine = configuration.build({}, {"engine": {"kind": "vllm", "max_num_seqs": 64}}).engine
    assert (mine.max_num_seqs, mine.max_num_batched_tokens) == (64, 8192)  # a user's field wins over the preset
    assert configuration.build({}, {}).engine == EngineConfig()  # simspec: no preset


def test_capture_sizes_follow_vllm():
    # vllm/config/vllm.py 0.33 l.2463-2598: [1, 2, 4] + range(8, 256, 8) + range(256, 513, 16)
    sizes = capture_sizes(VLLM_H100, depth=3).tolist()
    assert sizes == [1, 2, 4, *range(8, 256, 8), *range(256, 513, 16)] and len(sizes) == 51
    small = dataclasses.replace(VLLM_H100, max_num_seqs=4)  # min(4 x (1 + 3) x 2, 512) = 32
    assert capture_sizes(small, depth=3).tolist() == [1, 2, 4, 8, 16, 24, 32]
    assert capture_sizes(EngineConfig(), depth=3).size == 0  # no graphs


def terms(**kw) -> steps.EngineTerms:
    base = dict(overlap=False, graphs=steps.GRAPH_FULL_AND_PIECEWISE, capture=capture_sizes(VLLM_H100, 3),
                piecewise_max=512,
                piecewise_s=0.0, eager_s=0.0, drafter_over_prefill=False, lagged_key=False)
    return steps.EngineTerms(**{**base, **kw})


def test_graph_regimes_pad_to_the_next_captured_size():
    t = terms()
    # 9 requests verifying 1 + 3 tokens: 36 tokens, a uniform decode batch ->
    # a full graph padded to 40 (cudagraph_dispatcher.py l.71-90, 305-309)
    assert steps.graph_regime(t, 36, True) == (steps.REGIME_FULL, 40)
    # the same tokens with a prefill chunk or mixed draft lengths: piecewise (l.311-316)
    assert steps.graph_regime(t, 36, False) == (steps.REGIME_PIECEWISE, 40)
    assert steps.graph_regime(t, 257, False) == (steps.REGIME_PIECEWISE, 272)
    # above the largest size: eager, unpadded (l.276)
    assert steps.graph_regime(t, 513, True) == (steps.REGIME_EAGER, 513)
    assert steps.graph_regime(terms(graphs=steps.GRAPH_NONE), 36, True) == (steps.REGIME_EAGER, 36)
    assert steps.graph_regime(terms(graphs=steps.GRAPH_PIECEWISE), 36, True) == (steps.REGIME_PIECEWISE, 40)


def test_async_step_costs_max_of_gpu_and_cpu():
    # 12 ms step of which 5 ms is the fixed CPU part: 7 ms of GPU, overlapped -> 7 ms
    assert steps.engine_step_s(terms(overlap=True), 0.005, 0.012, steps.REGIME_FULL) == pytest.approx(0.007)
    # a 6 ms step with 5 ms of CPU: the CPU is the longer -> 5 ms
    assert steps.engine_step_s(terms(overlap=True), 0.005, 0.006, steps.REGIME_FULL) == pytest.approx(0.005)
    assert steps.engine_step_s(terms(), 0.005, 0.012, steps.REGIME_FULL) == pytest.approx(0.012)
    # regimes add their own terms before the overlap
    t = terms(piecewise_s=0.001, eager_s=0.003)
    assert steps.engine_step_s(t, 0.005, 0.012, steps.REGIME_PIECEWISE) == pytest.approx(0.013)
    assert steps.engine_step_s(t, 0.005, 0.012, steps.REGIME_EAGER) == pytest.approx(0.015)


def nine_requests(output_tokens: int = 40) -> list[Request]:
    return [Request(id=i, arrival_s=0.0, prompt_tokens=32, output_tokens=output_tokens) for i in range(9)]


def run(engine: EngineConfig, cost_model: CostModel, policy: str = "linear:k=3", requests=None):
    return simulate(requests or nine_requests(), policy=policies.parse(policy), costs=cost_model,
                    acceptance=AcceptanceModel.iid(0.6), engine=engine, kv_budget_tokens=1 << 20, seed=0)


def test_a_nine_request_k3_decode_step_is_padded_and_overlapped():
    """Hand-worked: affine 1 ms + 0.1 ms per target token. A decode step of 9
    requests verifying 1 + 3 tokens is 36 tokens: simspec prices 1 + 3.6 =
    4.6 ms; vLLM pads it to the 40-token graph (4.0 ms of GPU) and overlaps
    the 1 ms of CPU: max(4.0, 1.0) = 4.0 ms."""
    cost = costs.affine(1.0, 0.1)
    engine = dataclasses.replace(VLLM_H100, drafter_context="none")
    for mode, want_ms in ((EngineConfig(drafter_context="none"), 4.6), (engine, 4.0)):
        log = run(mode, cost)
        batch, duration = np.asarray(log.step_batch), np.asarray(log.step_duration_s)
        full = batch == 9
        assert full.sum() > 5
        # the first full decode steps, before any request nears its end (k stays 3)
        assert duration[full][:5] * 1e3 == pytest.approx([want_ms] * 5, rel=1e-9), mode.kind


def test_a_non_uniform_batch_pays_the_piecewise_regime():
    """The prefill step (9 prompts of 32 tokens = 288 tokens) is not a
    uniform decode: padded to 288 (a captured size), piecewise, so it pays
    graph_piecewise_s; decode steps replay full graphs and do not."""
    cost = dataclasses.replace(costs.affine(1.0, 0.1), graph_piecewise_s=0.002)
    engine = dataclasses.replace(VLLM_H100, drafter_context="none", async_scheduling=False)
    log = run(engine, cost)
    duration = np.asarray(log.step_duration_s) * 1e3
    assert duration[0] == pytest.approx(1.0 + 28.8 + 2.0, rel=1e-9)  # 288 tokens, piecewise
    assert duration[1] == pytest.approx(1.0 + 4.0, rel=1e-9)  # 36 -> 40 tokens, full graph


def test_vllm_drafter_runs_over_prefill_chunks():
    """vllm/v1/worker/gpu_model_runner.py 0.33 l.4889: the EAGLE drafter's
    first pass runs over every scheduled token, prefill chunks included, so
    the prefill step pays a drafter pass over its 288 tokens."""
    draft = frozen_table(TOKENS * 0.01e-3)  # 0.01 ms per drafter row
    cost = dataclasses.replace(costs.affine(1.0, 0.1), draft_s_table=draft)
    off = dataclasses.replace(VLLM_H100, drafter_context="none", async_scheduling=False, drafter_over_prefill=False)
    on = dataclasses.replace(off, drafter_over_prefill=True)
    first_off, first_on = (np.asarray(run(e, cost).step_duration_s)[0] * 1e3 for e in (off, on))
    assert first_on - first_off == pytest.approx(288 * 0.01, rel=1e-6)


def test_sglang_prefill_stalls_every_decode():
    """SGLang 0.5.23 runs a prefill batch alone (srt/managers/scheduler.py,
    get_next_batch_to_run: "Run prefill first if possible"; enable_mixed_chunk
    False): while a late request prefills, no decode runs in that step."""
    reqs = nine_requests(60) + [Request(id=9, arrival_s=0.05, prompt_tokens=32, output_tokens=5)]
    cost = costs.affine(1.0, 0.1)
    for kind, stalls in (("simspec", False), ("sglang", True)):
        engine = configuration.build({}, {"engine": {"kind": kind, "drafter_context": "none"}}).engine
        log = run(engine, cost, requests=reqs)
        start, batch = np.asarray(log.step_start_s), np.asarray(log.step_batch)
        late = np.flatnonzero(start >= 0.05)[0]  # the first step after the late arrival
        assert (batch[late] == 0) == stalls, kind


@pytest.mark.parametrize("kind,spec", [("vllm", "tree"), ("vllm", "marginal"), ("vllm", "truncate"),
                                       ("vllm", "goodput"), ("sglang", "marginal")])
def test_policies_an_engine_cannot_run_are_refused(kind, spec):
    with pytest.raises(InputError, match=f"policy {spec}: engine {kind} cannot run it.*--engine simspec"):
        configuration.build({}, {"engine": {"kind": kind}, "policies": [spec]})


def test_engine_default_policies_and_cli(tmp_path):
    cfg = configuration.build({}, {"engine": {"kind": "vllm"}})
    assert cfg.policies == modes.DEFAULT_POLICIES["vllm"]
    code, out, err = invoke(["simulate", "--engine", "vllm", "--policy", "tree", "--num-requests", "5", "--quiet"])
    assert code == 2 and "engine vllm cannot run it" in err and err.count("\n") == 1
    code, out, err = invoke(["simulate", "--engine", "nosuch", "--num-requests", "5", "--quiet"])
    assert code == 2 and "engine kind must be one of simspec, vllm, sglang" in err
    code, out, err = invoke(["simulate", "--engine", "vllm", "--num-requests", "20", "--quiet", "--policy", "ar",
                             "--out", str(tmp_path / "run")])
    assert code == 0, err
    assert "engine: vllm 0.33.0 | async | full_and_piecewise graphs <= 512 tok" in out
    import json
    marker = json.loads((tmp_path / "run" / "simspec-run.json").read_text())
    assert (marker["engine"], marker["engine_version"]) == ("vllm", "0.33.0")


def test_vllm_keys_batch_table_by_the_previous_steps_scheduled_requests():
    """vLLM's num_speculative_tokens_per_batch_size: K looked up by every
    request step N scheduled (prefills too) and verified in step N + 1
    (vllm/v1/core/sched/scheduler.py 0.33 l.1709-1713; output.py l.314-316).
    7 decoding requests after a step that scheduled 8 (one finished): vLLM
    drafts the 8-request length, simspec's own rule the 7-request one."""
    from simspec.policies import rules

    table = policies.parse("batch_table:table=1:5,8:3").params()
    b = 7
    fields = dict(context_tokens=np.full(b, 100), visual_tokens=np.zeros(b, np.int64),
                  kept_visual_tokens=np.zeros(b, np.int64), remaining_tokens=np.full(b, 50),
                  recent_accepted=np.ones(b), conf=np.ones((b, 8, 1)), true_ranks=np.zeros((b, 8), np.int64),
                  prefill_tokens=0, prefill_attn_pairs=0, prefill_kv_tokens=0, prefill_requests=0, vision_tokens=0,
                  prefill_max_context=0)
    own = rules._batch_table(rules.Batch(**fields), table)
    lagged = rules._batch_table(rules.Batch(**fields, table_key=8), table)
    assert own.num_nodes.tolist() == [5] * b and lagged.num_nodes.tolist() == [3] * b


def test_vllm_runs_batch_table_and_the_lag_changes_the_drafts():
    cost = costs.affine(1.0, 0.1)
    reqs = [Request(id=i, arrival_s=0.02 * i, prompt_tokens=32, output_tokens=10 + 7 * i) for i in range(9)]
    spec = "batch_table:table=1:5,4:2"
    simspec_log = run(EngineConfig(drafter_context="none"), cost, spec, reqs)
    vllm_log = run(dataclasses.replace(VLLM_H100, drafter_context="none"), cost, spec, reqs)
    assert vllm_log.rounds.drafted != simspec_log.rounds.drafted


def test_the_frontend_delays_requests_through_a_text_and_an_image_worker():
    """Hand-worked: 1 ms per request and 0.01 ms per text token on the
    text worker, 5 ms per image on the image worker, each first come, first
    served (vllm/renderers/base.py 0.33 l.139-148).
    text:  r0 0 + 1 + 1 = 2;  r1 max(0, 2) + 1 + 0.5 = 3.5;  r2 max(1, 3.5) + 1 + 0.1 = 4.6
    image: r0 0 + 5 = 5;      r2 max(1, 5) + 5 = 10
    ready: r0 5, r1 3.5, r2 10 (ms): r1 reaches the queue first."""
    from simspec.sim.replica import frontend_ready

    reqs = [Request(id=0, arrival_s=0.0, prompt_tokens=100, image_tokens=(576,), output_tokens=4),
            Request(id=1, arrival_s=0.0, prompt_tokens=50, output_tokens=4),
            Request(id=2, arrival_s=0.001, prompt_tokens=10, image_tokens=(576,), output_tokens=4)]
    engine = EngineConfig(frontend_s_per_request=1e-3, frontend_s_per_text_token=1e-5, frontend_s_per_image=5e-3)
    ready, order = frontend_ready(reqs, engine)
    assert ready * 1e3 == pytest.approx([5.0, 3.5, 10.0]) and order.tolist() == [1, 0, 2]
    ready, order = frontend_ready(reqs, EngineConfig())
    assert ready.tolist() == [0.0, 0.0, 0.001] and order.tolist() == [0, 1, 2]
    # alone, a request's TTFT grows by exactly its frontend time
    one = [Request(id=0, arrival_s=0.0, prompt_tokens=100, output_tokens=4)]
    base, slow = (run(EngineConfig(drafter_context="none", frontend_s_per_request=f), costs.affine(1.0, 0.1),
                      "ar", one) for f in (0.0, 0.004))
    assert slow.table.first_token_s[0] - base.table.first_token_s[0] == pytest.approx(0.004, rel=1e-9)
    with pytest.raises(InputError, match=r"frontend_s_per_image must be in \[0, 10\] seconds"):
        EngineConfig(frontend_s_per_image=-1.0)


def test_vllm_holds_kv_in_blocks_with_lookahead_and_the_drafters_layer():
    from simspec.costs import GPUS, MODELS
    from simspec.serving.scheduler import Scheduler
    from simspec.sim.replica import reserve_tokens

    # blocks of 16: a 20-token prompt holds 32 slots; 1 + K scheduled + K lookahead slots a round
    s = Scheduler(context=np.array([20, 33]), visual=np.zeros(2, np.int64), output=np.array([4, 4]), max_num_seqs=4,
                  max_num_batched_tokens=64, kv_budget_tokens=10_000, reserve_tokens=1, block_size=16)
    assert s.held(np.array([0, 1])).tolist() == [32, 48]
    assert reserve_tokens(VLLM_H100, 3) == 7 and reserve_tokens(EngineConfig(), 3) == 4
    # the EAGLE head's one layer shares the KV pool: LLaVA-1.5-7B's 32 layers hold 32/33 as many tokens
    model, gpu = MODELS["LLaVA-1.5-7B"], GPUS["h100-sxm"]
    plain = EngineConfig().kv_budget_tokens(model, gpu)
    with_drafter = dataclasses.replace(EngineConfig(), drafter_kv_layers=1).kv_budget_tokens(model, gpu)
    assert with_drafter == pytest.approx(plain * 32 / 33, abs=1)


def test_vllm_memory_sizes_the_kv_cache_as_vllm_does():
    """memory = vllm: torch's total (79.22 GiB on an H100) x utilisation -
    weights - the profiled activation peak - non-torch and CUDA-graph memory
    (vllm/v1/worker/gpu_worker.py 0.33 l.700-757)."""
    from simspec.costs import GPUS, MODELS
    from simspec.serving.memory import CUDAGRAPH_GIB, GIB, vllm_activation_bytes

    # Before vLLM 0.17 (memory = vllm-0.16) the forward term reproduces the
    # log it was fitted to: Llama-3-8B's shape at 8192 tokens and 256
    # sequences, 1.26 GiB (vLLM pull 10511), where the sampler's peak is the
    # smaller; at vLLM's H100 default of 1024 sequences the sampler's is the
    # larger (4.76 GiB in vLLM 0.11's log). From 0.17 (memory = vllm) the
    # sampler's run peaks at 1.89 GiB there (vLLM 0.19's log).
    llama3 = dataclasses.replace(MODELS["Llama-2-7B"], name="llama3-shape", kv_heads=8, mlp_hidden=14336, vocab=128256)
    eager = EngineConfig(memory="vllm-0.16", max_num_seqs=256, max_num_batched_tokens=8192)
    assert vllm_activation_bytes(eager, llama3) / GIB == pytest.approx(1.26, abs=0.005)
    wide = dataclasses.replace(eager, max_num_seqs=1024)
    assert vllm_activation_bytes(wide, llama3) / GIB == pytest.approx(4.76, abs=0.005)
    assert vllm_activation_bytes(dataclasses.replace(wide, memory="vllm"), llama3) / GIB == pytest.approx(1.89, abs=0.005)
    graphs = dataclasses.replace(eager, cudagraph_mode="full_and_piecewise")
    assert graphs.reserve_bytes(llama3) - eager.reserve_bytes(llama3) == pytest.approx(CUDAGRAPH_GIB * GIB)
    # An independent check: vLLM gave Llama-2-7B on one A100-80GB 7351 blocks
    # of 16 tokens at utilisation 0.9 (github.com/vllm-project/vllm/pull/2031,
    # V0: 256 sequences, 4096 batched tokens, no graphs counted, no drafter).
    a100 = EngineConfig(memory="vllm-0.16", max_num_seqs=256, max_num_batched_tokens=4096)
    assert a100.kv_budget_tokens(MODELS["Llama-2-7B"], GPUS["a100-80gb"]) == pytest.approx(7351 * 16, rel=0.02)
    # The H100 preset holds more than the datasheet's decimal 80 GB left room for.
    h100 = MODELS["LLaVA-1.5-7B"], GPUS["h100-sxm"]
    assert VLLM_H100.memory == "vllm"
    datasheet = dataclasses.replace(VLLM_H100, memory="datasheet").kv_budget_tokens(*h100)
    assert VLLM_H100.kv_budget_tokens(*h100) > 1.04 * datasheet
    with pytest.raises(InputError, match="memory must be one of datasheet, vllm, vllm-0.16, sglang"):
        EngineConfig(memory="torch")


def test_sglang_captures_batch_sizes_times_the_verify_width():
    """SGLang 0.5.23 (srt/arg_groups/cuda_graph_hook.py l.517-525, clamped to
    the request pool, model_executor/runner/base_cuda_graph_runner.py
    l.78-101): with EAGLE's 48 running requests the captured batch sizes
    are 1-8, 10-32 by 2, 40, 44, 48; a chain of 3 verifies 4 tokens each."""
    sglang = configuration.build({}, {"engine": {"kind": "sglang"}}).engine
    sizes = capture_sizes(sglang, depth=3).tolist()
    assert sizes == [4 * b for b in [*range(1, 9), *range(10, 33, 2), 40, 44, 48]]
    # a tree of num_draft_tokens 9 (budget 8, root included)
    assert capture_sizes(sglang, depth=4, width=9).tolist()[:3] == [9, 18, 27]
    t = steps.EngineTerms(False, steps.GRAPH_FULL_AND_PIECEWISE, np.array(sizes), 8192, 0.0, 0.0, False, False)
    # 9 requests verifying 4 tokens: batch 9 pads to the batch-10 graph, 40 tokens
    assert steps.graph_regime(t, 36, True) == (steps.REGIME_FULL, 40)
    # a 3000-token prefill: SGLang's prefill graphs reach the 8192-token chunk, piecewise and unpadded
    assert steps.graph_regime(t, 3000, False) == (steps.REGIME_PIECEWISE, 3000)
    assert steps.graph_regime(t, 9000, False) == (steps.REGIME_EAGER, 9000)


def test_prefix_caching_serves_a_shared_system_prompt_from_the_cache():
    """vLLM V1 caches prefixes by default (vllm/engine/arg_utils.py 0.33
    l.3075-3076), SGLang too (RadixAttention; disable_radix_cache = False):
    with one 800-token system prompt before prompts of 200 the prompts'
    shared blocks are computed once, so TTFT falls; with nothing shared the
    cache changes nothing."""
    def run(engine: dict, workload: dict) -> dict:
        config = configuration.build({}, {"engine": engine, "policies": ["linear:k=3"], "workload": {
            "num_requests": 200, "rate_per_s": 4.0, "multimodal_share": 0.0, "prompt_mean_tokens": 200.0,
            **workload}})
        return experiment.run(config).metrics["linear:k=3"]

    assert VLLM_H100.prefix_caching and configuration.build({}, {"engine": {"kind": "sglang"}}).engine.prefix_caching
    assert not EngineConfig().prefix_caching
    shared = {"shared_prefix_tokens": 800}
    on, off = run({"kind": "vllm"}, shared), run({"kind": "vllm", "prefix_caching": False}, shared)
    # 800 of every 1000 tokens are the prefix; its 50 full blocks of 16 (800 tokens) hit after the first request
    assert on["prefix_cache_hit_rate"] == pytest.approx(0.8 * 199 / 200, rel=0.02) and off["prefix_cache_hit_rate"] == 0
    assert on["total_token_throughput"] == pytest.approx(off["total_token_throughput"], rel=0.01)
    assert on["mean_ttft_ms"] < 0.8 * off["mean_ttft_ms"]
    assert run({"kind": "vllm"}, {}) == run({"kind": "vllm", "prefix_caching": False}, {})
