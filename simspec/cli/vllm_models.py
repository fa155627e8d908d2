"""``simspec vllm-models``: local Llama checkpoints vLLM can serve (simspec.vllm.models)."""

from __future__ import annotations

import argparse
import time

from simspec.vllm.models import DISTILL, SIZES, VllmModelsConfig, build, shapes


def cmd_vllm_models(args: argparse.Namespace) -> int:
    config = VllmModelsConfig(size=args.size, seed=args.seed, distilled=not args.no_distilled,
                              distill_steps=args.distill_steps)
    start = time.perf_counter()
    built = build(args.dir, config)
    sizes = shapes(config)
    flags = (" --no-distilled" if not config.distilled else "") + (
        f" --distill-steps {config.distill_steps}" if config.distill_steps else "")
    print(f"simspec vllm-models {args.dir} --size {config.size} --seed {config.seed}{flags}")
    for name in config.models:
        s = sizes[name]
        kind = "EAGLE-1 head (fc + 1 layer; the target's embedding and LM head)" if name == "eagle" \
            else "LlamaForCausalLM"
        print(f"{args.dir}/{name}: {kind}, {built.parameters[name] / 1e6:.1f}M parameters "
              f"({s.layers} layer{'s' if s.layers > 1 else ''}, hidden {s.hidden}, {s.heads} heads, vocabulary "
              f"{s.vocab_tokens}{', tied head' if s.tied else ''}), bf16")
    d = built.distillation
    if d is not None:
        print(f"draft_distilled: {d.steps} steps x {d.batch_sequences} of {d.train_sequences} target continuations "
              f"({d.train_tokens} tokens; target {d.generate_s:.1f} s, training {d.train_s:.1f} s, loss {d.final_loss:.3f})")
        for name, h in d.heldout.items():
            print(f"held-out agreement on {d.heldout_sequences} continuations, {name}: top-1 {h.top1:.3f}, "
                  f"accepted at depth 1..{len(h.chain)} {', '.join(f'{c:.3f}' for c in h.chain)} "
                  f"(acceptance length {h.acceptance_length:.2f})")
    print(f"built in {time.perf_counter() - start:.1f} s")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simspec vllm-models``."""
    d = VllmModelsConfig()
    p = sub.add_parser("vllm-models", help="local Llama checkpoints for `vllm serve`: a target, an "
                                           "identical-weight draft, a 1-layer draft, a distilled draft and an "
                                           "EAGLE head",
                       description="Write Hugging Face-format Llama checkpoints (config, safetensors, a "
                                   "word-level tokenizer) that `vllm serve` loads, deterministically from a "
                                   "seed and without downloads: DIR/target, DIR/draft_same (the target's "
                                   "weights: every draft token accepted), DIR/draft_1layer, "
                                   "DIR/draft_distilled (a small draft trained on the target's greedy "
                                   "continuations; needs torch) and DIR/eagle (an EAGLE-1 head for "
                                   "--speculative-config method eagle, whose weights copy the current token).")
    p.add_argument("dir", metavar="DIR", help="folder for the models (new, or one this command wrote)")
    p.add_argument("--size", default=d.size, choices=tuple(SIZES),
                   help=f"120m: 12 layers, hidden 768, engine time dominates; tiny: 2 layers, hidden 128, "
                        f"for quick tests (default: {d.size})")
    p.add_argument("--seed", type=int, default=d.seed, help=f"seed of the random weights (default: {d.seed})")
    p.add_argument("--no-distilled", action="store_true", help="leave out draft_distilled (no torch needed)")
    p.add_argument("--distill-steps", type=int, default=d.distill_steps, metavar="N",
                   help="training steps of draft_distilled (default: "
                        + ", ".join(f"{k} {v.steps}" for k, v in DISTILL.items()) + ")")
    p.set_defaults(handler=cmd_vllm_models)
