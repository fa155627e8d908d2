"""Serve one workload on a fleet: identical replicas, or groups of different ones.

Imports: numpy, simspec.seeds, simspec.sim, simspec.fleet.

A stateless router (round_robin, random) decides from the arrival order
(simspec.fleet.routers), so each replica's share is known first and each
replica is one simulation of its own, at one replica's cost per request;
the others read the replicas' state, and the replicas run side by side
(simspec.fleet.live). Their logs merge into the fleet's
(simspec.fleet.merge). A fleet of one is :func:`simspec.sim.simulate`
itself, byte for byte. Each request's difficulty is the one-replica run's
draw for it (``seeds.stream(seed, "difficulty")``), wherever it is served;
replica i draws its rounds from its own child of the run's seed
(``seeds.stream(seed, "replicas")``, spawned per replica) and the routers
their choices from ``seeds.stream(seed, "router")``; none depends on the
policy, so the policies of one run share their routing (where the router
does not read the replicas' state) and their draws (common random
numbers), as one replica's do. The replicas' logs share one count of the
gaps they keep one by one (simspec.logs.GapBudget), so the merged log
keeps them exactly where one replica's log of as many would. A fleet of
groups (simspec.fleet.groups) gives each replica its own setup (cost
model, engine, KV budget, policy: ``setups``); everything else is the
same.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from simspec import seeds
from simspec.fleet import routers
from simspec.fleet.live import simulate_routed
from simspec.fleet.merge import merge
from simspec.fleet.predict import calibrate
from simspec.logs import GapBudget
from simspec.sim import simulate
from simspec.sim.replica import request_logits
from simspec.types import Request, RunLog, require


@dataclass(frozen=True, slots=True)
class FleetRun:
    """The fleet's merged log, each replica's own (None: it got no request), and who served what."""

    log: RunLog
    replicas: tuple[RunLog | None, ...]
    assignment: np.ndarray  # [N] replica of each request, in the workload's order (disaggregated: its decode one)
    # A disaggregated fleet's (simspec.fleet.disagg): each request's prefill replica, and its KV transfer's seconds
    prefill_assignment: np.ndarray | None = None
    transfer_s: np.ndarray | None = None

    def served(self, replica: int) -> int:
        """Requests replica ``replica`` served (a prefill replica's prefills counted)."""
        count = int((self.assignment == replica).sum())
        if self.prefill_assignment is not None:
            count += int((self.prefill_assignment == replica).sum())
        return count


def replica_seeds(seed: int, replicas: int) -> list[int]:
    """The seed of each replica's simulation (module docstring)."""
    children = seeds.stream(seed, "replicas").spawn(replicas)
    return [int(child.generate_state(1)[0]) for child in children]


def simulate_fleet(requests: Sequence[Request], *, replicas: int, router: str, seed: int, label: str,
                   progress: Callable[[int], None] | None = None, staleness_s: float = 0.0, _live: bool = False,
                   setups: Sequence[dict] | None = None, **serve) -> FleetRun:
    """Serve ``requests`` (sorted by arrival) on ``replicas`` replicas behind
    ``router``; ``serve`` is :func:`simspec.sim.simulate`'s other arguments,
    each replica's own in ``setups`` (one dict a replica over ``serve``:
    a fleet of groups); ``staleness_s``: how late a stateful router hears a
    finish. ``_live`` runs a stateless router side by side too (tests
    compare the two)."""
    routers.check(router, replicas)
    require(setups is None or len(setups) == replicas,
            f"setups: one a replica ({replicas}; got {len(setups or ())})")
    if replicas == 1:
        own = {**serve, **setups[0]} if setups is not None else serve
        log = simulate(requests, label=label, seed=seed, progress=progress, **own)
        return FleetRun(log=log, replicas=(log,), assignment=np.zeros(len(requests), dtype=np.int64))
    budget = GapBudget()
    if setups is None:
        own = [{**serve, "gap_budget": budget}] * replicas
    else:  # one dict a distinct setup: a group's replicas share theirs (and a routed fleet's their arrays)
        alike: dict[int, dict] = {}
        own = [alike.setdefault(id(setup), {**serve, **setup, "gap_budget": budget}) for setup in setups]
    difficulty = request_logits(serve["acceptance"], np.random.default_rng(seeds.stream(seed, "difficulty")),
                                requests)
    rng = np.random.default_rng(seeds.stream(seed, "router"))
    if router not in routers.STATELESS or _live:
        models = _replica_models(requests, seed, own, setups) if router == "spec_aware" else None
        logs, assignment = simulate_routed(requests, replicas=replicas,
                                           router=routers.router(router, replicas, rng, models),
                                           seed=seed, label=label, replica_seeds=replica_seeds(seed, replicas),
                                           difficulty=difficulty, staleness_s=staleness_s, progress=progress,
                                           setups=own)
    else:
        arrival_s = np.array([r.arrival_s for r in requests], dtype=float)
        assignment = routers.route(arrival_s, replicas=replicas, router=router, rng=rng)
        logs = _by_share(requests, assignment, replicas, seed, label, difficulty, progress, own)
    served = [log for log in logs if log is not None]
    return FleetRun(log=merge(served, label), replicas=tuple(logs), assignment=assignment)


def _replica_models(requests, seed, own, setups) -> list:
    """spec_aware's model of each replica, measured once per distinct setup (simspec.fleet.predict)."""
    if setups is None:
        return [calibrate(requests, seed=seed, **own[0])] * len(own)
    measured: dict[int, object] = {}
    for setup, serve in zip(setups, own):
        if id(setup) not in measured:
            measured[id(setup)] = calibrate(requests, seed=seed, **serve)
    return [measured[id(setup)] for setup in setups]


def _by_share(requests, assignment, replicas, seed, label, difficulty, progress, own) -> list[RunLog | None]:
    """Each replica's share served as a simulation of its own (``own``: each replica's arguments)."""
    done = np.zeros(replicas, dtype=np.int64)
    logs: list[RunLog | None] = []
    for i, replica_seed in enumerate(replica_seeds(seed, replicas)):
        mine = np.flatnonzero(assignment == i)
        if not len(mine):
            logs.append(None)
            continue

        def advance(count: int, i=i) -> None:
            done[i] = count
            progress(int(done.sum()))

        logs.append(simulate([requests[j] for j in mine], label=label, seed=replica_seed, difficulty=difficulty[mine],
                             progress=advance if progress else None, **own[i]))
    return logs


__all__ = ["FleetRun", "simulate_fleet", "replica_seeds"]
