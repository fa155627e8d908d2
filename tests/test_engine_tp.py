"""The engine modes at tensor parallelism > 1: each engine's all-reduce
regimes (its custom kernel under its size limit, NCCL above), the
drafter's degree (--draft-tp) and what each engine accepts, and the KV
cache a 70B model gets per GPU under each engine's memory rule."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from simspec import config as cfg
from simspec import costs, experiment
from simspec.costs import collectives
from simspec.types import InputError

REPO = Path(__file__).resolve().parents[1]
PROFILES = REPO / "profiles"
H100 = costs.gpu_spec("h100-sxm")


def _reduce(engine: str, gpu, workers: int):
    return collectives.all_reduce(gpu, workers, PROFILES, engine)


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
@pytest.mark.parametrize("workers", [2, 4, 8])
def test_custom_kernel_below_the_limit_nccl_at_it(engine, workers):
    ar = _reduce(engine, H100, workers)
    limit = ar.custom_limit_bytes
    assert limit > 0
    below, at = ar.seconds(np.array([limit - 16, limit]))
    nccl = _reduce("simspec", H100, workers).seconds(np.array([limit]))[0]
    assert at == pytest.approx(nccl)  # NCCL's measured table from the limit on
    traffic = 2 * (workers - 1) / workers * (limit - 16) / ar.bandwidth
    assert below == pytest.approx(ar.custom_s + traffic)


def test_small_messages_cost_the_engines_custom_latency():
    small = np.array([4096.0])
    vllm, sglang = (_reduce(e, H100, 4).seconds(small)[0] for e in ("vllm", "sglang"))
    nccl = _reduce("simspec", H100, 4).seconds(small)[0]
    assert vllm == pytest.approx(collectives.VLLM_CUSTOM_S, rel=0.01)
    assert sglang == pytest.approx(collectives.SGLANG_CUSTOM_S, rel=0.01)
    assert nccl > 3 * vllm  # Vidur's NCCL at 4 GPUs: 38 us


def test_vllm_caps_its_kernel_on_hopper_at_8_gpus():
    assert collectives.custom_limit("vllm", H100, 8) == 256 * 1024
    assert collectives.custom_limit("vllm", H100, 4) == 8 * 2**20
    assert collectives.custom_limit("sglang", H100, 8) == 8 * 2**20
    assert collectives.custom_limit("vllm", costs.gpu_spec("a100-80gb"), 8) == 8 * 2**20


def test_pcie_gpus_use_the_custom_kernel_at_two_only():
    l40s = costs.gpu_spec("l40s")
    assert collectives.custom_limit("vllm", l40s, 2) > 0
    assert collectives.custom_limit("vllm", l40s, 4) == 0
    ar = _reduce("vllm", l40s, 4)
    assert ar.seconds(np.array([4096.0]))[0] >= collectives.NCCL_ALPHA_S
    assert "no custom all-reduce" in ar.label


def test_simspec_mode_prices_as_before():
    base = collectives.all_reduce(H100, 4, PROFILES)
    assert _reduce("simspec", H100, 4) == base
    assert base.custom_limit_bytes == 0


def test_the_cost_line_names_the_regime():
    model = costs.model_spec("Llama-3.1-70B", None, 4)
    line = costs.build("roofline", model, H100, PROFILES, engine="vllm").label
    assert "vllm custom all-reduce < 8 MiB" in line and "NCCL measured" in line


def _config(**top) -> cfg.SimConfig:
    engine = top.pop("engine", "simspec")
    device = top.pop("device", "h100-sxm")
    return cfg.build({}, {"model": "Llama-3.1-70B", "device": device, "workload": {"multimodal_share": 0.0},
                          "engine": {"kind": engine}, **top})


@pytest.mark.parametrize("engine", ["vllm", "sglang"])
def test_engines_refuse_a_drafter_off_the_targets_degree(engine):
    with pytest.raises(InputError, match=r"draft_tp must be 4 with engine .* at tp 4 \(got 1\)"):
        _config(engine=engine, tp=4, draft_tp=1)
    assert _config(engine=engine, tp=4, draft_tp=4).draft_tp == 4


def test_simspec_accepts_one_or_the_targets_degree():
    assert _config(tp=4, draft_tp=1).draft_tp == 1
    with pytest.raises(InputError, match=r"draft_tp must be 1 or 4"):
        _config(tp=4, draft_tp=2)


def test_draft_tp_left_out_of_the_toml_at_its_default():
    assert "draft_tp" not in cfg.to_toml(_config(tp=4))
    assert "draft_tp = 1" in cfg.to_toml(_config(tp=4, draft_tp=1))


def test_a_drafter_on_one_gpu_pays_no_all_reduce_but_computes_it_whole():
    sharded = experiment.model_of(_config(tp=8, drafter="eagle3"))
    whole = experiment.model_of(_config(tp=8, drafter="eagle3", draft_tp=1))
    one_gpu = costs.model_spec("Llama-3.1-70B", "eagle3", 1)
    a = costs.build("roofline", sharded, H100, PROFILES).draft_s_table
    b = costs.build("roofline", whole, H100, PROFILES).draft_s_table
    # At degree 1 a drafter call is the unsharded head's, all-reduce free ...
    np.testing.assert_allclose(b, costs.build("roofline", one_gpu, H100, PROFILES).draft_s_table)
    # ... which for a 70B target's EAGLE-3 head (1.4 B weights) reads 8 x the
    # bytes a shard reads: more than its all-reduces save, at every row.
    assert np.all(b > a)
    assert whole.weight_bytes > sharded.weight_bytes


@pytest.mark.parametrize("engine", ["simspec", "vllm", "sglang"])
def test_more_kv_per_request_at_tp4_than_tp2(engine):
    tokens = {}
    for tp in (2, 4, 8):
        config = _config(engine=engine, tp=tp, device="h200")  # 70B at tp 2 fits an H200, not an H100
        model = experiment.model_of(config)
        tokens[tp] = config.engine.kv_budget_tokens(model, costs.gpu_spec(config.device))
    # Every GPU holds 1/tp of the KV heads, so a request's tokens fill
    # 1/tp of each GPU's cache while each GPU's weights shrink too.
    assert tokens[4] > 2 * tokens[2]
    assert tokens[8] > tokens[4]
