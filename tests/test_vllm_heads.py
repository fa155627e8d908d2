"""Drafts trained on a real target (simspec.vllm.heads): the EAGLE head's
forward, start and replay, the draft model's start, and that training moves
them; the real-text traffic of ``validate --against vllm --texts``. On a
small random Llama, in torch (the build step runs them on SmolLM2)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from simspec.vllm import texts
from simspec.vllm.logs import replay_rounds, replay_runs
from simspec.vllm.server import Traffic

torch = pytest.importorskip("torch")
from simspec.vllm import distill, heads  # noqa: E402

CONFIG = {"num_hidden_layers": 4, "hidden_size": 32, "num_attention_heads": 4, "num_key_value_heads": 2,
          "head_dim": 8, "intermediate_size": 64, "vocab_size": 64, "rms_norm_eps": 1e-5,
          "rope_parameters": {"rope_theta": 10000.0}, "tie_word_embeddings": True}


def llama(seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    h, kv, d, m, v = 32, 2 * 8, 8, 64, 64
    w = {"model.embed_tokens.weight": torch.randn(v, h, generator=g), "model.norm.weight": torch.ones(h)}
    for i in range(CONFIG["num_hidden_layers"]):
        p = f"model.layers.{i}."
        for name, shape in (("self_attn.q_proj", (h, h)), ("self_attn.k_proj", (kv, h)), ("self_attn.v_proj", (kv, h)),
                            ("self_attn.o_proj", (h, h)), ("mlp.gate_proj", (m, h)), ("mlp.up_proj", (m, h)),
                            ("mlp.down_proj", (h, m))):
            w[p + name + ".weight"] = torch.randn(*shape, generator=g) * 0.2
        w[p + "input_layernorm.weight"] = torch.ones(h)
        w[p + "post_attention_layernorm.weight"] = torch.ones(h)
    return w


@pytest.fixture(scope="module")
def data():
    target, c = llama(), distill.LlamaConfig.from_hf(CONFIG)
    prompts = torch.randint(3, 64, (40, 6), generator=torch.Generator().manual_seed(1))
    sequences, labels = distill.greedy(target, c, prompts, 12)
    return target, c, sequences, labels


def test_the_eagle_head_starts_as_the_targets_own_state(data):
    """fc = [0 | I] and zero output projections: the head's output is the
    target's hidden state, whose head argmax is the target's own next token
    (so its first draft is the token just emitted, as vLLM feeds it)."""
    target, c, sequences, _ = data
    init = heads.eagle_init(target, c)
    states = heads.target_states(target, c, sequences)
    embeds = target["model.embed_tokens.weight"][sequences]
    assert torch.equal(heads.eagle(init, c, embeds, states), states)
    assert set(init) == {"fc.weight"} | {heads.EAGLE_PREFIX + n for n in (
        "self_attn.q_proj.weight", "self_attn.k_proj.weight", "self_attn.v_proj.weight", "self_attn.o_proj.weight",
        "mlp.gate_proj.weight", "mlp.up_proj.weight", "mlp.down_proj.weight", "post_attention_layernorm.weight")}


def test_the_draft_model_takes_evenly_spaced_layers():
    target = llama()
    draft, config = heads.draft_init(target, CONFIG, 2)
    assert config["num_hidden_layers"] == 2 and config["vocab_size"] == CONFIG["vocab_size"]
    assert torch.equal(draft["model.layers.0.mlp.up_proj.weight"], target["model.layers.0.mlp.up_proj.weight"])
    assert torch.equal(draft["model.layers.1.mlp.up_proj.weight"], target["model.layers.3.mlp.up_proj.weight"])
    assert not any(k.startswith("model.layers.2.") for k in draft)


def test_replay_runs_is_replay_rounds_where_drafts_are_the_first_at_later_positions():
    rng = np.random.default_rng(0)
    matches = [list(rng.random(30) < p) for p in (0.2, 0.5, 0.9)]
    runs = []
    for row in matches:
        runs.append([next((n for n in range(3) if not all(row[i:i + n + 1]) or i + n + 1 > len(row)), 3)
                     if i < len(row) else 0 for i in range(len(row))])
    assert replay_runs(runs, 3) == replay_rounds(matches, 3)
    assert replay_runs([[0, 3, 3, 3, 3, 3, 3, 3, 3]], 3) == ([2, 2, 2], 2)  # 1 + 4 + 4 tokens: two full rounds


def test_training_moves_the_head_and_the_draft():
    """A few steps raise the held-out chain acceptance of both from their
    start, on sequences that count up by one: a random target's own greedy
    text repeats one token, which the head's start (the target's own next
    token) already drafts."""
    target = llama()
    starts = torch.randint(3, 64, (40, 1), generator=torch.Generator().manual_seed(2))
    sequences = 3 + (starts - 3 + torch.arange(19)) % 61  # [40, 19]: ordinary ids, each one more than the last
    labels = torch.cat([sequences[:, 1:], sequences[:, -1:]], 1)  # the token after each
    head = heads.train_head(target, CONFIG, sequences, n_train=32, prompt_tokens=6,
                            plan=heads.EaglePlan(steps=60, batch_sequences=8, learning_rate=3e-3), seed=0)
    assert head.agreement.acceptance_length > head.start.acceptance_length
    assert 0 <= head.agreement.top1 <= 1 and all(0 <= r <= 1 for r in head.agreement.chain)
    assert list(head.agreement.chain) == sorted(head.agreement.chain, reverse=True)
    draft = heads.distill_draft(target, CONFIG, sequences, labels, layers=2, n_train=32, prompt_tokens=6,
                                plan=distill.DistillPlan(steps=60, batch_sequences=8, learning_rate=3e-3), seed=0)
    assert draft.agreement.acceptance_length > draft.start.acceptance_length
    assert np.array_equal(draft.weights["model.embed_tokens.weight"],
                          target["model.embed_tokens.weight"].numpy())  # frozen: the target's head


def test_text_traffic_is_the_benchs_custom_dataset(tmp_path):
    t = Traffic(name="low", prompts=12, input_len=100, output_len=40, range_ratio=0.5, rate=0.2, seed=5,
                dataset="prompts/low.jsonl")
    args = t.bench_args(tmp_path)
    assert args[:6] == ["--dataset-name", "custom", "--dataset-path", str(tmp_path / "prompts/low.jsonl"),
                        "--custom-output-len", "-1"]
    assert Traffic.from_json(t.to_json()) == t
    assert "dataset" not in Traffic(name="r", prompts=1, input_len=8, output_len=8).to_json()  # as runs.json had it
    rows = texts.bench_dataset(12, 5, 40, 0.5)
    assert rows == texts.bench_dataset(12, 5, 40, 0.5) and rows != texts.bench_dataset(12, 6, 40, 0.5)
    assert [r["task"] for r in rows] == list(texts.LIVE_CLASSES) * 2
    assert all(20 <= r["output_tokens"] <= 60 and r["prompt"] for r in rows)
    assert len({r["output_tokens"] for r in rows}) > 3
    json.dumps(rows)
