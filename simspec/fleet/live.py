"""A fleet whose router reads the replicas' state: the replicas run side by
side and each arrival is routed, at its arrival time, from what a router
could see then.

Imports: numba (its types), numpy, simspec.seeds, simspec.sim (the replica
and its compiled loop), simspec.fleet.

Each replica is the one-replica model (simspec.sim.replica) over the whole
stream with no arrival known (``routed``); the compiled loop runs it up to
the next routing decision and stops there (fastloop's CALL_HORIZON).
Routing request i at time t: every replica the router reads is run up to
t (a replica's course depends only on what was routed to it, so one not
read can catch up later; behind least_requests, least_tokens,
prefix_affinity and power_of_two, one none of whose requests can finish
by t is not run either, its load being known; simspec.fleet.fastroute
runs those four routers' loop compiled), the router picks from their
state as of t, and the request joins the chosen replica's arrivals at its
frontend's ready time (in order among those it has not yet queued: a
replica that lags behind t has not reached them; its steps stop there
when they do, as at any known arrival, so those routers do not run the
chosen replica up to t either). What the router reads is what a router
keeps itself: the requests it sent to each replica and has not yet heard
finish, and their prompt and output tokens; a finish is heard
``staleness_s`` after it happens (0: at once). A request in a step that ends after t is outstanding at t.
"""

from __future__ import annotations

import heapq
from typing import Callable, Sequence

import numba
import numpy as np
import simpy

from simspec.fleet import fastroute
from simspec.fleet.routers import Router
from simspec.sim import fastloop
from simspec.sim.replica import Frontend, Replica, RequestColumns, request_columns
from simspec.types import Request, RunLog
from simspec import compiled, seeds


class _Live:
    """One replica of a routed fleet and the router's view of it."""

    def __init__(self, requests: Sequence[Request], *, seed: int, difficulty: np.ndarray, serve: dict):
        rng_rounds = np.random.default_rng(seeds.stream(seed, "rounds"))
        event_detail = serve.pop("event_detail", True)
        self.replica = Replica(simpy.Environment(), requests, rng_difficulty=None, rng_rounds=rng_rounds,
                               progress=None, event_detail=event_detail, difficulty=difficulty, routed=True, **serve)
        self.frontend = Frontend(self.replica.engine)
        rep = self.replica
        self.loop = rep.loop
        self.head = self._head()
        self.run = None  # fastloop.run's compiled code for these arguments' types (compiled.entry), at the first call
        # One window of random numbers across calls, its cursor moving on, until the loop asks for more
        # (the numbers and the refill points of a window taken afresh each call: RandomBlocks).
        self.window = rep.rand.window(0)
        self.mine: list[int] = []  # requests routed here, in routing order
        self.live: list[int] = []  # ... not yet seen finished
        self.heard: list[tuple[float, int]] = []  # (finish time, request) finished, not yet heard by the router
        self.seen_finished = 0
        self.outstanding = 0  # requests the router has sent here and not heard finish
        self.outstanding_tokens = 0  # ... their prompt and output tokens
        tables = rep.tables
        self.step_floor_s = fastroute.step_floor_s(tables.layers_s, tables.head_s,
                                                   tables.overhead_s + max(tables.overhead_per_request, 0.0),
                                                   rep.terms.overlap)

    def _head(self) -> tuple:
        """fastloop.run's fixed arguments."""
        rep = self.replica
        return (rep.scheduler.state, rep.config, rep.arrival, rep.loop, rep.pending, rep.served, rep.state,
                rep.acceptance, rep.call, rep.tables, rep.terms, rep.costs.wake)

    def share(self, loop: fastloop.Loop, pending: fastloop.Pending) -> None:
        """Run with ``loop`` and ``pending`` (the same values, held in a fleet's rows: fastroute.shared_rows)."""
        self.loop = self.replica.loop = loop
        self.replica.pending = pending
        self.head = self._head()

    def advance(self, until_s: float) -> None:
        """Run the replica up to its first decision at or after ``until_s``."""
        loop = self.loop
        if loop.routing[0] == fastloop.ROUTING_OPEN and (loop.now_s[0] >= until_s or loop.finished[0] >= loop.routed[0]):
            return  # already there (nothing it does before until_s is unknown), or idle, waiting for the router
        rep = self.replica
        loop.until_s[0] = until_s
        while True:
            if self.run is None:  # a replica is called ~2 times an arrival: numba's dispatch would be most of it
                self.run = compiled.entry(fastloop.run, *self.head, self.window, rep.logs.buffers)
            why = self.run(*self.head, self.window, rep.logs.buffers)
            if why == fastloop.CALL_HORIZON or why == fastloop.CALL_DONE:
                break
            if why == fastloop.CALL_REFILL:  # the window's numbers read, a fresh one
                rep.rand.consume(self.window)
                self.window = rep.rand.window(int(loop.need[0]))
            elif why == fastloop.CALL_FLUSH:
                rep.logs.flush()
        rep.finished = int(loop.finished[0])

    def finish_after(self) -> float:
        """fastroute._finish_after: no request sent here and unfinished can finish before this."""
        rep = self.replica
        return fastroute.finish_bound(np.array(self.live, dtype=np.int64), rep.finish_s, rep.state.emitted,
                                      rep.state.output, rep.call.depth + 1, self.step_floor_s,
                                      float(self.loop.now_s[0]))

    def hear(self, now_s: float, staleness_s: float, tokens: np.ndarray) -> list[int]:
        """Bring the router's view up to ``now_s``: finishes it has heard of by then (returned)."""
        loop = self.loop
        if loop.finished[0] != self.seen_finished:  # some requests retired since the last look
            self.seen_finished = int(loop.finished[0])
            live = np.array(self.live, dtype=np.int64)
            finish_s = self.replica.finish_s[live]
            done = ~np.isnan(finish_s)
            for t, i in zip(finish_s[done].tolist(), live[done].tolist()):
                heapq.heappush(self.heard, (t, i))
            self.live = live[~done].tolist()
        out = []
        while self.heard and self.heard[0][0] + staleness_s <= now_s:
            _, i = heapq.heappop(self.heard)
            self.outstanding -= 1
            self.outstanding_tokens -= int(tokens[i])
            out.append(i)
        return out

    def wake_s(self, staleness_s: float) -> float:
        """Before this an arrival finds nothing to do here: none of its
        requests can finish, and the router hears of no finish (fastroute's
        ``Book.wake_s``)."""
        heard_s = self.heard[0][0] + staleness_s if self.heard else np.inf
        return min(self.finish_after(), heard_s)

    def add(self, i: int, request: Request, tokens: int) -> None:
        """Request ``i`` joins this replica's arrivals at its frontend's ready time."""
        arrivals, loop = self.replica.arrival, self.replica.loop
        ready = self.frontend.ready(request, request.arrival_s)
        first, end = int(loop.arrived[0]), int(loop.routed[0])
        at = first + int(np.searchsorted(arrivals.ready_s[first:end], ready, side="right"))
        for column in arrivals:  # make room: the later ones move one place on
            column[at + 1:end + 1] = column[at:end].copy()
        arrivals.order[at], arrivals.ready_s[at], arrivals.queued_s[at] = i, ready, ready
        before = arrivals.ready_s[at - 1] if at > 0 else 0.0
        arrivals.fresh[at] = ready > before  # as fastloop.arrival_times: one queued with the one before
        if at + 1 <= end:
            arrivals.fresh[at + 1] = arrivals.ready_s[at + 1] > ready
        loop.routed[0] = end + 1
        pending = self.replica.pending
        if pending.resume[0] and loop.now_s[0] >= ready:  # a run going on past the arrival is decided anew, with
            pending.decided[0] = pending.resume[0] = 0  # this request (one behind it stops there itself)
        self.mine.append(i)
        self.live.append(i)
        self.outstanding += 1
        self.outstanding_tokens += tokens

    def close(self) -> None:
        loop = self.replica.loop
        loop.routing[0], loop.until_s[0] = fastloop.ROUTING_CLOSED, np.inf
        self.advance(np.inf)

    def run_log(self, label: str) -> RunLog | None:
        """The log of the requests routed here (None: none was)."""
        if not self.mine:
            return None
        return self.replica.run_log(label, rows=np.sort(np.array(self.mine, dtype=np.int64)))


COMPILED = True  # route the routers of simspec.fleet.fastroute in compiled code where it can (tests switch it off)


def simulate_routed(requests: Sequence[Request], *, replicas: int, router: Router, seed: int, label: str,
                    replica_seeds: list[int], difficulty: np.ndarray, setups: Sequence[dict], staleness_s: float = 0.0,
                    progress: Callable[[int], None] | None = None) -> tuple[list[RunLog | None], np.ndarray]:
    """Serve ``requests`` (sorted by arrival) on ``replicas`` replicas behind
    a stateful ``router``, replica k with simspec.sim.simulate's arguments
    ``setups[k]``; returns each replica's log and who served what. The
    routers that read only the replicas' load run in compiled code
    (simspec.fleet.fastroute) where the replicas' arguments to the serving
    loop are of one type (replicas of different policies, GPUs and batch
    limits are); the same decisions either way."""
    columns = request_columns(requests)  # every replica reads the whole stream: read it once
    tokens = columns.prompt_tokens + columns.output
    # ... and the replicas of one setup keep their per-request arrays in one pool (each request is one's)
    pools: dict[int, dict] = {}
    fleet = [_Live(requests, seed=s, difficulty=difficulty,
                   serve={**setup, "columns": columns, "pool": pools.setdefault(id(setup), {})})
             for s, setup in zip(replica_seeds, setups)]
    every = max(1, len(requests) // 200)
    kind = fastroute.ROUTERS.get(router.name)
    assignment = _route_compiled(requests, columns, fleet, router, kind, tokens, staleness_s, every, progress) \
        if kind is not None and COMPILED else None
    if assignment is None:
        # As the compiled loop: a replica that cannot finish a request by t stays behind (spec_aware reads a
        # replica only to hear its finishes, so it may leave one too), and until it can, or the router would hear
        # of a finish, an arrival passes it by.
        lazy = kind in fastroute.LAZY
        wake_s = np.full(replicas, -np.inf)
        assignment = np.empty(len(requests), dtype=np.int64)
        for i, request in enumerate(requests):
            t = request.arrival_s
            for k in router.reads(request):
                if lazy and t < wake_s[k]:
                    continue
                if not lazy or fleet[k].finish_after() <= t:
                    fleet[k].advance(t)
                router.heard(k, fleet[k].hear(t, staleness_s, tokens))
                if lazy:
                    wake_s[k] = fleet[k].wake_s(staleness_s)
            chosen = router.choose(request, fleet)
            wake_s[chosen] = -np.inf
            fleet[chosen].add(i, request, int(tokens[i]))
            router.sent(chosen, i, request)
            assignment[i] = chosen
            if progress is not None and i % every == 0:
                progress(sum(f.replica.finished for f in fleet))
    for f in fleet:
        f.close()
    if progress is not None:
        progress(len(requests))
    return [f.run_log(label) for f in fleet], assignment


def _route_compiled(requests: Sequence[Request], columns: RequestColumns, fleet: list[_Live], router: Router, kind: int,
                    tokens: np.ndarray, staleness_s: float, every: int,
                    progress: Callable[[int], None] | None) -> np.ndarray | None:
    """simulate_routed's loop in simspec.fleet.fastroute, answering its
    replicas' calls for Python (a flush, a fresh window) as _Live.advance
    does; None (nothing run) where the replicas' arguments to fastloop.run
    are not of one type."""
    frontend = np.array([[f.replica.engine.frontend_s_per_request, f.replica.engine.frontend_s_per_text_token,
                          f.replica.engine.frontend_s_per_image] for f in fleet], dtype=float)
    book = fastroute.new_book(len(requests), np.array([f.step_floor_s for f in fleet]),
                              np.array([f.replica.call.depth for f in fleet]), frontend,
                              columns.prompt_tokens, columns.image_count)
    arrival = columns.arrival_s
    pairs = np.zeros((0, 2), np.int64)
    # The scalars the router reads at every arrival in rows of the fleet's own, so it reads them without taking
    # a replica's tuples out of their list (each array in them counts a reference).
    rows, loops, pendings = fastroute.shared_rows([f.loop for f in fleet], [f.replica.pending for f in fleet])
    for f, loop, pending in zip(fleet, loops, pendings):
        f.share(loop, pending)
    # One typed list a kind of argument, one item a replica: the compiled loop is one for every fleet size (a
    # tuple of replicas would compile anew for each size, and index them through a branch per replica).
    heads = _alike([f.head for f in fleet])
    buffers = _alike([f.replica.logs.buffers for f in fleet])
    windows = _alike([f.window for f in fleet])
    ends = _alike([(f.replica.finish_s, f.replica.state.emitted, f.replica.state.output) for f in fleet])
    arrivals = _alike([f.replica.arrival for f in fleet])
    if heads is None or buffers is None or windows is None or ends is None or arrivals is None:
        return None
    staleness_s = float(staleness_s)
    if kind == fastroute.POWER_OF_TWO:  # the router's draws, in the order its reads() makes them at each arrival
        pairs = np.array([router.reads(r) for r in requests], dtype=np.int64).reshape(len(requests), 2)
    elif kind == fastroute.PREFIX_AFFINITY:  # each request's home (-1: none), in the first column
        pairs = router.homes(requests)[:, None]
    fluids = fastroute.new_fluids(router.kinds, router.kind_of, *router.estimates_of(requests)) \
        if kind == fastroute.SPEC_AWARE else fastroute.no_fluids()
    # numba's dispatch would type the replicas' lists anew at each call: call the compiled code itself
    signature = tuple(fastroute.route.typeof_pyval(a) for a in (heads, windows, buffers, ends, arrivals, rows, book,
                                                               arrival, tokens, 0, 0, kind, staleness_s, pairs, fluids))
    route = fastroute.route.compile(signature)
    for start in range(0, len(requests), every):
        stop = min(start + every, len(requests))
        while True:
            why = route(heads, windows, buffers, ends, arrivals, rows, book, arrival, tokens, start, stop, kind,
                        staleness_s, pairs, fluids)
            if why == fastroute.OK:
                break
            f = fleet[int(book.stopped[2])]
            if why == fastloop.CALL_REFILL:  # the window's numbers read, a fresh one
                f.replica.rand.consume(f.window)
                f.window = f.replica.rand.window(int(f.loop.need[0]))
                fastroute.put(windows, int(book.stopped[2]), f.window)
            else:
                f.replica.logs.flush()
            start = int(book.stopped[0])
        if progress is not None:
            progress(sum(int(f.loop.finished[0]) for f in fleet))
    for k, f in enumerate(fleet):  # what the Python loop's _Live keeps, for close() and run_log()
        f.replica.finished = int(f.loop.finished[0])
        f.mine = np.flatnonzero(book.assignment == k).tolist()
    return book.assignment.copy()


def _alike(items: list) -> "numba.typed.List | None":
    """``items`` as one typed list, or None where they are not of one type."""
    kinds = {numba.typeof(item) for item in items}
    if len(kinds) != 1:
        return None
    out = fastroute.typed_list(items[0])
    for item in items[1:]:
        fastroute.push(out, item)
    return out


__all__ = ["simulate_routed"]
