"""Routers: which replica of a fleet serves each request.

Imports: numpy, simspec.types, simspec.fleet.fluid (spec_aware's arithmetic, compiled).

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

- ``spec_aware``: the replica whose predicted finish time for this request
  is lowest (none of the engines' routers has it). The router keeps a
  fluid model of each replica's batch: every request it sent and has not
  heard finish, with its expected remaining verification rounds (output
  tokens over the expected tokens per round of the replica's policy for a
  request of its kind, text or with images), advanced in time at the
  replica's decode step time for its batch size (measured at each batch
  size, capped by the batch limit, later requests queued in order). A request's predicted
  finish on a replica is when its rounds are done in that model. The step
  times and the tokens per round come from :class:`ReplicaModel`,
  measured once per fleet on a short burst of the workload served by one
  replica (simspec.fleet.predict), as an operator would benchmark a replica
  before routing to it.

Ties among the least loaded go to the first at or after the replica after
the last one chosen (a rotating start), so an idle fleet is served in turn.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from simspec.fleet import fluid
from simspec.types import Request, require

STATELESS = ("round_robin", "random")
ROUTERS = STATELESS + ("least_requests", "least_tokens", "power_of_two", "prefix_affinity", "spec_aware")
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


@dataclass(frozen=True, slots=True)
class ReplicaModel:
    """What ``spec_aware`` knows of a replica: its decode step time by batch
    size and its policy's tokens per round by kind of request."""

    batch_sizes: tuple[int, ...]  # decode batch sizes measured, ascending
    step_s: tuple[float, ...]  # the median step time at each (between them: interpolated; beyond: the nearest)
    batch_limit: int  # requests that run at once (max_num_seqs)
    tokens_per_round_text: float
    tokens_per_round_image: float
    prefill_s_per_token: float = 0.0  # what a request's prompt (text and visual tokens) adds to the steps

    def prefill_s(self, request: Request) -> float:
        return self.prefill_s_per_token * (request.prompt_tokens + sum(request.image_tokens))

    def rounds(self, request: Request) -> float:
        """Expected verification rounds to emit ``request``'s output after its first token."""
        per = self.tokens_per_round_image if request.image_tokens else self.tokens_per_round_text
        return max(request.output_tokens - 1, 0) / per + 1.0


class _Fluid:
    """The router's model of one replica's batch (module docstring,
    ``spec_aware``; its arithmetic compiled in simspec.fleet.fluid)."""

    def __init__(self, model: ReplicaModel):
        self.model = model
        self.steps = fluid.step_table(np.asarray(model.batch_sizes, dtype=float), np.asarray(model.step_s, dtype=float),
                                      model.batch_limit)
        self.ids = np.zeros(16, np.int64)  # in the order sent (the first ``count``)
        self.left = np.zeros(16)  # expected rounds left, same order
        self.scratch = np.zeros(16)  # fluid.decode_in's working room, as long as left
        self.count = 0
        self.done = np.zeros(16, np.bool_)  # [request] heard finished
        self.prefill_owed = 0.0  # seconds of prefill sent and not yet run
        self.t = 0.0

    def advance(self, t: float) -> None:
        """Run the model to ``t``: prefill owed first, then the first ``batch_limit`` unfinished
        requests progress one round a step."""
        self.prefill_owed = fluid.run_to(self.left, self.count, self.model.batch_limit, self.steps, self.prefill_owed,
                                         t - self.t)
        self.t = t

    def add(self, i: int, rounds: float, prefill_s: float) -> None:
        if self.count == len(self.left):  # room for as many again
            self.ids = np.concatenate([self.ids, np.zeros(self.count, np.int64)])
            self.left = np.concatenate([self.left, np.zeros(self.count)])
            self.scratch = np.zeros(len(self.left))
        if i >= len(self.done):
            self.done = np.concatenate([self.done, np.zeros(i + 1 + len(self.done), np.bool_)])
        self.ids[self.count], self.left[self.count] = i, rounds
        self.count += 1
        self.prefill_owed += prefill_s

    def drop(self, gone: Sequence[int]) -> None:
        self.done[np.asarray(gone, dtype=np.int64)] = True
        self.count = fluid.drop(self.ids, self.left, self.count, self.done)

    def finish_in(self, rounds: float, prefill_s: float) -> float:
        """Seconds until a request of ``rounds`` rounds and ``prefill_s`` of prefill, sent now, would finish."""
        return fluid.finish_in(self.left, self.count, self.model.batch_limit, self.steps, self.prefill_owed, rounds,
                               prefill_s, self.scratch)


class Router(ABC):
    """A router of simspec.fleet.live: which replicas it reads for a
    request, then which it picks. ``fleet`` items carry ``outstanding`` and
    ``outstanding_tokens`` as the router sees them."""

    name = ""  # as ROUTERS names it

    def __init__(self, replicas: int, rng: np.random.Generator):
        self.replicas, self.rng = replicas, rng
        self.everyone = tuple(range(replicas))
        self.last = -1

    def reads(self, request: Request) -> Sequence[int]:
        return self.everyone

    @abstractmethod
    def choose(self, request: Request, fleet: Sequence) -> int:
        """The replica that serves ``request``, from the state of those :meth:`reads` named."""

    def sent(self, k: int, i: int, request: Request) -> None:
        """Request ``i`` went to replica ``k`` (a router that keeps its own model of the replicas hears it)."""

    def heard(self, k: int, finished: list[int]) -> None:
        """The router heard requests ``finished`` (indices) end on replica ``k``."""

    def least(self, loads: Sequence[int]) -> int:
        """The least loaded; ties: the first from the replica after the last chosen."""
        n = self.replicas
        start = (self.last + 1) % n
        best = min(range(n), key=lambda k: (loads[k], (k - start) % n))
        self.last = best
        return best


class _RoundRobin(Router):  # as route's, one at a time (tests run the stateless routers this way too)
    name = "round_robin"

    def reads(self, request):
        return ()

    def choose(self, request, fleet):
        self.last = (self.last + 1) % self.replicas
        return self.last


class _Random(Router):
    name = "random"

    def reads(self, request):
        return ()

    def choose(self, request, fleet):
        return int(self.rng.integers(0, self.replicas))


class _LeastRequests(Router):
    name = "least_requests"

    def choose(self, request, fleet):
        return self.least([f.outstanding for f in fleet])


class _LeastTokens(Router):
    name = "least_tokens"

    def choose(self, request, fleet):
        return self.least([f.outstanding_tokens for f in fleet])


class _PowerOfTwo(Router):
    name = "power_of_two"

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
    name = "prefix_affinity"

    def __init__(self, replicas, rng):
        super().__init__(replicas, rng)
        self.salts = _mix(np.arange(1, replicas + 1, dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15))

    def home(self, prefix_id: int) -> int:
        """Rendezvous hashing: the replica whose hash with the prefix is highest."""
        return int(np.argmax(_mix(self.salts ^ np.uint64(prefix_id))))

    def homes(self, requests: Sequence[Request]) -> np.ndarray:
        """[N] each request's home, -1 where its shared prefix is too short a
        share of its prompt to go home (choose's rule, for the compiled loop)."""
        out = np.full(len(requests), -1, np.int64)
        goes = [i for i, r in enumerate(requests) if _goes_home(r)]
        if goes:
            ids, where = np.unique([requests[i].prefix_id for i in goes], return_inverse=True)
            out[goes] = np.array([self.home(int(p)) for p in ids], np.int64)[where]
        return out

    def choose(self, request, fleet):
        loads = [f.outstanding for f in fleet]
        high, low = max(loads), min(loads)
        if high - low > BALANCE_ABS and high > BALANCE_REL * low:  # as fastroute's compiled loop
            return self.least(loads)
        if _goes_home(request):
            return self.home(request.prefix_id)
        return self.least(loads)


def _goes_home(request: Request) -> bool:
    return request.prefix_id >= 0 and request.prefix_tokens > CACHE_THRESHOLD * request.context_tokens


class _SpecAware(Router):
    name = "spec_aware"

    def __init__(self, replicas, rng, models: Sequence[ReplicaModel]):
        super().__init__(replicas, rng)
        self.fluid = [_Fluid(model) for model in models]
        # Alike replicas share one model, and one estimate of a request: the distinct models, and each replica's
        kinds = {id(m): m for m in models}
        self.kinds = list(kinds.values())
        self.kind_of = [list(kinds).index(id(m)) for m in models]
        self.estimates: list[tuple[float, float]] = []  # the request last chosen for, per kind: rounds, prefill s

    def choose(self, request, fleet):
        self.estimates = [(m.rounds(request), m.prefill_s(request)) for m in self.kinds]
        finish = []
        for f, kind in zip(self.fluid, self.kind_of):
            f.advance(request.arrival_s)
            finish.append(f.finish_in(*self.estimates[kind]))
        return self.least(finish)

    def sent(self, k, i, request):
        self.fluid[k].add(i, *self.estimates[self.kind_of[k]])

    def estimates_of(self, requests: Sequence[Request]) -> tuple[np.ndarray, np.ndarray]:
        """[K, N] each request's expected rounds and prefill seconds on each
        kind of replica (what :meth:`choose` estimates at its arrival), for
        simspec.fleet.fastroute's compiled loop."""
        shape = (len(self.kinds), len(requests))
        rounds = np.array([[m.rounds(r) for r in requests] for m in self.kinds], dtype=float).reshape(shape)
        prefill_s = np.array([[m.prefill_s(r) for r in requests] for m in self.kinds], dtype=float).reshape(shape)
        return rounds, prefill_s

    def heard(self, k, finished):
        if finished:
            self.fluid[k].drop(finished)


_KINDS = {"round_robin": _RoundRobin, "random": _Random, "least_requests": _LeastRequests,
          "least_tokens": _LeastTokens, "power_of_two": _PowerOfTwo, "prefix_affinity": _PrefixAffinity}


def router(name: str, replicas: int, rng: np.random.Generator,
           model: ReplicaModel | Sequence[ReplicaModel] | None = None) -> Router:
    """The router ``name`` for simspec.fleet.live (``spec_aware`` needs the
    replicas' ``model``: one for alike replicas, or one a replica)."""
    check(name, replicas)
    if name == "spec_aware":
        require(model is not None, "router spec_aware needs the replicas' ReplicaModel (simspec.fleet.predict)")
        models = [model] * replicas if isinstance(model, ReplicaModel) else list(model)
        require(len(models) == replicas, f"router spec_aware: one ReplicaModel a replica ({replicas}; got {len(models)})")
        return _SpecAware(replicas, rng, models)
    return _KINDS[name](replicas, rng)


__all__ = ["ROUTERS", "STATELESS", "MAX_REPLICAS", "MAX_STALENESS_MS", "Router", "ReplicaModel", "check", "route",
           "router"]
