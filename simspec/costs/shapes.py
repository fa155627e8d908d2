"""Linear layers at tensor parallelism: one cost law in a GEMM's shape, fitted across models.

Imports: numpy, pandas and scipy (to fit), simspec.costs.specs, simspec.types.

Vidur's token-level profiles time each linear operator of a decoder layer on
one GPU's shard at 1, 2, 4 and 8 tensor-parallel workers (imported to
``profiles/<device>/<model>/tp/<op>.csv``, simspec.profiling.vidur). Each is
a GEMM of M tokens by a K x N weight, Megatron-sharded as vLLM shards it:

- ``attn_pre_proj`` (fused QKV, column-parallel): K = hidden, N = (heads / tp
  + 2 x max(kv_heads / tp, 1)) x head_dim;
- ``attn_post_proj`` (row-parallel): K = heads / tp x head_dim, N = hidden;
- ``mlp_up_proj`` (gate and up, column-parallel): K = hidden, N = 2 x MLP / tp;
- ``mlp_down_proj`` (row-parallel): K = MLP / tp, N = hidden.

The law (:class:`ShapeLaw`) is a launch term plus the smooth maximum of a
bytes term (weights and activations in and out over an effective bandwidth)
and a FLOPs term (2MKN over an effective throughput), its sharpness fitted
too:  t = launch + ((bytes / bandwidth)^p + (flops / throughput)^p)^(1/p).
Its four constants are fitted per device and operator group (attention
projections, MLP projections) by least squares of log time, on the points of
some models, and judged on others' (:func:`held_out_check`): the law knows a
model only by its GEMMs' shapes, so a shape it never saw is a fair test.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, fields, replace
from pathlib import Path

import numpy as np

from simspec.costs.catalog import MODELS
from simspec.costs.specs import ModelSpec
from simspec.types import InputError

SHARD_FOLDER = "tp"  # as simspec.profiling.vidur writes it
GROUPS = {"attention": ("attn_pre_proj", "attn_post_proj"), "mlp": ("mlp_up_proj", "mlp_down_proj")}
DEGREES = (1, 2, 4, 8)
# Which measured shapes fit the law and which judge it, per device: on H100 Vidur measured four shapes,
# on A100 two (there: fit on 7B, predict 70B).
HELD_OUT = {"h100-sxm": (("Llama-2-7B", "CodeLlama-34B"), ("Llama-2-70B", "Qwen-72B")),
            "a100-80gb": (("Llama-2-7B",), ("Llama-3-70B",))}


def gemm_shape(op: str, model: ModelSpec, tp: int) -> tuple[int, int]:
    """(K, N) of one GPU's shard of ``op``'s weight at ``tp`` workers (module docstring)."""
    d, heads, kv = model.head_dim, model.heads // tp, max(model.kv_heads // tp, 1)
    shapes = {"attn_pre_proj": (model.hidden, (heads + 2 * kv) * d), "attn_post_proj": (heads * d, model.hidden),
              "mlp_up_proj": (model.hidden, 2 * model.mlp_hidden // tp), "mlp_down_proj": (model.mlp_hidden // tp,
                                                                                            model.hidden)}
    if op not in shapes:
        raise InputError(f"shape law: operator {op!r} is none of {', '.join(shapes)}")
    return shapes[op]


@dataclass(frozen=True, slots=True, kw_only=True)
class ShapeLaw:
    """t = launch_s + ((bytes / bytes_per_s)^sharpness + (flops / flops_per_s)^sharpness)^(1/sharpness)."""

    launch_s: float  # a call's fixed time (launch, tail of the last wave)
    bytes_per_s: float  # effective bandwidth for weights and activations
    flops_per_s: float  # effective throughput of the GEMM
    sharpness: float  # 1: bytes and FLOPs times add; large: the larger of them
    source: str = ""  # what it was fitted to, as a cost-model label says it

    def seconds(self, tokens, k, n, dtype_bytes: int = 2):
        """One GEMM of ``tokens`` x ``k`` by ``k`` x ``n`` (arrays broadcast)."""
        tokens, k, n = (np.asarray(v, dtype=float) for v in (tokens, k, n))
        memory = dtype_bytes * (k * n + tokens * k + tokens * n) / self.bytes_per_s
        compute = 2.0 * tokens * k * n / self.flops_per_s
        p = self.sharpness
        return self.launch_s + (memory**p + compute**p) ** (1.0 / p)

    def layer_seconds(self, group: str, model: ModelSpec, tokens):
        """One decoder layer's GEMMs of ``group`` for ``model`` at its own tensor-parallel degree."""
        shapes = [gemm_shape(op, model, model.tensor_parallel) for op in GROUPS[group]]
        return sum(self.seconds(tokens, k, n, model.dtype_bytes) for k, n in shapes)


@dataclass(frozen=True, slots=True, kw_only=True)
class Points:
    """Measured GEMMs: one entry per row of the shard tables."""

    tokens: np.ndarray  # M
    k: np.ndarray
    n: np.ndarray
    tp: np.ndarray
    seconds: np.ndarray  # the row's median


def read_points(folder: Path, model: ModelSpec, group: str) -> Points:
    """The rows of ``group``'s operators in ``folder/tp/`` (a profile folder of ``model``)."""
    import pandas as pd

    parts = []
    for op in GROUPS[group]:
        path = Path(folder) / SHARD_FOLDER / f"{op}.csv"
        if not path.is_file():
            raise InputError(f"shape law: {path} is missing (import Vidur's profiles with --import-vidur)")
        table = pd.read_csv(path)
        missing = [c for c in ("tp", "tokens", "median_ms") if c not in table.columns]
        if missing:
            raise InputError(f"shape law: {path}: missing column(s) {', '.join(missing)}")
        bad = sorted(set(table["tp"]) - set(DEGREES))
        if bad:
            raise InputError(f"shape law: {path}: tp must be one of {', '.join(map(str, DEGREES))} (got {bad[0]})")
        shapes = np.array([gemm_shape(op, model, int(t)) for t in table["tp"]], dtype=float).reshape(-1, 2)
        parts.append((table["tokens"].to_numpy(float), shapes[:, 0], shapes[:, 1], table["tp"].to_numpy(int),
                      table["median_ms"].to_numpy(float) * 1e-3))
    tokens, k, n, tp, seconds = (np.concatenate(cols) for cols in zip(*parts))
    return Points(tokens=tokens, k=k, n=n, tp=tp, seconds=seconds)


def _joined(points: list[Points]) -> Points:
    return Points(**{f.name: np.concatenate([getattr(p, f.name) for p in points]) for f in fields(Points)})


def fit_law(points: Points) -> ShapeLaw:
    """The law's constants, by least squares of log time over ``points`` (all in log space: positive)."""
    from scipy.optimize import least_squares

    def law(x):
        launch, bw, fl, p = np.exp(x)
        return ShapeLaw(launch_s=launch, bytes_per_s=bw, flops_per_s=fl, sharpness=p)

    def residuals(x):
        return np.log(law(x).seconds(points.tokens, points.k, points.n)) - np.log(points.seconds)

    start = np.log([5e-6, 2e12, 5e14, 1.5])  # microseconds, TB/s, hundreds of TFLOP/s: a GPU's order
    return law(least_squares(residuals, start).x)


def relative_errors(law: ShapeLaw, points: Points) -> np.ndarray:
    """|predicted - measured| / measured at each point."""
    return np.abs(law.seconds(points.tokens, points.k, points.n) / points.seconds - 1.0)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    """One held-out model x degree of one device and operator group."""

    device: str
    group: str
    model: str
    tp: int
    median_error: float  # relative
    points: int


def _folder(root: Path, device: str, name: str) -> Path:
    folder = root / device / name
    if not (folder / SHARD_FOLDER).is_dir():
        raise InputError(f"shape law: no tensor-parallel tables in {folder / SHARD_FOLDER} (import Vidur's "
                         "profiles with `simspec profile-gpu --import-vidur DIR`)")
    return folder


def fit_device(root: Path, device: str, group: str, models: tuple[str, ...]) -> ShapeLaw:
    """The law of ``group`` on ``device`` fitted to ``models``' tp tables under ``root``."""
    return fit_law(_joined([read_points(_folder(root, device, m), MODELS[m], group) for m in models]))


@dataclass(frozen=True, slots=True, kw_only=True)
class GroupCheck:
    """The held-out check of one device and operator group."""

    device: str
    group: str
    law: ShapeLaw  # fitted on HELD_OUT[device][0]
    rows: tuple[HeldOut, ...]  # per held-out model and degree
    median_error: float  # over every held-out point of the group
    points: int


def measured_models(root: Path, device: str) -> tuple[str, ...]:
    """The catalogue models with tensor-parallel GEMM tables on ``device`` under ``root``."""
    folder = Path(root) / device
    if not folder.is_dir():
        return ()
    return tuple(sorted(p.name for p in folder.iterdir() if p.name in MODELS and (p / SHARD_FOLDER).is_dir()))


@functools.lru_cache(maxsize=16)
def device_laws(root: str, device: str) -> tuple[ShapeLaw, ShapeLaw] | None:
    """The (attention, MLP) laws of ``device`` fitted to every model it has
    tensor-parallel tables of (None: it has none), as ``auto`` prices a
    sharded model's linear layers with them."""
    models = measured_models(Path(root), device)
    if not models:
        return None
    source = f"Vidur's tensor-parallel GEMMs of {', '.join(models)} on {device}"
    return tuple(replace(fit_device(Path(root), device, group, models), source=source) for group in GROUPS)


def held_out_check(root: Path, devices: tuple[str, ...] | None = None) -> list[GroupCheck]:
    """Per device (of :data:`HELD_OUT`) and group: the law fitted on the device's small shapes,
    judged on the big ones, per held-out model and degree and over all of them."""
    checks = []
    for device in devices or tuple(HELD_OUT):
        if device not in HELD_OUT:
            raise InputError(f"--held-out-shapes: device {device} has no held-out shapes (known: "
                             f"{', '.join(HELD_OUT)})")
        fit_on, judged = HELD_OUT[device]
        for group in GROUPS:
            law = fit_device(root, device, group, fit_on)
            rows, pooled = [], []
            for name in judged:
                points = read_points(_folder(root, device, name), MODELS[name], group)
                errors = relative_errors(law, points)
                pooled.append(errors)
                for tp in DEGREES:
                    chosen = errors[points.tp == tp]
                    rows.append(HeldOut(device=device, group=group, model=name, tp=tp,
                                        median_error=float(np.median(chosen)), points=int(chosen.size)))
            every = np.concatenate(pooled)
            checks.append(GroupCheck(device=device, group=group, law=law, rows=tuple(rows),
                                     median_error=float(np.median(every)), points=int(every.size)))
    return checks


def table(checks: list[GroupCheck]) -> str:
    """The check as text: per device, each group's fitted constants and pooled error, then one line
    per group, held-out model and degree."""
    lines = []
    for device in dict.fromkeys(c.device for c in checks):
        fit_on, judged = HELD_OUT[device]
        lines.append(f"{device}: fitted on {', '.join(fit_on)}; held out {', '.join(judged)}")
        mine = [c for c in checks if c.device == device]
        for c in mine:
            law = c.law
            lines.append(f"  {c.group}: launch {law.launch_s * 1e6:.2f} us, {law.bytes_per_s / 1e12:.2f} TB/s, "
                         f"{law.flops_per_s / 1e12:.0f} TFLOP/s, sharpness {law.sharpness:.2f}; held-out median "
                         f"error {c.median_error:.1%} over {c.points} points")
        lines.append(f"  {'group':<10} {'model':<14} {'tp':>2} {'median err':>10} {'points':>6}")
        for r in (r for c in mine for r in c.rows):
            lines.append(f"  {r.group:<10} {r.model:<14} {r.tp:>2} {r.median_error:>10.1%} {r.points:>6}")
    return "\n".join(lines)
