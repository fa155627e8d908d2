"""A draft distilled from a Hugging Face Llama target, in torch.

Imports: the standard library, numpy, torch, simspec.types and
simspec.vllm.logs (the replay of vLLM's rounds). Nothing of
the package imports this module at its top: ``simspec.vllm.models`` calls
:func:`distill` from inside ``build``, so the checkpoint writer stays
importable without torch.

What :func:`distill` does, deterministically (one torch thread, torch's
deterministic algorithms, a seeded generator):

1. **generate**: the target's greedy continuation of every prompt, with a KV
   cache, and the target's argmax at every position of prompt +
   continuation (the labels);
2. **train**: the draft, by cross-entropy on those argmaxes at the
   continuation's positions (teacher forcing; from the prompt's last token,
   whose argmax is the first token a draft proposes after the prefill),
   AdamW with a linear warm-up and decay, each sequence's ordinary token ids
   permuted at random (:func:`train` says why);
3. **evaluate**: on held-out sequences, with the draft's weights rounded to
   bf16 as the checkpoint stores them: the draft's top-1 agreement with the
   target at each continuation position, and the acceptance at depths 1..K
   of vLLM's rounds of K-token drafts replayed on them (:func:`agreement`).

The forward (:func:`forward`) is Hugging Face's ``LlamaForCausalLM``, read
from ``config.json`` and the checkpoint's tensor names: RMSNorm with the
config's eps, rotary embeddings with the config's theta in the rotate-half
layout (``transformers`` ``apply_rotary_pos_emb``; vLLM's ``is_neox_style``),
grouped-query causal attention, a SwiGLU MLP, the head tied to the
embedding where ``tie_word_embeddings`` says so; float32 throughout, as
vLLM serves the checkpoints on this CPU (``--dtype float32``).

Greedy verification accepts a draft token while it equals the target's own
greedy token, and a held-out sequence *is* the target's greedy
continuation, so the draft's chain from a start position t is accepted to
depth j exactly when its teacher-forced argmax matches at t .. t+j-1: one
forward per sequence gives every round's outcome.
"""

from __future__ import annotations

import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import numpy as np
import torch
import torch.nn.functional as F

from simspec.types import require
from simspec.vllm.logs import replay_rounds

Weights = dict[str, torch.Tensor]
"""Checkpoint tensor name -> float32 tensor (``[out, in]`` for linear layers)."""
Cache = list[tuple[torch.Tensor, torch.Tensor]]
"""Per layer: keys and values seen so far, each ``[B, kv_heads, L, D]``."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LlamaConfig:
    """What the forward reads of a Hugging Face Llama ``config.json``."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    vocab_tokens: int
    rms_norm_eps: float
    rope_theta: float
    tied: bool  # tie_word_embeddings: the head is the embedding

    @classmethod
    def from_hf(cls, config: dict) -> LlamaConfig:
        heads = config["num_attention_heads"]
        rope = config.get("rope_parameters") or {}
        return cls(layers=config["num_hidden_layers"], hidden=config["hidden_size"], heads=heads,
                   kv_heads=config.get("num_key_value_heads", heads),
                   head_dim=config.get("head_dim") or config["hidden_size"] // heads,
                   vocab_tokens=config["vocab_size"], rms_norm_eps=float(config["rms_norm_eps"]),
                   rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10000.0))),
                   tied=bool(config.get("tie_word_embeddings", False)))


@dataclass(frozen=True, slots=True, kw_only=True)
class DistillPlan:
    """How long to train and on what."""

    steps: int
    batch_sequences: int
    learning_rate: float = 1e-3
    warmup_fraction: float = 0.1
    depth_tokens: int = 3  # K: the draft length whose chain acceptance is estimated

    def __post_init__(self) -> None:
        require(self.steps >= 1, f"DistillPlan.steps must be >= 1 (got {self.steps})")
        require(self.batch_sequences >= 1, f"DistillPlan.batch_sequences must be >= 1 (got {self.batch_sequences})")
        require(self.depth_tokens >= 1, f"DistillPlan.depth_tokens must be >= 1 (got {self.depth_tokens})")

    @property
    def warmup_steps(self) -> int:
        return max(1, round(self.steps * self.warmup_fraction))


@dataclass(frozen=True, slots=True, kw_only=True)
class Agreement:
    """A draft's greedy agreement with the target on held-out continuations."""

    top1: float  # P(draft argmax == target argmax), over every continuation position
    chain: tuple[float, ...]  # [K]: per round, P(the first j draft tokens all accepted), j = 1..K
    drafts: int  # rounds replayed

    @property
    def acceptance_length(self) -> float:
        """Tokens a verification emits: accepted + the bonus token."""
        return 1.0 + sum(self.chain)


@dataclass(frozen=True, slots=True, kw_only=True)
class Distilled:
    """The trained draft and what its training saw."""

    weights: dict[str, np.ndarray]  # checkpoint name -> float32 values (before bf16 rounding)
    train_sequences: int
    heldout_sequences: int
    train_tokens: int  # labelled positions the optimizer saw, over all steps
    final_loss: float  # mean cross-entropy of the last 10 steps (nats)
    agreement: Agreement  # the bf16-rounded draft on the held-out sequences
    baselines: dict[str, Agreement]  # the same, for each model of ``distill(baselines=...)``
    generate_s: float
    train_s: float


@contextmanager
def deterministic(threads: int = 1) -> Iterator[None]:
    """One torch thread count and deterministic algorithms, restored after."""
    old_threads, old_det = torch.get_num_threads(), torch.are_deterministic_algorithms_enabled()
    torch.set_num_threads(threads)
    torch.use_deterministic_algorithms(True)
    try:
        yield
    finally:
        torch.use_deterministic_algorithms(old_det)
        torch.set_num_threads(old_threads)


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


def rope(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """Rotate-half rotary embedding: dims i and i + D/2 form a pair. x: [B, H, T, D]; positions: [T]."""
    d = x.shape[-1]
    inv_freq = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)  # [D/2]
    angles = positions.to(torch.float32)[:, None] * inv_freq[None, :]  # [T, D/2]
    cos, sin = torch.cat([angles, angles], -1).cos(), torch.cat([angles, angles], -1).sin()  # [T, D]
    x1, x2 = x[..., : d // 2], x[..., d // 2:]
    return x * cos + torch.cat([-x2, x1], -1) * sin


def attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, start: int) -> torch.Tensor:
    """Causal attention of T new queries at positions start.. over L = start + T keys.
    q: [B, H, T, D]; k, v: [B, H, L, D] -> [B, H, T, D]."""
    t, length = q.shape[2], k.shape[2]
    scores = q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1])  # [B, H, T, L]
    if t > 1:
        future = torch.arange(length)[None, :] > (start + torch.arange(t))[:, None]  # [T, L]
        scores = scores.masked_fill(future, float("-inf"))
    return scores.softmax(-1) @ v


def layer(weights: Weights, prefix: str, config: LlamaConfig, x: torch.Tensor, positions: torch.Tensor,
          cache: tuple[torch.Tensor, torch.Tensor] | None = None,
          input_norm: bool = True) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
    """One decoder layer (the checkpoint's tensors under ``prefix``) over x [B, T, hidden]
    at ``positions`` [T], after the cached keys and values; the layer's output and its
    keys and values so far. ``input_norm=False``: no input RMSNorm (an EAGLE head's
    layer, whose input norm vLLM makes an identity)."""
    b, t, _ = x.shape
    h, d = config.heads, config.head_dim
    start = cache[0].shape[2] if cache else 0
    y = rms_norm(x, weights[prefix + "input_layernorm.weight"], config.rms_norm_eps) if input_norm else x
    q = (y @ weights[prefix + "self_attn.q_proj.weight"].T).view(b, t, h, d).transpose(1, 2)  # [B, H, T, D]
    k = (y @ weights[prefix + "self_attn.k_proj.weight"].T).view(b, t, config.kv_heads, d).transpose(1, 2)
    v = (y @ weights[prefix + "self_attn.v_proj.weight"].T).view(b, t, config.kv_heads, d).transpose(1, 2)
    q, k = rope(q, positions, config.rope_theta), rope(k, positions, config.rope_theta)
    if cache:
        k, v = torch.cat([cache[0], k], 2), torch.cat([cache[1], v], 2)  # [B, KV, L, D]
    group = h // config.kv_heads
    o = attention(q, k.repeat_interleave(group, 1), v.repeat_interleave(group, 1), start)  # [B, H, T, D]
    x = x + o.transpose(1, 2).reshape(b, t, h * d) @ weights[prefix + "self_attn.o_proj.weight"].T
    y = rms_norm(x, weights[prefix + "post_attention_layernorm.weight"], config.rms_norm_eps)
    gate = F.silu(y @ weights[prefix + "mlp.gate_proj.weight"].T)  # [B, T, intermediate]
    x = x + (gate * (y @ weights[prefix + "mlp.up_proj.weight"].T)) @ weights[prefix + "mlp.down_proj.weight"].T
    return x, (k, v)


def hidden(weights: Weights, config: LlamaConfig, ids: torch.Tensor, cache: Cache | None = None,
           logits_from: int = 0) -> tuple[torch.Tensor, Cache]:
    """The last hidden states (after the final norm: what the head scores) of positions
    ``logits_from``.. of ``ids``, and the cache extended by ``ids``.
    ids: [B, T] (following the cache's L tokens) -> [B, T - logits_from, hidden]."""
    t = ids.shape[1]
    start = cache[0][0].shape[2] if cache else 0
    positions = torch.arange(start, start + t)  # [T]
    x = weights["model.embed_tokens.weight"][ids]  # [B, T, hidden]
    new_cache: Cache = []
    for i in range(config.layers):
        x, kv = layer(weights, f"model.layers.{i}.", config, x, positions, cache[i] if cache else None)
        new_cache.append(kv)
    return rms_norm(x[:, logits_from:], weights["model.norm.weight"], config.rms_norm_eps), new_cache


def head(weights: Weights, config: LlamaConfig) -> torch.Tensor:
    """The LM head [V, hidden]: the embedding where the model ties them."""
    return weights["model.embed_tokens.weight" if config.tied else "lm_head.weight"]


def forward(weights: Weights, config: LlamaConfig, ids: torch.Tensor, cache: Cache | None = None,
            logits_from: int = 0) -> tuple[torch.Tensor, Cache]:
    """Logits of positions ``logits_from``.. of ``ids``, and the cache extended by ``ids``.
    ids: [B, T] (following the cache's L tokens) -> logits [B, T - logits_from, V]."""
    x, new_cache = hidden(weights, config, ids, cache, logits_from)
    return x @ head(weights, config).T, new_cache  # [B, T - logits_from, V]


@torch.no_grad()
def greedy(weights: Weights, config: LlamaConfig, prompts: torch.Tensor, new_tokens: int,
           chunk_sequences: int = 32) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's greedy continuation of each prompt and its argmax at every position.
    prompts: [B, P] -> sequences [B, P + C] (prompt, continuation), labels [B, P + C]
    (labels[:, t] = the argmax after token t: labels[:, P-1:-1] == sequences[:, P:])."""
    sequences, labels = [], []
    for part in prompts.split(chunk_sequences):
        logits, cache = forward(weights, config, part)  # [b, P, V]
        argmax = [logits.argmax(-1)]  # [b, P], then [b, 1] per step
        for _ in range(new_tokens):
            logits, cache = forward(weights, config, argmax[-1][:, -1:], cache)
            argmax.append(logits.argmax(-1))
        out = torch.cat(argmax, 1)  # [b, P + C]
        labels.append(out)
        sequences.append(torch.cat([part, out[:, part.shape[1] - 1: -1]], 1))
    return torch.cat(sequences), torch.cat(labels)


def bf16_rounded(weights: Weights) -> Weights:
    """The values a bf16 checkpoint holds (round to nearest even), as float32."""
    return {name: w.detach().to(torch.bfloat16).to(torch.float32) for name, w in weights.items()}


@torch.no_grad()
def agreement(weights: Weights, config: LlamaConfig, sequences: torch.Tensor, labels: torch.Tensor,
              prompt_tokens: int, depth_tokens: int) -> Agreement:
    """Greedy agreement on the continuations of held-out sequences [B, P + C] (labels alike).

    ``top1`` counts every continuation position. ``chain`` replays what vLLM
    does: the prefill emits the first token, then each round drafts K tokens
    after the last one emitted, accepts them to the first mismatch and emits
    the accepted + 1, until C tokens are out; rates are per round (vLLM's
    ``accepted_tokens_per_pos / num_drafts``). Rounds are not positions: a
    round that is accepted far moves on past the positions it covered, one
    that is rejected moves one, so the per-round rates are below the rates
    averaged over every start position."""
    match = torch.cat([forward(weights, config, part)[0].argmax(-1) == lab
                       for part, lab in zip(sequences.split(16), labels.split(16))])  # [B, P + C]
    match = match[:, prompt_tokens - 1:]  # [B, C + 1]: match[:, i] predicts continuation token i
    accepted, drafts = replay_rounds([row[:-1] for row in match.tolist()], depth_tokens)  # none past the C-th
    return Agreement(top1=float(match.to(torch.float64).mean()), chain=tuple(a / drafts for a in accepted),
                     drafts=drafts)


def distill(target: dict[str, np.ndarray], target_config: dict, draft: dict[str, np.ndarray],
            draft_config: dict, *, train_prompts: np.ndarray, heldout_prompts: np.ndarray, new_tokens: int,
            plan: DistillPlan, seed: int, frozen: tuple[str, ...] = (),
            baselines: dict[str, tuple[dict[str, np.ndarray], dict]] | None = None) -> Distilled:
    """Train ``draft`` (its initial weights; ``frozen`` names stay as given) to
    predict ``target``'s greedy next token on the continuations of ``train_prompts``.
    target, draft: checkpoint name -> float32 values; *_config: their ``config.json``;
    prompts: [N, P] token ids; new_tokens: C, the greedy continuation's length;
    baselines: other drafts (weights, config) to measure on the same held-out sequences."""
    t_config, d_config = LlamaConfig.from_hf(target_config), LlamaConfig.from_hf(draft_config)
    require(t_config.vocab_tokens == d_config.vocab_tokens,
            f"the draft's vocabulary ({d_config.vocab_tokens}) must be the target's ({t_config.vocab_tokens})")
    prompt_tokens = train_prompts.shape[1]
    with deterministic(threads=1):
        torch.manual_seed(seed)
        start = time.perf_counter()
        prompts = torch.from_numpy(np.concatenate([train_prompts, heldout_prompts]).astype(np.int64))
        sequences, labels = greedy(as_torch(target), t_config, prompts, new_tokens)  # [N, P + C] each
        n_train = len(train_prompts)
        generate_s = time.perf_counter() - start

        start = time.perf_counter()
        params = {name: torch.tensor(w, dtype=torch.float32, requires_grad=name not in frozen)
                  for name, w in draft.items()}
        losses = train(params, d_config, sequences[:n_train], labels[:n_train], plan, seed,
                       loss_from=prompt_tokens - 1)
        train_s = time.perf_counter() - start
        held = sequences[n_train:], labels[n_train:]
        served = agreement(bf16_rounded(params), d_config, *held, prompt_tokens, plan.depth_tokens)
        others = {name: agreement(as_torch(w), LlamaConfig.from_hf(c), *held, prompt_tokens, plan.depth_tokens)
                  for name, (w, c) in (baselines or {}).items()}
    return Distilled(weights={name: p.detach().numpy().copy() for name, p in params.items()},
                     train_sequences=n_train, heldout_sequences=len(heldout_prompts),
                     train_tokens=plan.steps * plan.batch_sequences * (sequences.shape[1] - prompt_tokens + 1),
                     final_loss=float(np.mean(losses[-10:])), agreement=served, baselines=others,
                     generate_s=generate_s, train_s=train_s)


def as_torch(weights: dict[str, np.ndarray]) -> Weights:
    return {name: torch.from_numpy(np.ascontiguousarray(w, np.float32)) for name, w in weights.items()}


def train(params: Weights, config: LlamaConfig, sequences: torch.Tensor, labels: torch.Tensor,
          plan: DistillPlan, seed: int, loss_from: int = 0, relabel: bool = True) -> list[float]:
    """AdamW on cross-entropy against the target's argmax at positions ``loss_from``..;
    the loss of each step. sequences, labels: [N, P + C]. With ``relabel``, each
    sequence of a batch has its ordinary token ids permuted at random (inputs and
    labels alike): what can be learnt is then how the target's continuations
    repeat their own tokens, not which token follows which in the few sequences
    generated, which a small draft otherwise memorises (held-out agreement near 0)."""
    optimizer = torch.optim.AdamW([p for p in params.values() if p.requires_grad], lr=plan.learning_rate,
                                  betas=(0.9, 0.95), weight_decay=0.0, foreach=False)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: min(
        (s + 1) / plan.warmup_steps, max(0.0, (plan.steps - s) / max(1, plan.steps - plan.warmup_steps))))
    order = torch.Generator().manual_seed(seed)
    losses = []
    for _ in range(plan.steps):
        batch = torch.randint(len(sequences), (plan.batch_sequences,), generator=order)  # [b]
        ids, lab = sequences[batch], labels[batch]  # [b, P + C]
        if relabel:
            names = relabeling(len(batch), config.vocab_tokens, order)  # [b, V]
            ids, lab = names.gather(1, ids), names.gather(1, lab)
        logits, _ = forward(params, config, ids, logits_from=loss_from)  # [b, T, V]
        loss = F.cross_entropy(logits.flatten(0, 1), lab[:, loss_from:].flatten())
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        schedule.step()
        losses.append(float(loss.detach()))
    return losses


def relabeling(count: int, vocab_tokens: int, generator: torch.Generator, special_tokens: int = 3) -> torch.Tensor:
    """``count`` random permutations of the ordinary token ids (the special ones kept): [count, V]."""
    keep = torch.arange(special_tokens).expand(count, special_tokens)  # [count, S]
    shuffled = torch.rand(count, vocab_tokens - special_tokens, generator=generator).argsort(1) + special_tokens
    return torch.cat([keep, shuffled], 1)
