"""Acceptance models: semantics, presets against published figures."""

from __future__ import annotations

import csv

import numpy as np
import pytest

from conftest import requests_at, run, shared
from simspec import acceptance, policies, trees
from simspec.acceptance import PRESETS, AcceptanceModel, DraftContext, RandomBlocks
from simspec.sim import EngineConfig
from simspec.types import InputError


def draw(model, n=20000, depth=6, ranks=10, retention=1.0, seed=0):
    rng = np.random.default_rng(seed)
    return model.draw(RandomBlocks(rng), model.request_logits(rng, n), np.full(n, retention), depth, ranks)


def test_iid_top1_acceptance_rate():
    rnd = draw(AcceptanceModel.iid(0.7), n=50000, depth=1)
    hits = (rnd.true_ranks[:, 0] == 1).mean()
    assert abs(hits - 0.7) < 4 * np.sqrt(0.7 * 0.3 / 50000)
    assert np.allclose(rnd.conf[:, 0, 0], 0.7)


def test_confidences_fall_with_rank_and_correlate_with_acceptance():
    rnd = draw(acceptance.preset(acceptance.DEFAULT_PRESET))
    assert np.all(np.diff(rnd.conf, axis=2) <= 1e-12)
    confident = rnd.conf[:, 0, 0] > 0.8
    doubtful = rnd.conf[:, 0, 0] < 0.3
    assert (rnd.true_ranks[confident, 0] == 1).mean() > (rnd.true_ranks[doubtful, 0] == 1).mean() + 0.3


@pytest.mark.parametrize("context,expected", [("full", 1.0), ("none", 0.55)])
def test_retention_ends(context, expected):
    model = acceptance.preset(acceptance.DEFAULT_PRESET)
    assert model.retention(DraftContext.parse(context), np.array([576]))[0] == pytest.approx(expected)
    assert model.retention(DraftContext.parse(context), np.array([0]))[0] == 1.0  # text-only requests lose nothing


def test_more_kept_tokens_keep_more_acceptance():
    model = acceptance.preset(acceptance.DEFAULT_PRESET)
    kept = [model.retention(DraftContext.parse(f"selected:{k}"), np.array([576]))[0] for k in (1, 4, 8, 32)]
    assert kept == sorted(kept) and kept[-1] > 0.999
    pooled = model.retention(DraftContext.parse("pooled:8"), np.array([576]))[0]
    assert pooled < kept[2]  # attention-guided selection keeps more than pooling


def test_acceptance_length_shrinks_with_the_drafters_view():
    model = acceptance.preset(acceptance.DEFAULT_PRESET)
    setting = PRESETS[acceptance.DEFAULT_PRESET.lower()].draft
    lengths = []
    for ctx in ("none", "selected:8", "full"):
        rnd = draw(model, retention=model.retention(DraftContext.parse(ctx), np.array([576]))[0], depth=setting.depth)
        plan = trees.eagle_tree(rnd.conf, setting.depth, setting.topk, setting.budget)
        lengths.append(1 + trees.accepted_length(plan, rnd.true_ranks).mean())
    assert lengths[0] < lengths[1] < lengths[2]
    assert lengths[1] / lengths[2] > 0.98  # 8 selected tokens keep nearly all of it


@pytest.mark.parametrize("name", [p.name for p in PRESETS.values()])
def test_preset_reproduces_published_length_at_concurrency_1(name):
    # The preset's own draft setting, one request at a time, drafter seeing
    # the whole image (as in the papers), at the temperature it was measured
    # at: within 5% of the published length.
    p = PRESETS[name.lower()]
    policy = policies.parse(f"tree:depth={p.draft.depth},topk={p.draft.topk},budget={p.draft.budget}")
    log = run(requests_at(np.arange(30) * 100.0, output=120, images=(576,)), policy,
              accept=acceptance.preset(name, p.temperature),
              engine=EngineConfig(max_num_seqs=1, drafter_context="full"))
    simulated = 1 + log.round_accepted.mean()
    assert simulated == pytest.approx(p.accept_length, rel=0.05)


@pytest.mark.parametrize("name", ["SpecVLM/LLaVA-1.5-7B", "EAGLE-2/LLaVA-1.6-7B", "EAGLE-3/Llama-3.3-70B"])
def test_shipped_fit_is_reproducible(name):
    assert acceptance.fit_preset(name).top1_logit == pytest.approx(acceptance.FITTED_TOP1_LOGIT[name], abs=0.01)


def test_presets_match_the_published_table():
    path = shared("published_acceptance.csv")
    rows = [r for r in csv.DictReader(path.open()) if r["accept_length"]]
    sources = {r["source"] for r in rows}
    assert len(rows) == len([p for p in PRESETS.values() if p.source in sources])
    for row in rows:
        length = float(row["accept_length"]) + (0 if row["accept_length_includes_bonus"] == "yes" else 1)
        matches = [p for p in PRESETS.values() if p.method == row["method"] and p.model == row["model"]
                   and p.setting == row["setting"]]
        assert len(matches) == 1 and matches[0].accept_length == pytest.approx(length)


@pytest.mark.parametrize("spec,needle", [("nosuch", "acceptance must be"), ("iid:1.5", "in \\(0, 1\\)"),
                                         ("iid:x", "iid:P")])
def test_bad_acceptance_names_the_problem(spec, needle):
    with pytest.raises(InputError, match=needle):
        acceptance.build(spec)


@pytest.mark.parametrize("text", ["selected:0", "selected:x", "pooled", "half"])
def test_bad_drafter_context(text):
    with pytest.raises(InputError, match="drafter_context"):
        DraftContext.parse(text)


def test_random_blocks_serve_one_generators_stream_in_order_across_refills():
    """RandomBlocks refills into two buffers in turn: the numbers served must
    be the generator's own blocks in draw order (at each window that finds
    too few unread numbers: max(BLOCK, n) normals, then as many uniforms),
    whatever the window sizes, and a window handed out must keep its numbers
    across the next refill (draw() reads normals, then asks for uniforms,
    which may refill the normals)."""
    blocks = RandomBlocks(np.random.default_rng(3))
    blocks.BLOCK = 64
    reference = np.random.default_rng(3)
    expected = [np.empty(0), np.empty(0)]

    def expect(n):  # what a window(n) call draws, from the unread counts before it
        for k, draw in ((0, reference.standard_normal), (1, reference.random)):
            if blocks._filled[k] - int(blocks._used[k]) < n:
                expected[k] = np.append(expected[k], draw(max(64, n)))

    served_n, served_u = [], []
    rng = np.random.default_rng(9)
    for step in range(300):
        n = int(rng.integers(0, 200))
        expect(n)
        window = blocks.window(n)
        assert len(window.normals) >= n and len(window.uniforms) >= n
        take = int(rng.integers(0, n + 1))
        served_n.append(window.normals[:take].copy())
        served_u.append(window.uniforms[:take].copy())
        window.used[:] = take
        blocks.consume(window)
        if step % 7 == 0:  # normals() then uniforms(): the first view must survive the second call's refill
            expect(150)
            first = blocks.normals(150)
            kept = first.copy()
            expect(150)
            served_u.append(blocks.uniforms(150).copy())
            assert np.array_equal(first, kept)
            served_n.append(kept)
    served_n, served_u = np.concatenate(served_n), np.concatenate(served_u)
    assert np.array_equal(served_n, expected[0][:len(served_n)])
    assert np.array_equal(served_u, expected[1][:len(served_u)])
    assert len(served_n) > 5000 and len(served_u) > 5000
