"""``simspec vllm-models``: local Llama checkpoints vLLM can serve (simspec.vllm_models)."""

from __future__ import annotations

import argparse
import time

from simspec.vllm_models import MODELS, SIZES, VllmModelsConfig, build, shapes


def cmd_vllm_models(args: argparse.Namespace) -> int:
    config = VllmModelsConfig(size=args.size, seed=args.seed)
    start = time.perf_counter()
    counts = build(args.dir, config)
    sizes = shapes(config)
    print(f"simspec vllm-models {args.dir} --size {config.size} --seed {config.seed}")
    for name in MODELS:
        s = sizes[name]
        print(f"{args.dir}/{name}: LlamaForCausalLM, {counts[name] / 1e6:.1f}M parameters "
              f"({s.layers} layer{'s' if s.layers > 1 else ''}, hidden {s.hidden}, {s.heads} heads, vocabulary {s.vocab_tokens}), bf16")
    print(f"built in {time.perf_counter() - start:.1f} s")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simspec vllm-models``."""
    d = VllmModelsConfig()
    p = sub.add_parser("vllm-models", help="local Llama checkpoints for `vllm serve`: a target, an "
                                           "identical-weight draft and a 1-layer draft",
                       description="Write Hugging Face-format Llama checkpoints (config, safetensors, a "
                                   "word-level tokenizer) that `vllm serve` loads, deterministically from a "
                                   "seed and without downloads: DIR/target, DIR/draft_same (the target's "
                                   "weights: every draft token accepted) and DIR/draft_1layer.")
    p.add_argument("dir", metavar="DIR", help="folder for the models (new, or one this command wrote)")
    p.add_argument("--size", default=d.size, choices=tuple(SIZES),
                   help=f"120m: 12 layers, hidden 768, engine time dominates; tiny: 2 layers, hidden 128, "
                        f"for quick tests (default: {d.size})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the random weights (default: {d.seed})")
    p.set_defaults(handler=cmd_vllm_models)
