"""The acceptance estimate the load-adaptive policies read: each request's
moving average of accepted draft tokens per drafted round, and the
replica-wide one a newly admitted request starts from, updated after every
round by the compiled :func:`after_round`. One copy, shared by the
simulator and the live engine.

Imports: numpy, simspec.compiled (numba).
"""

from __future__ import annotations

import numpy as np

from simspec.compiled import jit

RECENT_WEIGHT = 0.3  # weight of the newest round in a request's moving average of accepted tokens
POPULATION_WEIGHT = 0.05  # ... and in the replica-wide average a newly admitted request starts from
# A round a request does not draft tells nothing of its acceptance; its
# estimate relaxes toward the replica-wide one by this much a round, so a
# request that stopped drafting under load drafts again when it pays
# (without it, one unlucky start leaves a request at AR for good).
RELAX_WEIGHT = 0.1
MAX_PRIOR_ACCEPTED = 15.0


def prior_accepted(top1: float) -> float:
    """Accepted tokens per round a request is expected to have before it has
    any history: the geometric p / (1 - p) of top-1 acceptance ``top1``."""
    return float(min(top1 / (1.0 - top1), MAX_PRIOR_ACCEPTED))


@jit
def censored_accepted(accepted: int, depth: int, estimate: float) -> float:
    """A round's accepted tokens as evidence of how many the drafter would
    have had accepted with no depth limit: a round that accepted every level
    it verified says "at least ``depth``", and with geometric acceptance the
    expected count beyond is the current ``estimate`` (memoryless)."""
    return accepted + estimate if accepted >= depth else float(accepted)


@jit
def after_round(recent: np.ndarray, population: np.ndarray, i: int, drafted: int, accepted: int, depth: int) -> None:
    """Update request ``i``'s estimate (and the replica-wide one, ``population[0]``)
    after a round that verified ``drafted`` draft tokens ``depth`` deep and
    accepted ``accepted``; a round without drafts relaxes it toward the replica's."""
    recent[i], population[0] = updated(recent[i], population[0], drafted, accepted, depth)


@jit
def updated(recent: float, population: float, drafted: int, accepted: int, depth: int) -> tuple[float, float]:
    """:func:`after_round` on the numbers: (the request's estimate, the
    replica's) after the round. For a caller's loop over a batch: a call
    that takes the arrays counts a reference for each, every request."""
    if drafted > 0:
        mine = (1.0 - RECENT_WEIGHT) * recent + RECENT_WEIGHT * censored_accepted(accepted, depth, recent)
        seen = censored_accepted(accepted, depth, population)
        return mine, (1.0 - POPULATION_WEIGHT) * population + POPULATION_WEIGHT * seen
    # no draft, no evidence: the estimate drifts back to the replica's
    return (1.0 - RELAX_WEIGHT) * recent + RELAX_WEIGHT * population, population


class Estimate:
    """Each request's moving average of accepted draft tokens per drafted
    round (``recent[N]``) and the replica-wide one (``population[1]``)."""

    def __init__(self, n: int, top1: float, recent: np.ndarray | None = None):
        """``recent``: the requests' array to keep (shared with a fleet's alike replicas), else ones."""
        self.recent = np.ones(n) if recent is None else recent
        self.population = np.array([prior_accepted(top1)])

    def start(self, i: int) -> None:
        """A newly admitted request's history starts as the replica's."""
        self.recent[i] = self.population[0]

    def after_round(self, i: int, drafted: int, accepted: int, depth: int) -> None:
        after_round(self.recent, self.population, i, drafted, accepted, depth)



__all__ = ["Estimate", "after_round", "updated", "censored_accepted", "prior_accepted", "RECENT_WEIGHT",
           "POPULATION_WEIGHT", "RELAX_WEIGHT", "MAX_PRIOR_ACCEPTED"]
