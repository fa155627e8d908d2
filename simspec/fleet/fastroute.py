"""The routing loop of simspec.fleet.live, compiled, for the routers that
read only the replicas' outstanding load (``least_requests``,
``least_tokens``): many arrivals a call instead of a return to Python, and
a compiled call, for each replica at each arrival.

Imports: numpy, simspec.compiled (numba), simspec.sim.fastloop.

It decides what simspec.fleet.live's Python loop decides, arrival for
arrival (tests/test_fleet_routers.py compares the two): each replica run
up to the arrival (fastloop's CALL_HORIZON), the finishes the router has
heard by then (``staleness_s`` after they happen), the least loaded with
ties to the first from the replica after the last chosen, and the request
placed among the replica's known arrivals by its ready time. It returns to
Python where Python must act for a replica (its log buffers to flush, its
random numbers' window to refill: ``Escape``) and at the end of the
arrivals it was given; a call resumes at the arrival it stopped at, whose
replicas already run up to it are not run again. The replicas' arguments
to fastloop.run come as one tuple of like tuples (one type for all: alike
replicas, which a fleet of one setup is); the frontend has no cost here
(every request is ready when it arrives), as in every engine preset.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit
from simspec.sim import fastloop

LEAST_REQUESTS, LEAST_TOKENS = 0, 1
ROUTERS = {"least_requests": LEAST_REQUESTS, "least_tokens": LEAST_TOKENS}
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
    stopped: np.ndarray  # [2] int (arrival, replica) a call stopped at: the replicas before it are run up to it


def new_book(requests: int, replicas: int) -> Book:
    return Book(assignment=np.full(requests, -1, np.int64), next=np.full(requests, -1, np.int64),
                live=np.full(replicas, -1, np.int64), heard=np.full(replicas, -1, np.int64),
                seen_finished=np.zeros(replicas, np.int64), outstanding=np.zeros(replicas, np.int64),
                outstanding_tokens=np.zeros(replicas, np.int64), last=np.full(1, -1, np.int64),
                stopped=np.full(2, -1, np.int64))


@jit
def _advance(head, window, buffers, until_s: float) -> int:
    """simspec.fleet.live._Live.advance without its Python: OK, or the CALL_* Python must answer."""
    loop = head[3]
    if loop.routing[0] == fastloop.ROUTING_OPEN and (loop.now_s[0] >= until_s or loop.finished[0] >= loop.routed[0]):
        return OK
    loop.until_s[0] = until_s
    while True:
        why = fastloop.run(*head, window, buffers)
        if why == fastloop.CALL_HORIZON or why == fastloop.CALL_DONE:
            return OK
        if why == fastloop.CALL_REFILL or why == fastloop.CALL_FLUSH:
            return why


@jit
def _hear(book: Book, k: int, finish_s: np.ndarray, finished: int, now_s: float, staleness_s: float,
          tokens: np.ndarray) -> None:
    """_Live.hear: move what finished since the last look to the heard-of-soon
    list, then hear what finished ``staleness_s`` or more before ``now_s``."""
    nxt = book.next
    if finished != book.seen_finished[k]:
        book.seen_finished[k] = finished
        prev, i = -1, book.live[k]
        while i >= 0:
            after = nxt[i]
            if not np.isnan(finish_s[i]):  # out of the live list, onto the heard one
                if prev < 0:
                    book.live[k] = after
                else:
                    nxt[prev] = after
                nxt[i] = book.heard[k]
                book.heard[k] = i
            else:
                prev = i
            i = after
    prev, i = -1, book.heard[k]
    while i >= 0:
        after = nxt[i]
        if finish_s[i] + staleness_s <= now_s:
            if prev < 0:
                book.heard[k] = after
            else:
                nxt[prev] = after
            book.outstanding[k] -= 1
            book.outstanding_tokens[k] -= tokens[i]
        else:
            prev = i
        i = after


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
def _add(arrivals, loop, i: int, ready: float) -> None:
    """_Live.add: request ``i`` joins the replica's arrivals at ``ready``, in order among those not yet queued."""
    first, end = loop.arrived[0], loop.routed[0]
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
    loop.routed[0] = end + 1


@jit
def route(heads, windows, buffers, book: Book, arrival_s: np.ndarray, tokens: np.ndarray, start: int, stop: int,
          router: int, staleness_s: float) -> int:
    """Route arrivals ``start`` .. ``stop`` - 1; OK, or the CALL_* of the
    replica (``book.stopped``) that needs Python first."""
    n = len(heads)
    loads = np.empty(n, np.int64)
    for i in range(start, stop):
        t = arrival_s[i]
        first = book.stopped[1] if book.stopped[0] == i else 0  # the replicas before it are run up to t
        for k in range(first, n):
            why = _advance(heads[k], windows[k], buffers[k], t)
            if why != OK:
                book.stopped[0], book.stopped[1] = i, k
                return why
            loop = heads[k][3]
            _hear(book, k, heads[k][5].finish_s, loop.finished[0], t, staleness_s, tokens)
        book.stopped[0] = -1
        for k in range(n):
            loads[k] = book.outstanding[k] if router == LEAST_REQUESTS else book.outstanding_tokens[k]
        chosen = _least(loads, book.last[0])
        book.last[0] = chosen
        _add(heads[chosen][2], heads[chosen][3], i, t)
        book.assignment[i] = chosen
        book.next[i] = book.live[chosen]
        book.live[chosen] = i
        book.outstanding[chosen] += 1
        book.outstanding_tokens[chosen] += tokens[i]
    return OK


__all__ = ["ROUTERS", "LEAST_REQUESTS", "LEAST_TOKENS", "OK", "Book", "new_book", "route"]
