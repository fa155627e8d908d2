"""The serving model: one GPU replica with continuous batching and
speculative decoding, as a SimPy discrete-event simulation.

Imports: simpy (the only simpy importer in the package), numpy,
simspec.types, .seeds, .acceptance, .costs, .policies, .serving, .sim.steps, .sim.fastloop.
DESIGN.md "The serving model".

Two processes: ``arrivals`` puts requests in the waiting queue at their
arrival times; ``replica`` runs the engine loop. Each step:

1. admit waiting requests FCFS while ``max_num_seqs`` and the KV budget allow;
2. reserve KV for the decode batch, preempting the newest request (recompute,
   never a silent drop) when it does not fit;
3. schedule prefill chunks in the token budget the decode rounds leave (each
   counts 1 + its last round's draft tokens, as vLLM counts spec tokens);
   steps 1-3 are simspec.serving's Scheduler, which the live engine runs too;
4. plan: the policy decides every decode request's round from the batch's
   snapshot (the drafter's confidences of this round included);
5. the step costs selection + drafting + one target forward + overhead (+
   the vision encoder for requests starting prefill; + waking up, for the
   first step after the replica sat idle and the one after), from the cost
   model;
6. accept: per request the accepted path comes from the acceptance model;
   accepted + 1 tokens are emitted at the step's end; a prefill that
   completes emits the request's next token (its first: TTFT).

Steps 4-6 are compiled (sim/steps.py) and run several steps per SimPy
event while nothing outside the decode batch can change. Simulated time is
seconds.

Every decision is made once, by compiled functions: steps 1-3 by
simspec.serving.queues.schedule (prefix caching and vLLM's encoder budget
included) through sim/fastloop.py's ``decide``, the step by
sim/steps.py, completed prefills and finishes by fastloop's ``finish``.
Two drivers run them, with the same result to the last bit (a test
compares them). The one ``simulate`` uses is one SimPy process,
``replica``, around the compiled serving loop (fastloop.run): each call
runs event after event and returns only where Python must act (a log
buffer to flush, the random numbers to refill, progress, the end); the
process then yields a timeout to the call's last event. Arrivals there
are no process: the loop takes them from the frontend's ready times in
order (``frontend_ready``), each queued when an ``arrivals`` process
would queue it. The other (``_python``, for the test) runs ``arrivals``
and ``replica`` as SimPy processes, one event per step, calling the same
compiled functions: it checks that the compiled loop orders arrivals,
steps and wake-ups as SimPy does.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable, NamedTuple, Sequence

import numpy as np
import simpy

from simspec.sim import fastloop, steps
from simspec.acceptance import AcceptanceModel, DraftContext, RandomBlocks
from simspec.acceptance.model import normals_per_round
from simspec.costs import CostModel
from simspec.policies import Policy
from simspec.serving.config import EngineConfig
from simspec.serving.estimate import Estimate
from simspec.serving.queues import CHUNKS, DECODES
from simspec.serving.scheduler import Scheduler, shared_array
from simspec import seeds
from simspec.logs import GapBudget, LogBuilder
from simspec.types import Request, RequestTable, RunLog

LOG_STEPS = 4096  # steps per log buffer; a full buffer is flushed to Python lists
MAX_STEPS_PER_CALL = fastloop.MAX_STEPS_PER_CALL  # decode-only steps run in one compiled call at most


def reserve_tokens(engine: EngineConfig, depth: int) -> int:
    """KV slots a decoding request needs free for its next round: 1 + K
    scheduled tokens, and with vLLM's scheduler also K lookahead slots for
    the drafts it proposes next (vllm/v1/core/kv_cache_manager.py 0.33
    l.551-553)."""
    return 1 + depth + (depth if engine.scheduler == "vllm" else 0)


class Frontend:
    """The engine's frontend: a text worker (per request and per text
    token) and an image worker (per image), each first come, first served;
    a request is ready when both are done with it (EngineConfig's frontend
    fields). Fed requests in arrival order, one at a time."""

    def __init__(self, engine: EngineConfig):
        self.engine = engine
        self.priced = bool(engine.frontend_s_per_request or engine.frontend_s_per_text_token
                           or engine.frontend_s_per_image)  # False: every request is ready on arrival
        self.text_free = self.image_free = -np.inf

    def ready(self, request: Request, arrival_s: float) -> float:
        """When ``request``, arriving at ``arrival_s``, reaches the engine's queue."""
        e = self.engine
        if not self.priced:
            return arrival_s
        self.text_free = max(arrival_s, self.text_free) + e.frontend_s_per_request + \
            e.frontend_s_per_text_token * request.prompt_tokens
        done = self.text_free
        if request.images:
            self.image_free = max(arrival_s, self.image_free) + e.frontend_s_per_image * request.images
            done = max(done, self.image_free)
        return done


def frontend_ready(requests: Sequence[Request], engine: EngineConfig) -> tuple[np.ndarray, np.ndarray]:
    """When each request reaches the engine's queue (:class:`Frontend`), and the order they reach it in."""
    arrival = np.array([r.arrival_s for r in requests], float)
    frontend = Frontend(engine)
    if not frontend.priced:
        return arrival, np.arange(len(requests))
    ready = np.array([frontend.ready(r, a) for r, a in zip(requests, arrival)], float)
    return ready, np.argsort(ready, kind="stable")


def capture_sizes(engine: EngineConfig, depth: int, width: int | None = None) -> np.ndarray:
    """Token counts CUDA graphs are captured for; empty without graphs.
    vLLM (vllm/config/vllm.py 0.33, l.2463-2598): 1, 2, 4, then every 8
    below 256, every 16 from 256, up to min(max_num_seqs x (1 + K) x 2, the
    largest capture size, max_num_batched_tokens). SGLang
    (``cudagraph_buckets = "batch"``; srt/arg_groups/cuda_graph_hook.py
    0.5.23, l.500-532): batch sizes 1-8, every 2 to 32, every 4 to 64, every
    8 to 256 (without speculation 1, 2, 4, 8, 12, then every 8), at most
    max_num_seqs (the request pool), times the tokens each request verifies
    (``width``: 1 + K, or a tree's num_draft_tokens)."""
    if engine.cudagraph_mode == "none":
        return np.zeros(0, np.int64)
    if engine.cudagraph_buckets == "batch":
        width = width or 1 + depth
        if width > 1:
            sizes = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4), *range(72, 257, 8)]
        else:
            sizes = [1, 2, 4, 8, 12, *range(16, 257, 8)]
        return np.array([s * width for s in sizes if s <= engine.max_num_seqs], np.int64)
    top = min(engine.max_num_seqs * (1 + depth) * 2, engine.max_cudagraph_capture_size, engine.max_num_batched_tokens)
    sizes = [s for s in (1, 2, 4) if s <= top] + list(range(8, min(top + 1, 256), 8)) + list(range(256, top + 1, 16))
    if engine.max_num_batched_tokens <= top and engine.max_num_batched_tokens not in sizes:
        sizes.append(engine.max_num_batched_tokens)
    return np.array(sorted(sizes), np.int64)


def engine_terms(engine: EngineConfig, costs: CostModel, depth: int, width: int | None = None) -> steps.EngineTerms:
    graphs = {"none": steps.GRAPH_NONE, "piecewise": steps.GRAPH_PIECEWISE,
              "full_and_piecewise": steps.GRAPH_FULL_AND_PIECEWISE}[engine.cudagraph_mode]
    capture = capture_sizes(engine, depth, width)
    top = int(capture[-1]) if len(capture) else 0
    piecewise_max = max(top, engine.max_num_batched_tokens) if engine.cudagraph_buckets == "batch" else top
    return steps.EngineTerms(engine.async_scheduling, graphs, capture, piecewise_max, costs.graph_piecewise_s,
                             costs.graph_eager_s if graphs != steps.GRAPH_NONE else 0.0, engine.drafter_over_prefill,
                             engine.scheduler == "vllm")


class _LogBuffers:
    """Preallocated buffers the compiled step loop writes, handed to a
    LogBuilder (simspec.logs: bounded memory) whenever a call could
    overflow them."""

    def __init__(self, max_batch: int, builder: LogBuilder):
        chunks = LOG_STEPS * min(max_batch, 1024)  # at least one step of max_batch chunks; 100 MB at most
        self.builder = builder
        # Uninitialised: an entry is written before it is read (the *_logged counts say how many are), so only
        # the pages a run writes are ever touched; zeroed, in a process that has freed large arrays before (a
        # benchmark's repeats, a plan's candidates), the allocator would clear all 50 MB of them first.
        self.buffers = steps.Logs(
            chunk_id=np.empty(chunks, np.int64), chunk_tokens=np.empty(chunks, np.int64),
            chunk_time_s=np.empty(chunks), round_accepted=np.empty(chunks, np.int64),
            round_depth=np.empty(chunks, np.int64), round_drafted=np.empty(chunks, np.int64),
            step_start_s=np.empty(LOG_STEPS), step_duration_s=np.empty(LOG_STEPS),
            step_batch=np.empty(LOG_STEPS, np.int64), step_plans=np.empty((LOG_STEPS, 3), np.int64),
            step_tokens=np.empty(LOG_STEPS, np.int64), chunks_logged=np.zeros(1, np.int64),
            rounds_logged=np.zeros(1, np.int64), steps_logged=np.zeros(1, np.int64))

    def room_for(self, batch: int, count: int) -> int:
        """Steps of ``batch`` chunks each that fit; flushes first when short."""
        room, flushed = fastloop.log_room(self.buffers, batch, count)
        if room < count:
            self.flush()
            return flushed
        return room

    def flush(self) -> None:
        b = self.buffers
        c, r, s = int(b.chunks_logged[0]), int(b.rounds_logged[0]), int(b.steps_logged[0])
        self.builder.chunks(b.chunk_id[:c], b.chunk_time_s[:c], b.chunk_tokens[:c])
        self.builder.rounds(b.round_accepted[:r], b.round_depth[:r], b.round_drafted[:r])
        self.builder.steps(b.step_start_s[:s], b.step_duration_s[:s], b.step_batch[:s], b.step_plans[:s],
                           b.step_tokens[:s])
        b.chunks_logged[0] = b.rounds_logged[0] = b.steps_logged[0] = 0


def request_logits(acceptance: AcceptanceModel, rng: np.random.Generator, requests: Sequence[Request]) -> np.ndarray:
    """The requests' top-1 logits (AcceptanceModel.request_logits), each
    moved by its class and its context where the model has those terms."""
    if not acceptance.by_request:
        return acceptance.request_logits(rng, len(requests))
    return acceptance.request_logits(rng, len(requests), classes=[r.task for r in requests],
                                     context_tokens=[r.context_tokens for r in requests])


def _prefixes(requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray] | None:
    """Each request's (prefix_id, prefix_tokens); None when nothing is shared."""
    prefix_id = np.array([r.prefix_id for r in requests], dtype=np.int64)
    if not (prefix_id >= 0).any():
        return None
    return prefix_id, np.array([r.prefix_tokens for r in requests], dtype=np.int64)


class RequestColumns(NamedTuple):
    """The requests' figures a replica reads, one array each (a routed
    fleet's replicas each read the whole stream: read once, copied)."""

    ids: np.ndarray  # [N] int
    arrival_s: np.ndarray  # [N] float
    prompt_tokens: np.ndarray  # [N] int
    image_count: np.ndarray  # [N] int images
    context: np.ndarray  # [N] int prompt tokens, text + visual
    visual: np.ndarray  # [N] int
    output: np.ndarray  # [N] int
    images: list  # [N] each request's visual tokens per image
    prefixes: tuple[np.ndarray, np.ndarray] | None  # _prefixes


def request_columns(requests: Sequence[Request]) -> RequestColumns:
    return RequestColumns(ids=np.array([r.id for r in requests], np.int64),
                          arrival_s=np.array([r.arrival_s for r in requests], float),
                          prompt_tokens=np.array([r.prompt_tokens for r in requests], np.int64),
                          image_count=np.array([r.images for r in requests], np.int64),
                          context=np.array([r.context_tokens for r in requests], dtype=np.int64),
                          visual=np.array([r.visual_tokens for r in requests], dtype=np.int64),
                          output=np.array([r.output_tokens for r in requests], dtype=np.int64),
                          images=[r.image_tokens for r in requests], prefixes=_prefixes(requests))


class Replica:
    """State of one replica over one run; ``simulate`` drives it."""

    def __init__(self, env: simpy.Environment, requests: Sequence[Request], *, policy: Policy,
                 costs: CostModel, acceptance: AcceptanceModel, engine: EngineConfig, kv_budget_tokens: int,
                 rng_difficulty: np.random.Generator | None, rng_rounds: np.random.Generator,
                 progress: Callable[[int], None] | None, event_detail: bool = True, _python: bool = False,
                 difficulty: np.ndarray | None = None, routed: bool = False, transferred_kv: bool = False,
                 columns: RequestColumns | None = None, gap_budget: GapBudget | None = None,
                 pool: dict | None = None):
        """``event_detail``: keep the log's per-chunk and per-round arrays
        (simspec.logs.LogBuilder); ``_python`` runs the SimPy-process driver
        (tests compare the two); ``difficulty``: the requests' top-1 logits
        (None: drawn from ``rng_difficulty``); ``routed``: ``requests`` are
        the fleet's whole stream, of which a router hands this replica its
        share as it runs (simspec.fleet.live): no arrival is known yet;
        ``transferred_kv``: each request arrives with its prompt's KV cache
        (the decode side of a disaggregated fleet, simspec.fleet.disagg);
        ``columns``: :func:`request_columns` of ``requests``, read once for
        several replicas; ``gap_budget``: the exact gaps the log shares with
        a fleet's other replicas' (simspec.logs.GapBudget); ``pool``: the
        per-request arrays shared with a routed fleet's alike replicas
        (simspec.serving.scheduler.shared_array: each request is served by
        one, which alone reads and writes its entries)."""
        self.env, self.policy, self.costs, self.engine = env, policy, costs, engine
        self.progress = progress
        self.requests = requests
        n = len(requests)
        context = DraftContext.parse(engine.drafter_context)
        columns = request_columns(requests) if columns is None else columns

        def own(name: str, make: Callable[[], np.ndarray]) -> np.ndarray:
            return shared_array(pool, name, make)

        visual = own("visual", columns.visual.copy)
        images = columns.images if engine.encoder_budget == "vllm" else None
        self.scheduler = Scheduler(
            context=own("context", columns.context.copy), visual=visual, output=own("output", columns.output.copy),
            max_num_seqs=engine.max_num_seqs, max_num_batched_tokens=engine.max_num_batched_tokens,
            kv_budget_tokens=kv_budget_tokens, reserve_tokens=reserve_tokens(engine, policy.max_depth),
            images=images if images is not None and any(images) else None,  # no image: the budget never binds
            block_size=engine.block_size, prefixes=columns.prefixes if engine.prefix_caching else None,
            transferred=transferred_kv, pool=pool, attention=costs.local)
        self.estimate = Estimate(n, 1.0 / (1.0 + np.exp(-acceptance.top1_logit)), own("recent", lambda: np.ones(n)))
        sched = self.scheduler
        self.state = steps.RequestState(
            context=sched.context, visual=visual, kept=own("kept", lambda: context.kept(visual).astype(np.int64)),
            output=sched.output, emitted=sched.emitted, cache=sched.cache,
            absorbed=own("absorbed", lambda: np.zeros(n, np.int64)), recent=self.estimate.recent,
            drafted=sched.drafted,
            difficulty=request_logits(acceptance, rng_difficulty, requests) if difficulty is None else difficulty,
            retention=own("retention", lambda: acceptance.retention(context, visual).astype(float)),
            population=self.estimate.population)
        self.acceptance = acceptance.draws
        self.call = steps.PolicyCall(policy.kernel, policy.params(), policy.max_depth, policy.max_rank,
                                     policy.needs_truth, engine.drafting == "chain")
        self.tables = costs.tables
        self.terms = engine_terms(engine, costs, policy.max_depth, policy.max_verify_tokens)
        self.scheduled = 0  # requests the last step scheduled (decodes and prefill chunks)
        self.rand = RandomBlocks(rng_rounds)
        self.admitted_s = own("admitted_s", lambda: np.full(n, np.nan))
        self.first_token_s = own("first_token_s", lambda: np.full(n, np.nan))
        self.finish_s = own("finish_s", lambda: np.full(n, np.nan))
        self.preemptions = own("preemptions", lambda: np.zeros(n, dtype=np.int64))
        self.finished = 0
        self.arrived = 0
        self.routed = routed
        if routed:  # nothing known yet: the arrivals are filled in as routed (_setup)
            self.ready_s, self.order = np.zeros(0), np.zeros(0, np.int64)
        else:
            self.ready_s, self.order = frontend_ready(requests, engine)
        self.wake = env.event()
        self.idle_from: float | None = 0.0  # when the replica last ran out of work (None: it has work)
        self.wake_owed = 0.0  # the next step's share of waking up
        self.columns = columns
        self.logs = _LogBuffers(2 * min(engine.max_num_seqs, n),
                                LogBuilder(own("ids", columns.ids.copy), event_detail=event_detail,
                                           gap_budget=gap_budget, last_s=own("last_s", lambda: np.full(n, np.nan))))
        sched.check_fits()
        self.fast = not _python
        self._setup()

    def _setup(self) -> None:
        """The compiled serving loop's state (sim/fastloop.py), sharing the Scheduler's arrays."""
        sched, n, engine = self.scheduler, len(self.requests), self.engine
        seqs = len(sched.queues.running)
        every = max(1, n // 200) if self.progress is not None and self.fast else 0
        self.config = fastloop.Config(sched.limits, engine.scheduler == "vllm", engine.mixed_prefill, every)
        if self.routed:  # filled in as the router hands requests over (Loop's routed fields): of the times only
            # the first Loop.routed are read, so the rest stays untouched and its memory unused (a fleet's replica
            # has the whole stream's length, of which its share is a fraction); ``fresh`` past them ends a batch
            self.arrival = fastloop.Arrivals(np.zeros(n, np.int64), np.zeros(n), np.zeros(n), np.ones(n, np.bool_))
        else:
            order = np.asarray(self.order, dtype=np.int64)
            queued_s, fresh = fastloop.arrival_times(np.asarray(self.ready_s, dtype=float), order)
            self.arrival = fastloop.Arrivals(order, np.asarray(self.ready_s, dtype=float)[order], queued_s, fresh)
        self.loop = fastloop.new_loop()
        if self.routed:
            self.loop.routed[0], self.loop.routing[0] = 0, fastloop.ROUTING_OPEN
        self.pending = fastloop.pending_for(seqs)
        self.served = fastloop.Served(self.admitted_s, self.first_token_s, self.finish_s, self.preemptions)

    # -- processes ---------------------------------------------------------
    def arrivals(self):
        for i in self.order:
            delay = self.ready_s[i] - self.env.now
            if delay > 0:
                yield self.env.timeout(delay)
            self.scheduler.arrive(i)
            self.arrived += 1
            if not self.wake.triggered:
                self.wake.succeed()

    def replica(self):
        if self.fast:
            yield from self._serve()
            return
        n = len(self.requests)
        sched = self.scheduler
        while self.finished < n:
            if sched.idle:
                if self.idle_from is None:
                    self.idle_from = self.env.now
                self.wake = self.env.event()
                yield self.wake
                continue
            fastloop.decide(sched.state, self.config, self.env.now, self.pending, self.served, self.state)
            start = self.env.now
            end = self._run(start)
            yield self.env.timeout(end - start)
            self.finished += fastloop.finish(sched.state, self.config, self.terms, self.pending, self.served,
                                             self.state, self.logs.buffers, end)
            if self.progress is not None:
                self.progress(self.finished)

    def _serve(self):
        """The replica on the fast path: each compiled call runs events
        until Python must act; SimPy's clock then moves to its last event."""
        loop, why = self.loop, None
        while why != fastloop.CALL_DONE:
            window = self.rand.window(int(loop.need[0]) if why == fastloop.CALL_REFILL else 0)
            why = fastloop.run(self.scheduler.state, self.config, self.arrival, loop, self.pending, self.served,
                               self.state, self.acceptance, self.call, self.tables, self.terms, self.costs.wake,
                               window, self.logs.buffers)
            self.rand.consume(window)
            self.finished = int(loop.finished[0])
            if loop.now_s[0] > self.env.now:
                yield self.env.timeout(loop.now_s[0] - self.env.now)
            if why == fastloop.CALL_FLUSH:
                self.logs.flush()
            elif why == fastloop.CALL_PROGRESS and self.progress is not None:
                self.progress(self.finished)
        if self.progress is not None:
            self.progress(self.finished)

    # -- steps -------------------------------------------------------------
    def _run(self, start_s: float) -> float:
        """Run the decided step, and more like it (just one if it carries
        prefill) until something outside the batch could change it: a
        finish, the next arrival, a short KV cache. Returns the end time of
        the last step."""
        counts = self.pending.decision.counts
        b, chunks = int(counts[DECODES]), int(counts[CHUNKS])
        max_steps = self.logs.room_for(b + chunks, 1) if chunks else self.logs.room_for(b, MAX_STEPS_PER_CALL)
        stop_s = self.ready_s[self.order[self.arrived]] if self.arrived < len(self.requests) else np.inf
        kv_room = self.scheduler.kv_budget - self.scheduler.kv_used()
        randoms = self.rand.window(normals_per_round(self.acceptance, b, self.call.depth) * max_steps)
        wake, self.wake_owed = self.wake_owed, 0.0
        if self.idle_from is not None:
            first, after = self.costs.wake_split_s(start_s - self.idle_from)
            wake, self.wake_owed = wake + float(first), float(after)
            self.idle_from = None
        prefill = fastloop.step_prefill(self.scheduler.state, self.config, self.pending)
        _, end = steps.run_steps(self.pending.decision.decode[:b], self.state, self.acceptance, self.call,
                                 self.tables, self.terms, prefill, wake, start_s, stop_s, max_steps, kv_room,
                                 randoms, self.logs.buffers, self.scheduled)
        self.rand.consume(randoms)
        self.scheduled = b + chunks
        return end

    # -- results -----------------------------------------------------------
    def run_log(self, label: str, rows: np.ndarray | None = None) -> RunLog:
        """The run's log; ``rows`` (sorted): of these requests alone (a routed
        replica's share of the fleet's stream), its gaps' requests numbered
        by them."""
        self.logs.flush()
        c = self.columns
        shared = dict(id=c.ids, arrival_s=c.arrival_s, prompt_tokens=c.prompt_tokens, output_tokens=self.state.emitted,
                      images=c.image_count, visual_tokens=self.state.visual, cached_tokens=self.scheduler.cached_tokens)
        own = dict(admitted_s=self.admitted_s, first_token_s=self.first_token_s, finish_s=self.finish_s,
                   preemptions=self.preemptions)  # the log's own, not copied (a whole run's)
        if rows is None:
            table = RequestTable(**{k: v.copy() for k, v in shared.items()}, **own)
        else:
            table = RequestTable(**{k: v[rows] for k, v in {**shared, **own}.items()})
        expected = int(self.loop.routed[0]) if self.routed else len(self.requests)
        log = self.logs.builder.finish(policy=label, table=table, complete=self.finished == expected)
        gaps = log.gaps
        if rows is None or gaps.exact_request is None:
            return log
        renumber = np.full(len(c.ids), -1, np.int64)
        renumber[rows] = np.arange(len(rows))
        return replace(log, gaps=replace(gaps, exact_request=renumber[gaps.exact_request]))


def simulate(requests: Sequence[Request], *, policy: Policy, label: str | None = None, costs: CostModel,
             acceptance: AcceptanceModel, engine: EngineConfig, kv_budget_tokens: int,
             seed: int = 0, progress: Callable[[int], None] | None = None, event_detail: bool = True,
             _python: bool = False, difficulty: np.ndarray | None = None, transferred_kv: bool = False,
             gap_budget: GapBudget | None = None) -> RunLog:
    """Serve ``requests`` with ``policy`` and return everything measured.

    The run's seed gives the difficulty and round streams (simspec.seeds
    children, apart from the workload's), so policies compared under one
    seed share request difficulties, and the same seed gives the same log,
    byte for byte. Requests must be sorted by arrival. ``event_detail``
    False leaves the log's per-chunk and per-round arrays out (None; the
    rest of the log is the same). ``difficulty`` gives the requests' top-1
    logits instead of the seed's draw (a fleet's replica: its share of the
    fleet's draw). ``_python`` runs the SimPy-process driver
    (module docstring; tests compare the two paths). ``transferred_kv``:
    each request arrives with its prompt's KV cache (Replica).
    ``gap_budget``: the exact gaps its log shares with other replicas' (a fleet's).
    """
    rng_difficulty, rng_rounds = (np.random.default_rng(seeds.stream(seed, purpose))
                                  for purpose in ("difficulty", "rounds"))
    env = simpy.Environment()
    replica = Replica(env, requests, policy=policy, costs=costs, acceptance=acceptance, engine=engine,
                      kv_budget_tokens=kv_budget_tokens, rng_difficulty=rng_difficulty, rng_rounds=rng_rounds,
                      progress=progress, event_detail=event_detail, _python=_python, difficulty=difficulty,
                      transferred_kv=transferred_kv, gap_budget=gap_budget)
    if not replica.fast:
        env.process(replica.arrivals())
    env.process(replica.replica())
    env.run()
    return replica.run_log(label or policy.label)


__all__ = ["EngineConfig", "simulate", "Replica", "RequestColumns", "request_columns"]  # EngineConfig lives in simspec.serving
