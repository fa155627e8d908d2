"""The serving model: one GPU replica with continuous batching and
speculative decoding, as a SimPy discrete-event simulation.

Imports: simpy, numpy, simspec.types, .trees, .acceptance, .costs (for the
KV budget), .policies (the only simpy importer in the package). DESIGN.md
"The serving model".

Two processes: ``arrivals`` puts requests in the waiting queue at their
arrival times; ``replica`` runs the engine loop. Each step:

1. admit waiting requests FCFS while ``max_num_seqs`` and the KV budget allow;
2. reserve KV for the decode batch, preempting the newest request (recompute,
   never a silent drop) when it does not fit;
3. plan: the policy sees a ReplicaView and returns a StepPlan;
4. schedule prefill chunks in the token budget the decode batch leaves;
5. the step costs select + draft + one target forward + overhead (+ the
   vision encoder for requests starting prefill);
6. accept: per request the accepted path comes from the acceptance model;
   accepted + 1 tokens are emitted at the step's end, a prefill that
   completes emits the first token (TTFT).
Simulated time is seconds.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import simpy

from simspec import trees
from simspec.acceptance import AcceptanceModel, DraftContext, RandomBlocks
from simspec.costs import CostModel, GpuSpec, ModelSpec
from simspec.policies import Policy
from simspec.types import (InputError, PlanKind, ReplicaView, Request, RequestRecord, RunLog, StepShape,
                           require)

GIB = 1024**3
RECENT_WEIGHT = 0.3  # weight of the newest round in the moving average of accepted tokens


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineConfig:
    """The serving engine's knobs (vLLM names where vLLM has them)."""

    max_num_seqs: int = 128  # requests in the running batch
    max_num_batched_tokens: int = 8192  # prefill-chunk token budget per step
    gpu_memory_utilization: float = 0.9  # share of GPU memory for weights + activations + KV cache
    activation_reserve_gib: float = 2.0  # memory kept for activations and CUDA graphs
    kv_cache_tokens: int | None = None  # override the KV budget derived from memory
    drafter_context: str = "selected:8"  # what of the image the drafter sees: full, none, selected:K, pooled:K

    def __post_init__(self):
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1 (got {self.max_num_seqs})")
        require(self.max_num_batched_tokens >= 16,
                f"max_num_batched_tokens must be >= 16 (got {self.max_num_batched_tokens})")
        require(0.0 < self.gpu_memory_utilization <= 1.0,
                f"gpu_memory_utilization must be in (0, 1] (got {self.gpu_memory_utilization})")
        require(self.activation_reserve_gib >= 0,
                f"activation_reserve_gib must be >= 0 (got {self.activation_reserve_gib})")
        require(self.kv_cache_tokens is None or self.kv_cache_tokens >= 1,
                f"kv_cache_tokens must be >= 1 (got {self.kv_cache_tokens})")
        DraftContext.parse(self.drafter_context)

    def kv_budget_tokens(self, model: ModelSpec, gpu: GpuSpec) -> int:
        """Tokens the KV cache holds: GPU memory minus weights and activations."""
        if self.kv_cache_tokens is not None:
            return self.kv_cache_tokens
        free = gpu.memory_bytes * self.gpu_memory_utilization - model.weight_bytes - self.activation_reserve_gib * GIB
        tokens = int(free // model.kv_bytes_per_token)
        require(tokens > 0, f"model {model.name} does not fit on {gpu.name} at gpu_memory_utilization "
                            f"{self.gpu_memory_utilization} (weights {model.weight_bytes / GIB:.1f} GiB)")
        return tokens


class _Log:
    """Growing per-step records, concatenated once at the end."""

    def __init__(self):
        self.chunk_ids: list[np.ndarray] = []
        self.chunk_times: list[np.ndarray] = []
        self.chunk_tokens: list[np.ndarray] = []
        self.accepted: list[np.ndarray] = []
        self.depth: list[np.ndarray] = []
        self.drafted: list[np.ndarray] = []
        self.steps: list[tuple[float, float, int, int, int, int]] = []
        self.rounds = 0

    def emit(self, ids: np.ndarray, tokens: np.ndarray, time_s: float) -> None:
        self.chunk_ids.append(ids)
        self.chunk_tokens.append(tokens)
        self.chunk_times.append(np.full(len(ids), time_s))


def _cat(parts: list[np.ndarray], dtype) -> np.ndarray:
    return np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype=dtype)


class Replica:
    """State of one replica over one run; ``simulate`` drives it."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], *, policy: Policy,
                 costs: CostModel, acceptance: AcceptanceModel, engine: EngineConfig, kv_budget_tokens: int,
                 rng_difficulty: np.random.Generator, rng_rounds: np.random.Generator,
                 progress: Callable[[int], None] | None):
        self.env, self.policy, self.costs, self.acceptance, self.engine = env, policy, costs, acceptance, engine
        self.rand = RandomBlocks(rng_rounds)
        self.progress = progress
        self.kv_budget = kv_budget_tokens
        n = len(requests)
        self.requests = requests
        self.context = np.array([r.context_tokens for r in requests], dtype=np.int64)
        self.visual = np.array([r.visual_tokens for r in requests], dtype=np.int64)
        self.output = np.array([r.output_tokens for r in requests], dtype=np.int64)
        context = DraftContext.parse(engine.drafter_context)
        self.kept = context.kept(self.visual)
        self.retention = acceptance.retention(context, self.visual)
        self.difficulty = acceptance.request_logits(rng_difficulty, n)
        self.emitted = np.zeros(n, dtype=np.int64)
        self.cache = np.zeros(n, dtype=np.int64)  # tokens in the KV cache
        self.prefill_target = self.context.copy()  # tokens to prefill (prompt, or prompt + output on recompute)
        self.recent = np.ones(n)  # moving average of accepted tokens per drafted round
        self.admitted_s = np.full(n, np.nan)
        self.first_token_s = np.full(n, np.nan)
        self.finish_s = np.full(n, np.nan)
        self.preemptions = np.zeros(n, dtype=np.int64)
        self.waiting: deque[int] = deque()
        self.running: list[int] = []  # admission order (the newest is preempted first)
        self.finished = 0
        self.arrived = 0
        self.wake = env.event()
        self.log = _Log()
        self._depth = max(policy.max_depth, 0)
        self._check_fits()

    def _check_fits(self) -> None:
        need = self.context + self.output + self._depth + 1
        worst = int(np.argmax(need)) if len(need) else 0
        if len(need) and need[worst] > self.kv_budget:
            raise InputError(f"kv_cache_tokens {self.kv_budget} cannot hold request {worst} "
                             f"({int(need[worst])} tokens with its output); raise kv_cache_tokens")

    # -- processes ---------------------------------------------------------
    def arrivals(self):
        for i, request in enumerate(self.requests):
            delay = request.arrival_s - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            self.waiting.append(i)
            self.arrived += 1
            if not self.wake.triggered:
                self.wake.succeed()

    def replica(self):
        n = len(self.requests)
        while self.finished < n:
            if not self.running and not self.waiting:
                self.wake = self.env.event()
                yield self.wake
                continue
            self._admit()
            start = self.env.now
            step_s, apply = self._step()
            yield self.env.timeout(step_s)
            apply(start, self.env.now)
            if self.progress is not None:
                self.progress(self.finished)

    # -- one engine step ---------------------------------------------------
    def _admit(self) -> None:
        used = self._kv_used()
        while self.waiting and len(self.running) < self.engine.max_num_seqs:
            i = self.waiting[0]
            need = int(self.prefill_target[i]) + 1
            if used + need > self.kv_budget:
                break
            self.waiting.popleft()
            self.running.append(i)
            used += need
            if np.isnan(self.admitted_s[i]):
                self.admitted_s[i] = self.env.now

    def _kv_used(self) -> int:
        if not self.running:
            return 0
        ids = np.array(self.running)
        return int(np.maximum(self.cache[ids], self.prefill_target[ids]).sum())

    def _reserve_decode(self) -> np.ndarray:
        """Decode batch after preempting (newest first) until the step fits."""
        while True:
            ids = np.array(self.running)
            decoding = self.cache[ids] >= self.prefill_target[ids]
            held = np.maximum(self.cache[ids], self.prefill_target[ids]).sum()
            need = int(held + decoding.sum() * (self._depth + 1))
            if need <= self.kv_budget or len(self.running) == 1:
                return ids[decoding]
            self._preempt(self.running.pop())

    def _preempt(self, i: int) -> None:
        self.prefill_target[i] = self.context[i] + self.emitted[i]
        self.cache[i] = 0
        self.preemptions[i] += 1
        self.waiting.appendleft(i)

    def _schedule_prefill(self, budget: int) -> list[tuple[int, int]]:
        chunks = []
        for i in self.running:
            if budget <= 0:
                break
            left = int(self.prefill_target[i] - self.cache[i])
            if left > 0:
                take = min(left, budget)
                chunks.append((i, take))
                budget -= take
        return chunks

    def _prefill_shape(self, chunks: list[tuple[int, int]]) -> tuple[int, int, int, int]:
        tokens = pairs = kv = vision = 0
        for i, take in chunks:
            done = int(self.cache[i])
            tokens += take
            kv += done + take
            pairs += take * done + take * (take + 1) // 2  # causal: each new token sees those before it
            if done == 0:
                vision += int(self.visual[i])
        return tokens, pairs, kv, vision

    def _step(self):
        decode = self._reserve_decode()
        b = len(decode)
        budget = self.engine.max_num_batched_tokens
        chunks = self._schedule_prefill(budget - b)
        p_tokens, p_pairs, p_kv, vision = self._prefill_shape(chunks)
        plan = rnd = None
        if b:
            depth, ranks = self._depth, self.policy.max_rank
            if depth:
                rnd = self.acceptance.draw(self.rand, self.difficulty[decode], self.retention[decode], depth, ranks)
                conf = rnd.conf
            else:
                conf = np.zeros((b, 0, ranks))
            view = ReplicaView(
                context_tokens=self.cache[decode], visual_tokens=self.visual[decode],
                kept_visual_tokens=self.kept[decode], remaining_tokens=self.output[decode] - self.emitted[decode],
                recent_accepted=self.recent[decode], conf=conf, prefill_tokens=p_tokens,
                prefill_attn_pairs=p_pairs, prefill_kv_tokens=p_kv, prefill_requests=len(chunks),
                vision_tokens=vision, costs=self.costs,
                true_ranks=rnd.true_ranks if (self.policy.needs_truth and rnd is not None) else None)
            plan = self.policy.plan(view)
            verify = 1 + plan.num_nodes
            planned = int(verify.sum())
            if planned + p_tokens > budget:  # draft tokens count against the budget, as in vLLM
                chunks = self._schedule_prefill(budget - planned)
                p_tokens, p_pairs, p_kv, vision = self._prefill_shape(chunks)
            ctx = self.cache[decode]
            steps = plan.draft_steps
            drafting = steps > 0
            levels = np.arange(1, int(steps.max(initial=0)) + 1)
            per_level = np.where(levels[:, None] == 1, 1, plan.draft_width[None, :]) * (steps[None, :] >= levels[:, None])
            selecting = drafting & (plan.kept_visual_tokens > 0) & (plan.kept_visual_tokens < self.visual[decode])
            shape = StepShape(
                forward_tokens=p_tokens + planned, kv_read_tokens=p_kv + int(ctx.sum()),
                attn_pairs=p_pairs + int((verify * ctx).sum()), logit_tokens=len(chunks) + planned,
                vision_tokens=vision, draft_level_tokens=tuple(per_level.sum(axis=1).tolist()),
                draft_kept_visual_tokens=int(plan.kept_visual_tokens[drafting].sum()),
                select_visual_tokens=int(self.visual[decode][selecting].sum()),
                select_requests=int(selecting.sum()))
        else:
            shape = StepShape(forward_tokens=p_tokens, kv_read_tokens=p_kv, attn_pairs=p_pairs,
                              logit_tokens=len(chunks), vision_tokens=vision)
        step_s = self.costs.step_s(shape)

        def apply(start_s: float, end_s: float) -> None:
            self._apply(decode, plan, rnd, chunks, start_s, end_s)

        return step_s, apply

    def _apply(self, decode, plan, rnd, chunks, start_s: float, end_s: float) -> None:
        log = self.log
        kinds = (0, 0, 0)
        done: list[int] = []
        if len(decode):
            if rnd is not None and plan.codes.shape[1]:
                accepted = trees.accepted_length(plan.codes, rnd.true_ranks)
            else:
                accepted = np.zeros(len(decode), dtype=np.int64)
            remaining = self.output[decode] - self.emitted[decode]
            emit = np.minimum(accepted + 1, remaining)
            self.cache[decode] += emit
            self.emitted[decode] += emit
            log.emit(decode, emit, end_s)
            drafted = plan.num_nodes > 0
            if drafted.any():
                depth = trees.code_depth(plan.codes[drafted]).max(axis=1)
                log.accepted.append(accepted[drafted])
                log.depth.append(depth)
                log.drafted.append(plan.num_nodes[drafted])
                ids = decode[drafted]
                self.recent[ids] = (1 - RECENT_WEIGHT) * self.recent[ids] + RECENT_WEIGHT * accepted[drafted]
            log.rounds += len(decode)
            kinds = tuple(np.bincount(plan.kind, minlength=3).tolist())
            done.extend(decode[self.emitted[decode] >= self.output[decode]].tolist())
        first = []
        for i, take in chunks:
            self.cache[i] += take
            if self.cache[i] >= self.prefill_target[i]:
                first.append(i)
        if first:
            ids = np.array(first)
            new = np.isnan(self.first_token_s[ids])
            self.first_token_s[ids[new]] = end_s
            self.emitted[ids] += 1
            log.emit(ids, np.ones(len(ids), dtype=np.int64), end_s)
            done.extend(ids[self.emitted[ids] >= self.output[ids]].tolist())
        log.steps.append((start_s, end_s - start_s, len(decode), *kinds))
        if done:
            self.finish_s[done] = end_s
            gone = set(done)
            self.running = [i for i in self.running if i not in gone]
            self.finished += len(done)

    # -- results -----------------------------------------------------------
    def run_log(self, label: str) -> RunLog:
        log = self.log
        records = tuple(
            RequestRecord(id=r.id, arrival_s=r.arrival_s, admitted_s=float(self.admitted_s[i]),
                          first_token_s=float(self.first_token_s[i]), finish_s=float(self.finish_s[i]),
                          prompt_tokens=r.prompt_tokens, output_tokens=int(self.emitted[i]), images=r.images,
                          visual_tokens=r.visual_tokens, preemptions=int(self.preemptions[i]))
            for i, r in enumerate(self.requests))
        steps = np.array(log.steps, dtype=float).reshape(-1, 6)
        ids = np.array([r.id for r in self.requests], dtype=np.int64)
        chunk_index = _cat(log.chunk_ids, np.int64)
        return RunLog(
            policy=label, requests=records,
            chunk_request=ids[chunk_index], chunk_time_s=_cat(log.chunk_times, float),
            chunk_tokens=_cat(log.chunk_tokens, np.int64), round_accepted=_cat(log.accepted, np.int64),
            round_depth=_cat(log.depth, np.int64), round_drafted=_cat(log.drafted, np.int64),
            step_start_s=steps[:, 0].copy(), step_duration_s=steps[:, 1].copy(),
            step_plans=steps[:, 3:6].astype(np.int64), step_batch=steps[:, 2].astype(np.int64),
            start_s=float(min((r.arrival_s for r in self.requests), default=0.0)),
            end_s=float(np.nanmax(self.finish_s)) if len(self.requests) else 0.0,
            rounds_total=log.rounds, complete=self.finished == len(self.requests))


def simulate(requests: Sequence[Request], *, policy: Policy, label: str | None = None, costs: CostModel,
             acceptance: AcceptanceModel, engine: EngineConfig, kv_budget_tokens: int,
             seed: int = 0, progress: Callable[[int], None] | None = None) -> RunLog:
    """Serve ``requests`` with ``policy`` and return everything measured.

    The run's seed gives the difficulty and round streams (SeedSequence spawn
    keys 1 and 2; key 0 is the workload's), so policies compared under one
    seed share request difficulties, and the same seed gives the same log,
    byte for byte. Requests must be sorted by arrival.
    """
    rng_difficulty, rng_rounds = (np.random.default_rng(np.random.SeedSequence(seed, spawn_key=(key,)))
                                  for key in (1, 2))
    env = simpy.Environment()
    replica = Replica(env, requests, policy=policy, costs=costs, acceptance=acceptance, engine=engine,
                      kv_budget_tokens=kv_budget_tokens, rng_difficulty=rng_difficulty, rng_rounds=rng_rounds,
                      progress=progress)
    env.process(replica.arrivals())
    env.process(replica.replica())
    env.run()
    return replica.run_log(label or policy.label)


__all__ = ["EngineConfig", "simulate", "Replica", "PlanKind"]
