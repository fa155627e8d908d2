"""Drafts trained on SmolLM2-135M-Instruct (scripts/smollm2-drafts runs this
with vLLM's venv's python, the repository on PYTHONPATH).

    python smollm2_drafts.py DIR [--per-class N] [--draft-layers L] [--draft-steps S] [--eagle-steps S]
                                 [--what draft,eagle]

Reads DIR/target (scripts/smollm2-checkpoint). Writes DIR/draft_distilled
(a draft model for vLLM's draft-model speculation) and DIR/eagle (an
EAGLE-1 head for ``"method": "eagle"``), each float32 with the target's
tokenizer, and DIR/simspec-drafts.json (what training saw, each draft's
held-out agreement before and after, the seconds). simspec.vllm.heads says
how each is trained. The prompts are real text (simspec.vllm.texts, seed
TEXT_SEED, every class alike), chat-templated, cut to their last
PROMPT_TOKENS tokens; the target continues each greedily for NEW_TOKENS
tokens; the last HELDOUT of them are held out. The continuations are kept
in DIR/.build, keyed by the prompts' tokens (the same prompts read them
back: ``--what eagle`` retrains the head alone, its record merged into the
file).
"""

import argparse
import hashlib
import json
import os
import shutil
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import AutoTokenizer

from simspec.vllm import distill, heads, texts

TEXT_SEED = 1000  # the training prompts' seed (live runs use other seeds; the record counts shared passages)
PROMPT_TOKENS = 32
NEW_TOKENS = 96
HELDOUT = 48
SEED = 0
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja", "generation_config.json")


def prompt_ids(tokenizer, prompts: list) -> torch.Tensor:
    """Each prompt as the chat template renders it for the model, its last PROMPT_TOKENS tokens: [N, P]."""
    rows = []
    for p in prompts:
        text = tokenizer.apply_chat_template([{"role": "user", "content": p.text}], add_generation_prompt=True,
                                             tokenize=False)
        ids = tokenizer(text).input_ids
        assert len(ids) >= PROMPT_TOKENS, (p.index, len(ids))
        rows.append(ids[-PROMPT_TOKENS:])
    return torch.tensor(rows, dtype=torch.int64)


def write(out: Path, name: str, target: Path, weights: dict, config: dict) -> Path:
    """OUT/NAME: config.json, model.safetensors (float32) and the target's tokenizer, staged then renamed."""
    folder = out / name
    staging = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=out))
    save_file({k: torch.from_numpy(np.ascontiguousarray(v, np.float32)) for k, v in sorted(weights.items())},
              staging / "model.safetensors", metadata={"format": "pt"})
    (staging / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")
    for f in TOKENIZER_FILES:
        if (target / f).exists():
            shutil.copy(target / f, staging / f)
    if folder.exists():
        shutil.rmtree(folder)
    os.replace(staging, folder)
    return folder


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("dir", type=Path)
    parser.add_argument("--per-class", type=int, default=90, help="training and held-out prompts a class")
    parser.add_argument("--draft-layers", type=int, default=2)
    parser.add_argument("--draft-steps", type=int, default=600)
    parser.add_argument("--eagle-steps", type=int, default=600)
    parser.add_argument("--batch", type=int, default=8, help="sequences a training step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--what", default="draft,eagle", help="what to train: draft, eagle or both")
    args = parser.parse_args()
    what = set(args.what.split(","))
    if not what <= {"draft", "eagle"}:
        parser.error(f"--what must be draft, eagle or draft,eagle (got {args.what!r})")
    target_dir = args.dir / "target"
    config = json.loads((target_dir / "config.json").read_text())
    target = {k: v.float() for k, v in load_file(target_dir / "model.safetensors").items()}
    tokenizer = AutoTokenizer.from_pretrained(target_dir)
    kept = args.dir / "simspec-drafts.json"
    record = json.loads(kept.read_text()) if kept.is_file() and what != {"draft", "eagle"} else {}
    record.update({"target": str(target_dir), "text_seed": TEXT_SEED, "prompt_tokens": PROMPT_TOKENS,
                   "new_tokens": NEW_TOKENS, "seed": SEED, "threads": args.threads})
    with distill.deterministic(threads=args.threads):
        torch.manual_seed(SEED)
        prompts = texts.build(args.per_class, seed=TEXT_SEED)
        order = np.random.default_rng(SEED).permutation(len(prompts))  # classes mixed in train and held out
        prompts = [prompts[i] for i in order]
        ids = prompt_ids(tokenizer, prompts)
        # keyed by the prompts themselves: the prose on the machine decides them (simspec.vllm.texts)
        key = hashlib.sha256(ids.numpy().tobytes()).hexdigest()[:16]
        cache = args.dir / ".build" / f"continuations-{key}-{NEW_TOKENS}.npz"
        if not cache.is_file():
            started = time.perf_counter()
            sequences, labels = distill.greedy(target, distill.LlamaConfig.from_hf(config), ids, NEW_TOKENS)
            cache.parent.mkdir(exist_ok=True)
            np.savez_compressed(cache, sequences=sequences.numpy(), labels=labels.numpy(),
                                generate_s=round(time.perf_counter() - started, 1))
        kept_data = np.load(cache)
        sequences, labels = torch.from_numpy(kept_data["sequences"]), torch.from_numpy(kept_data["labels"])
        record["generate_s"] = float(kept_data["generate_s"])
        n_train = len(prompts) - HELDOUT
        record.update(prompts=len(prompts), train=n_train, heldout=HELDOUT,
                      classes=sorted({p.task for p in prompts}),
                      passages_sha256=sorted({p.sha256 for p in prompts}))
        print(f"{len(prompts)} continuations, generated in {record['generate_s']} s", flush=True)
        trained = {}
        if "draft" in what:
            plan = distill.DistillPlan(steps=args.draft_steps, batch_sequences=args.batch)
            trained["draft_distilled"] = heads.distill_draft(
                target, config, sequences, labels, layers=args.draft_layers, n_train=n_train,
                prompt_tokens=PROMPT_TOKENS, plan=plan, seed=SEED), asdict(plan)
        if "eagle" in what:
            plan = heads.EaglePlan(steps=args.eagle_steps, batch_sequences=args.batch)
            trained["eagle"] = heads.train_head(target, config, sequences, n_train=n_train,
                                                prompt_tokens=PROMPT_TOKENS, plan=plan, seed=SEED), asdict(plan)
    for name, (t, plan) in trained.items():
        print(f"{name}: {t.start} -> {t.agreement} in {t.train_s:.0f} s", flush=True)
        write(args.dir, name, target_dir, t.weights, t.config)
        record[name] = {"plan": plan, "final_loss": round(t.final_loss, 4), "train_s": round(t.train_s, 1),
                        "parameters": int(sum(np.prod(w.shape) for w in t.weights.values())),
                        "heldout_before": asdict(t.start), "heldout_after": asdict(t.agreement)}
    if "draft_distilled" in trained:
        record["draft_distilled"]["layers"] = args.draft_layers
    kept.write_text(json.dumps(record, indent=1) + "\n")


if __name__ == "__main__":
    main()
