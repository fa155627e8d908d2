"""The KV capacity engines logged against what simspec's memory rules
predict for the same model, GPU and settings: the rows of
``validation/published/kv_capacity.csv`` (``benchmarks/kv_capacity.py``
prints them; ``tests/test_memory.py`` holds the held-out rows to 5%).

A row's simulation: the catalog's model at the row's degree and weight
bytes, no drafter (none ran), the engine's preset for that GPU and degree
with the row's batch limits and memory share, and the memory profile of
the row's vLLM version (``vllm-0.16`` before 0.17). vLLM before 0.21 did
not subtract CUDA-graph memory from the KV cache (``graphs_subtracted =
no``), so those rows are predicted without it.

Imports: pandas, simspec.costs, simspec.serving.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from simspec.costs import GPUS, MODELS
from simspec.serving import memory, modes
from simspec.serving.config import GIB, EngineConfig

TABLE = Path(__file__).resolve().parents[2] / "validation" / "published" / "kv_capacity.csv"


@dataclass(frozen=True)
class Check:
    """One published row and simspec's prediction of it (GiB a GPU)."""

    id: str
    role: str
    logged_kv_gib: float
    predicted_kv_gib: float
    logged_weights_gib: float
    predicted_weights_gib: float
    logged_activation_gib: float | None
    predicted_activation_gib: float | None
    logged_share: float | None  # the memory share the engine chose by its own rule, where logged
    predicted_share: float  # gpu_memory_utilization (vLLM) or mem_fraction_static (SGLang)

    @property
    def error(self) -> float:
        return self.predicted_kv_gib / self.logged_kv_gib - 1


def rows(path: Path = TABLE) -> pd.DataFrame:
    return pd.read_csv(path, dtype={"engine_version": str})


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in str(text).split(".")[:2])


def engine_for(row) -> EngineConfig:
    """The engine a row ran: its preset on that GPU and degree, the row's limits, share and version, no drafter."""
    fields = modes.preset(row.engine, row.gpu, int(row.tp))
    if not pd.isna(row.max_num_seqs):
        fields["max_num_seqs"] = int(row.max_num_seqs)
    fields["max_num_batched_tokens"] = int(row.max_num_batched_tokens)
    fields["drafter_kv_layers"] = 0
    if row.engine == "vllm":
        fields["gpu_memory_utilization"] = float(row.share)
        if _version(row.engine_version) < _version(memory.VLLM_PROFILES["vllm"].since):
            fields["memory"] = "vllm-0.16"
        if row.graphs_subtracted == "no":
            fields["cudagraph_mode"] = "none"  # only the memory rule reads it here
    elif not pd.isna(row.share):
        fields["mem_fraction_static"] = float(row.share)
    return EngineConfig(**fields)


def check(row) -> Check:
    """Predict one row."""
    model = dataclasses.replace(MODELS[row.model], tensor_parallel=int(row.tp), drafter="ngram",
                                weight_dtype_bytes=0 if pd.isna(row.weight_dtype_bytes) else int(row.weight_dtype_bytes))
    engine, gpu = engine_for(row), GPUS[row.gpu]
    predicted = engine.kv_budget_tokens(model, gpu) * model.kv_bytes_per_token / GIB
    activation = None
    if row.engine == "vllm":
        activation = memory.vllm_activation_bytes(engine, model) / GIB
        share = engine.gpu_memory_utilization
    else:
        share = memory.sglang_mem_fraction_static(engine, model, gpu)
    logged_activation = None if pd.isna(row.logged_activation_gib) else float(row.logged_activation_gib)
    return Check(id=row.id, role=row.role, logged_kv_gib=float(row.logged_kv_gib), predicted_kv_gib=predicted,
                 logged_weights_gib=float(row.logged_weights_gib), predicted_weights_gib=model.weight_bytes / GIB,
                 logged_activation_gib=logged_activation, predicted_activation_gib=activation,
                 logged_share=None if pd.isna(row.logged_share) else float(row.logged_share), predicted_share=share)


def checks(path: Path = TABLE) -> list[Check]:
    return [check(row) for row in rows(path).itertuples()]


__all__ = ["TABLE", "Check", "rows", "engine_for", "check", "checks"]
