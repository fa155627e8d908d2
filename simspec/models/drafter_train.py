"""Deterministic CPU training of the drafter against the shipped target.

Imports: torch, numpy, tqdm, simspec.models (task, vlm, drafter, train).

Online-logit distillation (SpecVLM): the target runs alongside training and
its logits and features at every position are the teacher, computed fresh
for each batch; nothing is labelled offline. The text the teacher is run on
is the target's own greedy output: each example's prompt followed by
``rollout_tokens`` tokens the target generates (past its EOS, as serving
benchmarks with ``ignore_eos`` do), so the drafter learns the distribution
it will be asked to predict live. The loss is unrolled ``depth`` draft steps
with acceptance-aware position weights (:func:`drafter.unrolled_losses`).
The visual context is drawn per batch from ``CONTEXTS``, so one checkpoint
serves every variant the engine can load (none, selected:K, pooled:K, full).

A checkpoint folder holds ``drafter.pt`` (the drafter's own weights; the
target's embedding and LM head are shared) and ``meta.json`` (config, seeds,
data hash, the target checkpoint's hash, teacher-forced acceptance per
variant).
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from simspec.acceptance.context import DraftContext
from simspec.files import write_atomic, write_text
from simspec.models.config import DrafterMeta, DrafterTrainConfig
from simspec.models.drafter import Drafter, DrafterConfig, chain_acceptance, unrolled_losses
from simspec.models.task import Example, Vocab, examples_hash, generate
from simspec.models.train import deterministic, load_target, load_weights, read_checkpoint_meta
from simspec.models.vlm import TargetVLM
from simspec.seeds import derived_seed
from simspec.types import InputError

CONTEXTS = ("selected:8", "none", "selected:1", "selected:4", "full", "pooled:4", "selected:8", "selected:16")
"""Visual contexts drawn in turn, one per batch (selected:8 is the engine's default)."""
VARIANTS = ("none", "selected:1", "selected:4", "selected:8", "selected:16", "selected:32", "pooled:4", "full")
"""Variants whose acceptance the meta records (K >= the 16 visual tokens is full)."""


QUICK = DrafterTrainConfig(steps=6, batch=8, train_examples=32, eval_examples=8, rollout_tokens=8, depth=3)


@torch.no_grad()
def rollouts(target: TargetVLM, examples: list[Example], tokens: int, batch: int = 256) -> list[tuple[int, ...]]:
    """Each example's prompt followed by ``tokens`` greedy target tokens
    (EOS does not stop it). Examples with equal prompt lengths decode together."""
    out: list[tuple[int, ...] | None] = [None] * len(examples)
    by_length: dict[int, list[int]] = {}
    for i, e in enumerate(examples):
        by_length.setdefault(len(e.prompt_ids), []).append(i)
    for length, rows in sorted(by_length.items()):
        for start in range(0, len(rows), batch):
            ids = rows[start:start + batch]
            images = torch.from_numpy(np.stack([examples[i].image for i in ids]))
            prompt = torch.tensor([examples[i].prompt_ids for i in ids], dtype=torch.long)
            caches: list[list[torch.Tensor]] = [[] for _ in target.blocks]
            visual = target.encode_image(images)
            hidden = target._decode(torch.cat([visual, target.embed(prompt)], 1), 0, caches)
            position = hidden.shape[1]
            generated = []
            for _ in range(tokens):
                token = target.head(hidden[:, -1]).argmax(-1)  # [b]
                generated.append(token)
                hidden = target._decode(target.embed(token[:, None]), position, caches)
                position += 1
            new = torch.stack(generated, 1).tolist()
            for row, i in enumerate(ids):
                out[i] = (*examples[i].prompt_ids, *new[row])
    return out  # type: ignore[return-value]


def _tensors(examples: list[Example], texts: list[tuple[int, ...]], vocab: Vocab):
    length = max(map(len, texts))
    tokens = torch.full((len(texts), length), vocab.pad_id, dtype=torch.long)
    for row, text in enumerate(texts):
        tokens[row, :len(text)] = torch.tensor(text)
    images = torch.from_numpy(np.stack([e.image for e in examples]))
    return images, tokens, tokens != vocab.pad_id


def _file_hash(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@torch.no_grad()
def evaluate(drafter: Drafter, target: TargetVLM, images, tokens, valid, depth: int) -> dict[str, dict]:
    """Teacher-forced acceptance per variant: per-depth top-1 agreement and
    the acceptance length of linear drafts of 1..depth tokens."""
    trace = target.trace(images, tokens)
    result = {}
    for variant in VARIANTS:
        _, hits, counted = unrolled_losses(drafter, trace, tokens, valid, DraftContext.parse(variant), depth)
        result[variant] = {
            "top1_by_depth": [round(float(h[c].float().mean()), 4) for h, c in zip(hits, counted)],
            "acceptance_length_linear": {str(k): round(chain_acceptance(hits, counted, k), 4)
                                         for k in range(1, depth + 1)},
        }
    return result


def train_drafter(out_dir: str | Path, target_dir: str | Path = "checkpoints/target", *,
                  config: DrafterTrainConfig | None = None, quick: bool = False, progress: bool = True) -> DrafterMeta:
    """Train the drafter against the target in ``target_dir``; save
    ``drafter.pt`` and ``meta.json`` in ``out_dir``; return the meta record."""
    run = config or (QUICK if quick else DrafterTrainConfig())
    target, vocab, _ = load_target(target_dir)
    started = time.perf_counter()
    with deterministic():
        torch.manual_seed(run.seed)
        train = generate(derived_seed(run.seed, "drafter-data"), run.train_examples, vocab)
        held = generate(derived_seed(run.seed, "drafter-eval"), run.eval_examples, vocab)
        texts = rollouts(target, train, run.rollout_tokens)
        images, tokens, valid = _tensors(train, texts, vocab)
        eval_tensors = _tensors(held, rollouts(target, held, run.rollout_tokens), vocab)
        drafter = Drafter(DrafterConfig(), target)
        for p in target.parameters():
            p.requires_grad_(False)
        params = list(drafter.parameters())
        decay = [p for p in params if p.dim() >= 2]
        no_decay = [p for p in params if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": run.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=run.lr, betas=(0.9, 0.95))
        warmup = min(run.warmup_steps, max(1, run.steps // 10))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
            0.05 + 0.475 * (1 + math.cos(math.pi * min(1.0, s / run.steps)))))
        sampler = torch.Generator().manual_seed(run.seed)
        losses: list[float] = []
        drafter.train()
        bar = tqdm(range(run.steps), desc="train drafter", unit="step", disable=not progress, leave=False)
        for step in bar:
            rows = torch.randint(0, len(train), (run.batch,), generator=sampler)
            width = int(valid[rows].sum(1).max())
            batch_tokens, batch_valid = tokens[rows, :width], valid[rows, :width]
            with torch.no_grad():
                trace = target.trace(images[rows], batch_tokens)
            context = DraftContext.parse(CONTEXTS[step % len(CONTEXTS)])
            loss, _, _ = unrolled_losses(drafter, trace, batch_tokens, batch_valid, context, run.depth)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
            if step % 20 == 0:
                bar.set_postfix(loss=f"{losses[-1]:.3f}")
        train_s = time.perf_counter() - started
        drafter.eval()
        acceptance = evaluate(drafter, target, *eval_tensors, run.depth)
    window = max(1, min(20, run.steps // 4))
    full = acceptance["full"]["acceptance_length_linear"][str(run.depth)]
    meta = DrafterMeta(**{
        "config": asdict(DrafterConfig()),
        "train": asdict(run),
        "quick": quick,
        "contexts": list(CONTEXTS),
        "target_checkpoint_sha256": _file_hash(Path(target_dir) / "model.pt"),
        "data_hash": examples_hash(train),
        "rollout_hash": hashlib.sha256(json.dumps(texts).encode()).hexdigest(),
        "loss_first": float(np.mean(losses[:window])),
        "loss_last": float(np.mean(losses[-window:])),
        "train_wall_s": round(train_s, 2),
        "acceptance_teacher_forced": acceptance,
        "selected8_share_of_full": round(acceptance["selected:8"]["acceptance_length_linear"][str(run.depth)] / full, 4),
        "torch_version": torch.__version__,
    })
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in drafter.state_dict().items()}
    write_atomic(out / "drafter.pt", lambda f: torch.save(state, f))
    write_text(out / "meta.json", json.dumps(meta.to_json(), indent=2) + "\n")
    return meta


def load_drafter(directory: str | Path, target: TargetVLM,
                 target_dir: str | Path | None = None) -> tuple[Drafter, DrafterMeta]:
    """Load a drafter folder for ``target``; a missing or corrupt file, or
    weights that do not fit, raise :class:`InputError` naming the file."""
    record, meta_path, weights_path = read_checkpoint_meta(directory, "drafter.pt")
    meta = DrafterMeta.from_json(record, str(meta_path))
    try:
        config = DrafterConfig(**meta.config)
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"checkpoint file {meta_path} is corrupt: {error}") from None
    if target_dir is not None and meta.target_checkpoint_sha256 != _file_hash(Path(target_dir) / "model.pt"):
        raise InputError(f"checkpoint file {meta_path}: trained against a different target than {target_dir}")
    try:
        drafter = Drafter(config, target)
    except InputError as error:
        raise InputError(f"checkpoint file {meta_path}: {error}") from None
    load_weights(drafter, weights_path, meta_path)
    return drafter, meta
