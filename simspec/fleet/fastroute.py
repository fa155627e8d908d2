"""The routing loop of simspec.fleet.live, compiled, for the routers that
read only the replicas' outstanding load, the finishes they hear and what
is known of a request before it arrives (``least_requests``,
``least_tokens``, ``power_of_two``, ``prefix_affinity``, ``spec_aware``):
many arrivals a call instead of a return to Python, and a compiled call,
for each replica at each arrival.

Imports: numpy, simspec.compiled (numba), simspec.sim.fastloop, simspec.fleet.routers (its constants),
simspec.fleet.fluid (spec_aware's model).

It decides what simspec.fleet.live's Python loop decides, arrival for
arrival (tests/test_fleet_routers.py compares the two): each replica run
up to the arrival (fastloop's CALL_HORIZON) unless none of its requests
can finish by then (:func:`_finish_after`), the finishes the router has
heard by then (``staleness_s`` after they happen), the least loaded with
ties to the first from the replica after the last chosen, and the
request placed among the replica's known arrivals by its ready time
(a replica behind the arrival stops its steps there when it reaches it). It returns to
Python where Python must act for a replica (its log buffers to flush, its
random numbers' window to refill: ``Escape``) and at the end of the
arrivals it was given; a call resumes at the arrival it stopped at, whose
replicas already run up to it are not run again. The replicas' arguments
to fastloop.run come as typed lists of like tuples, an item a replica (one
type for all: alike replicas, which a fleet of one setup is; one compiled
loop for every fleet size); the frontend has no cost here
(every request is ready when it arrives), as in every engine preset.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba.typed import List

from simspec.compiled import jit
from simspec.fleet import fluid
from simspec.fleet.routers import BALANCE_ABS, BALANCE_REL
from simspec.sim import fastloop

LEAST_REQUESTS, LEAST_TOKENS, POWER_OF_TWO, PREFIX_AFFINITY, SPEC_AWARE = 0, 1, 2, 3, 4
ROUTERS = {"least_requests": LEAST_REQUESTS, "least_tokens": LEAST_TOKENS, "power_of_two": POWER_OF_TWO,
           "prefix_affinity": PREFIX_AFFINITY, "spec_aware": SPEC_AWARE}
# The routers that leave behind a replica none of whose requests can finish by an arrival (the Python loop's
# too; spec_aware reads a replica only to hear its finishes)
LAZY = (LEAST_REQUESTS, LEAST_TOKENS, PREFIX_AFFINITY, POWER_OF_TWO, SPEC_AWARE)
OK = -1  # route's return when it got through its arrivals (else the CALL_* of the replica that stopped it)


class Book(NamedTuple):
    """What the router keeps, between calls. Each request is in at most one
    of a replica's two lists, linked through ``next`` (-1 ends a list)."""

    assignment: np.ndarray  # [N] int replica of each request routed (-1: not yet)
    next: np.ndarray  # [N] int the next request in its list
    live: np.ndarray  # [R] int first request sent to a replica and not seen finished (-1: none)
    heard: np.ndarray  # [R] int first request seen finished and not yet heard
    seen_finished: np.ndarray  # [R] int the replica's finished count when its lists were last brought up to date
    outstanding: np.ndarray  # [R] int requests sent and not heard finish
    outstanding_tokens: np.ndarray  # [R] int ... their prompt and output tokens
    last: np.ndarray  # [1] int the replica last chosen (ties start after it)
    # [3] int where a call stopped: the arrival, how far through the replicas (the ones before are seen to),
    # the replica Python must answer for
    stopped: np.ndarray
    step_floor_s: np.ndarray  # [R] float no step of the replica is shorter (0: unknown)
    depth: np.ndarray  # [R] int draft tokens a request's round verifies at most (a step emits depth + 1 at most)
    # [R] float before this no arrival finds anything to do at the replica (none of its requests can finish, the
    # router hears of no finish): route passes it by (-inf: look)
    wake_s: np.ndarray
    heard_done: np.ndarray  # [N] bool the router has heard the request finish
    # [R, 3] float each replica's frontend (simspec.sim.replica.Frontend): seconds a request, a prompt token, an
    # image (all 0: a request is ready on arrival)
    frontend: np.ndarray
    frontend_free: np.ndarray  # [R, 2] float when its text and image workers are next free
    prompt_tokens: np.ndarray  # [N] int each request's prompt tokens (what the text worker reads)
    images: np.ndarray  # [N] int ... and its images


def new_book(requests: int, step_floor_s: np.ndarray, depth: np.ndarray, frontend: np.ndarray,
             prompt_tokens: np.ndarray, images: np.ndarray) -> Book:
    replicas = len(step_floor_s)
    return Book(assignment=np.full(requests, -1, np.int64), next=np.full(requests, -1, np.int64),
                live=np.full(replicas, -1, np.int64), heard=np.full(replicas, -1, np.int64),
                seen_finished=np.zeros(replicas, np.int64), outstanding=np.zeros(replicas, np.int64),
                outstanding_tokens=np.zeros(replicas, np.int64), last=np.full(1, -1, np.int64),
                stopped=np.full(3, -1, np.int64), step_floor_s=np.asarray(step_floor_s, float),
                depth=np.asarray(depth, np.int64), wake_s=np.full(replicas, -np.inf),
                heard_done=np.zeros(requests, np.bool_), frontend=np.asarray(frontend, float).reshape(replicas, 3),
                frontend_free=np.full((replicas, 2), -np.inf), prompt_tokens=np.asarray(prompt_tokens, np.int64),
                images=np.asarray(images, np.int64))


class Fluids(NamedTuple):
    """spec_aware's model of each replica's batch (simspec.fleet.routers'
    ``_Fluid``, one row a replica; its arithmetic simspec.fleet.fluid's)
    and its estimate of each request on each kind of replica."""

    ids: np.ndarray  # [R, C] int the requests in the model, in the order sent (the first ``count``)
    left: np.ndarray  # [R, C] float their expected rounds left
    count: np.ndarray  # [R] int
    t_s: np.ndarray  # [R] float the model's time
    owed_s: np.ndarray  # [R] float prefill seconds sent and not yet run
    steps: np.ndarray  # [R, L + 1] float the step time at each batch size up to the replica's limit (fluid.step_table)
    limit: np.ndarray  # [R] int requests that run at once
    kind: np.ndarray  # [R] int the replica's kind (alike replicas share one model)
    rounds: np.ndarray  # [K, N] float each request's expected rounds on each kind
    prefill_s: np.ndarray  # [K, N] float ... and its prefill seconds
    finish_s: np.ndarray  # [R] float room for each replica's answer at an arrival
    scratch: np.ndarray  # [N] float the models' working room (fluid.decode_in's)


def new_fluids(models: list, kind: list[int], rounds: np.ndarray, prefill_s: np.ndarray) -> Fluids:
    """The models of ``models`` (ReplicaModel, one a kind; ``kind``: each
    replica's), empty, for ``rounds`` [K, N] and ``prefill_s`` [K, N]."""
    replicas, requests = len(kind), rounds.shape[1]
    tables = [fluid.step_table(np.asarray(m.batch_sizes, dtype=float), np.asarray(m.step_s, dtype=float),
                               m.batch_limit) for m in models]
    steps = np.zeros((replicas, max(len(t) for t in tables)))
    for k, kk in enumerate(kind):
        steps[k, :len(tables[kk])] = tables[kk]
    return Fluids(ids=np.zeros((replicas, requests), np.int64), left=np.zeros((replicas, requests)),
                  count=np.zeros(replicas, np.int64), t_s=np.zeros(replicas), owed_s=np.zeros(replicas), steps=steps,
                  limit=np.array([models[kk].batch_limit for kk in kind], np.int64),
                  kind=np.asarray(kind, np.int64), rounds=rounds, prefill_s=prefill_s, finish_s=np.zeros(replicas),
                  scratch=np.zeros(requests))


def no_fluids() -> Fluids:
    """Fluids of the routers that keep none (route's argument all the same)."""
    none2, ints = np.zeros((0, 0)), np.zeros(0, np.int64)
    return Fluids(ids=np.zeros((0, 0), np.int64), left=none2, count=ints, t_s=np.zeros(0), owed_s=np.zeros(0),
                  steps=none2, limit=ints, kind=ints, rounds=none2, prefill_s=none2, finish_s=np.zeros(0),
                  scratch=np.zeros(0))


class Rows(NamedTuple):
    """The replicas' loop scalars the router reads at every arrival, one [R]
    row each: each replica's Loop and Pending hold [1] views of them
    (:func:`shared_rows`), so what its compiled loop writes lands here."""

    now_s: np.ndarray  # [R] float Loop.now_s
    finished: np.ndarray  # [R] int Loop.finished
    arrived: np.ndarray  # [R] int Loop.arrived
    routed: np.ndarray  # [R] int Loop.routed
    until_s: np.ndarray  # [R] float Loop.until_s
    routing: np.ndarray  # [R] int Loop.routing
    decided: np.ndarray  # [R] int Pending.decided
    resume: np.ndarray  # [R] int Pending.resume


def shared_rows(loops: list[fastloop.Loop], pendings: list[fastloop.Pending]):
    """(Rows, loops, pendings): the replicas' Rows fields gathered into rows,
    and each replica's Loop and Pending with those fields as [1] views of
    them (their values as they were)."""
    rows = Rows(*(np.concatenate([getattr(t, name) for t in (loops if name in fastloop.Loop._fields else pendings)])
                  for name in Rows._fields))

    def viewed(t, k: int):
        return t._replace(**{name: getattr(rows, name)[k:k + 1] for name in Rows._fields if name in t._fields})

    return rows, [viewed(t, k) for k, t in enumerate(loops)], [viewed(t, k) for k, t in enumerate(pendings)]


@jit
def _fastest(fl: Fluids, i: int, t: float, last: int) -> int:
    """spec_aware at arrival ``i``: each replica's model run to ``t``, the
    replica where request ``i`` would finish first (ties as _least)."""
    # the arrays read once: a tuple's field read in the loop would count a reference each time
    count, limit, left, steps, owed_s, t_s = fl.count, fl.limit, fl.left, fl.steps, fl.owed_s, fl.t_s
    kind, rounds, prefill_s, finish_s, scratch = fl.kind, fl.rounds, fl.prefill_s, fl.finish_s, fl.scratch
    for k in range(len(count)):
        owed_s[k] = fluid.run_to(left[k], count[k], limit[k], steps[k], owed_s[k], t - t_s[k])
        t_s[k] = t
        finish_s[k] = fluid.finish_in(left[k], count[k], limit[k], steps[k], owed_s[k], rounds[kind[k], i],
                                      prefill_s[kind[k], i], scratch)
    return _least(finish_s, last)


@jit
def _sent(fl: Fluids, k: int, i: int) -> None:
    """Request ``i`` joins replica ``k``'s model (_Fluid.add)."""
    c, kind = fl.count[k], fl.kind[k]
    fl.ids[k, c], fl.left[k, c] = i, fl.rounds[kind, i]
    fl.count[k] = c + 1
    fl.owed_s[k] += fl.prefill_s[kind, i]


@jit
def typed_list(first):
    """A typed list holding ``first``. Made here, in compiled and cached
    code, numba's list of that item type is compiled once for the cache;
    made from Python (``numba.typed.List``), it would be compiled anew in
    every process, some 5 s for a fleet's four lists of replica tuples."""
    items = List()
    items.append(first)
    return items


@jit
def push(items, item) -> None:
    """``items.append(item)``, compiled and cached (:func:`typed_list`)."""
    items.append(item)


@jit
def put(items, k: int, item) -> None:
    """``items[k] = item``, compiled and cached (:func:`typed_list`)."""
    items[k] = item


def step_floor_s(layers_s: np.ndarray, head_s: np.ndarray, cpu_s: float = 0.0, overlap: bool = False) -> float:
    """A step's seconds at least: the cost tables' cheapest forward of one
    token or more (layers and LM head; attention, the drafter, graph regimes
    and waking only add) and the engine's CPU part of a step of one request
    or more (``cpu_s``: beside the forward where the engine overlaps them,
    after it where not), a hair under; 0 where a table falls past its end
    (no floor)."""
    floor = 0.0
    for table in (layers_s, head_s):
        if len(table) < 3 or table[-1] < table[-2]:
            return 0.0
        floor += float(table[1:].min())
    floor = max(floor, cpu_s) if overlap else floor + cpu_s
    return max(floor, 0.0) * (1 - 1e-9)


@jit
def _advance(head, window, buffers) -> int:
    """simspec.fleet.live._Live.advance without its Python (its ``until_s``
    set in the rows): OK, or the CALL_* Python must answer."""
    while True:
        why = fastloop.run(*head, window, buffers)
        if why == fastloop.CALL_HORIZON or why == fastloop.CALL_DONE:
            return OK
        if why == fastloop.CALL_REFILL or why == fastloop.CALL_FLUSH:
            return why


@jit
def _hear(nxt: np.ndarray, live: np.ndarray, heard: np.ndarray, seen_finished: np.ndarray, outstanding: np.ndarray,
          outstanding_tokens: np.ndarray, heard_done: np.ndarray, k: int, finish_s: np.ndarray, finished: int,
          now_s: float, staleness_s: float, tokens: np.ndarray) -> float:
    """_Live.hear: move what finished since the last look to the heard-of-soon
    list, then hear what finished ``staleness_s`` or more before ``now_s``;
    returns when the router will hear the next of the rest (inf: none).
    The book's arrays (Book's fields) come one by one: a Book would count
    a reference for each of its arrays at each call."""
    if finished != seen_finished[k]:
        seen_finished[k] = finished
        prev, i = -1, live[k]
        while i >= 0:
            after = nxt[i]
            if not np.isnan(finish_s[i]):  # out of the live list, onto the heard one
                if prev < 0:
                    live[k] = after
                else:
                    nxt[prev] = after
                nxt[i] = heard[k]
                heard[k] = i
            else:
                prev = i
            i = after
    prev, i = -1, heard[k]
    soonest = np.inf
    while i >= 0:
        after = nxt[i]
        heard_s = finish_s[i] + staleness_s
        if heard_s <= now_s:
            if prev < 0:
                heard[k] = after
            else:
                nxt[prev] = after
            outstanding[k] -= 1
            outstanding_tokens[k] -= tokens[i]
            heard_done[i] = True
        else:
            prev = i
            soonest = min(soonest, heard_s)
        i = after
    return soonest


@jit
def _finish_after(nxt: np.ndarray, first: int, floor: float, per: int, now_s: float, finish_s: np.ndarray,
                  emitted: np.ndarray, output: np.ndarray) -> float:
    """No request sent to a replica and unfinished can finish before this:
    its next decision at ``now_s``, then as many steps of the step floor
    (``floor``) as the closest to done needs (``per``: depth + 1 tokens a
    step at most); ``first`` its first live request (Book.live)."""
    if floor <= 0.0:
        return now_s
    steps = -1
    i = first
    while i >= 0:
        if np.isnan(finish_s[i]):
            need = (output[i] - emitted[i] + per - 1) // per
            if steps < 0 or need < steps:
                steps = need
                if steps <= 1:
                    break
        i = nxt[i]
    if steps < 1:
        steps = 1
    return now_s + steps * floor


@jit
def finish_bound(live: np.ndarray, finish_s: np.ndarray, emitted: np.ndarray, output: np.ndarray, per: int,
                 floor_s: float, now_s: float) -> float:
    """:func:`_finish_after` for simspec.fleet.live's Python loop, which
    keeps a replica's ``live`` requests (sent to it and not seen finished)
    in an array: none can finish before this."""
    if floor_s <= 0.0:
        return now_s
    steps = -1
    for i in live:
        if np.isnan(finish_s[i]):
            need = (output[i] - emitted[i] + per - 1) // per
            if steps < 0 or need < steps:
                steps = need
    return now_s + max(steps, 1) * floor_s


@jit
def _least(loads: np.ndarray, last: int) -> int:
    """Router.least: the least loaded; ties, the first from the replica after ``last``."""
    n = len(loads)
    start = (last + 1) % n
    best = start
    for step in range(1, n):
        k = (start + step) % n
        if loads[k] < loads[best]:
            best = k
    return best


@jit
def _frontend_ready(frontend: np.ndarray, free: np.ndarray, k: int, arrival_s: float, prompt_tokens: int,
                    images: int) -> float:
    """simspec.sim.replica.Frontend.ready for replica ``k``: when a request
    arriving at ``arrival_s`` has passed its text worker (a request and its
    prompt tokens) and, with images, its image worker, each first come,
    first served; on arrival where the frontend costs nothing. The same
    operations in the same order, so the same float."""
    per_request, per_token, per_image = frontend[k, 0], frontend[k, 1], frontend[k, 2]
    if per_request == 0.0 and per_token == 0.0 and per_image == 0.0:
        return arrival_s
    free[k, 0] = max(arrival_s, free[k, 0]) + per_request + per_token * prompt_tokens
    done = free[k, 0]
    if images:
        free[k, 1] = max(arrival_s, free[k, 1]) + per_image * images
        done = max(done, free[k, 1])
    return done


@jit
def _add(arrivals, arrived: np.ndarray, routed: np.ndarray, k: int, i: int, ready: float) -> None:
    """_Live.add: request ``i`` joins replica ``k``'s arrivals at ``ready``, in
    order among those not yet queued (``arrived``, ``routed``: Rows')."""
    first, end = arrived[k], routed[k]
    at = first + np.searchsorted(arrivals.ready_s[first:end], ready, side="right")
    for j in range(end, at, -1):  # make room: the later ones move one place on
        arrivals.order[j] = arrivals.order[j - 1]
        arrivals.ready_s[j] = arrivals.ready_s[j - 1]
        arrivals.queued_s[j] = arrivals.queued_s[j - 1]
        arrivals.fresh[j] = arrivals.fresh[j - 1]
    arrivals.order[at], arrivals.ready_s[at], arrivals.queued_s[at] = i, ready, ready
    before = arrivals.ready_s[at - 1] if at > 0 else 0.0
    arrivals.fresh[at] = ready > before
    if at + 1 <= end:
        arrivals.fresh[at + 1] = arrivals.ready_s[at + 1] > ready
    routed[k] = end + 1


@jit
def route(heads, windows, buffers, ends, arrivals, rows: Rows, book: Book, arrival_s: np.ndarray, tokens: np.ndarray,
          start: int, stop: int, router: int, staleness_s: float, pairs: np.ndarray, fluids: Fluids) -> int:
    """Route arrivals ``start`` .. ``stop`` - 1; OK, or the CALL_* of the
    replica (``book.stopped``) that needs Python first. ``ends``: each
    replica's (finish_s, emitted, output), read at every look at it;
    ``arrivals``: each replica's Arrivals, read when a request joins it
    (a replica's whole ``heads`` entry is taken out of its list only when
    it runs); ``rows``: the loop scalars of them all. For least_requests
    and least_tokens a replica none of whose requests can finish by the
    arrival (_finish_after) is not run up to it, chosen or not: its load is
    known, so no decision moves, and a chosen one's steps stop at the
    arrival when they reach it (where a replica is stopped can
    move the last bit of its clock, SimPy's start + (end - start); the
    Python loop leaves the same replicas behind). power_of_two reads the
    arrival's two replicas alone, so (``pairs`` [N, 2], drawn as
    simspec.fleet.routers draws them); prefix_affinity reads every replica
    as least_requests does and sends a request home (``pairs`` [N, 1]; -1:
    its prefix does not go home) unless the fleet is out of balance;
    spec_aware reads every replica as least_requests does, its model of
    each (``fluids``) hearing the finishes the router hears, and sends a
    request where the models say it would finish first. The look at a
    replica and the placing of a request are written out here, over arrays
    read once before the loop: a helper taking the book or a replica's
    tuples would count a reference for every array in them, at every
    replica and arrival."""
    n = len(heads)
    loads = book.outstanding_tokens if router == LEAST_TOKENS else book.outstanding
    wake_s, outstanding, outstanding_tokens, stopped, last = (book.wake_s, book.outstanding, book.outstanding_tokens,
                                                              book.stopped, book.last)
    nxt, live, heard, seen_finished, heard_done = book.next, book.live, book.heard, book.seen_finished, book.heard_done
    floor_s, depth, assignment = book.step_floor_s, book.depth, book.assignment
    frontend, frontend_free, prompt_tokens, images = book.frontend, book.frontend_free, book.prompt_tokens, book.images
    now_s, finished, arrived, routed = rows.now_s, rows.finished, rows.arrived, rows.routed
    until_s, routing = rows.until_s, rows.routing
    decided, resume = rows.decided, rows.resume
    counts, fluid_ids, fluid_left = fluids.count, fluids.ids, fluids.left

    looks = 2 if router == POWER_OF_TWO else n  # power_of_two reads the arrival's two replicas alone
    for i in range(start, stop):
        t = arrival_s[i]
        first = stopped[1] if stopped[0] == i else 0  # the replicas before it are seen to
        for e in range(first, looks):
            k = pairs[i, e] if router == POWER_OF_TWO else e
            if t < wake_s[k]:  # nothing to run, nothing to hear: as looking would find
                continue
            # The look: the replica run up to the arrival unless it is there, idle, or none of its requests can
            # finish by then, and heard.
            finish_s, emitted, output = ends[k]
            there = routing[k] == fastloop.ROUTING_OPEN and (now_s[k] >= t or finished[k] >= routed[k])
            per = depth[k] + 1
            bound = np.nan  # _finish_after: what hearing leaves as it was, unless the replica runs
            if not there:
                bound = _finish_after(nxt, live[k], floor_s[k], per, now_s[k], finish_s, emitted, output)
                if bound <= t:
                    until_s[k] = t
                    why = _advance(heads[k], windows[k], buffers[k])
                    if why != OK:
                        stopped[0], stopped[1], stopped[2] = i, e, k
                        wake_s[k] = -np.inf
                        return why
                    bound = np.nan
            before = outstanding[k]
            heard_s = _hear(nxt, live, heard, seen_finished, outstanding, outstanding_tokens, heard_done, k, finish_s,
                            finished[k], t, staleness_s, tokens)
            if router == SPEC_AWARE and outstanding[k] != before:  # what it heard leaves its model
                counts[k] = fluid.drop(fluid_ids[k], fluid_left[k], counts[k], heard_done)
            # Until a request of it can finish (its course is fixed until then, the router's stops aside) or the
            # router hears of one, a later arrival would find the replica as it is; it is looked at anew once chosen.
            if np.isnan(bound):  # hearing takes only finished requests off the live list, which it skips
                bound = _finish_after(nxt, live[k], floor_s[k], per, now_s[k], finish_s, emitted, output)
            wake_s[k] = min(bound, heard_s)
        home = pairs[i, 0] if router == PREFIX_AFFINITY else -1
        if home >= 0:
            high, low = loads.max(), loads.min()
            if high - low > BALANCE_ABS and high > BALANCE_REL * low:  # out of balance: the least loaded
                home = -1
        if router == POWER_OF_TWO:  # the less loaded of the two, the first on ties
            a, b = pairs[i, 0], pairs[i, 1]
            chosen = b if outstanding[b] < outstanding[a] else a
        elif router == SPEC_AWARE:
            chosen = _fastest(fluids, i, t, last[0])
        else:
            chosen = _least(loads, last[0]) if home < 0 else home
        stopped[0] = -1
        wake_s[chosen] = -np.inf
        if home < 0:  # a request sent home leaves the least-loaded rotation where it was (power_of_two reads no turn)
            last[0] = chosen
        # The request joins the chosen replica at its frontend's ready time, in its arrivals and the book.
        ready = _frontend_ready(frontend, frontend_free, chosen, t, prompt_tokens[i], images[i])
        _add(arrivals[chosen], arrived, routed, chosen, i, ready)
        if now_s[chosen] >= ready:  # a run going on past the arrival is decided anew (one behind it stops there itself)
            decided[chosen] *= 1 - resume[chosen]
            resume[chosen] = 0
        assignment[i] = chosen
        nxt[i] = live[chosen]
        live[chosen] = i
        outstanding[chosen] += 1
        outstanding_tokens[chosen] += tokens[i]
        if router == SPEC_AWARE:
            _sent(fluids, chosen, i)
    return OK


__all__ = ["ROUTERS", "LEAST_REQUESTS", "LEAST_TOKENS", "POWER_OF_TWO", "PREFIX_AFFINITY", "LAZY", "OK", "Book",
           "new_book", "Rows", "shared_rows", "step_floor_s", "route", "finish_bound", "typed_list", "push", "put",
           "SPEC_AWARE", "Fluids", "new_fluids", "no_fluids"]
