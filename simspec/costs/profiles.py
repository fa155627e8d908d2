"""Reading measured operator profiles (``profiles/<device>/<model>/``).

Imports: stdlib, pandas, simspec.types, simspec.costs.specs (never torch:
profiles are plain data, written by ``simspec profile-gpu``). The layout
and columns are documented in ``profiles/README.md``. Every problem with a
profile is an InputError naming the file.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path

from typing import TYPE_CHECKING

import numpy as np

from simspec.costs.gpus import GPUS, GpuSpec
from simspec.costs.specs import ModelSpec
from simspec.types import InputError, require

if TYPE_CHECKING:
    import pandas as pd

TIMING = ("median_ms", "p10_ms", "p90_ms", "samples", "skipped")
LAYER_OPS = ("input_layernorm", "attn_pre_proj", "attn_rope", "attn_post_proj", "post_attention_layernorm",
             "mlp_up_proj", "mlp_act", "mlp_down_proj", "add")
CALLS_PER_LAYER = {op: 2 if op == "add" else 1 for op in LAYER_OPS}  # a layer runs each piece once, "add" twice
SHAPES: dict[str, tuple[str, ...]] = {
    **{op: ("tokens",) for op in LAYER_OPS},
    "attn_prefill": ("tokens", "context_tokens"),
    "attn_decode": ("batch", "context_tokens"),
    "attn_tree_verify": ("batch", "query_tokens", "context_tokens"),
    "lm_head": ("tokens",),
    "vision_encoder": ("images",),
    "drafter_step": ("tokens", "kept_tokens"),
    "select": ("requests", "visual_tokens"),
    "int8_quantize": ("visual_tokens",),
}
META_KEYS = ("device", "device_slug", "model", "source")


@dataclass(frozen=True, slots=True, kw_only=True)
class Profile:
    """One device x model profile: measured points of each operator."""

    folder: Path
    meta: dict = field(repr=False)
    tables: dict[str, pd.DataFrame] = field(repr=False)  # op -> rows measured (skipped rows dropped)

    @property
    def device_slug(self) -> str:
        return self.meta["device_slug"]

    @property
    def model(self) -> str:
        return self.meta["model"]


def default_root() -> Path:
    """``$SIMSPEC_PROFILES``, else the repository's ``profiles/`` folder."""
    env = os.environ.get("SIMSPEC_PROFILES")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "profiles"


def _read_table(path: Path, op: str) -> pd.DataFrame:
    import pandas as pd  # only when fitting: a stored cost model needs no pandas

    try:
        table = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as err:
        raise InputError(f"profile {path}: not a readable CSV ({str(err).splitlines()[0]})") from None
    missing = [c for c in (*SHAPES[op], "median_ms") if c not in table.columns]
    if missing:
        raise InputError(f"profile {path}: missing column(s) {', '.join(missing)} "
                         f"(expected {', '.join((*SHAPES[op], *TIMING))})")
    if "skipped" in table.columns:
        table = table[table["skipped"].isna() | (table["skipped"].astype(str).str.strip() == "")]
    numbers = table[[*SHAPES[op], "median_ms"]].apply(pd.to_numeric, errors="coerce")
    bad = numbers.isna().any(axis=1) | (numbers < 0).any(axis=1) | ~np.isfinite(numbers.to_numpy(float)).all(axis=1)
    if bad.any():
        row = int(bad.to_numpy().nonzero()[0][0]) + 2  # header is line 1
        raise InputError(f"profile {path}: line {row} has a missing, non-numeric, infinite or negative value")
    zero = (numbers["median_ms"] <= 0).to_numpy()
    if zero.any():
        row = int(zero.nonzero()[0][0]) + 2
        raise InputError(f"profile {path}: line {row} has median_ms {numbers['median_ms'].iloc[row - 2]:g}: "
                         "a measured time must be > 0 ms")
    return numbers.reset_index(drop=True)


def load(folder: str | Path) -> Profile:
    """Read ``folder`` (one device x model profile)."""
    folder = Path(folder)
    meta_path = folder / "meta.json"
    try:
        meta = json.loads(meta_path.read_text())
    except FileNotFoundError:
        raise InputError(f"profile {folder}: no meta.json") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as err:
        raise InputError(f"profile {meta_path}: not valid JSON ({err})") from None
    missing = [k for k in META_KEYS if not isinstance(meta, dict) or k not in meta]
    if missing:
        raise InputError(f"profile {meta_path}: missing key(s) {', '.join(missing)}")
    tables = {}
    for path in sorted(folder.glob("*.csv")):
        op = path.stem
        if op not in SHAPES:
            raise InputError(f"profile {path}: unknown operator {op!r} (expected one of {', '.join(SHAPES)})")
        table = _read_table(path, op)
        if len(table):
            tables[op] = table
    if not tables:
        raise InputError(f"profile {folder}: no operator CSVs with measured points")
    return Profile(folder=folder, meta=meta, tables=tables)


VISION_OPS = ("vision_encoder", "int8_quantize", "select", "drafter_step")


def check_fits(profile: Profile, model: ModelSpec, gpu: GpuSpec) -> None:
    """Refuse a profile (``--cost-model profile:DIR``) of another device, or
    of a model whose decoder layers (or, where it times them, vision encoder
    and visual tokens) differ from ``model``'s, saying which."""
    from simspec.costs.catalog import MODELS

    where = f"profile {profile.folder}"
    require(model.tensor_parallel == 1, f"{where} times the whole model on one GPU; a tp {model.tensor_parallel} "
                                        f"run has no profile of its shards yet (use --cost-model roofline or auto)")
    require(profile.device_slug == gpu.slug,
            f"{where} was measured on {profile.device_slug}; the run is on {gpu.slug} (choose --device "
            f"{profile.device_slug}, or profile {gpu.slug})")
    spec = MODELS.get(profile.model)
    require(spec is not None, f"{where} is of model {profile.model!r}, which has no spec here "
                              f"(known: {', '.join(MODELS)}): its shapes cannot be checked against {model.name}")
    if spec.name == model.name:
        return
    require(same_layers(spec, model),
            f"{where} is of {spec.name}, whose decoder layers differ from {model.name}'s (hidden, heads, kv heads, "
            f"MLP, vocabulary: {_layer_shape(spec)} vs {_layer_shape(model)})")
    vision = sorted(op for op in VISION_OPS if op in profile.tables)
    require(not vision or _vision_shape(spec) == _vision_shape(model),
            f"{where} times {', '.join(vision)} of {spec.name}, whose vision encoder differs from {model.name}'s "
            f"(width, layers, visual tokens per image: {_vision_shape(spec)} vs {_vision_shape(model)})")


def _layer_shape(m: ModelSpec) -> tuple:
    return m.hidden, m.heads, m.kv_heads, m.mlp_hidden, m.vocab


def _vision_shape(m: ModelSpec) -> tuple:
    return m.vision_hidden, m.vision_layers, m.visual_tokens_per_image


def same_layers(a: ModelSpec, b: ModelSpec) -> bool:
    """Whether two specs' decoder layers (and LM head) have the same shapes."""
    return (a.hidden, a.heads, a.kv_heads, a.mlp_hidden, a.vocab) == (b.hidden, b.heads, b.kv_heads, b.mlp_hidden,
                                                                      b.vocab)


def find(device_slug: str, model: ModelSpec, root: Path | None = None) -> list[Profile]:
    """Profiles that describe ``model`` on ``device_slug``: the model's own
    first, then profiles of models whose decoder layers have the same
    shape (LLaVA-1.5-7B's language model is Llama-2-7B's)."""
    from simspec.costs.catalog import MODELS  # the catalogue, to compare shapes

    if model.tensor_parallel > 1:  # profiles time one GPU running the whole model
        return []
    device_dir = (root or default_root()) / device_slug
    if not device_dir.is_dir():
        return []
    found = []
    own = device_dir / model.name
    if (own / "meta.json").is_file():
        found.append(load(own))
    for other in sorted(device_dir.iterdir()):
        spec = MODELS.get(other.name)
        if other != own and spec is not None and same_layers(spec, model) and (other / "meta.json").is_file():
            found.append(load(other))
    return found


def device(slug: str, root: Path | None = None) -> GpuSpec | None:
    """A device known only from its profiles (a CPU, say): name and memory
    from meta.json; no datasheet bandwidth or FLOPs."""
    if slug.lower() in GPUS:
        return GPUS[slug.lower()]
    folder = (root or default_root()) / slug
    for meta_path in sorted(folder.glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        memory = float(meta.get("memory_bytes") or 0)
        if memory <= 0:
            raise InputError(f"profile {meta_path}: memory_bytes must be > 0 to size the KV cache")
        return GpuSpec(name=meta.get("device", slug), slug=slug, memory_bytes=memory, hbm_bytes_per_s=0.0,
                       bf16_flops=0.0)
    return None
