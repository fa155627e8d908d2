"""``spec_aware``'s model of one replica's batch, compiled: the arithmetic
of simspec.fleet.routers' ``_Fluid``, which holds the arrays.

Imports: numpy, simspec.compiled (numba).

A replica's requests, in the order sent, each with its expected rounds
left (``left``, the first ``count`` entries; 0: done in the model). The
first ``limit`` unfinished run at once, one round a step, a step taking
the replica's measured time at that batch size (``sizes`` ascending,
``step_s``; between them interpolated, beyond the nearest, as
``numpy.interp``; read from :func:`step_table`, built once a replica).
At every arrival the router steps each replica's model to it and asks
when a request sent now would finish there: a handful of small array
operations per replica and arrival, which in numpy would be most of a
fleet's cost behind ``spec_aware``.
"""

from __future__ import annotations

import numpy as np

from simspec.compiled import jit

DONE = 1e-12  # rounds left at or below which a request is done in the model


@jit
def step_at(batch: float, sizes: np.ndarray, step_s: np.ndarray) -> float:
    """The step time at ``batch`` (numpy.interp's rule: the nearest end beyond the measured sizes)."""
    n = len(sizes)
    if batch <= sizes[0]:
        return step_s[0]
    if batch >= sizes[n - 1]:
        return step_s[n - 1]
    j = np.searchsorted(sizes, batch, side="right") - 1
    slope = (step_s[j + 1] - step_s[j]) / (sizes[j + 1] - sizes[j])
    return slope * (batch - sizes[j]) + step_s[j]


@jit
def _run(left: np.ndarray, count: int, limit: int, rounds: float, settle: bool) -> None:
    """The first ``limit`` unfinished requests progress ``rounds`` rounds (``settle``: one left at ~0 is done)."""
    seen = 0
    for j in range(count):
        if left[j] > 0:
            left[j] -= rounds
            if settle and left[j] <= DONE:
                left[j] = 0.0
            seen += 1
            if seen == limit:
                return


@jit
def step_table(sizes: np.ndarray, step_s: np.ndarray, limit: int) -> np.ndarray:
    """:func:`step_at` at every whole batch size 0 .. ``limit``: [limit + 1],
    what the model's steps read (a batch in the model is a count of requests)."""
    table = np.empty(limit + 1)
    for b in range(limit + 1):
        table[b] = step_at(b, sizes, step_s)
    return table


@jit
def advance(left: np.ndarray, count: int, limit: int, steps: np.ndarray, dt: float) -> None:
    """Run the model ``dt`` seconds of decode steps (``steps``: :func:`step_table`'s)."""
    while dt > 0:
        running, first = 0, np.inf
        for j in range(count):
            if left[j] > 0:
                first = min(first, left[j])
                running += 1
                if running == limit:
                    break
        if running == 0:
            return
        step = steps[running]
        if first * step >= dt:
            _run(left, count, limit, dt / step, False)
            return
        _run(left, count, limit, first, True)
        dt -= first * step


@jit
def decode_in(left: np.ndarray, count: int, limit: int, steps: np.ndarray, rounds: float,
              scratch: np.ndarray) -> float:
    """Seconds of decode steps until a request of ``rounds`` rounds, sent
    now, would finish: beside the others while the batch has room (the
    batch shrinking as the shorter finish), else once ``count - limit + 1``
    of the running have finished, or the work ahead has drained at a full
    batch. ``scratch``: room for ``count`` floats, overwritten.

    While the batch has room, only the requests that finish before it
    change its batch size, so only their rounds are put in order (the
    steps after it finishes add nothing)."""
    n, m = 0, 0  # the unfinished; those of them with fewer rounds left than it
    for j in range(count):
        if left[j] > 0:
            n += 1
            if left[j] < rounds:
                scratch[m] = left[j]
                m += 1
    if n < limit:  # it runs at once
        _insertion_sort(scratch, m)
        total, before = 0.0, 0.0
        for k in range(m):  # each of them finishes, and the batch shrinks
            total += (scratch[k] - before) * steps[n + 1 - k]
            before = scratch[k]
        if m < n:  # it finishes beside the rest
            return total + (rounds - before) * steps[n + 1 - m]
        return total + (rounds - before) * steps[1]  # alone at the end
    queued = n - limit  # ahead of it, waiting
    n = 0
    for j in range(count):
        if left[j] > 0:
            scratch[n] = left[j]
            n += 1
    if queued < limit:
        running = scratch[:limit]
        running.sort()
        wait = running[queued]
    else:
        wait = 0.0
        for k in range(n):
            wait += scratch[k]
        wait /= limit
    return (wait + rounds) * steps[limit]


@jit
def _insertion_sort(values: np.ndarray, n: int) -> None:
    """Sort ``values[:n]`` ascending in place (a handful of requests: no call, no copy)."""
    for k in range(1, n):
        moved = values[k]
        j = k
        while j > 0 and values[j - 1] > moved:
            values[j] = values[j - 1]
            j -= 1
        values[j] = moved


@jit(inline=True)
def run_to(left: np.ndarray, count: int, limit: int, steps: np.ndarray, owed_s: float, dt: float) -> float:
    """Run the model ``dt`` seconds: the prefill owed (``owed_s``) first,
    then decode steps; returns the prefill still owed."""
    paid = min(owed_s, dt)
    if dt - paid > 0:
        advance(left, count, limit, steps, dt - paid)
    return owed_s - paid


@jit(inline=True)
def finish_in(left: np.ndarray, count: int, limit: int, steps: np.ndarray, owed_s: float, rounds: float,
              prefill_s: float, scratch: np.ndarray) -> float:
    """Seconds until a request of ``rounds`` rounds and ``prefill_s`` of
    prefill, sent now, would finish: the prefill owed, its own, its decode
    (``scratch`` as :func:`decode_in`'s)."""
    return owed_s + prefill_s + decode_in(left, count, limit, steps, rounds, scratch)


@jit
def drop(ids: np.ndarray, left: np.ndarray, count: int, done: np.ndarray) -> int:
    """Take out the requests ``done`` flags (indexed by request), the rest
    kept in order; returns how many are left."""
    kept = 0
    for j in range(count):
        i = ids[j]
        if not done[i]:
            ids[kept], left[kept] = i, left[j]
            kept += 1
    return kept


__all__ = ["advance", "decode_in", "drop", "finish_in", "run_to", "step_at", "step_table", "DONE"]
