"""Cost models: how long each piece of an engine step takes on a device.

Imports: numpy, simspec.types, simspec.files and simspec.compiled (the cache
folder; never simpy or torch). scipy and pandas are imported only to fit.
``build`` turns the user's ``--cost-model`` string into a model:

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
import hashlib
import importlib.metadata
import pickle
import sys
from dataclasses import fields, replace
from pathlib import Path

import numpy as np

from simspec.compiled import cache_root
from simspec.costs import collectives, fitted, profiles, steps
from simspec.costs.base import CostModel, CostTables, LocalAttention
from simspec.costs.closed_form import affine, constant
from simspec.costs import gpus
from simspec.costs.roofline import roofline
from simspec.costs.hfconfig import model_spec
from simspec.costs.catalog import MODELS
from simspec.costs.gpus import GPUS, GpuSpec
from simspec.costs.specs import ModelSpec
from simspec.files import write_bytes
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
    return gpus.gpu_spec(slug)  # raises the error that lists the known devices

__all__ = ["CostModel", "CostTables", "constant", "affine", "roofline", "GpuSpec", "ModelSpec",
           "GPUS", "MODELS", "gpu_spec", "model_spec", "build", "COST_MODEL_FORMS"]

COST_MODEL_FORMS = "auto, roofline, profile:DIR, steps:FILE, constant:STEP_MS, affine:BASE_MS,PER_TOKEN_MS"


def _roofline(model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, engine: str = "simspec",
              measured_linear: bool = False) -> CostModel:
    """The datasheet prior, refused for a device known only from profiles of
    other models; ``measured_linear``: a dense 16-bit model sharded over
    several GPUs gets its linear layers from the device's shape laws where
    it has tensor-parallel GEMM tables (simspec.costs.shapes)."""
    if gpu.hbm_bytes_per_s <= 0 or gpu.bf16_flops <= 0:
        folder = (profiles_root or profiles.default_root()) / gpu.slug
        profiled = sorted(p.name for p in folder.glob("*") if (p / "meta.json").is_file())
        raise InputError(f"device {gpu.slug} has no datasheet for a roofline prior and no profile of {model.name} "
                         f"(profiled models: {', '.join(profiled) or 'none'}; profile it with `simspec profile-gpu "
                         f"--model {model.name}` or choose a datasheet GPU: {', '.join(GPUS)})")
    comm = linear = None
    root = profiles_root or profiles.default_root()
    if model.tensor_parallel > 1:
        comm = collectives.all_reduce(gpu, model.tensor_parallel, root, engine)
        if measured_linear and not model.sparse_layers and model.weight_bytes_per_param == 2:
            from simspec.costs import shapes  # pandas and scipy: only for a sharded model on a measured device

            linear = shapes.device_laws(str(root), gpu.slug)
    return roofline(model, gpu, all_reduce=comm, linear=linear)


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


def build(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None = None,
          engine: str = "simspec") -> CostModel:
    """The cost model named by ``spec`` for ``model`` on ``gpu``. Fitting a
    profile takes longer than simulating a few hundred requests, so models
    are kept per process, keyed also by the size and time of every file they
    were built from: a new or re-measured profile is refitted. CostModel is
    frozen (its tables read-only), so sharing one is safe. ``engine`` (an
    engine mode) decides how a tensor-parallel prior prices its
    all-reduces (simspec.costs.collectives.for_engine)."""
    return _build(spec, model, gpu, profiles_root, _sources(spec, gpu, profiles_root), engine)


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
def _build(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, sources: tuple,
           engine: str = "simspec") -> CostModel:
    if sources:
        return _stored(spec, model, gpu, profiles_root, sources, engine)
    return _make(spec, model, gpu, profiles_root, engine)


STORED_MODELS = 16
"""Fitted cost models kept on disk (:func:`_stored`), the newest."""
FITTED_BY = (Path(__file__).resolve().parent, Path(__file__).resolve().parents[1] / "types.py")
"""The code a fit depends on: every module of simspec.costs, and simspec.types."""


def _stored(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, sources: tuple,
            engine: str = "simspec") -> CostModel:
    """:func:`_make`'s model of files (a profile, logged steps), kept between
    processes beside the compiled code (``cache_root()/cost-models``): a fit
    costs ~0.5 s of CPU and imports scipy and pandas (~1.2 s more), which a
    ``simspec simulate`` process otherwise pays every time. The key hashes
    the bytes of every file read (not their times) and of every module in
    :data:`FITTED_BY`, the arguments, and the versions of Python, numpy,
    scipy and pandas: any change to any of them refits. Where the folder
    cannot be read or written, the model is fitted as before."""
    versions = [sys.version, np.__version__]
    for package in ("scipy", "pandas"):
        try:
            versions.append(importlib.metadata.version(package))
        except importlib.metadata.PackageNotFoundError:
            versions.append(None)
    key = (spec, model, gpu, str(profiles_root), versions, _prior_terms())
    digest = hashlib.sha256(repr(key if engine == "simspec" else (*key, engine)).encode())
    code = sorted(p for root in FITTED_BY for p in (root.rglob("*.py") if root.is_dir() else [root]))
    for path in [Path(src) for src, _, _ in sources] + code:
        digest.update(str(path).encode() + b"\0" + path.read_bytes() + b"\0")
    path = cache_root() / "cost-models" / f"{digest.hexdigest()[:32]}.pickle"
    try:
        with open(path, "rb") as f:
            stored = pickle.load(f)
        if isinstance(stored, CostModel):
            for name in (f.name for f in fields(stored)):
                if isinstance(value := getattr(stored, name), np.ndarray):
                    value.flags.writeable = False  # as frozen_table left it
            return stored
    except Exception:  # absent, unreadable, or written by other code: fit again
        pass
    made = _make(spec, model, gpu, profiles_root, engine)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write_bytes(path, pickle.dumps(made, protocol=pickle.HIGHEST_PROTOCOL))
        kept = sorted(path.parent.glob("*.pickle"), key=lambda p: p.stat().st_mtime_ns, reverse=True)
        for old in kept[STORED_MODELS:]:  # ~1 MB each: the most recently fitted are kept
            old.unlink(missing_ok=True)
    except OSError:
        pass
    return made


def _prior_terms() -> str:
    """The roofline prior's fixed terms as this process holds them: a fit to
    the published results (benchmarks/published.py --fit) varies them at run
    time, which no source file shows, so they key the store too."""
    prior = sys.modules["simspec.costs.roofline"]
    return repr((prior.FIXED, prior.ATTENTION_FIXED))


def _make(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, engine: str = "simspec") -> CostModel:
    """The cost model ``spec`` names, pricing ``model``'s chunked layers (LocalAttention) where it has them."""
    made = _priced(spec, model, gpu, profiles_root, engine)
    if not model.attention_chunk:
        return made
    return replace(made, local=LocalAttention(model.attention_chunk, model.chunked_layers / model.layers))


def _priced(spec: str, model: ModelSpec, gpu: GpuSpec, profiles_root: Path | None, engine: str) -> CostModel:
    kind, _, args = spec.partition(":")
    kind = kind.strip().lower()
    if kind == "auto" and not args:
        found = profiles.find(gpu.slug, model, profiles_root)
        return fitted.fit_profiles(found, model, gpu).cost_model if found else _roofline(model, gpu, profiles_root,
                                                                                          engine, measured_linear=True)
    if kind == "profile" and args:
        profile = profiles.load(args)
        profiles.check_fits(profile, model, gpu)
        return fitted.fit_profiles([profile], model, gpu).cost_model
    if kind == "steps" and args:
        return steps.load_step_costs(args, model=model.name, device=gpu.slug)
    if kind == "roofline" and not args:
        return _roofline(model, gpu, profiles_root, engine)
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
