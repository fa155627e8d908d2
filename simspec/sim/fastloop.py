"""The replica's serving loop, compiled: many SimPy events per call.

Imports: numpy, simspec.compiled (numba), simspec.serving (its compiled
rules), simspec.costs.base (the wake cost), simspec.sim.steps. No simpy:
replica.py's process calls :func:`run` and yields to SimPy once a call.

One call runs event after event what replica.py's SimPy-process driver
runs once per event: the arrivals that reach the queue, the step's
scheduling (:func:`decide`: admission, the KV reservation with
preemption, prefill chunks, as simspec.serving.queues.schedule decides
them, prefix caching and the encoder budget included), its price, the
steps (:func:`steps.run_steps`), the first tokens of completed prefills
and retirement (:func:`finish`), and the wake cost after an idle spell.
It returns only where Python must act (``CALL_*``): a log buffer to
flush, the random numbers' window to refill (at the points and sizes the
SimPy-process driver refills it, so the stream is the same), the progress
callback, the run's end.

Arrivals are not a SimPy process here: each request's queueing time is
when the SimPy-process driver's ``arrivals`` process would put it in the queue
(:func:`arrival_times`, from the frontend's ready times in order), and an
arrival at the very time the replica resumes counts before the replica's
decision exactly when SimPy would process it first: its timeout was
scheduled first (``Loop.seq`` numbers what each process schedules, in the
order SimPy runs them). So the compiled loop decides what the SimPy-process driver
decides, step for step (tests/test_fastloop.py compares them).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.acceptance.model import Draws, Randoms, normals_per_round
from simspec.compiled import jit
from simspec.costs.base import CostTables, WakeTerms, wake_split
from simspec.serving.queues import (ADMITTED, CHUNKS, DECODES, PREEMPTED, REQUEUED, RUN_LEN, WAIT_LEN, Decision,
                                    Limits, State, arrive, complete_prefill, kv_used, new_decision, prefill_cost,
                                    retire, schedule)
from simspec.sim.steps import EngineTerms, Logs, PolicyCall, RequestState, run_steps

MAX_STEPS_PER_CALL = 256  # decode-only steps run in one call of run_steps at most
CALL_DONE, CALL_FLUSH, CALL_REFILL, CALL_PROGRESS, CALL_HORIZON = range(5)  # why run returned
ROUTING_NONE, ROUTING_OPEN, ROUTING_CLOSED = range(3)  # Loop.routing
ALL_ROUTED = 1 << 62  # Loop.routed of a replica that has its whole stream (every run but a routed fleet's)


class Arrivals(NamedTuple):
    """When requests reach the engine's queue, in the order they reach it."""

    order: np.ndarray  # [N] int request ids
    ready_s: np.ndarray  # [N] float the frontend's ready time of each (a step stops at or after the next)
    queued_s: np.ndarray  # [N] float SimPy's time when the arrivals process queues it
    fresh: np.ndarray  # [N] bool the arrivals process waited for it (else it came in the same resume as the one before)


class Loop(NamedTuple):
    """The loop's scalars between calls, each a [1] array updated in place."""

    now_s: np.ndarray  # float SimPy's time at the replica's next decision
    idle_from_s: np.ndarray  # float when the replica last ran out of work (nan: it has work)
    wake_owed_s: np.ndarray  # float the next step's share of waking up
    arrived: np.ndarray  # int requests queued (Arrivals' index of the next)
    finished: np.ndarray  # int
    scheduled: np.ndarray  # int requests the last step scheduled (decodes and prefill chunks)
    seq: np.ndarray  # int events scheduled so far (SimPy's order of events at equal times)
    arrival_seq: np.ndarray  # int ... the arrivals process's pending timeout's number
    flushed: np.ndarray  # int 1: the log buffers were just flushed for the pending step
    need: np.ndarray  # int random numbers of each kind the pending step needs (CALL_REFILL)
    reported: np.ndarray  # int finished requests at the last CALL_PROGRESS
    # A replica of a fleet whose router reads its state (simspec.fleet.live) gets its arrivals as they are
    # routed: only the first ``routed`` of Arrivals are known, and the loop returns CALL_HORIZON at the
    # first decision at or after ``until_s`` (or when it waits for an arrival not yet routed) while
    # ``routing`` is ROUTING_OPEN.
    routed: np.ndarray  # int arrivals known (ALL_ROUTED: the whole stream)
    until_s: np.ndarray  # float the router's next decision (inf: none)
    routing: np.ndarray  # int ROUTING_NONE, ROUTING_OPEN (more may be routed) or ROUTING_CLOSED


def _count() -> np.ndarray:
    return np.zeros(1, np.int64)


def new_loop() -> Loop:
    """At time 0, idle since 0 (the first step pays the wake cost of its start), nothing scheduled."""
    return Loop(now_s=np.zeros(1), idle_from_s=np.zeros(1), wake_owed_s=np.zeros(1), arrived=_count(),
                finished=_count(), scheduled=_count(), seq=_count(), arrival_seq=_count(), flushed=_count(),
                need=_count(), reported=_count(), routed=np.full(1, ALL_ROUTED, np.int64),
                until_s=np.full(1, np.inf), routing=_count())


class Pending(NamedTuple):
    """The step decided and not yet run (a call may return before running
    it); its counts are [1] int arrays updated in place, as Loop's."""

    decision: Decision  # its scheduling (simspec.serving.queues.schedule)
    decided: np.ndarray  # 1: a step is decided and not yet run
    max_steps: np.ndarray  # steps the log buffers hold for it (0: not yet known)
    first: np.ndarray  # [S] int requests whose prefill completed at its end
    done: np.ndarray  # [S] int requests that finished at its end
    # 1: the decided decode run was cut only by the router's horizon (a routed fleet's replica) and goes on
    # as decided at the next call, as it would have gone on unrouted; a request routed here clears it
    resume: np.ndarray


class Served(NamedTuple):
    """Per-request times and counts the run reports, [N] each."""

    admitted_s: np.ndarray  # float nan: waiting
    first_token_s: np.ndarray
    finish_s: np.ndarray
    preemptions: np.ndarray  # int


class Config(NamedTuple):
    """The engine loop's fixed choices."""

    limits: Limits
    vllm: bool  # EngineConfig.scheduler == "vllm": running requests first, admission only in a step that preempted none
    mixed_prefill: bool
    progress_every: int  # finished requests between CALL_PROGRESS returns (0: never)


def pending_for(max_num_seqs: int) -> Pending:
    return Pending(decision=new_decision(max_num_seqs), decided=_count(), max_steps=_count(),
                   first=np.zeros(max_num_seqs, np.int64), done=np.zeros(max_num_seqs, np.int64), resume=_count())


@jit
def arrival_times(ready_s: np.ndarray, order: np.ndarray):
    """(queued_s, fresh) of Arrivals: the SimPy-process driver's arrivals process
    waits ``ready - now`` whenever that is positive (SimPy's clock then
    reads ``now + (ready - now)``), else queues at once."""
    n = len(order)
    queued = np.empty(n)
    fresh = np.zeros(n, np.bool_)
    now = 0.0
    for k in range(n):
        delay = ready_s[order[k]] - now
        if delay > 0:
            now = now + delay
            fresh[k] = True
        queued[k] = now
    return queued, fresh


@jit
def _arrive_batch(queues, arrivals: Arrivals, loop: Loop, initial: bool) -> None:
    """One resume of the arrivals process: the request it waited for (none
    at its start), those due at once after it, then its next timeout."""
    n = len(arrivals.order)
    k = loop.arrived[0]
    if not initial:
        arrive(queues, arrivals.order[k])
        k += 1
    while k < n and not arrivals.fresh[k]:
        arrive(queues, arrivals.order[k])
        k += 1
    loop.arrived[0] = k
    loop.arrival_seq[0] = loop.seq[0]
    loop.seq[0] += 1


@jit
def decide(sched: State, config: Config, now_s: float, pending: Pending, served: Served,
           state: RequestState) -> None:
    """Steps 1-3 (simspec.serving.queues.schedule) and what they mean for
    the requests: admission times, the acceptance estimate's start,
    preemption counts; the pending step."""
    d = pending.decision
    n = d.counts
    schedule(sched, config.limits, config.vllm, config.mixed_prefill, d)
    for a in range(n[ADMITTED]):
        i = d.admitted[a]
        if np.isnan(served.admitted_s[i]):
            served.admitted_s[i] = now_s
            state.recent[i] = state.population[0]  # Estimate.start
    for a in range(n[PREEMPTED]):
        i = d.preempted[a]
        state.absorbed[i] = 0
        served.preemptions[i] += 1
    for a in range(n[REQUEUED]):  # admitted, then sent back before any prefill: its queueing goes on
        served.admitted_s[d.requeued[a]] = np.nan
    pending.decided[0], pending.max_steps[0] = 1, 0


@jit
def step_prefill(sched: State, config: Config, pending: Pending):
    """What the pending step's prefill chunks cost its forward."""
    d = pending.decision
    return prefill_cost(sched, config.limits, d.chunk_ids, d.takes, d.counts[CHUNKS])


@jit
def finish(sched: State, config: Config, terms: EngineTerms, pending: Pending, served: Served,
           state: RequestState, logs: Logs, end_s: float) -> int:
    """After the step ran, at ``end_s``: the chunks are in the cache; the
    requests whose prefill completed sampled their first token (logged);
    those done retire. Returns how many retired."""
    d = pending.decision
    nf = complete_prefill(sched, config.limits, d.chunk_ids, d.takes, d.counts[CHUNKS], pending.first)
    for a in range(nf):
        i = pending.first[a]
        if terms.drafter_over_prefill:  # the drafter ran over the prompt with the target
            state.absorbed[i] = state.context[i] - state.visual[i]
        if np.isnan(served.first_token_s[i]):
            served.first_token_s[i] = end_s
    if nf > 0:
        first_tokens(logs, pending.first, nf, end_s)
    ndone = retire(sched, pending.done)
    for a in range(ndone):
        served.finish_s[pending.done[a]] = end_s
    return ndone


@jit
def log_room(logs: Logs, batch: int, count: int) -> tuple[int, int]:
    """(steps of ``batch`` chunks each the log buffers hold, at most
    ``count``; the steps they would hold once flushed): both paths flush
    when the first is short of ``count``."""
    chunk_room = (len(logs.chunk_id) - max(logs.chunks_logged[0], logs.rounds_logged[0])) // max(batch, 1)
    step_room = len(logs.step_start_s) - logs.steps_logged[0]
    return min(chunk_room, step_room, count), min(len(logs.chunk_id) // max(batch, 1), len(logs.step_start_s), count)


@jit
def first_tokens(logs: Logs, ids: np.ndarray, count: int, time_s: float) -> None:
    """The tokens prefills sampled at the end of the last step (room was made for them)."""
    c = logs.chunks_logged[0]
    for a in range(count):
        logs.chunk_id[c + a] = ids[a]
        logs.chunk_tokens[c + a] = 1
        logs.chunk_time_s[c + a] = time_s
    logs.step_tokens[logs.steps_logged[0] - 1] += count
    logs.chunks_logged[0] += count


@jit
def run(sched: State, config: Config, arrivals: Arrivals, loop: Loop, pending: Pending, served: Served,
        state: RequestState, draws: Draws, policy: PolicyCall, costs: CostTables, terms: EngineTerms,
        wake: WakeTerms, rand: Randoms, logs: Logs) -> int:
    """Run events until Python must act; returns why (``CALL_*``)."""
    n = min(len(arrivals.order), loop.routed[0])  # arrivals known
    routed = loop.routing[0] != ROUTING_NONE  # a routed fleet's replica (Loop's routed fields)
    wait = CALL_HORIZON if loop.routing[0] == ROUTING_OPEN else CALL_DONE  # out of known arrivals
    queues, lim = sched.queues, config.limits
    if loop.seq[0] == 0:  # SimPy starts the arrivals process first: it queues what is ready at 0
        _arrive_batch(queues, arrivals, loop, True)
    while True:
        if pending.decided[0] == 0:
            if routed:  # what was routed up to this decision is queued; the router's turn comes first
                while loop.arrived[0] < n and arrivals.queued_s[loop.arrived[0]] <= loop.now_s[0]:
                    _arrive_batch(queues, arrivals, loop, False)
            if loop.finished[0] >= n:
                return wait
            if queues.counts[WAIT_LEN] == 0 and queues.counts[RUN_LEN] == 0:  # idle until the next arrival
                if np.isnan(loop.idle_from_s[0]):
                    loop.idle_from_s[0] = loop.now_s[0]
                if loop.arrived[0] >= n:  # nothing left to arrive (unrouted: not while requests are unfinished)
                    return wait
                if routed and arrivals.queued_s[loop.arrived[0]] > loop.until_s[0]:
                    return CALL_HORIZON
                loop.now_s[0] = arrivals.queued_s[loop.arrived[0]]
                _arrive_batch(queues, arrivals, loop, False)
                continue
            if routed and loop.now_s[0] >= loop.until_s[0]:
                return CALL_HORIZON
            decide(sched, config, loop.now_s[0], pending, served, state)
        elif pending.resume[0] == 1 and loop.now_s[0] >= loop.until_s[0]:
            return CALL_HORIZON  # a run going on as decided stops for the router all the same
        nd, nc = pending.decision.counts[DECODES], pending.decision.counts[CHUNKS]
        if pending.max_steps[0] == 0:  # how many steps the log buffers hold (_LogBuffers.room_for)
            batch, count = (nd + nc, 1) if nc > 0 else (nd, MAX_STEPS_PER_CALL)
            room, _ = log_room(logs, batch, count)
            if room < count and loop.flushed[0] == 0:
                loop.flushed[0] = 1
                return CALL_FLUSH
            loop.flushed[0] = 0
            pending.max_steps[0] = room
        max_steps = pending.max_steps[0]
        need = normals_per_round(draws, nd, policy.depth) * max_steps  # as the SimPy-process driver's window
        if len(rand.normals) - rand.used[0] < need or len(rand.uniforms) - rand.used[1] < need:
            loop.need[0] = need
            return CALL_REFILL
        pending.decided[0] = 0

        start = loop.now_s[0]
        own_stop_s = arrivals.ready_s[loop.arrived[0]] if loop.arrived[0] < n else np.inf
        stop_s = min(own_stop_s, loop.until_s[0])  # a routed fleet's replica stops for the router too
        kv_room = lim.kv_budget - kv_used(sched, lim)
        wake_s = loop.wake_owed_s[0]
        loop.wake_owed_s[0] = 0.0
        if not np.isnan(loop.idle_from_s[0]):
            first, after = wake_split(wake, start - loop.idle_from_s[0])
            wake_s = wake_s + first
            loop.wake_owed_s[0] = after
            loop.idle_from_s[0] = np.nan
        _, end = run_steps(pending.decision.decode[:nd], state, draws, policy, costs, terms,
                           step_prefill(sched, config, pending), wake_s, start, stop_s, max_steps, kv_room, rand,
                           logs, loop.scheduled[0])
        loop.scheduled[0] = nd + nc

        # SimPy resumes the replica at start + (end - start); arrivals
        # scheduled before that (or at that time, scheduled first) come first.
        resume = start + (end - start)
        resume_seq = loop.seq[0]
        loop.seq[0] += 1
        while loop.arrived[0] < n and (arrivals.queued_s[loop.arrived[0]] < resume or (
                arrivals.queued_s[loop.arrived[0]] == resume and loop.arrival_seq[0] < resume_seq)):
            _arrive_batch(queues, arrivals, loop, False)
        loop.now_s[0] = resume

        retired = finish(sched, config, terms, pending, served, state, logs, end)
        loop.finished[0] += retired
        pending.resume[0] = 0
        if routed and end >= loop.until_s[0] and end < own_stop_s and retired == 0 and nc == 0 and nd > 0 and \
                lim.kv_budget - kv_used(sched, lim) >= nd * (policy.depth + 1):
            # cut by the router alone: the run goes on as decided (run_steps would have gone on)
            pending.decided[0], pending.max_steps[0], pending.resume[0] = 1, 0, 1
        if config.progress_every > 0 and \
                loop.finished[0] // config.progress_every > loop.reported[0] // config.progress_every:
            loop.reported[0] = loop.finished[0]
            return CALL_PROGRESS
