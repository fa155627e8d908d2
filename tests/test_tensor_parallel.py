"""Tensor parallelism: one GPU's share of a sharded model, the all-reduces
it pays, and the sanity of what follows (TPOT, throughput per GPU, KV per
request, the all-reduce's share of a step)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from conftest import invoke
from simspec import costs
from simspec.costs import collectives
from simspec.costs.roofline import roofline
from simspec.serving.config import EngineConfig
from simspec.types import InputError

H100, H200 = costs.gpu_spec("h100-sxm"), costs.gpu_spec("h200")
FREE = collectives.AllReduce(workers=2, label="free", alpha_s=0.0, bandwidth=np.inf)


def decode_s(model, gpu, batch: int, context: int = 1000, all_reduce=None) -> float:
    """One AR decode step of ``batch`` requests of ``context`` tokens each, on the roofline prior."""
    cost = roofline(model, gpu, all_reduce=all_reduce)
    return cost.forward_s(batch, batch * context, batch * context, batch, batch, batch * context)


def test_one_gpus_share_of_a_sharded_model():
    full = costs.model_spec("Qwen2.5-72B")
    for tp in (2, 4, 8):
        shard = costs.model_spec("Qwen2.5-72B", tp=tp)
        assert shard.heads_per_gpu == 64 // tp and shard.kv_heads_per_gpu == 8 // tp
        assert shard.kv_bytes_per_token * tp == full.kv_bytes_per_token
        assert shard.weight_bytes == pytest.approx(full.weight_bytes / tp, rel=1e-3)
    # 8 KV heads over 16 GPUs would be replicated: each GPU keeps one (vLLM's rule); here at 8, one each.
    assert costs.model_spec("Llama-3.1-70B", tp=8).kv_heads_per_gpu == 1


def test_tpot_at_batch_1_falls_with_tp_but_less_than_linearly():
    model = costs.model_spec("Qwen2.5-72B")
    steps = {tp: decode_s(replace(model, tensor_parallel=tp), H100, 1) for tp in (2, 4, 8)}
    assert steps[2] > steps[4] > steps[8]
    assert steps[2] / steps[4] < 2 and steps[4] / steps[8] < 2


def test_throughput_per_gpu_falls_with_tp():
    model = costs.model_spec("Llama-3.1-70B")
    per_gpu = {tp: 64 / decode_s(replace(model, tensor_parallel=tp), H100, 64) / tp for tp in (2, 4, 8)}
    assert per_gpu[2] > per_gpu[4] > per_gpu[8]


def test_the_all_reduce_share_of_a_decode_step_grows_with_tp():
    model = costs.model_spec("Llama-3.1-70B")
    share = {}
    for tp in (2, 4, 8):
        sharded = replace(model, tensor_parallel=tp)
        paid, free = decode_s(sharded, H100, 8), decode_s(sharded, H100, 8, all_reduce=replace(FREE, workers=tp))
        share[tp] = 1 - free / paid
    assert 0 < share[2] < share[4] < share[8]


def test_a_72b_model_gets_more_kv_per_request_on_tp_4_than_on_tp_2():
    engine = EngineConfig()
    tokens = {tp: engine.kv_budget_tokens(costs.model_spec("Qwen2.5-72B", tp=tp), H200) for tp in (2, 4)}
    assert tokens[4] > 2 * tokens[2]  # twice the GPUs' memory, and each holds half the weights


def test_a_model_that_does_not_fit_says_which_degree_to_try():
    # 70.6B parameters in bf16 (141.1 GB) and the EAGLE-1 head's layer and fc (2.0 GB) on one 80 GB GPU.
    with pytest.raises(InputError, match=r"Llama-3.1-70B at tp 1 does not fit .* weights 143\.1 GB a GPU, "
                                         r"72\.0 GB usable; try --tp 2 or more"):
        EngineConfig().kv_budget_tokens(costs.model_spec("Llama-3.1-70B"), H100)


def test_one_gpu_is_unchanged_by_the_tensor_parallel_terms():
    model = costs.model_spec("LLaVA-1.5-7B")
    ours, plain = roofline(model, H100, all_reduce=collectives.prior(H100, 2)).tables, roofline(model, H100).tables
    assert all(np.array_equal(a, b) for a, b in zip(ours, plain))  # tp 1 pays no all-reduce, whatever is given


def test_the_measured_all_reduce_interpolates_and_the_prior_extends_it(tmp_path):
    folder = tmp_path / "h100-sxm" / "collectives"
    folder.mkdir(parents=True)
    (folder / "all_reduce.csv").write_text("workers,bytes,median_ms\n4,1000,0.010\n4,100000,0.020\n")
    measured = collectives.all_reduce(H100, 4, tmp_path)
    assert measured.seconds(np.array([1000.0, 10000.0, 100000.0])) == pytest.approx([10e-6, np.sqrt(10e-6 * 20e-6),
                                                                                     20e-6])
    beyond = measured.seconds(np.array([200000.0]))[0] - 20e-6
    assert beyond == pytest.approx(1.5 * 100000 / measured.bandwidth)  # the ring traffic's slope past the table
    assert collectives.all_reduce(H100, 8, tmp_path).sizes == ()  # no rows for 8 GPUs: the prior


@pytest.mark.parametrize("argv, says", [
    ("--tp 3", "tp must be one of 1, 2, 4, 8"),
    ("--model Qwen2-VL-7B --tp 8", "28 attention heads are not divisible by tp 8"),
    ("--model Llama-3.1-70B --multimodal-share 0", "try --tp 2 or more"),
    ("--model Llama-3.1-70B --multimodal-share 0 --tp 4 --cost-model profile:profiles/h100-sxm/Llama-2-7B",
     "tp 4 run has no profile"),
])
def test_bad_tensor_parallel_input_is_one_line(argv, says):
    code, _, err = invoke(["simulate", "--num-requests", "5", "--quiet", *argv.split()])
    assert code == 2 and says in err and err.count("\n") == 1, err


def test_simulate_runs_a_70b_model_on_four_gpus():
    code, out, err = invoke(["simulate", "--model", "Llama-3.1-70B", "--tp", "4", "--num-requests", "30",
                             "--multimodal-share", "0", "--policy", "ar", "--policy", "linear:k=3"])
    assert code == 0, err
    assert "tensor parallel 4: all-reduce measured" in out.replace("\n  ", " ")
    rows = {line.split()[0]: float(line.split()[4]) for line in out.splitlines()
            if line.startswith(("ar ", "linear:k=3"))}
    assert rows["linear:k=3"] < rows["ar"]  # speculation pays on a memory-bound 70B decode


def test_a_sweep_runs_every_scenario_at_the_given_degree(tmp_path):
    import pandas as pd

    out = tmp_path / "t.parquet"
    code, _, err = invoke(["sweep", "--model", "Llama-3.1-70B", "--tp", "4", "--multimodal-share", "0", "--rate", "2",
                           "--num-requests", "20", "--policy", "ar", "--out", out, "--quiet", "--workers", "1"])
    assert code == 0, err
    table = pd.read_parquet(out)
    assert "tp = 4" in table.config_toml[0] and (table.cost_calibration == "partly calibrated").all()  # shape law
