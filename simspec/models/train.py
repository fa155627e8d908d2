"""Deterministic CPU training and evaluation of the target VLM; checkpoints.

Imports: torch, numpy, :mod:`simspec.types` and :mod:`simspec.seeds`.

Training is cross-entropy on the answer tokens (and the closing EOS) of a
fixed set of generated examples, with AdamW and a warmup + cosine schedule.
It runs single-threaded with deterministic algorithms, so a run is
bit-reproducible on one machine and ``simspec train`` regenerates the shipped
checkpoint. Accuracy is exact match of greedy (KV-cached) answers on held-out
examples generated from a different seed.

A checkpoint folder holds ``model.pt`` (a state_dict, loadable with
``torch.load(weights_only=True)``) and ``meta.json`` (config, seeds, data
hash, steps, wall time, held-out accuracy, torch version).
"""

from __future__ import annotations

import json
import math
import time
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from simspec.files import write_atomic, write_text
from simspec.models.config import QUICK, TargetMeta, TrainConfig
from simspec.models.task import KINDS, Example, Vocab, default_vocab, examples_hash, generate
from simspec.models.vlm import TargetVLM, VLMConfig
from simspec.seeds import derived_seed
from simspec.types import InputError, require

IGNORE = -100


@contextmanager
def deterministic():
    """One thread and deterministic kernels, restored afterwards."""
    threads, strict = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        torch.use_deterministic_algorithms(strict)


def batch_tensors(examples: list[Example], vocab: Vocab) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Images ``[B, P, P, 3]`` uint8, tokens ``[B, T]`` (prompt, answer, EOS,
    right-padded) and targets ``[B, T]`` (the next token where it is an answer
    token or EOS, else IGNORE)."""
    sequences = [(*e.prompt_ids, *e.answer_ids, vocab.eos_id) for e in examples]
    length = max(map(len, sequences))
    tokens = np.full((len(examples), length), vocab.pad_id, np.int64)
    targets = np.full((len(examples), length), IGNORE, np.int64)
    for row, (example, seq) in enumerate(zip(examples, sequences)):
        tokens[row, :len(seq)] = seq
        start = len(example.prompt_ids) - 1  # position whose next token is the first answer token
        targets[row, start:len(seq) - 1] = seq[start + 1:]
    images = np.stack([e.image for e in examples])
    return torch.from_numpy(images), torch.from_numpy(tokens), torch.from_numpy(targets)


def answer(model: TargetVLM, example: Example, vocab: Vocab, max_new_tokens: int = 8) -> tuple[int, ...]:
    """The model's greedy answer (without EOS)."""
    out = model.generate(torch.from_numpy(example.image), example.prompt_ids, max_new_tokens, vocab.eos_id)
    return tuple(out[:-1]) if out and out[-1] == vocab.eos_id else tuple(out)


def accuracy(model: TargetVLM, examples: list[Example], vocab: Vocab) -> dict[str, float]:
    """Exact-match accuracy overall (``"all"``) and per question kind."""
    model.eval()
    hits: dict[str, list[bool]] = {kind: [] for kind in KINDS}
    with torch.no_grad():
        for example in examples:
            hits[example.question.kind].append(answer(model, example, vocab) == example.answer_ids)
    everything = [h for kind in KINDS for h in hits[kind]]
    result = {"all": float(np.mean(everything)) if everything else 0.0}
    result.update({kind: float(np.mean(h)) for kind, h in hits.items() if h})
    return result


def eval_examples(seed: int, n: int) -> list[Example]:
    """The held-out examples of a run trained with ``seed``."""
    return generate(derived_seed(seed, "target-eval"), n)


def train_target(out_dir: str | Path, *, steps: int = TrainConfig().steps, seed: int = TrainConfig().seed,
                 quick: bool = False) -> TargetMeta:
    """Train the target VLM and save ``model.pt`` + ``meta.json`` in ``out_dir``.

    The other hyperparameters come from :class:`TrainConfig` (``QUICK`` when
    ``quick``: 256 examples, batch 16, 20 held out; for tests). Returns the
    meta record written to ``meta.json``."""
    run = TrainConfig(**{**asdict(QUICK if quick else TrainConfig()), "steps": steps, "seed": seed})
    n_train, n_eval, batch = run.train_examples, run.eval_examples, run.batch
    vocab = default_vocab()
    config = VLMConfig(vocab_size=vocab.size)
    started = time.perf_counter()
    train = generate(seed, n_train, vocab)
    images, tokens, targets = batch_tensors(train, vocab)
    losses: list[float] = []
    with deterministic():
        torch.manual_seed(seed)
        model = TargetVLM(config)
        decay = [p for p in model.parameters() if p.dim() >= 2]
        no_decay = [p for p in model.parameters() if p.dim() < 2]
        optimizer = torch.optim.AdamW([{"params": decay, "weight_decay": run.weight_decay},
                                       {"params": no_decay, "weight_decay": 0.0}], lr=run.lr, betas=(0.9, 0.95))
        warmup = min(run.warmup_steps, max(1, steps // 10))
        schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(1.0, (s + 1) / warmup) * (
            0.1 + 0.45 * (1 + math.cos(math.pi * min(1.0, s / steps)))))
        sampler = torch.Generator().manual_seed(seed)
        model.train()
        for _ in range(steps):
            rows = torch.randint(0, n_train, (batch,), generator=sampler)
            out = model(images[rows], tokens[rows])
            loss = F.cross_entropy(out.logits.flatten(0, 1), targets[rows].flatten(), ignore_index=IGNORE)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            losses.append(float(loss.detach()))
        train_s = time.perf_counter() - started
        held_out = accuracy(model, eval_examples(seed, n_eval), vocab)
    window = max(1, min(20, steps // 4))
    meta = TargetMeta(**{
        "config": asdict(config),
        "vocab": list(vocab.words),
        "seed": seed,
        "train_examples": n_train,
        "data_hash": examples_hash(train),
        "eval_seed": derived_seed(seed, "target-eval"),
        "eval_examples": n_eval,
        "steps": steps,
        "batch": batch,
        "lr": run.lr,
        "warmup_steps": run.warmup_steps,
        "weight_decay": run.weight_decay,
        "quick": quick,
        "loss_first": float(np.mean(losses[:window])),
        "loss_last": float(np.mean(losses[-window:])),
        "train_wall_s": round(train_s, 2),
        "wall_s": round(time.perf_counter() - started, 2),
        "heldout_accuracy": held_out["all"],
        "heldout_accuracy_by_kind": {k: v for k, v in held_out.items() if k != "all"},
        "torch_version": torch.__version__,
    })
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().clone().contiguous() for k, v in model.state_dict().items()}
    write_atomic(out / "model.pt", lambda f: torch.save(state, f))
    write_text(out / "meta.json", json.dumps(meta.to_json(), indent=2) + "\n")
    return meta


def read_checkpoint_meta(directory: str | Path, weights_name: str) -> tuple[dict, Path, Path]:
    """A checkpoint folder's parsed ``meta.json`` and the paths of it and of
    its weights; a missing or unreadable file raises :class:`InputError` naming it."""
    directory = Path(directory)
    meta_path, weights_path = directory / "meta.json", directory / weights_name
    for path in (meta_path, weights_path):
        require(path.is_file(), f"checkpoint file {path} is missing")
    try:
        return json.loads(meta_path.read_text()), meta_path, weights_path
    except ValueError as error:
        raise InputError(f"checkpoint file {meta_path} is corrupt: {error}") from None


def load_weights(module: torch.nn.Module, weights_path: Path, meta_path: Path) -> None:
    """Load ``weights_path`` into ``module``; a corrupt file or weights that
    do not fit the config in ``meta_path`` raise :class:`InputError`."""
    try:
        state = torch.load(weights_path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many types for a bad file
        raise InputError(f"checkpoint file {weights_path} is corrupt: {type(error).__name__}") from None
    try:
        module.load_state_dict(state)
    except (RuntimeError, TypeError, AttributeError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise InputError(f"checkpoint file {weights_path} does not match the config in {meta_path}: {first}") from None
    module.eval()


def load_target(directory: str | Path) -> tuple[TargetVLM, Vocab, TargetMeta]:
    """Load a checkpoint folder; a missing or corrupt file or a config that
    does not fit the weights raises :class:`InputError` naming the file."""
    record, meta_path, weights_path = read_checkpoint_meta(directory, "model.pt")
    meta = TargetMeta.from_json(record, str(meta_path))
    try:
        config = VLMConfig(**meta.config)
        vocab = Vocab(words=tuple(meta.vocab))
    except (ValueError, KeyError, TypeError) as error:
        raise InputError(f"checkpoint file {meta_path} is corrupt: {error}") from None
    require(vocab == default_vocab(), f"checkpoint file {meta_path}: its vocab differs from the task's")
    require(config.vocab_size == vocab.size,
            f"checkpoint file {meta_path}: config.vocab_size={config.vocab_size} but vocab has {vocab.size} words")
    model = TargetVLM(config)
    load_weights(model, weights_path, meta_path)
    return model, vocab, meta
