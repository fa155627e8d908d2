"""Timing-only live runs: random weights at a spec's shape, replayed acceptance."""

from dataclasses import replace

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simspec import metrics, workloads  # noqa: E402
from simspec.acceptance import AcceptanceModel, DraftContext, mean_chain_tokens  # noqa: E402
from simspec.cli import main  # noqa: E402
from simspec.costs import MODELS, affine  # noqa: E402
from simspec.live import run as live, timing  # noqa: E402
from simspec.live.engine import LiveConfig  # noqa: E402
from simspec.types import InputError  # noqa: E402

SMALL = replace(MODELS["LLaVA-1.5-7B"], name="small-llava-shape", layers=2, hidden=64, heads=2, kv_heads=2,
                mlp_hidden=128, vocab=300, visual_tokens_per_image=16, vision_layers=1, vision_hidden=64,
                vision_mlp_hidden=128, max_context_tokens=1024)


def serve(policy: str, acceptance: AcceptanceModel, *, n: int = 16, dtype=torch.float32, seed: int = 0,
          realtime: bool = True):
    target, drafter = timing.shaped_models(SMALL, dtype=dtype, seed=seed)
    models = live.Models(target=target, drafter=drafter, target_dir="", drafter_dir="")
    cfg = workloads.WorkloadConfig(arrival="poisson", rate_per_s=1000.0, num_requests=n, output_mean_tokens=60,
                                   prompt_mean_tokens=12)
    requests, examples = timing.shaped_workload(cfg, SMALL, seed, max_context_tokens=SMALL.max_context_tokens)
    config = LiveConfig()
    replay = timing.AcceptanceReplay(acceptance, DraftContext.parse(config.drafter_context), seed=seed)
    return live.serve_live(models, policy, requests, examples, affine(1.0, 0.05), config, replay=replay,
                           realtime=realtime)


def test_shape_of_llava_15_7b():
    c = timing.vlm_config(MODELS["LLaVA-1.5-7B"])
    assert (c.width, c.layers, c.heads, c.mlp_hidden, c.vocab_size) == (4096, 32, 32, 11008, 32000)
    assert c.visual_tokens == 576 and (c.vision_width, c.vision_layers, c.vision_mlp_hidden) == (1024, 24, 4096)


@pytest.mark.parametrize("name, message", [("LLaVA-1.6-7B", "not one square grid"),
                                           ("Vicuna-7B", "need a VLM spec")])
def test_shapes_it_cannot_build_are_refused(name, message):
    with pytest.raises(InputError, match=message):
        timing.vlm_config(MODELS[name])


def test_replayed_iid_acceptance_matches_the_closed_form():
    """Random weights accept nothing on their own; with i.i.d. acceptance
    a = 0.7 replayed, a 3-token chain emits (1 - a^4) / (1 - a) tokens a
    round. The live engine's batching follows the wall clock, so the rounds
    the replayed draws fall on vary: 296-325 in six runs on the development
    machine. A round's tokens have s.d. 1.24, so from 250 rounds the bound
    (0.25) is at least 3.2 standard errors."""
    result = serve("linear:k=3", AcceptanceModel.iid(0.7))
    assert result.log.complete
    length = metrics.summarize(result.log)["spec_decode_acceptance_length"]
    assert length == pytest.approx(mean_chain_tokens(0.7, 3), abs=0.25)
    assert len(result.log.round_accepted) >= 250


def test_replay_lifts_acceptance_above_what_random_weights_give():
    high = metrics.summarize(serve("linear:k=3", AcceptanceModel.iid(0.9), n=6).log)
    low = metrics.summarize(serve("linear:k=3", AcceptanceModel.iid(0.2), n=6).log)
    assert high["spec_decode_acceptance_length"] > low["spec_decode_acceptance_length"] + 1.0


@pytest.mark.parametrize("policy", ["tree:depth=3,topk=2,budget=6", "marginal", "truncate"])
def test_every_policy_serves_in_bfloat16(policy):
    result = serve(policy, AcceptanceModel.iid(0.8), n=4, dtype=torch.bfloat16)
    assert result.log.complete
    assert all(len(out) == r.output_tokens for r, out in zip(result.log.requests, result.outputs.values()))


def test_same_seed_same_acceptance():
    """The replay draws each round for the batch as it stands, so the same
    seed gives the same acceptance given the same batches. In real time the
    batches follow the wall clock (a request that arrives a millisecond
    later joins a step later, on a loaded machine), so both runs take
    every request at t=0: then the scheduler alone forms the batches."""
    a = serve("linear:k=3", AcceptanceModel.iid(0.6), n=4, realtime=False).log
    b = serve("linear:k=3", AcceptanceModel.iid(0.6), n=4, realtime=False).log
    assert len(a.round_accepted) > 20
    assert np.array_equal(a.round_accepted, b.round_accepted)
    other = serve("linear:k=3", AcceptanceModel.iid(0.6), n=4, seed=1, realtime=False).log
    assert not np.array_equal(a.round_accepted[:20], other.round_accepted[:20])


def test_cli_timing_only_on_the_tiny_spec(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["live", "--timing-only", "simspec-tiny-vlm", "--acceptance", "iid:0.8", "--policy", "ar", "--policy",
                 "linear:k=3", "--num-requests", "6", "--rate", "200", "--gpu", "h100-sxm", "--quiet",
                 "--out", str(out)])
    assert code == 0
    assert (out / "metrics.json").is_file() and (out / "acceptance_traces.jsonl").is_file()
    assert "timing-only: random-weight simspec-tiny-vlm" in capsys.readouterr().err


def test_cli_refuses_a_missing_traces_file(tmp_path, capsys):
    code = main(["live", "--timing-only", "simspec-tiny-vlm", "--traces", str(tmp_path / "none.jsonl"),
                 "--num-requests", "2", "--quiet"])
    assert code == 2
    assert "--traces" in capsys.readouterr().err


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_llava_15_7b_shape_on_cuda():
    spec = MODELS["LLaVA-1.5-7B"]
    target, drafter = timing.shaped_models(spec, device="cuda", dtype=torch.bfloat16)
    models = live.Models(target=target, drafter=drafter, target_dir="", drafter_dir="")
    cfg = workloads.WorkloadConfig(arrival="poisson", rate_per_s=1000.0, num_requests=8, output_mean_tokens=32)
    requests, examples = timing.shaped_workload(cfg, spec, 0, max_context_tokens=spec.max_context_tokens)
    replay = timing.AcceptanceReplay(AcceptanceModel.iid(0.7), DraftContext.parse("selected:8"))
    result = live.serve_live(models, "linear:k=3", requests, examples, affine(1.0, 0.05), LiveConfig(),
                             replay=replay)
    assert result.log.complete
    assert metrics.summarize(result.log)["spec_decode_acceptance_length"] > 1.5
