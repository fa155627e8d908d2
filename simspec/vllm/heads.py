"""Drafts trained on a real target, in torch: a draft model distilled from
it and an EAGLE-1 head trained on its hidden states, both on the target's
own greedy continuations of real-text prompts.

Imports: the standard library, numpy, torch, simspec.types and
simspec.vllm.distill (the Llama forward, greedy generation, the replay of
vLLM's rounds). Nothing of the package imports this module at its top: the
build step (``scripts/smollm2-drafts``) runs it with vLLM's venv's python,
which reads the target's checkpoint and tokenizer.

**The data.** ``prompts`` [N, P] (token ids: the last P tokens of real-text
chat prompts) and the target's greedy continuation of each, C tokens
(:func:`simspec.vllm.distill.greedy`): ``sequences`` [N, P + C] and
``labels`` [N, P + C], ``labels[:, t]`` the target's argmax after token t.
Greedy verification accepts a draft token while it equals the target's
own, and a held-out sequence *is* the target's greedy continuation, so
one teacher-forced pass over it gives every round's outcome
(:func:`simspec.vllm.distill.agreement`, :func:`head_agreement`).

**The draft model** (:func:`draft_init`): the target's embedding (frozen,
tied head), final norm and ``layers`` of its decoder layers, evenly spaced
from the first to the last; trained by cross-entropy on the labels of the
continuation positions (:func:`simspec.vllm.distill.train`, token ids as
they are).

**The EAGLE-1 head** (:func:`eagle`), as vLLM's ``EagleLlamaForCausalLM``
runs it (``vllm/model_executor/models/llama_eagle.py``; the layout of
:func:`simspec.vllm.models.eagle_tensors`): at position t it reads the
embedding of the token the target emitted there, x[t+1], and the target's
last hidden state h[t] (after the final norm) that the token came from;
``fc`` maps their concatenation to the hidden width, then one decoder layer
without its input norm, no final norm; the target's LM head scores the
output for the next token, x[t+2]. Each further draft feeds the head its
own output and the token it drafted. Training (:func:`train_eagle`)
unrolls ``depth`` drafts: draft j at position t reads the embedding of
x[t+j] (the token the draft before it proposed, when accepted) and the
previous draft's output at t, and is scored on x[t+j+1]; the later drafts
run as one causal pass over the sequence's positions (vLLM's later drafts
attend to the first draft's keys at the earlier positions: an
approximation that only training makes). It starts as a copy of the
target's last decoder layer behind ``fc`` = [0 | I] with its two output
projections zero, so it first predicts what the target predicted at t.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from simspec.types import require
from simspec.vllm.distill import (Agreement, DistillPlan, LlamaConfig, Weights, head, hidden, layer, rms_norm,
                                  train)
from simspec.vllm.logs import replay_runs

EAGLE_PREFIX = "layers.0."
"""The EAGLE head's decoder layer, as vLLM's checkpoint names it."""


def draft_init(target: Weights, config: dict, layers: int) -> tuple[Weights, dict]:
    """A draft model from ``target`` (a Llama with a tied head): its embedding,
    final norm and ``layers`` of its decoder layers, evenly spaced from the
    first to the last; the draft's weights and ``config.json``."""
    total = config["num_hidden_layers"]
    require(config.get("tie_word_embeddings", False), "draft_init: the target's head must be tied to its embedding")
    require(1 <= layers <= total, f"draft_init: layers must be in 1..{total} (got {layers})")
    picked = np.linspace(0, total - 1, layers).round().astype(int).tolist()
    out = {"model.embed_tokens.weight": target["model.embed_tokens.weight"].clone(),
           "model.norm.weight": target["model.norm.weight"].clone()}
    for i, j in enumerate(picked):
        for name, w in target.items():
            if name.startswith(f"model.layers.{j}."):
                out[name.replace(f"model.layers.{j}.", f"model.layers.{i}.", 1)] = w.clone()
    return out, {**config, "num_hidden_layers": layers}


def eagle_init(target: Weights, config: LlamaConfig) -> Weights:
    """An EAGLE head that first predicts what the target predicted: ``fc`` =
    [0 | I], the target's last decoder layer less its input norm, its two
    output projections zero."""
    h = config.hidden
    last = f"model.layers.{config.layers - 1}."
    out = {"fc.weight": torch.cat([torch.zeros(h, h), torch.eye(h)], 1)}
    for name, w in target.items():
        if name.startswith(last) and not name.endswith("input_layernorm.weight"):
            key = EAGLE_PREFIX + name[len(last):]
            zero = key.endswith(("self_attn.o_proj.weight", "mlp.down_proj.weight"))
            out[key] = torch.zeros_like(w) if zero else w.clone()
    return out


def eagle(weights: Weights, config: LlamaConfig, embeds: torch.Tensor, states: torch.Tensor) -> torch.Tensor:
    """The head's output at each position (what the LM head scores), causal over the sequence.
    embeds, states: [B, T, hidden] -> [B, T, hidden]."""
    x = torch.cat([embeds, states], -1) @ weights["fc.weight"].T
    out, _ = layer(weights, EAGLE_PREFIX, config, x, torch.arange(x.shape[1]), input_norm=False)
    return out


def _unrolled(weights: Weights, config: LlamaConfig, embedding: torch.Tensor, ids: torch.Tensor,
              states: torch.Tensor, depth: int) -> list[torch.Tensor]:
    """The head's outputs of drafts 1..depth at every position: draft j at
    position t reads x[t+j] and draft j-1's output at t (the target's state
    for j = 1); ids [B, T], states [B, T, hidden] -> depth x [B, T - depth, hidden]."""
    t = ids.shape[1] - depth
    outs, prev = [], states[:, :t]
    for j in range(1, depth + 1):
        prev = eagle(weights, config, embedding[ids[:, j:j + t]], prev)
        outs.append(prev)
    return outs


@dataclass(frozen=True, slots=True, kw_only=True)
class EaglePlan:
    """How long to train the head and on what."""

    steps: int
    batch_sequences: int
    depth: int = 3  # drafts unrolled in training (and K of the held-out replay)
    learning_rate: float = 3e-4
    warmup_fraction: float = 0.1
    clip: float = 0.5  # the gradient's largest norm: the head's output reaches the LM head unnormed

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"EaglePlan.steps must be >= 1 (got {self.steps})")
        require(self.batch_sequences >= 1, f"EaglePlan.batch_sequences must be >= 1 (got {self.batch_sequences})")
        require(self.depth >= 1, f"EaglePlan.depth must be >= 1 (got {self.depth})")
        require(self.clip > 0, f"EaglePlan.clip must be > 0 (got {self.clip})")


def train_eagle(params: Weights, target: Weights, config: LlamaConfig, sequences: torch.Tensor,
                states: torch.Tensor, plan: EaglePlan, seed: int, loss_from: int) -> list[float]:
    """AdamW on the summed cross-entropy of the unrolled drafts against the
    target's tokens at positions ``loss_from``.. (the continuation); the
    loss of each step. sequences [N, P + C], states [N, P + C, hidden]: the
    target's hidden states there."""
    embedding, lm_head = target["model.embed_tokens.weight"], head(target, config)
    trained = [p for p in params.values() if p.requires_grad]
    optimizer = torch.optim.AdamW(trained, lr=plan.learning_rate,
                                  betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    warmup = max(1, round(plan.steps * plan.warmup_fraction))
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        (s + 1) / warmup, max(0.0, (plan.steps - s) / max(1, plan.steps - warmup))))
    order = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(plan.steps):
        batch = torch.randint(len(sequences), (plan.batch_sequences,), generator=order)
        ids = sequences[batch]  # [b, T]
        outs = _unrolled(params, config, embedding, ids, states[batch], plan.depth)
        loss = 0.0
        for j, out in enumerate(outs, start=1):  # draft j at t is scored on x[t+j+1]
            t = out.shape[1]
            labels = ids[:, j + 1:j + 1 + t]  # [b, <= t]
            span = labels.shape[1]
            logits = out[:, loss_from:span] @ lm_head.T  # [b, span - loss_from, V]
            loss = loss + F.cross_entropy(logits.flatten(0, 1), labels[:, loss_from:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(trained, plan.clip)
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()) / plan.depth)
    return losses


@torch.no_grad()
def target_states(target: Weights, config: LlamaConfig, sequences: torch.Tensor, chunk: int = 16) -> torch.Tensor:
    """The target's last hidden states at every position: [N, T, hidden]."""
    return torch.cat([hidden(target, config, part)[0] for part in sequences.split(chunk)])


@torch.no_grad()
def head_agreement(weights: Weights, target: Weights, config: LlamaConfig, sequences: torch.Tensor,
                   states: torch.Tensor, prompt_tokens: int, depth: int) -> Agreement:
    """The head's greedy agreement on held-out continuations [N, P + C], as
    vLLM's rounds of ``depth``-token drafts replay it (simspec.vllm.logs
    replay_runs): the round that drafts continuation tokens i.. after token
    i - 1 was emitted runs the head from position t = P + i - 2 (that token
    and the target's state it came from), and its draft j is right, with
    every draft before it, when the head unrolled on the target's tokens
    predicts token i + j - 1 at each. ``top1``: the first draft's agreement
    over the continuation."""
    embedding, lm_head = target["model.embed_tokens.weight"], head(target, config)
    c = sequences.shape[1] - prompt_tokens
    runs, firsts = [], []
    for ids, st in zip(sequences.split(16), states.split(16)):
        b, t = ids.shape
        pad = depth + 1  # positions past the end, so that every start has its drafts (none counted past C)
        ids_p = torch.cat([ids, ids.new_zeros(b, pad)], 1)
        st_p = torch.cat([st, st.new_zeros(b, pad, st.shape[-1])], 1)
        outs = _unrolled(weights, config, embedding, ids_p, st_p, depth)
        right = torch.stack([(out[:, :t] @ lm_head.T).argmax(-1) == ids_p[:, j + 1:j + 1 + t]
                             for j, out in enumerate(outs, start=1)], -1)  # [b, t, depth]: draft j at position t
        in_a_row = right.to(torch.int64).cumprod(-1).sum(-1)  # [b, t]
        firsts.append(right[:, prompt_tokens - 1:t - 2, 0])  # continuation tokens 1..C-1
        runs += [[0] + row for row in in_a_row[:, prompt_tokens - 1:prompt_tokens - 1 + c - 1].tolist()]
    accepted, drafts = replay_runs(runs, depth)
    first = torch.cat(firsts)
    return Agreement(top1=float(first.to(torch.float64).mean()), chain=tuple(a / drafts for a in accepted),
                     drafts=drafts)


@dataclass(frozen=True, slots=True, kw_only=True)
class Trained:
    """A trained draft or head, what its training saw and how it does held out."""

    weights: dict[str, np.ndarray]
    config: dict  # its config.json
    train_sequences: int
    heldout_sequences: int
    final_loss: float  # mean cross-entropy of the last 10 steps (nats; the head's: per draft)
    start: Agreement  # its initial weights on the held-out sequences
    agreement: Agreement  # trained, on the held-out sequences
    train_s: float


def _frozen(weights: Weights, trainable) -> Weights:
    return {name: w.detach().clone().requires_grad_(trainable(name)) for name, w in weights.items()}


def distill_draft(target: Weights, target_config: dict, sequences: torch.Tensor, labels: torch.Tensor, *,
                  layers: int, n_train: int, prompt_tokens: int, plan: DistillPlan, seed: int) -> Trained:
    """The draft model of ``layers`` layers, trained on the first ``n_train``
    sequences, measured on the rest (the module docstring)."""
    from simspec.vllm.distill import agreement

    init, config = draft_init(target, target_config, layers)
    c = LlamaConfig.from_hf(config)
    held = sequences[n_train:], labels[n_train:]
    start_agreement = agreement(init, c, *held, prompt_tokens, plan.depth_tokens)
    params = _frozen(init, lambda name: name != "model.embed_tokens.weight")
    started = time.perf_counter()
    losses = train(params, c, sequences[:n_train], labels[:n_train], plan, seed, loss_from=prompt_tokens - 1,
                   relabel=False)
    train_s = time.perf_counter() - started
    return Trained(weights={k: v.detach().numpy().copy() for k, v in params.items()}, config=config,
                   train_sequences=n_train, heldout_sequences=len(sequences) - n_train,
                   final_loss=float(np.mean(losses[-10:])), start=start_agreement,
                   agreement=agreement(params, c, *held, prompt_tokens, plan.depth_tokens), train_s=train_s)


def train_head(target: Weights, target_config: dict, sequences: torch.Tensor, *, n_train: int,
               prompt_tokens: int, plan: EaglePlan, seed: int) -> Trained:
    """The EAGLE head, trained on the first ``n_train`` sequences, measured on the rest."""
    c = LlamaConfig.from_hf(target_config)
    states = target_states(target, c, sequences)
    held = sequences[n_train:], states[n_train:]
    init = eagle_init(target, c)
    start_agreement = head_agreement(init, target, c, *held, prompt_tokens, plan.depth)
    params = _frozen(init, lambda name: True)
    started = time.perf_counter()
    losses = train_eagle(params, target, c, sequences[:n_train], states[:n_train], plan, seed,
                         loss_from=prompt_tokens - 1)
    train_s = time.perf_counter() - started
    return Trained(weights={k: v.detach().numpy().copy() for k, v in params.items()},
                   config={**target_config, "num_hidden_layers": 1}, train_sequences=n_train,
                   heldout_sequences=len(sequences) - n_train, final_loss=float(np.mean(losses[-10:])),
                   start=start_agreement,
                   agreement=head_agreement(params, target, c, *held, prompt_tokens, plan.depth), train_s=train_s)


__all__ = ["draft_init", "eagle_init", "eagle", "EaglePlan", "train_eagle", "target_states", "head_agreement",
           "Trained", "distill_draft", "train_head", "rms_norm"]
