"""The compiled serving loop (simspec/sim/fastloop.py) against replica.py's
SimPy-process path (the same decisions, one SimPy event each): the same
workloads, every array of the run logs equal, so the compiled loop orders
arrivals, steps and wake-ups as SimPy does.

Each case forces preemptions (a small KV budget), idle spells that pay a
wake cost, or vLLM's and SGLang's scheduling; ``test_cases_exercise_*``
check that they do, so a case that stopped testing what it names fails.
"""

from __future__ import annotations

import dataclasses
from dataclasses import replace

import numpy as np
import pytest

from conftest import H100, LLAVA
from simspec import acceptance, costs, policies
from simspec.serving import modes
from simspec.sim import EngineConfig, simulate
from simspec.types import Request, RunLog
from simspec.workloads import WorkloadConfig, WorkloadStreams, make_requests

ROOFLINE = costs.build("roofline", LLAVA, H100)
WAKING = replace(ROOFLINE, wake_s=0.03, wake_tau_s=0.5, wake_next_share=0.3)
CONSTANT = costs.build("constant:10", LLAVA, H100)


def workload(n: int, *, rate_per_s: float, burstiness: float = 1.0, multimodal: float = 0.5, seed: int = 0,
             prompt: int = 200, output: int = 60) -> list[Request]:
    """``n`` requests, Gamma inter-arrival gaps (shape ``burstiness``; 1: Poisson)."""
    rng = np.random.default_rng(seed)
    gaps = rng.gamma(burstiness, 1.0 / (rate_per_s * burstiness), n)
    arrivals = np.cumsum(gaps) - gaps[0]  # the first at 0: SimPy queues it before the replica starts
    prompts = rng.integers(8, 2 * prompt, n)
    outputs = rng.integers(1, 2 * output, n)
    images = rng.random(n) < multimodal
    return [Request(id=i, arrival_s=float(arrivals[i]), prompt_tokens=int(prompts[i]),
                    image_tokens=(576,) if images[i] else (), output_tokens=int(outputs[i])) for i in range(n)]


def ticks(n: int) -> list[Request]:
    """Arrivals on the 10 ms grid a constant:10 step lands on, some at once:
    ties between an arrival and a step's end, and arrivals at time 0."""
    times = [0.0, 0.0, 0.01, 0.02, 0.02, 0.03, 0.05, 0.05, 0.06, 0.1, 0.13, 0.2, 0.2, 0.21, 0.5]
    return [Request(id=i, arrival_s=times[i % len(times)] + 0.5 * (i // len(times)), prompt_tokens=10 + i % 7,
                    output_tokens=1 + i % 5) for i in range(n)]


def preset(kind: str, **fields) -> EngineConfig:
    return EngineConfig(**{**modes.preset(kind, "h100-sxm"), **fields})


def shared(n: int, rate_per_s: float, *, images: int = 1, **fields) -> list[Request]:
    """A generated workload whose requests share prefixes (three system
    prompts, four images) and carry up to ``images`` images each."""
    cfg = WorkloadConfig(num_requests=n, rate_per_s=rate_per_s, shared_prefix_tokens=300, shared_prefixes=3,
                         image_pool=4, images_max=images, **fields)
    return make_requests(cfg, WorkloadStreams.from_seed_sequence(np.random.SeedSequence(7)),
                         visual_tokens_per_image=576, max_context_tokens=4096)


VLLM = dict(encoder_budget="none")
CASES = {  # name: (policy, engine, cost model, KV tokens, workload)
    "ar": ("ar", EngineConfig(), ROOFLINE, 200_000, workload(80, rate_per_s=20)),
    "linear-preempt": ("linear:k=3", EngineConfig(), ROOFLINE, 6_000, workload(80, rate_per_s=40)),
    "truncate-bursty": ("truncate", EngineConfig(), ROOFLINE, 200_000, workload(80, rate_per_s=10, burstiness=0.25)),
    "tree-idle-wake": ("tree", EngineConfig(), WAKING, 200_000, workload(40, rate_per_s=0.5, burstiness=0.25)),
    "marginal-preempt": ("marginal", EngineConfig(block_size=16), ROOFLINE, 6_000, workload(60, rate_per_s=30)),
    "goodput-wake": ("goodput", EngineConfig(drafter_over_prefill=True), WAKING, 200_000,
                     workload(60, rate_per_s=2)),
    "batch_table-chain": ("batch_table", EngineConfig(drafting="chain"), ROOFLINE, 8_000, workload(60, rate_per_s=30)),
    "ties": ("ar", EngineConfig(), CONSTANT, 200_000, ticks(45)),
    "ties-wake": ("linear:k=2", EngineConfig(), replace(CONSTANT, wake_s=0.03, wake_tau_s=0.5, wake_next_share=0.5),
                  200_000, ticks(45)),
    "frontend": ("linear:k=3", EngineConfig(frontend_s_per_request=0.002, frontend_s_per_text_token=1e-5,
                                            frontend_s_per_image=0.03), ROOFLINE, 200_000,
                 workload(60, rate_per_s=20, burstiness=0.25)),
    "vllm-linear-preempt": ("linear:k=3", preset("vllm", **VLLM), ROOFLINE, 6_000, workload(80, rate_per_s=40)),
    "vllm-batch_table-wake": ("batch_table", preset("vllm", **VLLM, max_num_batched_tokens=512), WAKING, 20_000,
                              workload(60, rate_per_s=3, burstiness=0.25)),
    "vllm-text-only": ("ar", preset("vllm", max_num_seqs=8), ROOFLINE, 4_000,
                       workload(60, rate_per_s=30, multimodal=0.0)),
    "sglang-tree": ("tree", preset("sglang"), ROOFLINE, 200_000, workload(60, rate_per_s=15)),
    "sglang-linear-preempt": ("linear:k=3", preset("sglang", block_size=16), WAKING, 6_000,
                              workload(80, rate_per_s=40, burstiness=0.25)),
    # prefix caching and vLLM's encoder budget
    "vllm-prefix-images": ("linear:k=3", preset("vllm"), ROOFLINE, 20_000, shared(80, 20, images=3)),
    "vllm-prefix-preempt": ("marginal", preset("vllm"), ROOFLINE, 6_000, shared(80, 40)),
    "vllm-encoder-wake": ("tree", preset("vllm", prefix_caching=False, max_num_batched_tokens=1024), WAKING, 30_000,
                          workload(60, rate_per_s=10, burstiness=0.25, multimodal=0.8)),
    "sglang-prefix-preempt": ("linear:k=3", preset("sglang", block_size=16), WAKING, 5_000,
                              shared(80, 40, burstiness=0.25)),
    "simspec-prefix": ("truncate", EngineConfig(prefix_caching=True, block_size=16), ROOFLINE, 6_000, shared(80, 40)),
}


def _run(name: str, *, python: bool, seed: int = 3) -> RunLog:
    spec, engine, cost_model, kv_tokens, requests = CASES[name]
    return simulate(requests, policy=policies.parse(spec), costs=cost_model,
                    acceptance=acceptance.preset(acceptance.DEFAULT_PRESET), engine=engine,
                    kv_budget_tokens=kv_tokens, seed=seed, _python=python)


def differences(a, b, path: str = "log") -> list[str]:
    """Where two run logs (or any of their parts) differ: every array equal
    in dtype, shape and bits (NaN where NaN), every number and string equal."""
    if dataclasses.is_dataclass(a) or isinstance(a, tuple) and hasattr(a, "_fields"):
        names = [f.name for f in dataclasses.fields(a)] if dataclasses.is_dataclass(a) else list(a._fields)
        return [d for name in names for d in differences(getattr(a, name), getattr(b, name), f"{path}.{name}")]
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        a, b = np.asarray(a), np.asarray(b)
        same = a.dtype == b.dtype and a.shape == b.shape and (
            a.tobytes() == b.tobytes() or np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
        return [] if same else [path]
    if isinstance(a, (list, tuple)):
        if len(a) != len(b):
            return [path]
        return [d for k, (x, y) in enumerate(zip(a, b)) for d in differences(x, y, f"{path}[{k}]")]
    if isinstance(a, dict):
        if a.keys() != b.keys():
            return [path]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    if isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b):
        return []
    return [] if type(a) is type(b) and a == b else [path]


@pytest.mark.parametrize("name", CASES)
def test_the_compiled_loop_gives_the_python_paths_log(name):
    fast, python = _run(name, python=False), _run(name, python=True)
    assert differences(fast, python) == []


def test_prefix_cases_hit_the_cache_and_the_encoder_budget_binds():
    for name in ("vllm-prefix-images", "vllm-prefix-preempt", "sglang-prefix-preempt", "simspec-prefix"):
        log = _run(name, python=False)
        assert log.table.cached_tokens.sum() > 0 and log.table.preemptions.sum() > 0, name
    # Without the encoder budget the same run schedules other chunks.
    spec, engine, cost_model, kv_tokens, requests = CASES["vllm-encoder-wake"]
    unbudgeted = simulate(requests, policy=policies.parse(spec), costs=cost_model,
                          acceptance=acceptance.preset(acceptance.DEFAULT_PRESET),
                          engine=replace(engine, encoder_budget="none"), kv_budget_tokens=kv_tokens, seed=3)
    budgeted = _run("vllm-encoder-wake", python=False)
    assert not np.array_equal(budgeted.chunk_tokens, unbudgeted.chunk_tokens)


def test_cases_exercise_preemption_and_wake_costs():
    logs = {name: _run(name, python=False) for name in ("linear-preempt", "vllm-linear-preempt",
                                                         "sglang-linear-preempt", "tree-idle-wake")}
    for name in ("linear-preempt", "vllm-linear-preempt", "sglang-linear-preempt"):
        assert logs[name].table.preemptions.sum() > 0, name
    idle = logs["tree-idle-wake"]
    plain = simulate(CASES["tree-idle-wake"][4], policy=policies.parse("tree"), costs=ROOFLINE,
                     acceptance=acceptance.preset(acceptance.DEFAULT_PRESET), engine=EngineConfig(),
                     kv_budget_tokens=200_000, seed=3)
    assert idle.table.finish_s.sum() > plain.table.finish_s.sum()  # the wake costs were paid


def test_a_difference_is_found():
    # The comparison itself can fail: another seed's rounds, or one token
    # less of KV cache (ar draws nothing random), change the log.
    assert differences(_run("linear-preempt", python=False), _run("linear-preempt", python=False, seed=4)) != []
    spec, engine, cost_model, kv_tokens, requests = CASES["linear-preempt"]
    tighter = simulate(requests, policy=policies.parse(spec), costs=cost_model,
                       acceptance=acceptance.preset(acceptance.DEFAULT_PRESET), engine=engine,
                       kv_budget_tokens=kv_tokens - 1, seed=3)
    assert differences(_run("linear-preempt", python=True), tighter) != []


def test_the_compiled_loop_reports_progress_as_requests_finish():
    spec, engine, cost_model, kv_tokens, requests = CASES["linear-preempt"]
    seen = []
    simulate(requests, policy=policies.parse(spec), costs=cost_model,
             acceptance=acceptance.preset(acceptance.DEFAULT_PRESET), engine=engine, kv_budget_tokens=kv_tokens,
             progress=seen.append)
    assert seen == sorted(seen) and seen[-1] == len(requests) and len(seen) > 10


def test_a_round_term_reads_the_same_random_numbers_on_both_paths():
    """An acceptance model with a round term reads B more normals a round
    (normals_per_round): both paths must size and refill their windows
    alike, and the term must change the rounds (so it is exercised)."""
    spec, engine, cost_model, kv_tokens, requests = CASES["linear-preempt"]
    rounds = replace(acceptance.preset(acceptance.DEFAULT_PRESET), round_sigma=2.0)

    def run(model, python):
        return simulate(requests, policy=policies.parse(spec), costs=cost_model, acceptance=model, engine=engine,
                        kv_budget_tokens=kv_tokens, seed=3, _python=python)

    fast = run(rounds, False)
    assert differences(fast, run(rounds, True)) == []
    assert differences(fast, run(acceptance.preset(acceptance.DEFAULT_PRESET), False)) != []
