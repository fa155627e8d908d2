"""The live engine: real batched speculative decoding with the shipped models.

Imports: torch, numpy, simspec.models, simspec.policies, simspec.serving,
simspec.costs, simspec.types, simspec.live.config, simspec.live.drafting, simspec_kernels
(through the models). DESIGN.md "Live engine".

It serves a workload in wall-clock time with the simulator's own scheduler
and acceptance estimate (simspec.serving: FCFS admission, decode rounds
first, prefill chunks in the token budget they leave) and the same policy
objects (``Policy.plan(ReplicaView)``). Each step (:meth:`LiveEngine.step`):

1. **draft**: the policy plans with the confidences known so far (levels
   not drafted yet are 0); every request whose plan wants more drafter
   steps (``draft_steps``) than it has had gets one more (its rank-1
   chain), and the policy plans again, until no plan wants more; then tree
   nodes off the rank-1 chain that have children are run through the
   drafter, depth by depth (simspec.live.drafting);
2. **verify**: one target forward over the prefill chunks (chains) and every
   round's tree (the pending token as root) with the tree-attention kernel;
3. **accept** greedily: follow the target's argmax down the tree; emit the
   accepted tokens and the target's bonus token;
4. **record** the step's shape (the cost model's inputs) and its time.

Output is exactly the target's greedy decoding (``ignore_eos``: a request
generates its workload output length), whatever the policy: the tests
compare it request by request. Every round's acceptance trace (the target
token's rank among the drafter's candidates per depth, the drafter's
confidences) is recorded.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from simspec import trees
from simspec.acceptance.context import DraftContext
from simspec.costs import CostModel
from simspec.live.config import LiveConfig
from simspec.live.drafting import DraftCache, Drafting, Node, RowNode, plan_rows, select_kept, walk
from simspec.live.prefixes import PrefixStore
from simspec.live.records import LiveResult, StepRecord, acceptance_trace, run_log
from simspec.live.timing import AcceptanceReplay
from simspec.models.drafter import Drafter
from simspec.models.task import Example
from simspec.models.vlm import TargetVLM
from simspec.policies import Policy, ReplicaView, StepPlan
from simspec.serving.estimate import Estimate
from simspec.serving.queues import Prefill
from simspec.serving.scheduler import Scheduler
from simspec.types import PLAN_KINDS, AcceptanceTrace, Request, require

MAX_LEN = 2 * 1024  # tokens of one request's KV cache slot


@dataclass(slots=True)
class _Seq:
    """One request's live state (its scheduling state is the scheduler's, at ``index``)."""

    index: int
    request: Request
    example: Example
    prompt: list[int]  # text token ids (BOS + question)
    slot: int = -1
    emitted: list[int] = field(default_factory=list)
    draft: Drafting = field(default_factory=Drafting)
    visual_hidden: torch.Tensor | None = None  # [N, C]
    visual_keys: torch.Tensor | None = None  # [layers, N, H, D]
    queries: torch.Tensor | None = None  # [layers, H, D] the verifier's last queries
    prefill_hidden: list[torch.Tensor] = field(default_factory=list)
    visual_embeds: torch.Tensor | None = None  # [N, C] LM inputs of the image
    replay: tuple[float, float] = (0.0, 1.0)  # timing-only runs: (top-1 logit, visual retention) drawn at admission

    @property
    def remaining(self) -> int:
        return self.request.output_tokens - len(self.emitted)


@dataclass(slots=True)
class _Run:
    """One ``serve`` call's state."""

    requests: Sequence[Request]
    seqs: list[_Seq]
    scheduler: Scheduler
    estimate: Estimate
    now: Callable[[], float]
    realtime: bool
    rejected: set[int]
    admitted_s: np.ndarray
    first_s: np.ndarray
    finish_s: np.ndarray
    chunks: list[tuple[int, float, int]] = field(default_factory=list)  # (request index, time, tokens) emitted
    rounds: list[tuple[int, int, int]] = field(default_factory=list)  # (accepted, depth, drafted) of drafted rounds
    steps: list[StepRecord] = field(default_factory=list)
    step_tokens: list[int] = field(default_factory=list)  # tokens emitted at each step's end
    traces: list[AcceptanceTrace] = field(default_factory=list)
    arrived: int = 0
    finished: int = 0
    idle_from: float | None = 0.0  # when the engine last ran out of work (None: it has work), as the replica's


@dataclass(slots=True)
class _Round:
    """A step's drafting: the plan, what the drafter proposed, its calls."""

    plan: StepPlan | None
    chains: list[list[Node]]  # per decode request: its rank-1 chain as drafted
    known: np.ndarray  # [B] levels drafted
    kept: np.ndarray  # [B] kept visual tokens
    calls: list[int]  # rows of each drafter call (the first: absorbed entries)
    rows: list[list[RowNode]]  # per decode request: the plan as verification rows
    replayed: tuple[np.ndarray, np.ndarray] | None  # timing-only: confidences [B, D, R], true ranks [B, D]


@dataclass(slots=True)
class _Outcome:
    seq: _Seq
    emitted: int
    drafted: int
    accepted: int
    depth: int


class LiveEngine:
    """Serve requests with the target and drafter (see the module docstring)."""

    def __init__(self, target: TargetVLM, drafter: Drafter, policy: Policy, costs: CostModel,
                 config: LiveConfig = LiveConfig(), replay: AcceptanceReplay | None = None):
        """``replay``: timing-only runs (random weights at a real shape) take
        the drafter's confidences and the target's choice among the drafted
        candidates from it instead of from the models' logits."""
        self.target, self.drafter, self.policy, self.costs = target, drafter, policy, costs
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
        self.heads, self.head_dim = c.heads, c.width // c.heads
        slots = config.max_num_seqs
        like = dict(device=self.device, dtype=self.dtype)
        self.k_cache = [torch.zeros(slots, MAX_LEN, self.heads, self.head_dim, **like) for _ in target.blocks]
        self.v_cache = [torch.zeros(slots, MAX_LEN, self.heads, self.head_dim, **like) for _ in target.blocks]
        self.drafting = DraftCache(drafter, slots, MAX_LEN, config.impl)
        self.free_slots = list(range(slots - 1, -1, -1))

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
            require(r.image_tokens == (self.n_visual,), f"request {r.id}: has images of {list(r.image_tokens)} "
                                                        f"visual tokens; the engine serves one of {self.n_visual}")
        notes: list[str] = []
        rejected = set()
        for i, r in enumerate(requests):  # a request that can never fit is refused; the rest are served
            need = r.context_tokens + r.output_tokens + self.policy.max_depth + 2
            if need > MAX_LEN:
                rejected.add(i)
                notes.append(f"request {r.id} rejected: prompt + output + draft ({need} tokens) exceeds the "
                             f"engine's context limit {MAX_LEN}")
        n = len(requests)
        scheduler = Scheduler(
            context=np.array([r.context_tokens for r in requests], dtype=np.int64),
            visual=np.array([r.visual_tokens for r in requests], dtype=np.int64),
            output=np.array([r.output_tokens for r in requests], dtype=np.int64),
            max_num_seqs=self.config.max_num_seqs, max_num_batched_tokens=self.config.max_num_batched_tokens,
            kv_budget_tokens=self.config.max_num_seqs * MAX_LEN, reserve_tokens=self.policy.max_depth + 1,
            images=[r.image_tokens for r in requests] if self.config.encoder_budget == "vllm" else None,
            block_size=self.config.block_size,
            prefixes=(np.array([r.prefix_id for r in requests], np.int64),
                      np.array([r.prefix_tokens for r in requests], np.int64)) if self.config.prefix_caching else None)
        self.prefixes = PrefixStore(self.config.block_size, self.n_visual)
        start = clock()
        run = _Run(requests=requests, scheduler=scheduler, estimate=Estimate(n, self.config.prior_top1),
                   seqs=[_Seq(index=i, request=r, example=e, prompt=list(e.prompt_ids))
                         for i, (r, e) in enumerate(zip(requests, examples))],
                   now=lambda: clock() - start, realtime=realtime, rejected=rejected, finished=len(rejected),
                   admitted_s=np.full(n, np.nan), first_s=np.full(n, np.nan), finish_s=np.full(n, np.nan))
        try:
            self._loop(run, progress)
        except KeyboardInterrupt:  # keep what was measured; the log says it is incomplete
            notes.append("interrupted: the run stopped before every request finished")
        return LiveResult(log=run_log(label or self.policy.label, run, tuple(notes)), steps=tuple(run.steps),
                          traces=tuple(run.traces), outputs={r.id: run.seqs[i].emitted for i, r in enumerate(requests)})

    # -- the engine loop ----------------------------------------------------------
    def _loop(self, run: _Run, progress: Callable[[int], None] | None) -> None:
        sched, n = run.scheduler, len(run.seqs)
        while run.finished < n:
            t = run.now()
            while run.arrived < n and (not run.realtime or run.requests[run.arrived].arrival_s <= t):
                if run.arrived not in run.rejected:
                    sched.arrive(run.arrived)
                run.arrived += 1
            if sched.idle:
                if run.idle_from is None:
                    run.idle_from = t
                # Poll rather than sleep, as a serving loop does: a core that slept
                # comes back with cold caches and a lower clock, and the first
                # steps after every idle gap would be slower than the rest.
                while run.arrived < n and run.now() < run.requests[run.arrived].arrival_s:
                    pass
                continue
            admitted, decode, preempted, requeued, chunks = sched.schedule()  # the simulator's decisions
            # Each request fits its slot and the budget holds every slot: nothing is ever sent back.
            require(not preempted and not requeued, "the live engine's KV slots never preempt")
            for i in admitted:
                seq = run.seqs[i]
                seq.slot = self.free_slots.pop()
                if sched.hit[i]:  # a prefix-cache hit: its KV, hidden states and image come from the cache
                    hidden, seq.visual_embeds = self.prefixes.restore(
                        seq.request, seq.example.image, seq.prompt, int(sched.hit[i]),
                        [k[seq.slot] for k in self.k_cache], [v[seq.slot] for v in self.v_cache])
                    seq.prefill_hidden = [hidden]
                run.estimate.start(i)
                if self.replay is not None:
                    seq.replay = self.replay.admit(seq.request.visual_tokens)
                run.admitted_s[i] = t
            work, outcomes = self.step(run, [run.seqs[i] for i in decode], [(run.seqs[i], take) for i, take in chunks])
            end = run.now()
            idle = t - run.idle_from if run.idle_from is not None else 0.0
            run.idle_from = None
            run.steps.append(replace(work, start_s=t, duration_s=end - t, idle_s=idle))
            for o in outcomes:
                run.chunks.append((o.seq.index, end, o.emitted))
                if o.drafted > 0:
                    run.rounds.append((o.accepted, o.depth, o.drafted))
            first = sched.complete_prefill(chunks)
            for i in first:
                run.first_s[i] = end
                run.chunks.append((i, end, 1))
            run.step_tokens.append(sum(o.emitted for o in outcomes) + len(first))
            done = sched.retire()
            for i in done:
                run.finish_s[i] = end
                self.free_slots.append(run.seqs[i].slot)
            run.finished += len(done)
            if done and progress is not None:
                progress(run.finished)

    # -- one step ----------------------------------------------------------------
    def step(self, run: _Run, decode: list[_Seq], chunks: list[tuple[_Seq, int]]) -> tuple[StepRecord, list[_Outcome]]:
        """Draft, verify, accept, record (module docstring); the record's times are filled in by the loop."""
        clock = time.perf_counter
        t_start = clock()
        prefill = run.scheduler.prefill([(s.index, take) for s, take in chunks])
        self._encode_images([s for s, take in chunks if run.scheduler.images_reached(s.index, take)])
        t_draft = clock()
        drafted = self._draft(run, decode, prefill)
        t_verify = clock()
        out = self._verify(run, decode, chunks, drafted)
        work = self._record(run, decode, chunks, prefill, drafted)
        self._finish_prefill(run, chunks, out)
        outcomes = self._accept(run, decode, len(chunks), drafted, out)
        t_end = clock()
        return replace(work, draft_s=t_verify - t_draft, target_s=(t_draft - t_start) + (t_end - t_verify)), outcomes

    def _encode_images(self, starting: list[_Seq]) -> None:
        """The vision encoder over every image a chunk reaches (simspec.serving: its prefill's start, or
        under the encoder budget the chunk that reaches it), in one batch."""
        if starting:
            images = torch.from_numpy(np.stack([s.example.image for s in starting])).to(self.device)
            for s, e in zip(starting, self.target.encode_image(images)):
                s.visual_embeds = e

    def _draft(self, run: _Run, decode: list[_Seq], prefill: Prefill) -> _Round:
        """Plan and draft incrementally, then draft the plan's off-chain parents."""
        b = len(decode)
        depth, ranks = self.policy.max_depth, max(self.policy.max_rank, 1)
        kept = self.context.kept(np.array([s.request.visual_tokens for s in decode], dtype=np.int64))
        drafted = _Round(plan=None, chains=[[] for _ in decode], known=np.zeros(b, dtype=np.int64),
                         kept=kept.astype(np.int64), calls=[], rows=[], replayed=None)
        if not b:
            return drafted
        if self.replay is not None and depth > 0:
            drafted.replayed = self.replay.round(np.array([s.replay[0] for s in decode]),
                                                 np.array([s.replay[1] for s in decode]), depth)
        conf = np.zeros((b, max(depth, 1), ranks))  # levels not drafted yet: unknown (0)
        visual: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        drafted.plan = self.policy.plan(self._view(run, decode, conf, drafted.kept, prefill))
        while depth > 0:
            known = drafted.known
            want = [i for i in range(b) if drafted.plan.draft_steps[i] > known[i] and known[i] < depth]
            if not want:
                break
            self._draft_level(decode, want, drafted, visual)
            for i in want:
                probs = decode[i].draft.conf if known[i] == 0 else drafted.chains[i][known[i] - 1].conf
                conf[i, known[i], :] = (probs if drafted.replayed is None else drafted.replayed[0][i, known[i]])[:ranks]
                known[i] += 1
            drafted.plan = self.policy.plan(self._view(run, decode, conf, drafted.kept, prefill))
        drafted.rows = self._plan_rows(decode, drafted, visual)
        return drafted

    def _visual(self, s: _Seq, visual: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """The request's kept visual features this round (selected once per round)."""
        if s.index not in visual:
            visual[s.index] = select_kept(self.context, s.visual_hidden, s.queries, s.visual_keys, self.config.impl)
        return visual[s.index]

    def _run_nodes(self, seqs: list[_Seq], nodes: list[Node], visual: dict) -> None:
        self.drafting.run_nodes([s.draft for s in seqs], [s.slot for s in seqs], nodes,
                                [self._visual(s, visual) for s in seqs])

    def _draft_level(self, decode: list[_Seq], want: list[int], drafted: _Round, visual: dict) -> None:
        """One drafter step for the requests in ``want``: level 1 absorbs the
        new true entries; deeper levels run the rank-1 chain node."""
        first = [i for i in want if drafted.known[i] == 0]
        deeper = [i for i in want if drafted.known[i] > 0]
        if first:
            seqs = [decode[i] for i in first]
            drafted.calls.append(sum(len(s.draft.entries) for s in seqs))  # the absorbed entries run the drafter's GEMMs
            self.drafting.absorb([s.draft for s in seqs], [s.slot for s in seqs], [self._visual(s, visual) for s in seqs])
            for i in first:
                drafted.chains[i].append(Node(trees.child(0, 1), 1, None, int(decode[i].draft.cand[0])))
        if deeper:
            parents = [drafted.chains[i][-1] for i in deeper]
            self._run_nodes([decode[i] for i in deeper], parents, visual)
            drafted.calls.append(len(deeper))
            for i, parent in zip(deeper, parents):
                drafted.chains[i].append(Node(trees.child(parent.code, 1), parent.depth + 1, parent,
                                              int(parent.cand[0])))

    def _plan_rows(self, decode: list[_Seq], drafted: _Round, visual: dict) -> list[list[RowNode]]:
        """Every request's plan as verification rows (parents before
        children, tokens filled in); plan nodes whose parent was never run
        through the drafter (off the rank-1 chain, or the chain's last node)
        get a drafter step first, batched across requests depth by depth."""
        plan = drafted.plan
        nodes: list[dict[int, Node]] = [{nd.code: nd for nd in chain} for chain in drafted.chains]
        codes = [plan_rows([int(c) for c in plan.codes[i, :plan.num_nodes[i]]]) for i in range(len(decode))]
        deepest = max((trees.depth(c[-1]) for c in codes if c), default=0)
        rows: list[list[RowNode]] = [[] for _ in decode]
        index: list[dict[int, int]] = [{} for _ in decode]
        for d in range(1, deepest + 1):
            at_depth = [(i, c) for i in range(len(decode)) for c in codes[i] if trees.depth(c) == d]
            if d > 1:  # parents (depth d-1) that still need their drafter step
                parents = {(i, trees.parent(c)) for i, c in at_depth}
                todo = [(i, nodes[i][pc]) for i, pc in sorted(parents) if nodes[i][pc].cand is None]
                if todo:
                    self._run_nodes([decode[i] for i, _ in todo], [nd for _, nd in todo], visual)
                    drafted.calls.append(len(todo))
            for i, code in at_depth:
                parent = nodes[i][trees.parent(code)] if d > 1 else None
                cand = decode[i].draft.cand if parent is None else parent.cand
                node = nodes[i].get(code)
                if node is None:
                    node = nodes[i][code] = Node(code, d, parent, int(cand[trees.rank(code) - 1]))
                index[i][code] = len(rows[i]) + 1  # row 0 is the pending token
                rows[i].append(RowNode(node.token, d, 0 if parent is None else index[i][parent.code],
                                       trees.rank(code)))
        return rows

    def _verify(self, run: _Run, decode: list[_Seq], chunks: list[tuple[_Seq, int]], drafted: _Round):
        """One target forward over the prefill chunks and the rounds' trees."""
        cache = run.scheduler.cache
        xs, positions, parents, lengths, slots = [], [], [], [], []
        for s, take in chunks:
            done = int(cache[s.index])
            full = torch.cat([s.visual_embeds, self.target.embed(torch.tensor(s.prompt, device=self.device))], 0)
            xs.append(full[done:done + take])
            positions.append(torch.arange(done, done + take, device=self.device))
            parents.append(torch.arange(-1, take - 1, device=self.device))
            lengths.append(done)
            slots.append(s.slot)
        for s, nodes in zip(decode, drafted.rows):
            done = int(cache[s.index])
            xs.append(self.target.embed(torch.tensor([s.emitted[-1]] + [nd.token for nd in nodes], device=self.device)))
            positions.append(torch.tensor([done] + [done + nd.depth for nd in nodes], device=self.device))
            parents.append(torch.tensor([-1] + [nd.parent for nd in nodes], device=self.device))
            lengths.append(done)
            slots.append(s.slot)
        return self._forward(xs, positions, parents, lengths, slots)

    def _finish_prefill(self, run: _Run, chunks: list[tuple[_Seq, int]], out) -> None:
        """Commit the chunks' keys and values; a request whose prompt is now
        whole keeps its visual keys and last queries for selection, samples
        its first token and hands its prompt to the drafter."""
        sched = run.scheduler
        for row, (s, take) in enumerate(chunks):
            done = int(sched.cache[s.index])
            self._commit(s, done, out, row, list(range(take)))
            s.prefill_hidden.append(out.hidden[row, :take])
            if self.config.prefix_caching:
                self.prefixes.save(s.request, s.example.image, s.prompt, done + take, s.prefill_hidden, s.visual_embeds,
                                   [k[s.slot] for k in self.k_cache], [v[s.slot] for v in self.v_cache])
            if done + take < sched.target[s.index]:
                continue
            hidden = torch.cat(s.prefill_hidden, 0)  # [P, C]
            s.prefill_hidden = []
            n = self.n_visual
            s.visual_hidden = hidden[:n]
            s.visual_keys = torch.stack([self.k_cache[layer][s.slot, :n] for layer in range(len(self.k_cache))], 0)
            s.queries = torch.stack([q[row, take - 1] for q in out.queries], 0)
            token = int(self.target.head(hidden[-1]).argmax())
            s.emitted.append(token)
            text = hidden[n:]
            ids = s.prompt[1:] + [token]
            s.draft.entries = [(text[t], ids[t], n + t) for t in range(len(s.prompt))]

    def _accept(self, run: _Run, decode: list[_Seq], first_row: int, drafted: _Round, out) -> list[_Outcome]:
        """Greedy acceptance along each round's tree; commit the accepted path."""
        sched, outcomes = run.scheduler, []
        for i, (s, nodes) in enumerate(zip(decode, drafted.rows)):
            row = first_row + i
            best = self.target.head(out.hidden[row, :1 + len(nodes)]).argmax(-1).tolist()  # [1+M] the target's tokens
            path = walk(nodes, best, None if drafted.replayed is None else drafted.replayed[1][i])
            at = path[-1]
            accepted = len(path) - 1
            emit = min(accepted + 1, s.remaining)
            new_tokens = [nodes[j - 1].token for j in path[1:]] + [best[at]]
            base = int(sched.cache[s.index])
            self._commit(s, base, out, row, path)
            s.draft.entries += [(out.hidden[row][j], new_tokens[k], base + k) for k, j in enumerate(path)]
            sched.cache[s.index] += len(path)
            first_index = len(s.emitted)
            s.emitted.extend(new_tokens[:emit])
            sched.emitted[s.index] += emit
            s.queries = torch.stack([q[row, at] for q in out.queries], 0)
            sched.drafted[s.index] = len(nodes)
            deepest = max((nd.depth for nd in nodes), default=0)
            run.estimate.after_round(s.index, len(nodes), accepted, deepest)
            if nodes:
                run.traces.append(acceptance_trace(s.request.id, s.draft, drafted.chains[i], int(drafted.known[i]),
                                                   new_tokens, accepted, first_index, int(sched.cache[s.index])))
            outcomes.append(_Outcome(seq=s, emitted=emit, drafted=len(nodes), accepted=accepted, depth=deepest))
        return outcomes

    def _record(self, run: _Run, decode: list[_Seq], chunks: list[tuple[_Seq, int]], prefill: Prefill,
                drafted: _Round) -> StepRecord:
        """The step's shape, as the simulator prices it (times are the loop's),
        from the caches as the forward saw them."""
        sched, b = run.scheduler, len(decode)
        verify = sum(1 + len(t) for t in drafted.rows)
        contexts = [int(sched.cache[s.index]) for s in decode]
        kinds = drafted.plan.kind if b else np.zeros(0, dtype=np.int8)
        drafting = [i for i in range(b) if drafted.plan.draft_steps[i] > 0]
        selecting = [i for i in drafting if 0 < drafted.kept[i] < decode[i].request.visual_tokens]
        lengths = [int(sched.cache[s.index]) for s, _ in chunks] + contexts  # attention rows' caches
        return StepRecord(
            start_s=0.0, duration_s=0.0, forward_tokens=prefill.tokens + verify,
            kv_read_tokens=prefill.kv_tokens + sum(contexts),
            attn_pairs=prefill.attn_pairs + sum((1 + len(t)) * c for t, c in zip(drafted.rows, contexts)),
            attn_requests=len(chunks) + b, padded_kv_tokens=len(lengths) * max(lengths, default=0),
            prefill_tokens=prefill.tokens, prefill_kv_tokens=prefill.kv_tokens,
            prefill_attn_pairs=prefill.attn_pairs, prefill_requests=len(chunks), verifying=verify > b,
            logit_tokens=sum(1 for s, take in chunks if sched.cache[s.index] + take >= sched.target[s.index]) + verify,
            vision_tokens=prefill.vision_tokens, draft_level_tokens=tuple(drafted.calls),
            draft_kept_visual_tokens=int(sum(drafted.kept[i] for i in drafting)), select_requests=len(selecting),
            select_visual_tokens=int(sum(decode[i].request.visual_tokens for i in selecting)), batch=b,
            plans=tuple(int((kinds == k).sum()) for k in range(len(PLAN_KINDS))))

    # -- target ------------------------------------------------------------------
    def _forward(self, xs, positions, parents, lengths, slots):
        b = len(xs)
        q_len = max(x.shape[0] for x in xs)
        x = xs[0].new_zeros(b, q_len, self.target.config.width)  # [B, Q, C]
        pos = torch.zeros(b, q_len, dtype=torch.long, device=self.device)  # [B, Q]
        par = torch.full((b, q_len), -1, dtype=torch.long, device=self.device)  # [B, Q]
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

    def _commit(self, s: _Seq, at: int, out, row: int, nodes: list[int]) -> None:
        """Write the target keys/values of ``nodes`` (row indices) at ``at`` in the request's cache."""
        idx = torch.tensor(nodes, device=self.device)
        for layer in range(len(self.k_cache)):
            self.k_cache[layer][s.slot, at:at + len(nodes)] = out.keys[layer][row, idx]
            self.v_cache[layer][s.slot, at:at + len(nodes)] = out.values[layer][row, idx]

    # -- views, traces, logs ---------------------------------------------------------
    def _view(self, run: _Run, decode: list[_Seq], conf: np.ndarray, kept: np.ndarray, prefill: Prefill) -> ReplicaView:
        ids = np.array([s.index for s in decode], dtype=np.int64)
        return ReplicaView(
            context_tokens=run.scheduler.cache[ids].copy(), visual_tokens=run.scheduler.visual[ids].copy(),
            kept_visual_tokens=kept, remaining_tokens=np.array([s.remaining for s in decode], dtype=np.int64),
            recent_accepted=run.estimate.recent[ids].copy(), conf=conf, prefill_tokens=prefill.tokens,
            prefill_attn_pairs=prefill.attn_pairs, prefill_kv_tokens=prefill.kv_tokens,
            prefill_requests=prefill.requests, prefill_max_context=prefill.max_context,
            vision_tokens=prefill.vision_tokens, costs=self.costs)
