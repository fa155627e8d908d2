"""Routers: which replica of a fleet serves each request.

Imports: numpy, simspec.types.

The routers here decide from the arrival order alone, as a router that
keeps no load state decides: ``round_robin`` sends the i-th arrival to
replica i mod N (so each replica sees every N-th arrival: Erlang-N
inter-arrival times out of a Poisson stream); ``random`` picks a replica
uniformly for each arrival from its own seeded stream (each replica then
sees a thinned Poisson stream: N independent queues). Because neither
looks at the replicas' state, each replica's share of the stream is known
before any of them runs, and every replica runs as one simulation of its
own (simspec.fleet.run).
"""

from __future__ import annotations

import numpy as np

from simspec.types import require

ROUTERS = ("round_robin", "random")
MAX_REPLICAS = 1024


def check(router: str, replicas: int) -> None:
    """Raise InputError unless ``router`` and ``replicas`` name a fleet."""
    require(router in ROUTERS, f"router must be one of {', '.join(ROUTERS)} (got {router!r})")
    require(1 <= replicas <= MAX_REPLICAS, f"replicas must be in 1..{MAX_REPLICAS} (got {replicas})")


def route(arrival_s: np.ndarray, *, replicas: int, router: str, rng: np.random.Generator) -> np.ndarray:
    """[N] the replica of each request, the requests given by their arrival
    times (any order; ties keep the given order)."""
    check(router, replicas)
    order = np.argsort(arrival_s, kind="stable")
    chosen = np.empty(len(arrival_s), dtype=np.int64)
    if router == "round_robin":
        chosen[order] = np.arange(len(arrival_s)) % replicas
    else:
        chosen[order] = rng.integers(0, replicas, size=len(arrival_s))
    return chosen


__all__ = ["ROUTERS", "MAX_REPLICAS", "check", "route"]
