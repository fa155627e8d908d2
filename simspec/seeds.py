"""Every seed derived from a run's seed, each named by its purpose, in one
table, so that no two purposes share a random stream by accident.

Imports: numpy.

Two kinds, both fixed forever once a committed output depends on them:

- :func:`stream`: an independent child of the run's seed, as
  ``numpy.random.SeedSequence`` derives them (``SeedSequence(seed,
  spawn_key=(k,))`` is ``SeedSequence(seed).spawn(k + 1)[k]``). The
  simulator's workload and acceptance draws, and the timing-only live runs,
  use these.
- :func:`derived_seed`: ``seed + offset``, an integer seed. These offsets
  predate the streams, and the committed outputs were made with them: the
  shipped checkpoints (``checkpoints/*/meta.json`` records the held-out
  seed; the drafter was trained on its data seed), the validation results
  under ``validation/`` (calibration workloads, the capacity burst, the
  saturation probe, the task examples of every live request). A
  ``SeedSequence`` would give other numbers and so other outputs than
  those committed; the offsets stay (distinct, so that one seed's purposes
  never share a value).
"""

from __future__ import annotations

import numpy as np

STREAMS = {
    "workload": 0,  # arrivals, lengths, images, shared content, image sizes (WorkloadStreams spawns five)
    "difficulty": 1,  # the simulator's per-request acceptance difficulty
    "rounds": 2,  # the simulator's per-round acceptance draws
    "timing-examples": 3,  # timing-only live runs: random images and prompts
    "router": 4,  # a fleet's random router
    "replicas": 5,  # a fleet's replicas: one child each (simspec.fleet.run)
    "acceptance-replay": 7,  # timing-only live runs: replayed acceptance
    "plan-search": 8,  # simspec plan: the workload sample every capacity probe serves
    "plan-confirm": 9,  # simspec plan: the seeds every finalist fleet is confirmed on (one child each)
    "router-model": 10,  # a fleet's spec_aware router: the burst that measures a replica (simspec.fleet.predict)
}
"""Spawn key of each purpose's child :class:`numpy.random.SeedSequence`."""

OFFSETS = {
    "calibration-poisson": 1000,  # validation: the Poisson calibration workload
    "calibration-gamma": 1001,  # validation: the bursty calibration workload
    "capacity-burst": 2000,  # validation: the capacity guess and the speed probe's burst
    "saturation-probe": 3000,  # validation: the requests the simulated AR saturation is measured on
    "target-eval": 1_000_003,  # the target's held-out examples
    "drafter-data": 2_000_003,  # the drafter's training examples
    "drafter-eval": 3_000_017,  # the drafter's held-out examples
    "task-examples": 4_000_037,  # a live workload's prompts and images
}
"""Offset each integer-seeded purpose adds to the run's seed."""


def _check(purpose: str, table: dict[str, int]) -> int:
    if purpose not in table:
        raise ValueError(f"seed purpose must be one of {', '.join(table)} (got {purpose!r})")
    return table[purpose]


def stream(seed: int, purpose: str) -> np.random.SeedSequence:
    """The child seed sequence of ``seed`` for ``purpose`` (:data:`STREAMS`)."""
    return np.random.SeedSequence(seed, spawn_key=(_check(purpose, STREAMS),))


def derived_seed(seed: int, purpose: str) -> int:
    """The integer seed of ``purpose`` (:data:`OFFSETS`) for a run of ``seed``:
    ``seed`` plus the purpose's offset, the values the committed outputs were
    made with (module docstring)."""
    return seed + _check(purpose, OFFSETS)
