"""Marginal's best-first expansion frontier: a binary heap kept in arrays, compiled.

Imports: numpy, numba (simspec.compiled).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from simspec.compiled import jit


class Frontier(NamedTuple):
    """The best-first expansion's candidate nodes: a binary heap in arrays,
    ordered as the tuples (-value, request, code) (highest value first, ties
    to the lower request, then the lower code; a node's (request, code) is
    unique, so the order is total and any correct heap pops the same
    sequence). Capacity: the batch plus max_nodes (each pop adds at most one)."""

    value: np.ndarray  # [C] float64 the node's value (expected tokens)
    request: np.ndarray  # [C] int64 its row in the batch
    code: np.ndarray  # [C] int64 its rank-path code
    parent: np.ndarray  # [C] float64 its parent's value (a sibling's is that x its confidence)


@jit
def before(f: Frontier, a: int, value: float, request: int, code: int) -> bool:
    """Whether heap entry ``a`` pops before the node (value, request, code)."""
    if f.value[a] != value:
        return f.value[a] > value
    if f.request[a] != request:
        return f.request[a] < request
    return f.code[a] < code


@jit
def move(f: Frontier, to: int, at: int) -> None:
    f.value[to], f.request[to], f.code[to], f.parent[to] = f.value[at], f.request[at], f.code[at], f.parent[at]


@jit
def put(f: Frontier, at: int, value: float, request: int, code: int, parent: float) -> None:
    f.value[at], f.request[at], f.code[at], f.parent[at] = value, request, code, parent


@jit
def push(f: Frontier, size: int, value: float, request: int, code: int, parent: float) -> int:
    """Add a node; returns the new size."""
    k = size
    while k > 0:
        up = (k - 1) >> 1
        if before(f, up, value, request, code):
            break
        move(f, k, up)
        k = up
    put(f, k, value, request, code, parent)
    return size + 1


@jit
def sift_down(f: Frontier, size: int, value: float, request: int, code: int, parent: float) -> None:
    """Place a node at the root's hole and sift it down into heap order."""
    k = 0
    while True:
        c = 2 * k + 1
        if c >= size:
            break
        if c + 1 < size and before(f, c + 1, f.value[c], f.request[c], f.code[c]):
            c += 1
        if not before(f, c, value, request, code):
            break
        move(f, k, c)
        k = c
    put(f, k, value, request, code, parent)


@jit
def pop(f: Frontier, size: int) -> int:
    """Drop the root; returns the new size."""
    size -= 1
    if size > 0:
        sift_down(f, size, f.value[size], f.request[size], f.code[size], f.parent[size])
    return size


__all__ = ["Frontier", "push", "pop", "sift_down"]
