"""Timing-only live runs at a real model's shape (``simspec live --timing-only``).

Imports: torch, numpy, simspec's models, acceptance, workloads and costs.
DESIGN.md "Live engine": for real model sizes on a GPU, the live engine runs
a random-weight target of a real spec's shape (layers, width, heads, MLP,
vocabulary, vision encoder, visual tokens per image) and a drafter of the
same width, and takes acceptance from an :class:`AcceptanceReplay` instead
of the random weights' argmax: every step's kernels, batch shapes, caches and
scheduling are real, only *which* drafted tokens the target accepts is
replayed. The replayed acceptance is drawn from an acceptance model (the
simulator's, so both see the same statistics): fitted to the acceptance
traces of a live run (``--traces FILE.jsonl``, the same fit ``simspec
validate`` makes), a calibrated file, or a published preset.

Approximations, said where they are made: grouped-query attention is run as
full multi-head attention (exact for LLaVA-1.5's Vicuna; Qwen2's 4 KV heads
become 28), the image is one square grid of ``visual_tokens_per_image``
patches (LLaVA-1.6's AnyRes tiles are refused), and the prompt's text tokens
are random ids.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import torch

from simspec import seeds, workloads
from simspec.acceptance import AcceptanceModel, DraftContext, RandomBlocks
from simspec.costs import ModelSpec
from simspec.models.drafter import Drafter, DrafterConfig
from simspec.models.vlm import TargetVLM, VLMConfig
from simspec.types import MAX_RANK, Request, require

PATCH_PX = 14  # CLIP ViT-L/14 and Qwen2's ViT both use 14-pixel patches


@dataclass(frozen=True, slots=True)
class ShapedExample:
    """What the live engine reads of a task example: an image and a prompt."""

    image: np.ndarray  # [P, P, 3] uint8
    prompt_ids: tuple[int, ...]  # BOS + text tokens


def vlm_config(spec: ModelSpec) -> VLMConfig:
    """The target's shape for ``spec`` (see the module docstring)."""
    require(spec.multimodal, f"--model {spec.name}: timing-only runs need a VLM spec with visual tokens")
    grid = math.isqrt(spec.visual_tokens_per_image)
    require(grid * grid == spec.visual_tokens_per_image,
            f"--model {spec.name}: {spec.visual_tokens_per_image} visual tokens per image is not one square grid "
            "of patches (multi-tile images are not modelled in timing-only runs)")
    vision_heads = max(spec.vision_hidden // 64, 1)
    return VLMConfig(image_px=grid * PATCH_PX, patch_px=PATCH_PX, vision_width=spec.vision_hidden,
                     vision_layers=spec.vision_layers, vision_heads=vision_heads,
                     vision_mlp_hidden=spec.vision_mlp_hidden, width=spec.hidden, layers=spec.layers,
                     heads=spec.heads, mlp_hidden=spec.mlp_hidden, vocab_size=spec.vocab)


def shaped_models(spec: ModelSpec, *, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
                  seed: int = 0) -> tuple[TargetVLM, Drafter]:
    """A random-weight target of ``spec``'s shape and an EAGLE-style drafter
    of the same width (one decoder layer, the spec's MLP), on ``device``."""
    torch.manual_seed(seed)
    with torch.device(device):  # weights are made where they run: no host copy of a 7B model
        target = TargetVLM(vlm_config(spec)).to(dtype).eval()
        drafter = Drafter(DrafterConfig(width=spec.hidden, heads=spec.heads, mlp_hidden=spec.mlp_hidden),
                          target).to(dtype).eval()
    return target, drafter


def shaped_workload(cfg: workloads.WorkloadConfig, spec: ModelSpec, seed: int, *,
                    max_context_tokens: int) -> tuple[list[Request], list[ShapedExample]]:
    """Requests of ``cfg`` (every one with one image) and random images and
    prompts of their lengths; the seed's streams as in ``simspec simulate``."""
    require(cfg.arrival != "trace", "timing-only runs need a synthetic arrival process (poisson, gamma or onoff)")
    config = vlm_config(spec)
    streams = workloads.WorkloadStreams.from_seed_sequence(seeds.stream(seed, "workload"))
    requests = workloads.make_requests(replace(cfg, multimodal_share=1.0, images_min=1, images_max=1), streams,
                                       visual_tokens_per_image=spec.visual_tokens_per_image,
                                       max_context_tokens=max_context_tokens)
    rng = np.random.default_rng(seeds.stream(seed, "timing-examples"))
    examples = [ShapedExample(image=rng.integers(0, 256, (config.image_px, config.image_px, 3), dtype=np.uint8),
                              prompt_ids=(1, *rng.integers(3, spec.vocab, r.prompt_tokens - 1).tolist()))
                for r in requests]
    return requests, examples


class AcceptanceReplay:
    """Which drafted tokens the target accepts, per request and round, drawn
    from an acceptance model as the simulator draws them: a per-request
    difficulty at admission, then each round the target token's rank among
    the drafter's candidates at every depth, and the drafter's confidences."""

    def __init__(self, model: AcceptanceModel, context: DraftContext, seed: int = 0):
        self.model, self.context = model, context
        ss = seeds.stream(seed, "acceptance-replay")
        request_ss, round_ss = ss.spawn(2)
        self._requests = np.random.default_rng(request_ss)
        self._rounds = RandomBlocks(np.random.default_rng(round_ss))

    def admit(self, visual_tokens: int) -> tuple[float, float]:
        """A new request's difficulty (top-1 logit) and visual retention."""
        logit = float(self.model.request_logits(self._requests, 1)[0])
        retention = float(self.model.retention(self.context, np.array([visual_tokens]))[0])
        return logit, retention

    def round(self, logits: np.ndarray, retention: np.ndarray, depth: int) -> tuple[np.ndarray, np.ndarray]:
        """Confidences ``[B, depth, MAX_RANK]`` and true ranks ``[B, depth]`` (0: none) for one round."""
        drawn = self.model.draw(self._rounds, logits, retention, depth, MAX_RANK)
        return drawn.conf, drawn.true_ranks


def other_token(token: int, taken: set[int]) -> int:
    """``token`` unless it is one of ``taken`` (a drafted child the replay
    says the target did not pick); then the smallest id that is not."""
    if token not in taken:
        return token
    return next(t for t in range(len(taken) + 1) if t not in taken)
