"""Profiling grids: the operators of a profile and the shapes each is measured at.

Imports: the standard library and simspec.costs (never torch), so the CLI
can list operators and validate flags on a machine without torch.

A profile folder holds one table per operator (profiles/README.md): shape
columns, then ``median_ms,p10_ms,p90_ms,samples,skipped``. Each operator's
points are the product of a few grid axes; ``--quick`` measures a subset of
the full grid, and on a CPU it stops at 512 tokens and 4096 context tokens
so that one 7B-class model profiles in a few minutes.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

from simspec.costs import ModelSpec
from simspec.costs.profiles import LAYER_OPS

TIMING_COLUMNS = ("median_ms", "p10_ms", "p90_ms", "samples", "skipped")
DEFAULT_MODELS = ("LLaVA-1.5-7B", "LLaVA-1.6-13B", "Qwen2-VL-7B")
SELECT_LAYERS = 4  # verifier layers whose saved queries vote in visual-token selection
SELECT_KEPT_TOKENS = 8  # visual tokens selected per request (Uni-LaSpec's default)


@dataclass(frozen=True, slots=True, kw_only=True)
class Grid:
    """The values each shape axis takes. Every operator's points are a
    product of some of these axes (``OPS``)."""

    name: str  # "full", "quick", ...: recorded in meta.json
    tokens: tuple[int, ...]  # tokens per step: per-layer pieces, LM head
    prefill_tokens: tuple[int, ...]  # chunk tokens of attn_prefill
    prefill_contexts: tuple[int, ...]  # tokens cached before the chunk (0: first chunk)
    contexts: tuple[int, ...]  # context tokens per request: attn_decode, attn_tree_verify
    query_tokens: tuple[int, ...]  # tree nodes per request: attn_tree_verify
    batches: tuple[int, ...]  # requests: attn_decode, attn_tree_verify
    requests: tuple[int, ...]  # requests selecting visual tokens in one step: select
    draft_tokens: tuple[int, ...]  # draft positions of one drafter step
    kept_tokens: tuple[int, ...]  # kept visual tokens per request: drafter_step
    visual_tokens: tuple[int, ...]  # visual tokens of one request: select, int8_quantize
    images: tuple[int, ...]  # images through the vision encoder

    def __post_init__(self):
        for name in self.__slots__:
            values = getattr(self, name)
            if name != "name" and (not values or min(values) < 0 or len(set(values)) != len(values)):
                raise ValueError(f"grid {self.name}: {name} must be distinct non-negative ints (got {values})")


@dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One operator table: its CSV shape columns and the grid axis of each."""

    name: str
    columns: tuple[str, ...]  # shape columns of the CSV, in order
    axes: tuple[str, ...]  # Grid field giving each column's values
    multimodal: bool = False  # only profiled for models with a vision encoder

    @property
    def header(self) -> tuple[str, ...]:
        return self.columns + TIMING_COLUMNS


def _per_token(name: str) -> Op:
    return Op(name=name, columns=("tokens",), axes=("tokens",))


OPS: dict[str, Op] = {op.name: op for op in (
    *(_per_token(name) for name in LAYER_OPS),
    Op(name="attn_prefill", columns=("tokens", "context_tokens"), axes=("prefill_tokens", "prefill_contexts")),
    Op(name="attn_decode", columns=("batch", "context_tokens"), axes=("batches", "contexts")),
    Op(name="attn_tree_verify", columns=("batch", "query_tokens", "context_tokens"),
       axes=("batches", "query_tokens", "contexts")),
    _per_token("lm_head"),
    Op(name="vision_encoder", columns=("images",), axes=("images",), multimodal=True),
    Op(name="drafter_step", columns=("tokens", "kept_tokens"), axes=("draft_tokens", "kept_tokens")),
    Op(name="select", columns=("requests", "visual_tokens"), axes=("requests", "visual_tokens"), multimodal=True),
    Op(name="int8_quantize", columns=("visual_tokens",), axes=("visual_tokens",), multimodal=True),
)}
"""Operator names follow Vidur's profiles for the per-layer pieces."""

VIDUR_OPS = LAYER_OPS
"""The per-layer operators Vidur's token-level (mlp.csv) profiles measure: the cost model's decoder-layer pieces."""


def ops_for(model: ModelSpec) -> list[Op]:
    """The operators profiled for ``model`` (no vision ones for a text-only LM)."""
    return [op for op in OPS.values() if model.multimodal or not op.multimodal]


CONTEXT_AXES = ("prefill_tokens", "prefill_contexts", "contexts", "query_tokens", "visual_tokens")
"""Axes whose values are tokens of one request's context: clipped to the model's max_context_tokens."""


def _clip(op: Op, model: ModelSpec, point: tuple[int, ...]) -> tuple[int, ...]:
    """``point`` within the model's context: one request's context tokens
    plus its queries (prefill chunk, tree nodes) at most max_context_tokens;
    a visual-token axis cut at the context also measures one image."""
    limit = model.max_context_tokens
    values = dict(zip(op.axes, point))
    for axis in CONTEXT_AXES:
        if axis in values:
            values[axis] = min(values[axis], limit)
    if "contexts" in values and "query_tokens" in values:
        values["contexts"] = min(values["contexts"], limit - values["query_tokens"])
    if "prefill_contexts" in values:
        values["prefill_contexts"] = min(values["prefill_contexts"], limit - values["prefill_tokens"])
    return tuple(values[axis] for axis in op.axes)


def points(op: Op, grid: Grid, model: ModelSpec) -> list[tuple[int, ...]]:
    """``op``'s shape points on ``grid`` clipped to the model's context
    (duplicates dropped), in measuring order (small first)."""
    axes = [getattr(grid, axis) for axis in op.axes]
    if not model.multimodal:  # a text-only drafter has no visual tokens to cross-attend to
        axes = [(0,) if axis == "kept_tokens" else values for axis, values in zip(op.axes, axes)]
    if "visual_tokens" in op.axes and max(grid.visual_tokens) > model.max_context_tokens and model.multimodal:
        k = op.axes.index("visual_tokens")  # a small model's context holds fewer: measure one image too
        axes[k] = (*axes[k], model.visual_tokens_per_image)
    clipped = {_clip(op, model, point) for point in itertools.product(*axes)}
    return sorted(clipped, key=lambda p: (sum(p), p))


_TOKENS_FULL = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096)
_CONTEXTS_FULL = (128, 256, 512, 1024, 2048, 4096, 8192, 16384)

FULL = Grid(
    name="full",
    tokens=_TOKENS_FULL,
    prefill_tokens=(8, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    prefill_contexts=(0, *_CONTEXTS_FULL),
    contexts=_CONTEXTS_FULL,
    query_tokens=(1, 8, 16, 32, 64),
    batches=(1, 8, 32, 64),
    requests=(1, 8, 32, 64),
    draft_tokens=_TOKENS_FULL,
    kept_tokens=(0, 8, 16, 32, 64),
    visual_tokens=(576, 1152, 1728, 2304, 2880),
    images=(1, 2, 4),
)

QUICK_CUDA = Grid(
    name="quick",
    tokens=(1, 8, 32, 64, 128, 256, 512, 1024, 2048, 4096),
    prefill_tokens=(64, 512, 2048),
    prefill_contexts=(0, 1024, 4096, 16384),
    contexts=(128, 1024, 4096, 16384),
    query_tokens=(1, 16, 64),
    batches=(1, 8, 64),
    requests=(1, 8, 64),
    draft_tokens=(1, 8, 64, 512),
    kept_tokens=(0, 8, 64),
    visual_tokens=(576, 2880),
    images=(1, 4),
)

QUICK_CPU = Grid(
    name="quick",
    # Dense enough in tokens that every fourth point can be held out and
    # still leave the knee resolved (costs report's held-out error).
    tokens=(1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512),
    prefill_tokens=(16, 64, 128, 256, 512),
    prefill_contexts=(0, 512, 1024, 4096),
    contexts=(128, 512, 1024, 2048, 4096),
    query_tokens=(1, 8, 16, 64),
    batches=(1, 4, 8, 32, 64),
    requests=(1, 2, 4, 8),
    draft_tokens=(1, 2, 4, 8, 16, 32, 64),
    kept_tokens=(0, 8, 64),
    visual_tokens=(576, 1152, 2880),
    images=(1, 2),  # an image is several seconds on one core; the fit is a line
)


def grid_for(device: str, quick: bool) -> Grid:
    """The grid ``simspec profile-gpu`` measures on ``device`` ("cuda" or "cpu")."""
    if not quick:
        return FULL
    return QUICK_CUDA if device == "cuda" else QUICK_CPU
