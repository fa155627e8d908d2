"""Routers: which replica of a fleet serves each request.

Imports: numpy, simspec.types.

Two kinds. The stateless ones decide from the arrival order alone:
``round_robin`` sends the i-th arrival to replica i mod N (each replica
sees every N-th arrival: Erlang-N inter-arrival times out of a Poisson
stream); ``random`` picks a replica uniformly for each arrival from its own
seeded stream (each replica sees a thinned Poisson stream: N independent
queues). Each replica's share is then known before any runs, and each
replica runs as a simulation of its own (:func:`route`, simspec.fleet.run).

The others read the replicas' state at the arrival (simspec.fleet.live
keeps it as a router does: what it sent and has not heard finish):

- ``least_requests``: the fewest outstanding requests (vLLM
  production-stack's least-in-flight router, Envoy's least-request);
- ``least_tokens``: the fewest outstanding prompt + output tokens (the
  request's output length stands for its ``max_tokens``);
- ``power_of_two``: two replicas drawn at random, the one with fewer
  outstanding requests wins (Mitzenmacher's two choices; the SGLang
  router's ``power_of_two``);
- ``prefix_affinity``: a request whose shared prefix is more than
  ``CACHE_THRESHOLD`` of its prompt goes to its prefix's home replica
  (rendezvous hashing on the prefix: the same prefix, the same replica, and
  a replica's removal moves only its own prefixes), unless the fleet is
  out of balance, when it goes to the least loaded: the SGLang router's
  cache-aware rule and its defaults (cache_threshold 0.3,
  balance_abs_threshold 64, balance_rel_threshold 1.5:
  sgl-model-gateway/bindings/python/src/sglang_router/router_args.py).
  SGLang finds the home by matching the prompt against a radix tree of
  what it sent each worker and sends a miss to the worker with the
  smallest tree; here the home is the prefix's hash and a miss goes to the
  least loaded. (vLLM production-stack's prefix-aware router picks the
  endpoint with the longest matched prefix and has no balance escape.)

Ties among the least loaded go to the first at or after the replica after
the last one chosen (a rotating start), so an idle fleet is served in turn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Sequence

import numpy as np

from simspec.types import Request, require

STATELESS = ("round_robin", "random")
ROUTERS = STATELESS + ("least_requests", "least_tokens", "power_of_two", "prefix_affinity")
MAX_REPLICAS = 1024
MAX_STALENESS_MS = 60_000.0
CACHE_THRESHOLD = 0.3  # prefix share of the prompt above which prefix_affinity goes home (SGLang's default)
BALANCE_ABS = 64  # outstanding requests: max - min above this ...
BALANCE_REL = 1.5  # ... and max above this times min: out of balance (SGLang's defaults)


def check(router: str, replicas: int) -> None:
    """Raise InputError unless ``router`` and ``replicas`` name a fleet."""
    require(router in ROUTERS, f"router must be one of {', '.join(ROUTERS)} (got {router!r})")
    require(1 <= replicas <= MAX_REPLICAS, f"replicas must be in 1..{MAX_REPLICAS} (got {replicas})")


def route(arrival_s: np.ndarray, *, replicas: int, router: str, rng: np.random.Generator) -> np.ndarray:
    """[N] the replica of each request under a stateless router, the
    requests given by their arrival times (any order; ties keep the given
    order)."""
    check(router, replicas)
    require(router in STATELESS, f"router {router!r} reads the replicas' state: route it with simspec.fleet.live")
    order = np.argsort(arrival_s, kind="stable")
    chosen = np.empty(len(arrival_s), dtype=np.int64)
    if router == "round_robin":
        chosen[order] = np.arange(len(arrival_s)) % replicas
    else:
        chosen[order] = rng.integers(0, replicas, size=len(arrival_s))
    return chosen


class Router(ABC):
    """A router of simspec.fleet.live: which replicas it reads for a
    request, then which it picks. ``fleet`` items carry ``outstanding`` and
    ``outstanding_tokens`` as the router sees them."""

    def __init__(self, replicas: int, rng: np.random.Generator):
        self.replicas, self.rng = replicas, rng
        self.everyone = tuple(range(replicas))
        self.last = -1

    def reads(self, request: Request) -> Sequence[int]:
        return self.everyone

    @abstractmethod
    def choose(self, request: Request, fleet: Sequence) -> int:
        """The replica that serves ``request``, from the state of those :meth:`reads` named."""

    def least(self, loads: Sequence[int]) -> int:
        """The least loaded; ties: the first from the replica after the last chosen."""
        n = self.replicas
        start = (self.last + 1) % n
        best = min(range(n), key=lambda k: (loads[k], (k - start) % n))
        self.last = best
        return best


class _RoundRobin(Router):  # as route's, one at a time (tests run the stateless routers this way too)
    def reads(self, request):
        return ()

    def choose(self, request, fleet):
        self.last = (self.last + 1) % self.replicas
        return self.last


class _Random(Router):
    def reads(self, request):
        return ()

    def choose(self, request, fleet):
        return int(self.rng.integers(0, self.replicas))


class _LeastRequests(Router):
    def choose(self, request, fleet):
        return self.least([f.outstanding for f in fleet])


class _LeastTokens(Router):
    def choose(self, request, fleet):
        return self.least([f.outstanding_tokens for f in fleet])


class _PowerOfTwo(Router):
    def reads(self, request):
        if self.replicas == 1:
            self.pair = (0, 0)
        else:
            a = int(self.rng.integers(0, self.replicas))
            b = int(self.rng.integers(0, self.replicas - 1))
            self.pair = (a, b + (b >= a))
        return self.pair

    def choose(self, request, fleet):
        a, b = self.pair
        return b if fleet[b].outstanding < fleet[a].outstanding else a


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64's finaliser: a fixed, well-spread 64-bit hash."""
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


class _PrefixAffinity(Router):
    def __init__(self, replicas, rng):
        super().__init__(replicas, rng)
        self.salts = _mix(np.arange(1, replicas + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))

    def home(self, prefix_id: int) -> int:
        """Rendezvous hashing: the replica whose hash with the prefix is highest."""
        return int(np.argmax(_mix(self.salts ^ np.uint64(prefix_id))))

    def choose(self, request, fleet):
        loads = [f.outstanding for f in fleet]
        high, low = max(loads), min(loads)
        if high - low > BALANCE_ABS and high > BALANCE_REL * low:
            return self.least(loads)
        if request.prefix_id >= 0 and request.prefix_tokens > CACHE_THRESHOLD * request.context_tokens:
            return self.home(request.prefix_id)
        return self.least(loads)


_KINDS = {"round_robin": _RoundRobin, "random": _Random, "least_requests": _LeastRequests,
          "least_tokens": _LeastTokens, "power_of_two": _PowerOfTwo, "prefix_affinity": _PrefixAffinity}


def router(name: str, replicas: int, rng: np.random.Generator) -> Router:
    """The router ``name`` for simspec.fleet.live."""
    check(name, replicas)
    return _KINDS[name](replicas, rng)


__all__ = ["ROUTERS", "STATELESS", "MAX_REPLICAS", "MAX_STALENESS_MS", "Router", "check", "route", "router"]
