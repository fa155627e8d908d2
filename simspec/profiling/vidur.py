"""Import Vidur's operator profiles into simspec's profile layout.

Imports: the standard library and simspec (never torch): importing needs no
GPU and no torch.

Vidur (Agrawal et al., MLSys 2024; MIT licence) profiles the token-level
operators of a decoder layer (its ``mlp.csv``): one row per token count and
tensor-parallel degree, with ``time_stats.<op>.{min,max,mean,median,std}``
in milliseconds. The files are named ``vidur_<gpu>_<model>_<kind>.csv``
(``vidur_h100_llama2_7b_mlp.csv``); the importer keeps the tensor-parallel-1
rows of every per-layer operator simspec tables too (``emb`` is not per
layer: skipped) and writes ``<out>/<device-slug>/<model>/<op>.csv`` with
Vidur's licence file beside them.
"""

from __future__ import annotations

import csv
import re
import shutil
from pathlib import Path

from simspec.costs import GPUS, MODELS, ModelSpec
from simspec.profiling.grid import OPS, VIDUR_OPS
from simspec.files import write_text
from simspec.profiling.store import ProfileMeta, git_commit, read_meta, utc_now, write_meta
from simspec.types import InputError

SOURCE_PREFIX = "Vidur"
LICENCE_FILE = "LICENSE-vidur-MIT.txt"
GPU_TOKENS = {"h100": "h100-sxm", "a100": "a100-80gb", "h200": "h200", "l40s": "l40s", **{s: s for s in GPUS}}
SHAPE_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
STATS = ("min", "median", "max")
# Vidur's model-shape columns, checked against the spec the file name names.
SPEC_COLUMNS = {"n_embd": "hidden", "n_expanded_embd": "mlp_hidden", "n_head": "heads", "n_kv_head": "kv_heads"}
NOTES = ("imported from Vidur: median_ms is Vidur's median; p10_ms and p90_ms approximate the 10th and 90th "
         "percentiles by Vidur's min and max (Vidur records no percentiles); samples is unknown (empty); "
         "tensor-parallel-1 rows only; emb is skipped (not a per-layer operator); a token count Vidur "
         "measured twice keeps both rows; dtype not recorded by Vidur")


def _fold(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _parse_name(path: Path) -> tuple[str, ModelSpec]:
    """(device slug, model spec) from ``vidur_<gpu>_<model>_<kind>.csv``."""
    parts = path.stem.split("_")
    gpu = parts[1].lower() if len(parts) >= 4 else ""
    if gpu not in GPU_TOKENS:
        raise InputError(f"{path}: name must be vidur_<gpu>_<model>_<kind>.csv with <gpu> one of "
                         f"{', '.join(sorted(GPU_TOKENS))}")
    models = {_fold(name): spec for name, spec in MODELS.items()}
    model = models.get(_fold("".join(parts[2:-1])))
    if model is None:
        raise InputError(f"{path}: model {'_'.join(parts[2:-1])!r} in the name is none of {', '.join(MODELS)}")
    return GPU_TOKENS[gpu], model


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        return float(text)
    except (TypeError, ValueError):
        raise InputError(f"{path} line {line}: {column} must be a number (got {text!r})") from None


def _read(path: Path, model: ModelSpec) -> dict[str, list[list[str]]]:
    """Per operator, the output rows (tokens, median, p10, p90, samples, skipped) of ``path``."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = reader.fieldnames or []
        missing = [c for c in SHAPE_COLUMNS if c not in header]
        if missing:
            raise InputError(f"{path}: missing column(s) {', '.join(missing)}; expected Vidur's token-level "
                             "profile (time_stats.<op>.{min,max,mean,median,std}, num_tokens, "
                             "num_tensor_parallel_workers)")
        ops = [op for op in VIDUR_OPS if all(f"time_stats.{op}.{s}" in header for s in STATS)]
        if not ops:
            raise InputError(f"{path}: no time_stats.<op>.{{min,median,max}} columns for any of "
                             f"{', '.join(VIDUR_OPS)}")
        tables: dict[str, list[tuple[int, list[str]]]] = {op: [] for op in ops}
        for line, row in enumerate(reader, start=2):
            if _number(path, line, "num_tensor_parallel_workers", row["num_tensor_parallel_workers"]) != 1:
                continue
            for column, field in SPEC_COLUMNS.items():
                if column in row and _number(path, line, column, row[column]) != getattr(model, field):
                    raise InputError(f"{path} line {line}: {column} {row[column]} does not match {model.name}'s "
                                     f"{field} {getattr(model, field)}")
            tokens = _number(path, line, "num_tokens", row["num_tokens"])
            if tokens < 1 or tokens != int(tokens):
                raise InputError(f"{path} line {line}: num_tokens must be a positive integer (got {row['num_tokens']})")
            for op in ops:
                low, median, high = (_number(path, line, f"time_stats.{op}.{s}", row[f"time_stats.{op}.{s}"])
                                     for s in STATS)
                tables[op].append((int(tokens), [str(int(tokens)), repr(median), repr(low), repr(high), "", ""]))
    if not any(tables.values()):
        raise InputError(f"{path}: no rows with num_tensor_parallel_workers = 1")
    return {op: [cells for _, cells in sorted(rows, key=lambda r: r[0])] for op, rows in tables.items()}


def _licence(src_dir: Path) -> Path:
    found = [src_dir / LICENCE_FILE] if (src_dir / LICENCE_FILE).exists() else sorted(src_dir.glob("LICENSE*vidur*"))
    if not found:
        raise InputError(f"--import-vidur {src_dir}: no Vidur licence file ({LICENCE_FILE}) beside the CSVs")
    return found[0]


def _csv_text(rows: list[list[str]], header: tuple[str, ...]) -> str:
    return "\n".join(",".join(cells) for cells in [list(header), *rows]) + "\n"


def import_vidur(src_dir: Path, out: Path) -> list[Path]:
    """Convert every ``vidur_*.csv`` in ``src_dir`` into profile folders
    under ``out``; returns the folders written. Raises InputError naming the
    folder or file for anything it cannot import, before writing anything."""
    src_dir, out = Path(src_dir), Path(out)
    if not src_dir.is_dir():
        raise InputError(f"--import-vidur {src_dir}: no such folder")
    files = sorted(src_dir.glob("vidur_*.csv"))
    if not files:
        raise InputError(f"--import-vidur {src_dir}: no Vidur CSVs (vidur_<gpu>_<model>_<kind>.csv) in it")
    licence = _licence(src_dir)
    folders: dict[Path, tuple[str, ModelSpec, list[str], dict[str, list[list[str]]]]] = {}
    for path in files:
        slug, model = _parse_name(path)
        folder = out / slug / model.name
        _, _, names, tables = folders.setdefault(folder, (slug, model, [], {}))
        for op, rows in _read(path, model).items():
            if op in tables:
                raise InputError(f"{path}: {op} for {slug}/{model.name} is also in {', '.join(names)}")
            tables[op] = rows
        names.append(path.name)
    for folder in folders:
        meta = read_meta(folder)
        if meta is not None and not str(meta.get("source", "")).startswith(SOURCE_PREFIX):
            raise InputError(f"{folder}: holds a profile from {meta.get('source')!r}; "
                             "refusing to overwrite it with Vidur's (choose another --out)")
    commit, date = git_commit(), utc_now()
    for folder, (slug, model, names, tables) in folders.items():
        for op, rows in tables.items():
            folder.mkdir(parents=True, exist_ok=True)
            write_text(folder / f"{op}.csv", _csv_text(rows, OPS[op].header))
        shutil.copyfile(licence, folder / licence.name)
        gpu = GPUS[slug]
        write_meta(folder, ProfileMeta(
            device=gpu.name, device_slug=slug, memory_bytes=int(gpu.memory_bytes), kind="cuda", driver=None,
            cuda=None, torch=None, triton=None, date=date, git_commit=commit, model=model.name, grid="vidur",
            dtype=None, source=f"{SOURCE_PREFIX} (MIT licence): {', '.join(names)}", licence=licence.name,
            kernels=None, notes=NOTES))
    return list(folders)
