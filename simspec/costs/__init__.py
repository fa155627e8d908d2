"""Cost models: how long each piece of an engine step takes on a device.

Imports: numpy and simspec.types (never simpy or torch). ``build`` turns the
user's ``--cost-model`` string into a model:

- ``auto`` (default): fitted to ``profiles/<device>/<model>`` when the device
  has a profile of the model (or of a model with the same decoder layers),
  else the roofline prior.
- ``roofline``: datasheet prior, uncalibrated.
- ``profile:DIR``: fitted to the profile in DIR.
- ``steps:FILE``: fitted to live engine steps (simspec.costs.steps, ``simspec validate``).
- ``constant:STEP_MS``: every step costs STEP_MS.
- ``affine:BASE_MS,PER_TOKEN_MS``: BASE_MS per step + PER_TOKEN_MS per target token.
"""

from __future__ import annotations

import functools
from pathlib import Path

from simspec.costs import fitted, profiles, steps
from simspec.costs.base import CostModel, CostTables
from simspec.costs.closed_form import affine, constant
from simspec.costs import specs
from simspec.costs.roofline import roofline
from simspec.costs.specs import GPUS, MODELS, GpuSpec, ModelSpec, model_spec
from simspec.types import InputError


def gpu_spec(slug: str, profiles_root: Path | None = None) -> GpuSpec:
    """A GPU from the datasheet catalogue, a device known from its profiles,
    or a host CPU (``cpu`` or ``cpu-NAME``) known by nothing else: no
    bandwidth, FLOPs or memory, so only a measured or fitted cost model
    (``profile:``, ``steps:``) prices it and ``--kv-cache-tokens`` sizes its
    KV cache (as for a vLLM CPU server, whose cache is VLLM_CPU_KVCACHE_SPACE)."""
    known = profiles.device(slug, profiles_root)
    if known is not None:
        return known
    if slug.lower() == "cpu" or slug.lower().startswith("cpu-"):
        return GpuSpec(name=f"host CPU ({slug.lower()})", slug=slug.lower(), memory_bytes=0.0, hbm_bytes_per_s=0.0,
                       bf16_flops=0.0)
    return specs.gpu_spec(slug)  # raises the error that lists the known devices

__all__ = ["CostModel", "CostTables", "constant", "affine", "roofline", "GpuSpec", "ModelSpec",
           "GPUS", "MODELS", "gpu_spec", "model_spec", "build", "COST_MODEL_FORMS"]

COST_MODEL_FORMS = "auto, roofline, profile:DIR, steps:FILE, constant:STEP_MS, affine:BASE_MS,PER_TOKEN_MS"


def _roofline(model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None) -> CostModel:
    """The datasheet prior, refused for a device known only from profiles of other models."""
    if gpu.hbm_bytes_per_s <= 0 or gpu.bf16_flops <= 0:
        folder = (profiles_root or profiles.default_root()) / gpu.slug
        profiled = sorted(p.name for p in folder.glob("*") if (p / "meta.json").is_file())
        raise InputError(f"device {gpu.slug} has no datasheet for a roofline prior and no profile of {model.name} "
                         f"(profiled models: {', '.join(profiled) or 'none'}; profile it with `simspec profile-gpu "
                         f"--model {model.name}` or choose a datasheet GPU: {', '.join(GPUS)})")
    return roofline(model, gpu)


MAX_STEP_MS = 1e6  # a closed-form step price above 1000 s is a typo


def _numbers(text: str, count: int, form: str) -> list[float]:
    parts = text.split(",")
    try:
        values = [float(p) for p in parts]
    except ValueError:
        values = []
    if len(values) != count:
        raise InputError(f"cost_model must look like {form} (got {text!r})")
    if not all(0 <= v <= MAX_STEP_MS for v in values):  # also refuses nan
        raise InputError(f"cost_model {form}: each number must be in [0, {MAX_STEP_MS:g}] ms (got {text!r})")
    return values


def build(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None = None) -> CostModel:
    """The cost model named by ``spec`` for ``model`` on ``gpu``. Fitting a
    profile takes longer than simulating a few hundred requests, so models
    are kept per process, keyed also by the size and time of every file they
    were built from: a new or re-measured profile is refitted. CostModel is
    frozen (its tables read-only), so sharing one is safe."""
    return _build(spec, model, gpu, profiles_root, _sources(spec, gpu, profiles_root))


def _sources(spec: str, gpu: GpuSpec, profiles_root: Path | None) -> tuple:
    """(path, mtime, size) of every file ``spec`` reads for ``gpu``."""
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "auto" and not args:
        folder = (profiles_root or profiles.default_root()) / gpu.slug
    elif kind in ("profile", "steps") and args:
        folder = Path(args)
    else:
        return ()
    files = sorted(folder.rglob("*")) if folder.is_dir() else [folder] if folder.is_file() else []
    return tuple((str(f), f.stat().st_mtime_ns, f.stat().st_size) for f in files if f.is_file())


@functools.lru_cache(maxsize=64)
def _build(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, sources: tuple) -> CostModel:
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "auto" and not args:
        found = profiles.find(gpu.slug, model, profiles_root)
        return fitted.fit_profiles(found, model, gpu).cost_model if found else _roofline(model, gpu, profiles_root)
    if kind == "profile" and args:
        profile = profiles.load(args)
        profiles.check_fits(profile, model, gpu)
        return fitted.fit_profiles([profile], model, gpu).cost_model
    if kind == "steps" and args:
        return steps.load_step_costs(args, model=model.name, device=gpu.slug)
    if kind == "roofline" and not args:
        return _roofline(model, gpu, profiles_root)
    if kind == "constant":
        (step_ms,) = _numbers(args, 1, "constant:STEP_MS")
        if not step_ms > 0:
            raise InputError(f"cost_model constant STEP_MS must be > 0 (got {step_ms})")
        return constant(step_ms)
    if kind == "affine":
        base_ms, per_token_ms = _numbers(args, 2, "affine:BASE_MS,PER_TOKEN_MS")
        if base_ms < 0 or per_token_ms < 0 or base_ms + per_token_ms <= 0:
            raise InputError(f"cost_model affine needs BASE_MS >= 0, PER_TOKEN_MS >= 0, not both 0 (got {args})")
        return affine(base_ms, per_token_ms)
    raise InputError(f"cost_model must be one of {COST_MODEL_FORMS} (got {spec!r})")
