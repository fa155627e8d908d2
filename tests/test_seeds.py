"""Tests of simspec.seeds: each purpose's stream is the library's spawned
child, no two purposes share a stream or an offset, the integer seeds are
those the committed checkpoints were made with, and an unknown purpose is
refused by name."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from simspec import seeds

REPO = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("purpose", list(seeds.STREAMS))
def test_a_stream_is_the_seed_sequences_spawned_child(purpose):
    key = seeds.STREAMS[purpose]
    child = np.random.SeedSequence(7).spawn(key + 1)[key]
    assert (seeds.stream(7, purpose).generate_state(4) == child.generate_state(4)).all()


def test_purposes_never_share_a_stream_or_an_offset():
    assert len(set(seeds.STREAMS.values())) == len(seeds.STREAMS)
    assert len(set(seeds.OFFSETS.values())) == len(seeds.OFFSETS) and 0 not in seeds.OFFSETS.values()
    states = {tuple(seeds.stream(3, p).generate_state(2)) for p in seeds.STREAMS}
    assert len(states) == len(seeds.STREAMS)
    assert len({seeds.derived_seed(3, p) for p in seeds.OFFSETS} | {3}) == len(seeds.OFFSETS) + 1


def test_the_target_checkpoints_held_out_seed_is_derived_as_it_was_trained():
    meta = json.loads((REPO / "checkpoints" / "target" / "meta.json").read_text())
    assert meta["eval_seed"] == seeds.derived_seed(meta["seed"], "target-eval")


def test_an_unknown_purpose_is_named():
    with pytest.raises(ValueError, match="seed purpose must be one of workload, difficulty.*got 'workloads'"):
        seeds.stream(0, "workloads")
    with pytest.raises(ValueError, match="seed purpose must be one of calibration-poisson.*got 'calibration'"):
        seeds.derived_seed(0, "calibration")
