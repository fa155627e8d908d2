"""The live engine: real batched speculative decoding with the shipped models.

Imports: torch, numpy, simspec.models, simspec.policies, simspec.costs,
simspec.types, simspec_kernels (through the models). DESIGN.md "Live engine".

It serves a workload in wall-clock time with the same scheduling rules as
the simulator's replica (FCFS admission under ``max_num_seqs`` and the KV
budget, decode rounds first, prefill chunks in the token budget they leave,
draft tokens counted as the request's last round drafted) and the same
policy objects (``Policy.plan(ReplicaView)``). Each step:

1. **draft** (incremental): the policy plans with the confidences known so
   far (levels not drafted yet are 0); every request whose plan wants more
   drafter steps (``draft_steps``) than it has had gets one more (its rank-1
   chain), and the policy plans again, until no plan wants more. Linear and
   tree plans ask for their depth, truncate for one level past its cut,
   marginal for the depth its acceptance history pays for. A drafter step on a
   request first absorbs its new true entries (the target's features of the
   tokens it accepted) and selects its kept visual tokens from the int8 key
   cache with the verifier's last queries;
2. **draft the rest of the plan**: tree nodes off the rank-1 chain that have
   children are run through the drafter, depth by depth, for their children's
   tokens;
3. **verify**: one target forward over the prefill chunks (chains) and every
   round's tree (the pending token as root) with the tree-attention kernel;
4. **accept** greedily: follow the target's argmax down the tree; emit the
   accepted tokens and the target's bonus token.

Output is exactly the target's greedy decoding (``ignore_eos``: a request
generates its workload output length), whatever the policy: the test
compares it request by request. Every step's shape and duration, and every
round's acceptance trace (the target token's rank among the drafter's
candidates per depth, the drafter's confidences) are recorded.
"""

from __future__ import annotations

import gc
import time
from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np
import torch

from simspec.acceptance.context import DraftContext
from simspec.costs import CostModel
from simspec.models.drafter import Drafter, chain_attention, select_visual
from simspec.models.task import Example
from simspec.models.vlm import TargetVLM
from simspec.engine.timing import AcceptanceReplay, other_token
from simspec.policies import Policy
from simspec.types import MAX_RANK, RANK_BITS, ReplicaView, Request, RequestRecord, RunLog, require

from simspec.sim.steps import POPULATION_WEIGHT, RECENT_WEIGHT, RELAX_WEIGHT, censored_accepted  # as the simulator
TRACE_RANKS = 8  # candidate ranks recorded per depth in acceptance traces


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveConfig:
    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    drafter_context: str = "selected:8"
    impl: str = "auto"  # simspec_kernels implementation; auto: Triton on CUDA, the PyTorch reference on a CPU
    prior_top1: float = 0.5  # top-1 acceptance assumed before any history (the simulator uses its model's)

    def __post_init__(self):
        require(self.max_num_seqs >= 1, f"max_num_seqs must be >= 1 (got {self.max_num_seqs})")
        require(self.max_num_batched_tokens >= 16,
                f"max_num_batched_tokens must be >= 16 (got {self.max_num_batched_tokens})")
        require(0.0 < self.prior_top1 < 1.0, f"prior_top1 must be in (0, 1) (got {self.prior_top1})")
        DraftContext.parse(self.drafter_context)


@dataclass(slots=True)
class _Seq:
    """One request's live state."""

    index: int
    request: Request
    example: Example
    prompt: list[int]  # text token ids (BOS + question)
    slot: int = -1
    cache: int = 0  # target KV entries (visual tokens first, then text)
    emitted: list[int] = field(default_factory=list)
    entries: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)  # (feature, next token, position) not yet in the drafter cache
    draft_cache: int = 0  # drafter KV entries
    visual_hidden: torch.Tensor | None = None  # [N, C]
    visual_keys: torch.Tensor | None = None  # [layers, N, H, D]
    queries: torch.Tensor | None = None  # [layers, H, D] verifier's last queries
    prefill_hidden: list[torch.Tensor] = field(default_factory=list)
    recent: float = 1.0
    drafted: int = 0
    visual_embeds: torch.Tensor | None = None  # [N, C] LM inputs of the image
    cand: list[int] | None = None  # drafter's candidates after the pending token, best first
    conf_pending: np.ndarray | None = None  # their probabilities
    pending_out: torch.Tensor | None = None  # drafter's predicted feature after the pending token
    draft_position: int = 0  # position of the pending token's entry
    replay: tuple[float, float] = (0.0, 1.0)  # timing-only runs: (top-1 logit, visual retention) drawn at admission

    @property
    def prefill_target(self) -> int:
        return self.request.context_tokens

    @property
    def remaining(self) -> int:
        return self.request.output_tokens - len(self.emitted)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepRecord:
    """One engine step's work (the cost model's inputs) and its wall time."""

    start_s: float
    duration_s: float
    forward_tokens: int
    kv_read_tokens: int
    attn_pairs: int
    attn_requests: int  # sequences in the target forward (prefill chunks + decode rounds)
    logit_tokens: int
    vision_tokens: int
    draft_level_tokens: tuple[int, ...]  # rows of each drafter call (EngineConfig.drafting = "chain" prices these)
    draft_kept_visual_tokens: int
    select_requests: int
    select_visual_tokens: int
    batch: int
    plans: tuple[int, int, int]
    padded_kv_tokens: int = 0  # attention rows x the longest cached context (the dense caches it gathers)
    prefill_tokens: int = 0  # of forward_tokens etc.: the prefill chunks' part
    prefill_kv_tokens: int = 0
    prefill_attn_pairs: int = 0
    prefill_requests: int = 0
    verifying: bool = False  # some decode round verified drafts
    draft_s: float = 0.0  # of duration_s: drafting (selection and planning included)
    target_s: float = 0.0  # ... the vision encoder, the target forward and acceptance
    idle_s: float = 0.0  # the engine had nothing to run for this long just before the step (0: it had work)


@dataclass(slots=True)
class LiveResult:
    log: RunLog
    steps: list[StepRecord]
    traces: list[dict]  # per drafted round: request, round, depth ranks and confidences
    outputs: dict[int, list[int]]  # request id -> generated tokens


class _Node:
    __slots__ = ("code", "depth", "parent", "token", "feature", "k", "v", "conf", "cand")

    def __init__(self, code, depth, parent, token):
        self.code, self.depth, self.parent, self.token = code, depth, parent, token
        self.feature = self.k = self.v = self.conf = self.cand = None


class LiveEngine:
    """Serve requests with the target and drafter (see the module docstring)."""

    def __init__(self, target: TargetVLM, drafter: Drafter, policy: Policy, costs: CostModel,
                 config: LiveConfig = LiveConfig(), replay: AcceptanceReplay | None = None):
        """``replay``: timing-only runs (random weights at a real shape) take
        the drafter's confidences and the target's choice among the drafted
        candidates from it instead of from the models' logits."""
        self.target, self.drafter, self.policy, self.costs, self.config = target, drafter, policy, costs, config
        self.replay = replay
        self.context = DraftContext.parse(config.drafter_context)
        weight = next(target.parameters())
        self.device, self.dtype = weight.device, weight.dtype  # caches and inputs follow the models
        if config.impl == "auto" and self.device.type != "cuda":
            # Not the kernels' own "auto": under TRITON_INTERPRET=1 (the kernel
            # tests) that picks the interpreter, far too slow to serve with.
            config = replace(config, impl="reference")
            self.config = config
        c = target.config
        self.n_visual = c.visual_tokens
        self.max_len = 2 * 1024
        self.heads, self.head_dim = c.heads, c.width // c.heads
        slots = config.max_num_seqs
        like = dict(device=self.device, dtype=self.dtype)
        self.k_cache = [torch.zeros(slots, self.max_len, self.heads, self.head_dim, **like) for _ in target.blocks]
        self.v_cache = [torch.zeros(slots, self.max_len, self.heads, self.head_dim, **like) for _ in target.blocks]
        dh = drafter.config.heads
        self.dk = torch.zeros(slots, self.max_len, dh, drafter.config.width // dh, **like)
        self.dv = torch.zeros_like(self.dk)
        self.free_slots = list(range(slots - 1, -1, -1))
        p = config.prior_top1  # moving average of accepted tokens per drafted round, all requests
        self.population = min(p / (1.0 - p), 15.0)

    # -- public ----------------------------------------------------------------
    @torch.no_grad()
    def serve(self, requests: Sequence[Request], examples: Sequence[Example], *, label: str | None = None,
              clock: Callable[[], float] = time.perf_counter, progress: Callable[[int], None] | None = None,
              realtime: bool = True) -> LiveResult:
        """Serve ``requests`` (sorted by arrival; ``examples[i]`` gives request
        i's image and prompt) in wall-clock time. With ``realtime=False``
        arrivals are ignored (all wait at t=0): for tests of the outputs."""
        require(len(requests) == len(examples), "requests and examples must have the same length")
        threads = torch.get_num_threads()
        if self.device.type == "cpu":
            torch.set_num_threads(1)  # timings as the CPU profiles measure them; no stalls on a shared core
        # As vLLM does after start-up: what exists now is permanent for the
        # collector, so its full passes do not walk a large host process's
        # objects in the middle of a step.
        gc.collect()
        gc.freeze()
        try:
            return self._serve(requests, examples, label, clock, progress, realtime)
        finally:
            gc.unfreeze()
            torch.set_num_threads(threads)

    def _serve(self, requests, examples, label, clock, progress, realtime) -> LiveResult:
        shape = (self.target.config.image_px, self.target.config.image_px, 3)
        for r, e in zip(requests, examples):
            require(tuple(e.image.shape) == shape, f"request {r.id}: image is {list(e.image.shape)} pixels, "
                                                   f"the model accepts {list(shape)}")
        seqs = [_Seq(index=i, request=r, example=e, prompt=list(e.prompt_ids)) for i, (r, e) in enumerate(zip(requests, examples))]
        n = len(seqs)
        notes: list[str] = []
        rejected = set()
        for i, r in enumerate(requests):  # a request that can never fit is refused; the rest are served
            need = r.context_tokens + r.output_tokens + self.policy.max_depth + 2
            if need > self.max_len:
                rejected.add(i)
                notes.append(f"request {r.id} rejected: prompt + output + draft ({need} tokens) exceeds the "
                             f"engine's context limit {self.max_len}")
        admitted, first, finish = np.full(n, np.nan), np.full(n, np.nan), np.full(n, np.nan)
        chunks_log: list[tuple[int, float, int]] = []
        rounds: list[tuple[int, int, int]] = []  # accepted, depth, drafted
        steps: list[StepRecord] = []
        traces: list[dict] = []
        waiting: deque[int] = deque()
        running: list[int] = []
        finished = len(rejected)
        start = clock()
        now = lambda: clock() - start  # noqa: E731
        try:
            self._loop(requests, seqs, rejected, realtime, now, waiting, running, admitted, first, finish, chunks_log,
                       rounds, steps, traces, progress, finished)
        except KeyboardInterrupt:  # keep what was measured; the log says it is incomplete
            notes.append("interrupted: the run stopped before every request finished")
        log = self._run_log(label or self.policy.label, requests, seqs, admitted, first, finish, chunks_log, rounds,
                            steps, tuple(notes))
        return LiveResult(log=log, steps=steps, traces=traces,
                          outputs={r.id: seqs[i].emitted for i, r in enumerate(requests)})

    def _loop(self, requests, seqs, rejected, realtime, now, waiting, running, admitted, first, finish, chunks_log,
              rounds, steps, traces, progress, finished) -> None:
        n = len(seqs)
        arrived = 0
        idle_from = 0.0  # when the engine last ran out of work (None: it has work), as the simulator's replica
        while finished < n:
            t = now()
            while arrived < n and (not realtime or requests[arrived].arrival_s <= t):
                if arrived not in rejected:
                    waiting.append(arrived)
                arrived += 1
            if not running and not waiting:
                if idle_from is None:
                    idle_from = t
                # Poll rather than sleep, as a serving loop does: a core that slept
                # comes back with cold caches and a lower clock, and the first
                # steps after every idle gap would be slower than the rest.
                while arrived < n and now() < requests[arrived].arrival_s:
                    pass
                continue
            while waiting and len(running) < self.config.max_num_seqs:
                i = waiting.popleft()
                running.append(i)
                seqs[i].slot = self.free_slots.pop()
                seqs[i].recent = self.population  # its history starts as the engine's
                if self.replay is not None:
                    seqs[i].replay = self.replay.admit(seqs[i].request.visual_tokens)
                admitted[i] = t
            decode = [seqs[i] for i in running if seqs[i].cache >= seqs[i].prefill_target]
            budget = self.config.max_num_batched_tokens - len(decode) - sum(s.drafted for s in decode)
            chunks = []
            for i in running:
                s = seqs[i]
                left = s.prefill_target - s.cache
                if left > 0 and budget > 0:
                    take = min(left, budget)
                    chunks.append((s, take))
                    budget -= take
            step_start = t  # the step's time includes scheduling it, as the simulator's steps run back to back
            record, outcome = self._step(decode, chunks, traces)
            end = now()
            idle = step_start - idle_from if idle_from is not None else 0.0
            idle_from = None
            steps.append(StepRecord(start_s=step_start, duration_s=end - step_start, idle_s=idle, **record))
            for s, emitted, drafted, accepted, depth in outcome:
                chunks_log.append((s.index, end, emitted))
                if drafted > 0:
                    rounds.append((accepted, depth, drafted))
            for s, take in chunks:
                if s.cache >= s.prefill_target:
                    first[s.index] = end
                    chunks_log.append((s.index, end, 1))
            done = [i for i in running if seqs[i].remaining <= 0]
            for i in done:
                finish[i] = end
                running.remove(i)
                self.free_slots.append(seqs[i].slot)
                finished += 1
            if done and progress is not None:
                progress(finished)

    # -- one step ----------------------------------------------------------------
    def _step(self, decode: list[_Seq], chunks: list[tuple[_Seq, int]], traces: list[dict]):
        b = len(decode)
        clock = time.perf_counter
        t_start = clock()
        prefill_tokens = sum(take for _, take in chunks)
        prefill_pairs = sum(take * s.cache + take * (take + 1) // 2 for s, take in chunks)
        prefill_kv = sum(s.cache + take for s, take in chunks)
        vision_tokens = sum(self.n_visual for s, _ in chunks if s.cache == 0)
        starting = [s for s, _ in chunks if s.cache == 0]
        if starting:  # the vision encoder over every image starting prefill, in one batch
            embeds = self.target.encode_image(torch.from_numpy(np.stack([s.example.image for s in starting])).to(self.device))
            for s, e in zip(starting, embeds):
                s.visual_embeds = e

        t_draft = clock()
        # 1. incremental drafting of the rank-1 chains, planning in between
        depth, ranks = self.policy.max_depth, max(self.policy.max_rank, 1)
        calls: list[int] = []  # rows of each drafter call (the first: absorbed entries), as the simulator prices them
        chains: list[list[_Node]] = [[] for _ in decode]
        conf = np.zeros((b, max(depth, 1), ranks))  # levels not drafted yet: unknown (0)
        known = np.zeros(b, dtype=np.int64)
        kept = np.array([self.context.kept(np.array([s.request.visual_tokens]))[0] for s in decode], dtype=np.int64)
        visual_ctx: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        replayed = None  # timing-only runs: this round's confidences [B, D, R] and true ranks [B, D]
        if self.replay is not None and b and depth > 0:
            replayed = self.replay.round(np.array([s.replay[0] for s in decode]),
                                         np.array([s.replay[1] for s in decode]), depth)
        longest = max((s.cache for s, _ in chunks), default=0)
        view = self._view(decode, conf, kept, prefill_tokens, prefill_pairs, prefill_kv, len(chunks), longest,
                          vision_tokens)
        plan = self.policy.plan(view) if b else None
        while b and depth > 0:
            want = [i for i in range(b) if plan.draft_steps[i] > known[i] and known[i] < depth]
            if not want:
                break
            self._draft_level(decode, want, known, chains, visual_ctx, calls)
            for i in want:
                probs = decode[i].conf_pending if known[i] == 0 else chains[i][known[i] - 1].conf
                conf[i, known[i], :] = (probs if replayed is None else replayed[0][i, known[i]])[:ranks]
                known[i] += 1
            view = self._view(decode, conf, kept, prefill_tokens, prefill_pairs, prefill_kv, len(chunks),
                              longest, vision_tokens)
            plan = self.policy.plan(view)

        # 2. the plan's trees: draft off-chain parents depth by depth
        trees = self._trees(decode, chains, plan, calls, visual_ctx) if b else []

        t_verify = clock()
        # 3. verify: one target forward over prefill chains and round trees
        rows_x, rows_pos, rows_par, rows_len, rows_slot = [], [], [], [], []
        for s, take in chunks:
            full = torch.cat([s.visual_embeds, self.target.embed(torch.tensor(s.prompt, device=self.device))], 0)
            rows_x.append(full[s.cache:s.cache + take])
            rows_pos.append(torch.arange(s.cache, s.cache + take, device=self.device))
            rows_par.append(torch.arange(-1, take - 1, device=self.device))
            rows_len.append(s.cache)
            rows_slot.append(s.slot)
        for s, nodes in zip(decode, trees):
            tokens = torch.tensor([s.emitted[-1]] + [nd.token for nd in nodes], device=self.device)
            rows_x.append(self.target.embed(tokens))
            rows_pos.append(torch.tensor([s.cache] + [s.cache + nd.depth for nd in nodes], device=self.device))
            rows_par.append(torch.tensor([-1] + [nd.parent for nd in nodes], device=self.device))
            rows_len.append(s.cache)
            rows_slot.append(s.slot)
        out = self._forward(rows_x, rows_pos, rows_par, rows_len, rows_slot)
        verify_tokens = sum(1 + len(t) for t in trees)
        pairs = sum((1 + len(t)) * s.cache for s, t in zip(decode, trees))

        # 4. prefill bookkeeping, then accept
        for row, (s, take) in enumerate(chunks):
            self._commit(s, out, row, list(range(take)))
            s.prefill_hidden.append(out.hidden[row, :take])
            s.cache += take
            if s.cache >= s.prefill_target:
                hidden = torch.cat(s.prefill_hidden, 0)  # [P, C]
                s.prefill_hidden = []
                n = self.n_visual
                s.visual_hidden = hidden[:n]
                s.visual_keys = torch.stack([self.k_cache[l][s.slot, :n] for l in range(len(self.k_cache))], 0)
                s.queries = torch.stack([q[row, take - 1] for q in out.queries], 0)
                token = int(self.target.head(hidden[-1]).argmax())
                s.emitted.append(token)
                text = hidden[n:]
                ids = s.prompt[1:] + [token]
                s.entries = [(text[t], ids[t], n + t) for t in range(len(s.prompt))]
        outcome = []
        for i, (s, nodes) in enumerate(zip(decode, trees)):
            row = len(chunks) + i
            logits = self.target.head(out.hidden[row, :1 + len(nodes)])  # [1+M, V]
            best = logits.argmax(-1).tolist()
            path, at = [0], 0  # node indices in the row (0 = root)
            children: dict[int, list[int]] = {}
            for j, nd in enumerate(nodes):
                children.setdefault(nd.parent, []).append(j + 1)
            while True:
                kids = children.get(at, [])
                if replayed is not None:  # the replayed rank picks the target's token among the drafted
                    d = 0 if at == 0 else nodes[at - 1].depth
                    want = int(replayed[1][i, d]) if d < replayed[1].shape[1] else 0
                    match = [c for c in kids if nodes[c - 1].rank == want]
                    best[at] = nodes[match[0] - 1].token if match else other_token(
                        best[at], {nodes[c - 1].token for c in kids})
                nxt = [c for c in kids if nodes[c - 1].token == best[at]]
                if not nxt:
                    break
                at = nxt[0]
                path.append(at)
            accepted = len(path) - 1
            emit = min(accepted + 1, s.remaining)
            new_tokens = [nodes[j - 1].token for j in path[1:]] + [best[at]]
            self._commit(s, out, row, path)
            hidden = out.hidden[row]
            base = s.cache
            for step_i, j in enumerate(path):
                nxt_token = new_tokens[step_i]
                s.entries.append((hidden[j], nxt_token, base + step_i))
            s.cache += len(path)
            first_index = len(s.emitted)
            s.emitted.extend(new_tokens[:emit])
            s.queries = torch.stack([q[row, at] for q in out.queries], 0)
            s.drafted = len(nodes)
            if nodes:
                deepest = max(nd.depth for nd in nodes)
                s.recent = (1 - RECENT_WEIGHT) * s.recent + RECENT_WEIGHT * censored_accepted(accepted, deepest, s.recent)
                self.population = ((1 - POPULATION_WEIGHT) * self.population
                                   + POPULATION_WEIGHT * censored_accepted(accepted, deepest, self.population))
                traces.append(self._trace(s, chains[i], int(known[i]), new_tokens, accepted, first_index))
            else:
                s.recent = (1 - RELAX_WEIGHT) * s.recent + RELAX_WEIGHT * self.population
            outcome.append((s, emit, len(nodes), accepted, max((nd.depth for nd in nodes), default=0)))
        t_end = clock()
        kinds = plan.kind if b else np.zeros(0, dtype=np.int8)
        drafting = [i for i in range(b) if plan.draft_steps[i] > 0]
        selecting = [i for i in drafting if 0 < kept[i] < decode[i].request.visual_tokens]
        record = dict(
            forward_tokens=prefill_tokens + verify_tokens, kv_read_tokens=prefill_kv + sum(rows_len[len(chunks):]),
            attn_pairs=prefill_pairs + pairs, attn_requests=len(chunks) + b,
            padded_kv_tokens=len(rows_len) * max(rows_len, default=0), prefill_tokens=prefill_tokens,
            prefill_kv_tokens=prefill_kv, prefill_attn_pairs=prefill_pairs, prefill_requests=len(chunks),
            verifying=verify_tokens > b,
            logit_tokens=sum(1 for s, _ in chunks if s.cache >= s.prefill_target) + verify_tokens,
            vision_tokens=vision_tokens, draft_level_tokens=tuple(calls),
            draft_kept_visual_tokens=int(sum(kept[i] for i in drafting)), select_requests=len(selecting),
            select_visual_tokens=int(sum(decode[i].request.visual_tokens for i in selecting)), batch=b,
            plans=tuple(int((kinds == k).sum()) for k in range(3)),
            draft_s=t_verify - t_draft, target_s=(t_draft - t_start) + (t_end - t_verify))
        return record, outcome

    # -- drafting ----------------------------------------------------------------
    def _visual(self, s: _Seq, visual_ctx: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's kept visual features this round (selected once per round)."""
        if s.index not in visual_ctx:
            kept, length = select_visual(self.context, s.visual_hidden[None], s.queries[None], s.visual_keys[None],
                                         impl=self.config.impl)
            visual_ctx[s.index] = (kept[0], length[0])
        return visual_ctx[s.index]

    def _draft_level(self, decode, want, known, chains, visual_ctx, calls: list[int]) -> None:
        """One drafter step for the requests in ``want``: level 1 absorbs the
        new true entries; deeper levels run the rank-1 chain node."""
        first = [i for i in want if known[i] == 0]
        deeper = [i for i in want if known[i] > 0]
        if first:
            calls.append(sum(len(decode[i].entries) for i in first))  # the absorbed entries run the drafter's GEMMs
            self._absorb([decode[i] for i in first], visual_ctx)
            for i in first:
                chains[i].append(_Node(1, 1, None, int(decode[i].cand[0])))  # rank-1 child of the pending token
        if deeper:
            parents = [chains[i][-1] for i in deeper]
            self._run_nodes([decode[i] for i in deeper], parents, visual_ctx)
            calls.append(len(deeper))
            for i, parent in zip(deeper, parents):
                code = parent.code + (1 << (RANK_BITS * parent.depth))
                chains[i].append(_Node(code, parent.depth + 1, parent, int(parent.cand[0])))

    def _absorb(self, seqs: list[_Seq], visual_ctx) -> None:
        """Run each request's new true entries through the drafter (a chain
        after its cache), commit them, and keep the last one's candidates.
        The entries are packed for the drafter's GEMMs, and only each
        request's last entry attends (the others only need their keys and
        values): a request just out of prefill brings its whole prompt,
        and padding every row to it would cost batch x prompt."""
        lengths = [len(s.entries) for s in seqs]
        entries = [e for s in seqs for e in s.entries]
        feats = torch.stack([f for f, _, _ in entries])[None]  # [1, T, C]
        tokens = torch.tensor([[tok for _, tok, _ in entries]], device=self.device)  # [1, T]
        positions = torch.tensor([[pos for _, _, pos in entries]], device=self.device)  # [1, T]
        x, q, k, v = self.drafter.project(feats, tokens, positions)  # [1, T, C], [1, T, H, D]
        ends = np.cumsum(lengths)
        starts = ends - np.array(lengths)
        last = torch.tensor(ends - 1, device=self.device)
        k_chain = k.new_zeros(len(seqs), 1, max(lengths), *k.shape[-2:])  # [R, 1, A, H, D]
        v_chain = torch.zeros_like(k_chain)
        for r, (a, e) in enumerate(zip(starts, ends)):
            k_chain[r, 0, :e - a], v_chain[r, 0, :e - a] = k[0, a:e], v[0, a:e]
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        cache_len = torch.tensor([s.draft_cache for s in seqs], device=self.device)
        top = int(cache_len.max())
        y = chain_attention(q[0, last][:, None], self.dk[slots, :top], self.dv[slots, :top], cache_len, k_chain,
                            v_chain, torch.tensor(lengths, device=self.device))  # [R, 1, H, D]
        visual = [self._visual(s, visual_ctx) for s in seqs]
        kept, kept_len = self._stack_visual(visual)
        feats_out, logits = self.drafter.finish(x[0, last][:, None], y, kept, kept_len, impl=self.config.impl)
        for r, (s, a, e) in enumerate(zip(seqs, starts, ends)):
            n = lengths[r]
            self.dk[s.slot, s.draft_cache:s.draft_cache + n] = k[0, a:e]
            self.dv[s.slot, s.draft_cache:s.draft_cache + n] = v[0, a:e]
            s.draft_cache += n
            s.entries = []
            probs = logits[r, 0].softmax(-1)
            p, cand = probs.topk(min(MAX_RANK, probs.shape[-1]))
            s.cand, s.conf_pending, s.pending_out = cand.tolist(), p.float().cpu().numpy().astype(float), feats_out[r, 0]
            s.draft_position = int(positions[0, e - 1])

    @staticmethod
    def _stack_visual(visual):
        k = max(v[0].shape[0] for v in visual)
        c = visual[0][0].shape[-1]
        kept = visual[0][0].new_zeros(len(visual), k, c)
        for r, (v, _) in enumerate(visual):
            kept[r, :v.shape[0]] = v
        return kept, torch.stack([v[1] for v in visual])

    @staticmethod
    def _ancestors(node: _Node) -> list[_Node]:
        """``node`` and its ancestors below the pending token, depth 1 first."""
        out = [node]
        while out[-1].parent is not None:
            out.append(out[-1].parent)
        return out[::-1]

    def _run_nodes(self, seqs: list[_Seq], nodes: list[_Node], visual_ctx) -> None:
        """Drafter step on draft nodes (one per row): each attends to its
        request's drafter cache and its own chain; stores its features,
        keys, candidates and confidences on the node."""
        rows = len(nodes)
        paths = [self._ancestors(nd) for nd in nodes]
        feats = torch.stack([s.pending_out if nd.parent is None else nd.parent.feature
                             for s, nd in zip(seqs, nodes)])[:, None]
        tokens = torch.tensor([[nd.token] for nd in nodes], device=self.device)
        positions = torch.tensor([[s.draft_position + nd.depth] for s, nd in zip(seqs, nodes)], device=self.device)
        x, q, k, v = self.drafter.project(feats, tokens, positions)
        for r, nd in enumerate(nodes):
            nd.k, nd.v = k[r, 0], v[r, 0]
        a = max(len(p) for p in paths)
        hd = q.shape[-2:]
        k_chain = k.new_zeros(rows, 1, a, *hd)
        v_chain = k.new_zeros(rows, 1, a, *hd)
        for r, path in enumerate(paths):  # front-aligned; masked past each row's chain length
            for j, p in enumerate(path):
                k_chain[r, 0, j], v_chain[r, 0, j] = p.k, p.v
        slots = torch.tensor([s.slot for s in seqs], device=self.device)
        lens = torch.tensor([s.draft_cache for s in seqs], device=self.device)
        top = int(lens.max())
        y = chain_attention(q, self.dk[slots, :top], self.dv[slots, :top], lens, k_chain, v_chain,
                            torch.tensor([len(p) for p in paths], device=self.device))
        visual = [self._visual(s, visual_ctx) for s in seqs]
        kept, kept_len = self._stack_visual(visual)
        feats_out, logits = self.drafter.finish(x, y, kept, kept_len, impl=self.config.impl)
        probs = logits[:, 0].softmax(-1)
        p, cand = probs.topk(min(MAX_RANK, probs.shape[-1]))
        for r, nd in enumerate(nodes):
            nd.feature, nd.cand, nd.conf = feats_out[r, 0], cand[r].tolist(), p[r].float().cpu().numpy().astype(float)

    def _trees(self, decode: list[_Seq], chains: list[list[_Node]], plan, calls: list[int],
               visual_ctx) -> list[list[_RowNode]]:
        """Every request's plan as verification rows (parents before
        children, tokens filled in); plan nodes whose parent was never run
        through the drafter (off the rank-1 chain, or the chain's last node)
        get a drafter step first, batched across requests depth by depth."""
        nodes: list[dict[int, _Node]] = [{nd.code: nd for nd in chain} for chain in chains]
        codes = [sorted((int(c) for c in plan.codes[i, :plan.num_nodes[i]]), key=lambda c: (_depth(c), c))
                 for i in range(len(decode))]
        deepest = max((_depth(c[-1]) for c in codes if c), default=0)
        rows: list[list[_RowNode]] = [[] for _ in decode]
        index: list[dict[int, int]] = [{} for _ in decode]
        for d in range(1, deepest + 1):
            at_depth = [(i, c) for i in range(len(decode)) for c in codes[i] if _depth(c) == d]
            if d > 1:  # parents (depth d-1) that still need their drafter step
                parents = {(i, c & ((1 << (RANK_BITS * (d - 1))) - 1)) for i, c in at_depth}
                todo = [(i, nodes[i][pc]) for i, pc in sorted(parents) if nodes[i][pc].cand is None]
                if todo:
                    self._run_nodes([decode[i] for i, _ in todo], [nd for _, nd in todo], visual_ctx)
                    calls.append(len(todo))
            for i, code in at_depth:
                rank = (code >> (RANK_BITS * (d - 1))) & MAX_RANK
                parent = nodes[i][code & ((1 << (RANK_BITS * (d - 1))) - 1)] if d > 1 else None
                cand = decode[i].cand if parent is None else parent.cand
                node = nodes[i].get(code)
                if node is None:
                    node = nodes[i][code] = _Node(code, d, parent, int(cand[rank - 1]))
                index[i][code] = len(rows[i]) + 1  # row 0 is the pending token
                parent_row = 0 if parent is None else index[i][parent.code]
                rows[i].append(_RowNode(node.token, d, parent_row, rank))
        return rows

    # -- target ------------------------------------------------------------------
    def _forward(self, xs, positions, parents, lengths, slots):
        b = len(xs)
        q_len = max(x.shape[0] for x in xs)
        c = self.target.config.width
        x = xs[0].new_zeros(b, q_len, c)
        pos = torch.zeros(b, q_len, dtype=torch.long, device=self.device)
        par = torch.full((b, q_len), -1, dtype=torch.long, device=self.device)
        for r in range(b):
            n = xs[r].shape[0]
            x[r, :n], pos[r, :n], par[r, :n] = xs[r], positions[r], parents[r]
        sizes = torch.tensor([xx.shape[0] for xx in xs], device=self.device)
        cache_len = torch.tensor(lengths, device=self.device)
        top = int(cache_len.max())
        idx = torch.tensor(slots, device=self.device)
        kc = [k[idx, :top] for k in self.k_cache]
        vc = [v[idx, :top] for v in self.v_cache]
        return self.target.tree_forward(x, pos, par, sizes, kc, vc, cache_len, impl=self.config.impl)

    def _commit(self, s: _Seq, out, row: int, nodes: list[int]) -> None:
        """Write the target keys/values of ``nodes`` (row indices) after the request's cache."""
        idx = torch.tensor(nodes, device=self.device)
        for l in range(len(self.k_cache)):
            self.k_cache[l][s.slot, s.cache:s.cache + len(nodes)] = out.keys[l][row, idx]
            self.v_cache[l][s.slot, s.cache:s.cache + len(nodes)] = out.values[l][row, idx]

    # -- views, traces, logs ---------------------------------------------------------
    def _view(self, decode, conf, kept, prefill_tokens, prefill_pairs, prefill_kv, prefill_requests,
              prefill_max_context, vision_tokens):
        return ReplicaView(
            context_tokens=np.array([s.cache for s in decode], dtype=np.int64),
            visual_tokens=np.array([s.request.visual_tokens for s in decode], dtype=np.int64),
            kept_visual_tokens=kept, remaining_tokens=np.array([s.remaining for s in decode], dtype=np.int64),
            recent_accepted=np.array([s.recent for s in decode]), conf=conf, prefill_tokens=prefill_tokens,
            prefill_attn_pairs=prefill_pairs, prefill_kv_tokens=prefill_kv, prefill_requests=prefill_requests,
            prefill_max_context=prefill_max_context, vision_tokens=vision_tokens, costs=self.costs)

    @staticmethod
    def _trace(s: _Seq, chain: list[_Node], known: int, new_tokens: list[int], accepted: int,
               first_index: int) -> dict:
        """The target token's rank among the candidates the drafter proposed
        along its rank-1 chain (0: not among the top TRACE_RANKS), depth by
        depth while the chain is the target's path and the target's token is
        known, with the drafter's confidences at each depth. ``output_index``
        is the depth-1 token's index in the request's output."""
        ranks, confs = [], []
        for d in range(known):
            if d > accepted:  # the target's token at this depth was never computed
                break
            cands, conf = (s.cand, s.conf_pending) if d == 0 else (chain[d - 1].cand, chain[d - 1].conf)
            if cands is None:
                break
            truth = new_tokens[d]
            top = cands[:TRACE_RANKS]
            rank = top.index(truth) + 1 if truth in top else 0
            ranks.append(rank)
            confs.append([round(float(c), 5) for c in conf[:TRACE_RANKS]])
            if rank != 1:
                break
        return {"request": s.request.id, "output_index": first_index, "context": s.cache,
                "ranks": ranks, "conf": confs}

    @staticmethod
    def _run_log(label, requests, seqs, admitted, first, finish, chunks_log, rounds, steps, notes) -> RunLog:
        records = tuple(
            RequestRecord(id=r.id, arrival_s=r.arrival_s, admitted_s=float(admitted[i]), first_token_s=float(first[i]),
                          finish_s=float(finish[i]), prompt_tokens=r.prompt_tokens,
                          output_tokens=min(len(seqs[i].emitted), r.output_tokens), images=r.images,
                          visual_tokens=r.visual_tokens)
            for i, r in enumerate(requests))
        ids = np.array([r.id for r in requests], dtype=np.int64)
        idx = np.array([c[0] for c in chunks_log], dtype=np.int64)
        times = np.array([c[1] for c in chunks_log])
        tokens = np.array([c[2] for c in chunks_log], dtype=np.int64)
        order = np.argsort(times, kind="stable")
        rd = np.array(rounds, dtype=np.int64).reshape(-1, 3)
        return RunLog(
            policy=label, requests=records, chunk_request=ids[idx[order]] if len(idx) else idx,
            chunk_time_s=times[order], chunk_tokens=tokens[order], round_accepted=rd[:, 0], round_depth=rd[:, 1],
            round_drafted=rd[:, 2], step_start_s=np.array([s.start_s for s in steps]),
            step_duration_s=np.array([s.duration_s for s in steps]),
            step_plans=np.array([s.plans for s in steps], dtype=np.int64).reshape(-1, 3),
            step_batch=np.array([s.batch for s in steps], dtype=np.int64),
            start_s=float(min((r.arrival_s for r in requests), default=0.0)),
            end_s=float(np.nanmax(finish)) if np.isfinite(finish).any() else 0.0,
            rounds_total=int(sum(s.batch for s in steps)), complete=bool(np.isfinite(finish).all()), notes=notes)


class _RowNode:
    """A plan node in a verification row: its token, depth, parent's row (0:
    the pending token) and rank among its parent's drafted candidates."""

    __slots__ = ("token", "depth", "parent", "rank")

    def __init__(self, token: int, depth: int, parent: int, rank: int):
        self.token, self.depth, self.parent, self.rank = token, depth, parent, rank


def _depth(code: int) -> int:
    d = 0
    while code:
        code >>= RANK_BITS
        d += 1
    return d
