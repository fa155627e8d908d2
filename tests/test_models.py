"""The live models: task generator, target VLM, training, shipped checkpoint."""

from __future__ import annotations

import dataclasses
import json
import re
import shutil
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from simspec.models import task  # noqa: E402
from simspec.models.config import QUICK  # noqa: E402
from simspec.models.train import accuracy, eval_examples, load_target, train_target  # noqa: E402
from simspec.models.vlm import TargetVLM, VLMConfig  # noqa: E402
from simspec.types import InputError  # noqa: E402

CHECKPOINT = Path(__file__).resolve().parents[1] / "checkpoints" / "target"


# --- task -------------------------------------------------------------------

def test_generator_is_deterministic():
    a, b = task.generate(7, 50), task.generate(7, 50)
    assert all(np.array_equal(x.image, y.image) and x.prompt_ids == y.prompt_ids
               and x.answer_ids == y.answer_ids for x, y in zip(a, b))
    assert task.dataset_hash(7, 50) == task.dataset_hash(7, 50)
    assert task.dataset_hash(7, 50) != task.dataset_hash(8, 50)
    assert a[0].image.dtype == np.uint8 and a[0].image.shape == (task.IMAGE_PX, task.IMAGE_PX, 3)


def test_every_template_appears_and_grounding_matches_the_template():
    examples = task.generate(0, 300)
    assert {e.question.kind for e in examples} == set(task.KINDS)
    for e in examples:
        grounded = task.image_grounded_positions(e)
        assert len(e.grounded) == len(e.answer_ids)
        assert (len(grounded) == 0) == (e.question.kind == "repeat")


def _recoloured(scene: task.Scene) -> task.Scene:
    """Every shape gets the next colour and the next shape."""
    colours = list(task.COLOURS)
    cells = tuple(None if c is None else (colours[(colours.index(c[0]) + 1) % len(colours)],
                                          task.SHAPES[(task.SHAPES.index(c[1]) + 1) % len(task.SHAPES)])
                  for c in scene.cells)
    return dataclasses.replace(scene, cells=cells)


@pytest.mark.parametrize("kind", ["colour_at", "shape_at", "repeat"])
def test_grounded_tokens_follow_the_image_and_the_rest_do_not(kind):
    vocab = task.default_vocab()
    example = next(e for e in task.generate(3, 200) if e.question.kind == kind)
    changed = task.make_example(_recoloured(example.scene), example.question, vocab)
    assert not np.array_equal(changed.image, example.image)
    grounded = set(task.image_grounded_positions(example))
    for i, (old, new) in enumerate(zip(example.answer_ids, changed.answer_ids)):
        assert (old != new) == (i in grounded), (kind, i)


def test_counts_follow_the_image():
    vocab = task.default_vocab()
    scene = task.Scene(cells=(("red", "circle"), ("red", "square"), None, ("blue", "circle")),
                       jitter_px=((0, 0),) * 4)
    ask = task.Question(kind="count_colour", slot="red")
    assert vocab.decode(task.make_example(scene, ask, vocab).answer_ids) == ("there", "are", "two", ".")
    ask = task.Question(kind="count_shape", slot="circle")
    assert vocab.decode(task.make_example(scene, ask, vocab).answer_ids) == ("there", "are", "two", ".")
    # the square becomes the only circle
    assert vocab.decode(task.make_example(_recoloured(scene), ask, vocab).answer_ids)[2] == "one"


# --- model ------------------------------------------------------------------

@pytest.fixture(scope="module")
def random_model():
    torch.manual_seed(0)
    return TargetVLM(VLMConfig(vocab_size=task.default_vocab().size)).eval()


@pytest.mark.parametrize("batch,length", [(1, 1), (3, 7), (2, 17)])
def test_forward_shapes(random_model, batch, length):
    c = random_model.config
    images = torch.randint(0, 256, (batch, c.image_px, c.image_px, 3), dtype=torch.uint8)
    out = random_model(images, torch.randint(0, c.vocab_size, (batch, length)))
    assert out.logits.shape == (batch, length, c.vocab_size)
    assert out.hidden.shape == (batch, length, c.width)
    assert out.visual.shape == (batch, c.visual_tokens, c.width)


def test_wrong_image_shape_is_rejected(random_model):
    with pytest.raises(InputError, match="images must be"):
        random_model(torch.zeros(1, 16, 16, 3, dtype=torch.uint8), torch.zeros(1, 3, dtype=torch.long))


def _uncached_greedy(model, image, prompt, steps):
    sequence = list(prompt)
    with torch.no_grad():
        for _ in range(steps):
            sequence.append(int(model(image[None], torch.tensor([sequence])).logits[0, -1].argmax()))
    return sequence[len(prompt):]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_cached_generation_equals_uncached_greedy(random_model, seed):
    # Random weights give varied tokens; the trained model is checked below.
    example = task.generate(seed, 1)[0]
    image = torch.from_numpy(example.image)
    cached = random_model.generate(image, example.prompt_ids, 12, eos_id=None)
    assert cached == _uncached_greedy(random_model, image, example.prompt_ids, 12)


# --- training ---------------------------------------------------------------

@pytest.mark.slow
def test_quick_training_is_bit_reproducible_and_learns(tmp_path):
    metas = [train_target(tmp_path / name, steps=QUICK.steps, seed=5, quick=True) for name in ("a", "b")]
    first, second = (torch.load(tmp_path / name / "model.pt", weights_only=True) for name in ("a", "b"))
    assert first.keys() == second.keys()
    assert all(torch.equal(first[k], second[k]) for k in first)
    assert metas[0].data_hash == metas[1].data_hash == task.examples_hash(task.generate(5, 256))
    assert metas[0].loss_last < 0.7 * metas[0].loss_first


# --- shipped checkpoint -----------------------------------------------------

@pytest.fixture(scope="module")
def shipped():
    if not (CHECKPOINT / "model.pt").is_file():
        pytest.fail(f"shipped checkpoint missing at {CHECKPOINT}; run `simspec train`")
    return load_target(CHECKPOINT)


def test_shipped_checkpoint_meets_its_recorded_accuracy(shipped):
    model, vocab, meta = shipped
    examples = eval_examples(meta.seed, 100)
    measured = accuracy(model, examples, vocab)["all"]
    assert meta.heldout_accuracy > 0.8
    assert measured > 0.8
    assert abs(measured - meta.heldout_accuracy) <= 0.05


def test_shipped_checkpoint_cached_decoding_equals_uncached(shipped):
    model, vocab, meta = shipped
    for example in eval_examples(meta.seed, 3):
        image = torch.from_numpy(example.image)
        cached = model.generate(image, example.prompt_ids, 6, eos_id=None)
        assert cached == _uncached_greedy(model, image, example.prompt_ids, 6)


@pytest.mark.parametrize("damage", ["truncate_weights", "garbage_meta", "missing_weights", "wrong_width"])
def test_bad_checkpoint_raises_input_error_naming_the_file(tmp_path, damage):
    if not (CHECKPOINT / "model.pt").is_file():
        pytest.fail(f"shipped checkpoint missing at {CHECKPOINT}")
    folder = tmp_path / "ckpt"
    shutil.copytree(CHECKPOINT, folder)
    weights, meta = folder / "model.pt", folder / "meta.json"
    if damage == "truncate_weights":
        weights.write_bytes(weights.read_bytes()[:1000])
        named = weights
    elif damage == "garbage_meta":
        meta.write_text("{not json")
        named = meta
    elif damage == "missing_weights":
        weights.unlink()
        named = weights
    else:
        record = json.loads(meta.read_text())
        record["config"]["width"] = 64
        meta.write_text(json.dumps(record))
        named = weights
    with pytest.raises(InputError, match=re.escape(str(named))):
        load_target(folder)
