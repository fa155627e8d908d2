"""Serving with the shipped models: load them, build the synthetic task's
workloads, and serve one policy live (``simspec live``, validation).

Imports: torch, numpy, simspec.models, simspec.live.engine, simspec.costs,
simspec.policies, simspec.workloads, simspec.types.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable, Sequence

import numpy as np
import torch

from simspec import policies, seeds, workloads
from simspec.costs import CostModel, affine
from simspec.live.engine import LiveConfig, LiveEngine, LiveResult
from simspec.live.timing import AcceptanceReplay
from simspec.models.config import DrafterMeta
from simspec.models.drafter_train import load_drafter
from simspec.models.task import Example, generate
from simspec.models.train import load_target
from simspec.types import InputError, Request, require



@dataclass(frozen=True, slots=True, kw_only=True)
class Models:
    target: torch.nn.Module
    drafter: torch.nn.Module
    target_dir: str
    drafter_dir: str
    drafter_meta: DrafterMeta | None = None  # how the drafter was trained (None: random weights)


def load_models(target_dir: str = "checkpoints/target", drafter_dir: str = "checkpoints/drafter",
                device: str = "cpu") -> Models:
    """The shipped checkpoints, on ``device`` ("cpu", "cuda", "cuda:1", ...)."""
    target, _, _ = load_target(target_dir)
    drafter, meta = load_drafter(drafter_dir, target, target_dir)
    target.to(torch_device(device))
    drafter.to(torch_device(device))
    return Models(target=target, drafter=drafter, target_dir=target_dir, drafter_dir=drafter_dir, drafter_meta=meta)


def torch_device(name: str) -> torch.device:
    """``--device``: cpu or cuda[:N], checked against what this machine has."""
    try:
        device = torch.device(name)
    except RuntimeError:
        raise InputError(f"--device must be cpu or cuda[:N] (got {name!r})") from None
    require(device.type in ("cpu", "cuda"), f"--device must be cpu or cuda[:N] (got {name!r})")
    if device.type == "cuda":
        require(torch.cuda.is_available(), f"--device {name}: no CUDA device on this machine")
        require((device.index or 0) < torch.cuda.device_count(),
                f"--device {name}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    return device


def live_workload(cfg: workloads.WorkloadConfig, seed: int, max_output_tokens: int = 96,
                  visual_tokens: int = 16) -> tuple[list[Request], list[Example]]:
    """Requests of the synthetic task: arrivals and output lengths from the
    workload config (its seed's streams), prompts and images from task
    examples drawn with the same seed. Every request carries one image."""
    require(cfg.arrival != "trace", "live workloads need a synthetic arrival process (poisson, gamma or onoff)")
    streams = workloads.WorkloadStreams.from_seed_sequence(seeds.stream(seed, "workload"))
    base = workloads.make_requests(replace(cfg, multimodal_share=1.0, images_min=1, images_max=1), streams,
                                   visual_tokens_per_image=visual_tokens, max_context_tokens=4096)
    examples = generate(seeds.derived_seed(seed, "task-examples"), len(base))
    requests = [replace(r, prompt_tokens=len(e.prompt_ids), image_tokens=(visual_tokens,),
                        output_tokens=int(min(max(r.output_tokens, 2), max_output_tokens)))
                for r, e in zip(base, examples)]
    return requests, examples


def drafter_top1(models: Models, context: str) -> float:
    """The drafter's teacher-forced depth-1 top-1 rate for ``context`` (from its meta.json), as a prior."""
    require(models.drafter_meta is not None, "the drafter has no training record (meta.json) to take a prior from")
    table = models.drafter_meta.acceptance_teacher_forced
    return float(np.clip(table.get(context, table["full"])["top1_by_depth"][0], 0.05, 0.95))


def serve_live(models: Models, policy: str, requests: Sequence[Request], examples: Sequence[Example],
               costs: CostModel, live: LiveConfig, progress: Callable[[int], None] | None = None,
               replay: AcceptanceReplay | None = None, realtime: bool = True) -> LiveResult:
    engine = LiveEngine(models.target, models.drafter, policies.parse(policy), costs, live, replay)
    return engine.serve(requests, examples, label=policy, progress=progress, realtime=realtime)


def warm_up(models: Models, policy_specs: Sequence[str], live: LiveConfig) -> None:
    """Compile the policies' kernels and warm torch before anything is timed."""
    requests, examples = live_workload(workloads.WorkloadConfig(arrival="poisson", rate_per_s=1000.0,
                                                                num_requests=4, output_mean_tokens=8), 99)
    for spec in policy_specs:
        serve_live(models, spec, requests, examples, affine(1.0, 0.01), live)
