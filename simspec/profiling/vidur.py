"""Import Vidur's operator profiles into simspec's profile layout.

Imports: the standard library and simspec (never torch): importing needs no
GPU and no torch.

Vidur (Agrawal et al., MLSys 2024; MIT licence) publishes two kinds of
per-layer operator profile, named ``vidur_<gpu>_<model>_<kind>.csv``
(``vidur_h100_llama2_7b_mlp.csv``; an evenly spaced sample of one ends in
``_<kind>_sample.csv``). Both hold ``time_stats.<op>.{min,max,mean,median,std}``
in milliseconds per layer and shape columns; they are read by column name,
never by position (Vidur's files differ in column order). The importer
keeps the tensor-parallel-1 rows, checks the model-shape columns against
the spec the file name names, and writes ``<out>/<device-slug>/<model>/<op>.csv``
with Vidur's licence file beside them and a meta.json saying what came from where.
A token-level file's rows of every tensor-parallel degree (1, 2, 4, 8: each
times one GPU's shard) also go to ``<model>/tp/<op>.csv`` with the degree as
the first shape column (:data:`SHARD_HEADER`): the one-GPU tables and their
fits stay as they are, and simspec.costs.shapes fits the shards.

- ``mlp``: the token-level operators of a decoder layer, one row per token
  count: every per-layer operator simspec tables too (``emb`` is not per
  layer: skipped).
- ``attention``: one row per attention call. A decode row
  (``is_prefill`` False) is ``batch_size`` requests each with
  ``kv_cache_size`` cached tokens and one new one -> simspec's
  ``attn_decode`` (``batch, context_tokens``); a prefill row is one chunk
  of ``prefill_chunk_size`` tokens after ``kv_cache_size`` cached ->
  ``attn_prefill`` (``tokens, context_tokens``).

What an attention row's time is. Vidur times each piece of its attention
wrapper as a separate operator (CUDA kernel time, from the profiler): the
input reshape (views: 0 ms), the attention kernel (``attn_prefill`` /
``attn_decode``), the copy of its output into the layer's output buffer
(``attn_output_reshape``) and, with the FLASHINFER backend, the append of
the step's keys and values to the paged cache (``attn_kv_cache_save``; with
FLASH_ATTENTION, ``flash_attn_with_kvcache`` appends them inside the
attention kernel). simspec imports the attention kernel alone and adds
none of the others: its own attention tables (simspec.profiling.ops) time
the attention kernel alone, over keys and values already in place, so an
imported table and a measured one mean the same and fit the same form;
Vidur's own simulator leaves the reshapes out too. The KV-cache write is
its own kernel in the engines simspec emulates (vLLM's
``reshape_and_cache``, FlashInfer's append), a per-layer launch for the
prior's fixed costs rather than attention's context and pair terms; the
medians left out are listed in meta.json's ``notes``. ``max_model_len`` is
Vidur's engine setting, checked against each row's context and not against
the model's own context (Vidur ran Llama-3-8B at 16384, twice its 8192).
"""

from __future__ import annotations

import csv
import math
import re
import shutil

import numpy as np
from dataclasses import dataclass
from pathlib import Path

from simspec.costs.collectives import ALL_REDUCE_FILE, HEADER as ALL_REDUCE_HEADER
from simspec.costs import GPUS, MODELS, ModelSpec
from simspec.costs.specs import TP_DEGREES  # the degrees Vidur profiles, and simspec's
from simspec.profiling.grid import OPS, VIDUR_OPS
from simspec.files import write_text
from simspec.profiling.store import ProfileMeta, git_commit, read_meta, utc_now, write_meta
from simspec.types import InputError

SOURCE_PREFIX = "Vidur"
LICENCE_FILE = "LICENSE-vidur-MIT.txt"
GPU_TOKENS = {"h100": "h100-sxm", "a100": "a100-80gb", "h200": "h200", "l40s": "l40s", **{s: s for s in GPUS}}
ATTENTION_KIND = "attention"  # the <kind> of Vidur's attention profiles; any other kind is token-level
SAMPLE_SUFFIX = "sample"  # vidur_<gpu>_<model>_<kind>_sample.csv: an evenly spaced sample of one
SHAPE_COLUMNS = ("num_tokens", "num_tensor_parallel_workers")
STATS = ("min", "median", "max")
TP = "num_tensor_parallel_workers"
SHARD_FOLDER = "tp"  # <model>/tp/<op>.csv: every degree's rows of a token-level operator
SHARD_HEADER = ("tp", "tokens", "median_ms", "p10_ms", "p90_ms", "samples", "skipped")
# Vidur's model-shape columns, checked against the spec the file name names.
SPEC_COLUMNS = {"n_embd": "hidden", "n_expanded_embd": "mlp_hidden", "n_head": "heads", "n_kv_head": "kv_heads"}
ATTENTION_COLUMNS = ("n_embd", "n_q_head", "n_kv_head", "block_size", TP, "max_model_len", "batch_size",
                     "prefill_chunk_size", "kv_cache_size", "is_prefill", "attention_backend")
ATTENTION_SPEC = {"n_embd": "hidden", "n_q_head": "heads", "n_kv_head": "kv_heads"}
ATTENTION_OPS = {True: "attn_prefill", False: "attn_decode"}  # is_prefill -> Vidur's op, which is simspec's table
LEFT_OUT = ("attn_input_reshape", "attn_output_reshape", "attn_kv_cache_save")  # module docstring
COMMON_NOTES = ("imported from Vidur: median_ms is Vidur's median; p10_ms and p90_ms approximate the 10th and 90th "
                "percentiles by Vidur's min and max (Vidur records no percentiles); samples is unknown (empty); "
                "tensor-parallel-1 rows only (every degree's rows of the token-level operators in tp/); a shape Vidur measured twice keeps both rows; dtype not recorded by "
                "Vidur")
TOKEN_NOTES = "token-level operators (mlp): emb is skipped (not a per-layer operator)"
ATTENTION_NOTES = ("attention: attn_decode is Vidur's attn_decode (batch requests, context_tokens = kv_cache_size "
                   "cached tokens each); attn_prefill is Vidur's attn_prefill (one chunk of tokens = "
                   "prefill_chunk_size after context_tokens = kv_cache_size cached); the attention kernel alone: "
                   "attn_input_reshape, attn_output_reshape and attn_kv_cache_save are not added (simspec's "
                   "attention tables time the kernel alone; the KV-cache write is a launch of its own)")

FAMILY_NOTES = {"mlp": TOKEN_NOTES, ATTENTION_KIND: ATTENTION_NOTES}


@dataclass(frozen=True, slots=True, kw_only=True)
class Imported:
    """What one Vidur file contributes to its profile folder."""

    tables: dict[str, list[list[str]]]  # op -> output rows (shape cells, median, p10, p90, samples, skipped)
    notes: str  # what a reader of meta.json must know about this file's tables ("" if nothing more than its kind's)
    shards: dict[str, list[list[str]]] | None = None  # op -> rows of every tp degree (SHARD_HEADER); token-level only


def _fold(text: str) -> str:
    return re.sub(r"[^a-z0-9]", "", text.lower())


def _parse_name(path: Path) -> tuple[str, ModelSpec, str]:
    """(device slug, model spec, kind) from ``vidur_<gpu>_<model>_<kind>[_sample].csv``."""
    parts = path.stem.split("_")
    if len(parts) >= 5 and parts[-1].lower() == SAMPLE_SUFFIX:
        parts = parts[:-1]
    gpu = parts[1].lower() if len(parts) >= 4 else ""
    if gpu not in GPU_TOKENS:
        raise InputError(f"{path}: name must be vidur_<gpu>_<model>_<kind>.csv with <gpu> one of "
                         f"{', '.join(sorted(GPU_TOKENS))}")
    models = {_fold(name): spec for name, spec in MODELS.items()}
    model = models.get(_fold("".join(parts[2:-1])))
    if model is None:
        raise InputError(f"{path}: model {'_'.join(parts[2:-1])!r} in the name is none of {', '.join(MODELS)}")
    return GPU_TOKENS[gpu], model, parts[-1].lower()


def _number(path: Path, line: int, column: str, text: str) -> float:
    try:
        value = float(text)
    except (TypeError, ValueError):
        value = math.nan
    if not math.isfinite(value):
        raise InputError(f"{path} line {line}: {column} must be a number (got {text!r})")
    return value


def _count(path: Path, line: int, row: dict, column: str, least: int) -> int:
    """``row[column]`` as an integer >= ``least`` (Vidur writes some as 4096.0)."""
    value = _number(path, line, column, row[column])
    if value != int(value) or value < least:
        raise InputError(f"{path} line {line}: {column} must be an integer >= {least} (got {row[column]})")
    return int(value)


def _timing(path: Path, line: int, row: dict, op: str) -> tuple[float, float, float]:
    """(min, median, max) of ``op`` in ``row``: finite, median > 0, min <= median <= max."""
    low, median, high = (_number(path, line, f"time_stats.{op}.{s}", row[f"time_stats.{op}.{s}"]) for s in STATS)
    if not median > 0:
        raise InputError(f"{path} line {line}: time_stats.{op}.median must be > 0 ms (got {median:g})")
    if not low <= median <= high:
        raise InputError(f"{path} line {line}: time_stats.{op}.min <= median <= max must hold "
                         f"(got {low:g}, {median:g}, {high:g})")
    return low, median, high


def _check_spec(path: Path, line: int, row: dict, model: ModelSpec, columns: dict[str, str]) -> None:
    for column, field in columns.items():
        if column in row and _number(path, line, column, row[column]) != getattr(model, field):
            raise InputError(f"{path} line {line}: {column} {row[column]} does not match {model.name}'s "
                             f"{field} {getattr(model, field)}")


def _cells(shape: tuple[int, ...], timing: tuple[float, float, float]) -> list[str]:
    low, median, high = timing
    return [*(str(v) for v in shape), repr(median), repr(low), repr(high), "", ""]


def _header(path: Path, reader: csv.DictReader, required, expected: str) -> list[str]:
    """The file's columns, or a one-line error naming the ``required`` ones it lacks and what was ``expected``."""
    header = reader.fieldnames or []
    missing = [c for c in required if c not in header]
    if missing:
        raise InputError(f"{path}: missing column(s) {', '.join(missing)}; expected {expected}")
    return list(header)


def _read_tokens(path: Path, model: ModelSpec) -> Imported:
    """A token-level (``mlp``) file: per operator, one row per token count."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = _header(path, reader, SHAPE_COLUMNS, "Vidur's token-level profile (time_stats.<op>.{min,max,mean,"
                                                      "median,std}, num_tokens, num_tensor_parallel_workers)")
        ops = [op for op in VIDUR_OPS if all(f"time_stats.{op}.{s}" in header for s in STATS)]
        if not ops:
            raise InputError(f"{path}: no time_stats.<op>.{{min,median,max}} columns for any of "
                             f"{', '.join(VIDUR_OPS)}")
        tables: dict[str, list[tuple[tuple[int, ...], list[str]]]] = {op: [] for op in ops}
        shards: dict[str, list[tuple[tuple[int, ...], list[str]]]] = {op: [] for op in ops}
        for line, row in enumerate(reader, start=2):
            degree = _number(path, line, TP, row[TP])
            if degree not in TP_DEGREES:
                raise InputError(f"{path} line {line}: {TP} must be one of {', '.join(map(str, TP_DEGREES))} "
                                 f"(got {row[TP]})")
            _check_spec(path, line, row, model, SPEC_COLUMNS)
            tokens = _number(path, line, "num_tokens", row["num_tokens"])
            if tokens < 1 or tokens != int(tokens):
                raise InputError(f"{path} line {line}: num_tokens must be a positive integer (got {row['num_tokens']})")
            for op in ops:
                low, median, high = (_number(path, line, f"time_stats.{op}.{s}", row[f"time_stats.{op}.{s}"])
                                     for s in STATS)
                shape = (int(degree), int(tokens))
                shards[op].append((shape, _cells(shape, (low, median, high))))
                if degree == 1:
                    tables[op].append(((int(tokens),), _cells((int(tokens),), (low, median, high))))
    return Imported(tables=_sorted(path, tables), notes="",
                    shards={op: [cells for _, cells in sorted(rows, key=lambda r: r[0])] for op, rows in shards.items()})


def _read_attention(path: Path, model: ModelSpec) -> Imported:
    """An ``attention`` file: decode rows -> attn_decode, prefill rows -> attn_prefill (module docstring)."""
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        header = _header(path, reader, ATTENTION_COLUMNS, "Vidur's attention profile (time_stats.{attn_prefill,"
                                                          f"attn_decode}}.{{min,max,mean,median,std}}, "
                                                          f"{', '.join(ATTENTION_COLUMNS)})")
        tables: dict[str, list[tuple[tuple[int, ...], list[str]]]] = {op: [] for op in ATTENTION_OPS.values()}
        backends: set[str] = set()
        settings: set[tuple[int, int]] = set()
        left_out: dict[str, list[float]] = {op: [] for op in LEFT_OUT if f"time_stats.{op}.median" in header}
        for line, row in enumerate(reader, start=2):
            if _count(path, line, row, TP, 1) != 1:
                continue
            _check_spec(path, line, row, model, ATTENTION_SPEC)
            prefill = _flag(path, line, row["is_prefill"])
            op = ATTENTION_OPS[prefill]
            if f"time_stats.{op}.median" not in header:
                raise InputError(f"{path} line {line}: a {'prefill' if prefill else 'decode'} row, but the file "
                                 f"has no time_stats.{op}.{{min,median,max}} columns")
            block, limit = _count(path, line, row, "block_size", 1), _count(path, line, row, "max_model_len", 1)
            batch = _count(path, line, row, "batch_size", 1)
            chunk = _count(path, line, row, "prefill_chunk_size", 1 if prefill else 0)
            context = _count(path, line, row, "kv_cache_size", 0)
            if prefill and batch != 1:
                raise InputError(f"{path} line {line}: batch_size must be 1 in a prefill row (one chunk; got {batch})")
            if not prefill and chunk != 0:
                raise InputError(f"{path} line {line}: prefill_chunk_size must be 0 in a decode row (got {chunk})")
            if context + max(chunk, 1) > limit:
                raise InputError(f"{path} line {line}: kv_cache_size {context} + {max(chunk, 1)} new token(s) "
                                 f"exceeds max_model_len {limit}")
            shape = (chunk, context) if prefill else (batch, context)
            tables[op].append((shape, _cells(shape, _timing(path, line, row, op))))
            backends.add(row["attention_backend"].strip().removeprefix("AttentionBackend."))
            settings.add((block, limit))
            for other, medians in left_out.items():
                if row[f"time_stats.{other}.median"].strip():
                    medians.append(_number(path, line, f"time_stats.{other}.median", row[f"time_stats.{other}.median"]))
    dropped = "; ".join(f"{op} median {_span(v)} ms" for op, v in left_out.items() if v)
    notes = (f"{path.name}: attention backend {', '.join(sorted(backends))}; block size, max_model_len "
             f"{', '.join(f'{b}, {n}' for b, n in sorted(settings))}" + (f"; left out: {dropped}" if dropped else ""))
    return Imported(tables=_sorted(path, tables), notes=notes)


def _span(values: list[float]) -> str:
    low, high = min(values), max(values)
    return f"{low:g}" if low == high else f"{low:g}-{high:g}"


def _flag(path: Path, line: int, text: str) -> bool:
    folded = text.strip().lower()
    if folded not in ("true", "false"):
        raise InputError(f"{path} line {line}: is_prefill must be True or False (got {text!r})")
    return folded == "true"


def _sorted(path: Path, tables: dict[str, list[tuple[tuple[int, ...], list[str]]]]) -> dict[str, list[list[str]]]:
    """Each table's rows in shape order; refuses a file with no tensor-parallel-1 row at all."""
    if not any(tables.values()):
        raise InputError(f"{path}: no rows with {TP} = 1")
    return {op: [cells for _, cells in sorted(rows, key=lambda r: r[0])] for op, rows in tables.items() if rows}


def _licence(src_dir: Path) -> Path:
    found = [src_dir / LICENCE_FILE] if (src_dir / LICENCE_FILE).exists() else sorted(src_dir.glob("LICENSE*vidur*"))
    if not found:
        raise InputError(f"--import-vidur {src_dir}: no Vidur licence file ({LICENCE_FILE}) beside the CSVs")
    return found[0]


def _csv_text(rows: list[list[str]], header: tuple[str, ...]) -> str:
    return "\n".join(",".join(cells) for cells in [list(header), *rows]) + "\n"


def _family(kind: str) -> str:
    """``attention``, or ``mlp`` for every token-level kind."""
    return ATTENTION_KIND if kind == ATTENTION_KIND else "mlp"


def read_vidur(path: Path, model: ModelSpec, kind: str) -> Imported:
    """The tables of one Vidur file (``kind`` from its name, :func:`_parse_name`)."""
    return (_read_attention if _family(kind) == ATTENTION_KIND else _read_tokens)(path, model)


@dataclass(slots=True)
class _Folder:
    slug: str
    model: ModelSpec
    names: list[str]  # the Vidur files it holds
    notes: list[str]
    tables: dict[str, list[list[str]]]
    shards: dict[str, list[list[str]]]


def _kept_from_before(folder: Path, meta: dict | None, kinds: set[str]) -> tuple[list[str], list[str]]:
    """(files, notes) of an earlier Vidur import into ``folder`` that this
    one leaves in place: files of another kind, whose tables are still there."""
    if meta is None:
        return [], []
    _, _, listed = str(meta.get("source", "")).partition(": ")
    kept = []
    for name in filter(None, (n.strip() for n in listed.split(","))):
        try:
            _, _, kind = _parse_name(Path(name))
        except InputError:
            continue
        ops = ATTENTION_OPS.values() if _family(kind) == ATTENTION_KIND else VIDUR_OPS
        if _family(kind) not in kinds and any((folder / f"{op}.csv").exists() for op in ops):
            kept.append(name)
    notes = [n for n in str(meta.get("notes", "")).split(" | ") if any(n.startswith(k) for k in kept)]
    return kept, notes


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
    collectives = [f for f in files if f.stem.lower().endswith(ALL_REDUCE_SUFFIX)]
    files = [f for f in files if f not in collectives and not f.stem.lower().endswith(SEND_RECV_SUFFIX)]
    reduced = [read_all_reduce(f) for f in collectives]  # every file read before anything is written
    folders: dict[Path, _Folder] = {}
    kinds: dict[Path, set[str]] = {}
    for path in files:
        slug, model, kind = _parse_name(path)
        folder = out / slug / model.name
        entry = folders.setdefault(folder, _Folder(slug, model, [], [], {}, {}))
        imported = read_vidur(path, model, kind)
        for op, rows in imported.tables.items():
            if op in entry.tables:
                raise InputError(f"{path}: {op} for {slug}/{model.name} is also in {', '.join(entry.names)}")
            entry.tables[op] = rows
        entry.shards.update(imported.shards or {})
        entry.names.append(path.name)
        entry.notes.append(imported.notes)
        kinds.setdefault(folder, set()).add(_family(kind))
    before = {}
    for folder in folders:
        meta = read_meta(folder)
        if meta is not None and not str(meta.get("source", "")).startswith(SOURCE_PREFIX):
            raise InputError(f"{folder}: holds a profile from {meta.get('source')!r}; "
                             "refusing to overwrite it with Vidur's (choose another --out)")
        before[folder] = _kept_from_before(folder, meta, kinds[folder])
    written = [_write_all_reduce(out, slug, rows, licence) for slug, rows in reduced]
    commit, date = git_commit(), utc_now()
    for folder, entry in folders.items():
        kept_names, kept_notes = before[folder]
        folder.mkdir(parents=True, exist_ok=True)
        for op, rows in entry.tables.items():
            write_text(folder / f"{op}.csv", _csv_text(rows, OPS[op].header))
        if entry.shards:
            (folder / SHARD_FOLDER).mkdir(exist_ok=True)
        for op, rows in entry.shards.items():
            write_text(folder / SHARD_FOLDER / f"{op}.csv", _csv_text(rows, SHARD_HEADER))
        shutil.copyfile(licence, folder / licence.name)
        gpu = GPUS[entry.slug]
        names = sorted({*kept_names, *entry.names})
        families = sorted({_family(_parse_name(Path(n))[2]) for n in names})
        details = sorted({*kept_notes, *entry.notes} - {""})
        notes = [COMMON_NOTES, *(FAMILY_NOTES[f] for f in families), *details]
        write_meta(folder, ProfileMeta(
            device=gpu.name, device_slug=entry.slug, memory_bytes=int(gpu.memory_bytes), kind="cuda", driver=None,
            cuda=None, torch=None, triton=None, date=date, git_commit=commit, model=entry.model.name, grid="vidur",
            dtype=None, source=f"{SOURCE_PREFIX} (MIT licence): {', '.join(names)}", licence=licence.name,
            kernels=None, notes=" | ".join(notes)))
    return [*written, *folders]


ALL_REDUCE_SUFFIX = "_dgx_all_reduce"  # vidur_<gpu>_dgx_all_reduce.csv: NCCL all-reduce on a DGX node
SEND_RECV_SUFFIX = "_dgx_send_recv"  # pipeline hand-offs: not imported (no pipeline parallelism here)


def read_all_reduce(path: Path) -> tuple[str, list[tuple[int, int, float]]]:
    """(device slug, [(workers, bytes, median ms)]) of a Vidur all-reduce
    file: the rows on one node (devices_per_node = num_workers), each
    size's median over ranks and repeats of Vidur's per-row medians.
    Vidur's ``size`` is bytes (vidur/profiling/collectives/
    collectives_wrapper.py writes the fp16 buffer's length x 2)."""
    gpu = path.stem.split("_")[1].lower()
    if gpu not in GPU_TOKENS:
        raise InputError(f"{path}: name must be vidur_<gpu>_dgx_all_reduce.csv with <gpu> one of "
                         f"{', '.join(sorted(GPU_TOKENS))}")
    times: dict[tuple[int, int], list[float]] = {}
    with open(path, newline="") as f:
        reader = csv.DictReader(f)
        _header(path, reader, ("num_workers", "size", "devices_per_node", "time_stats.all_reduce.median"),
                "a Vidur all-reduce profile")
        for line, row in enumerate(reader, start=2):
            workers = _count(path, line, row, "num_workers", 2)
            if _count(path, line, row, "devices_per_node", 1) != workers:
                continue  # crosses nodes: a tensor-parallel group stays on one
            size = _count(path, line, row, "size", 1)
            times.setdefault((workers, size), []).append(
                _number(path, line, "time_stats.all_reduce.median", row["time_stats.all_reduce.median"]))
    if not times:
        raise InputError(f"{path}: no all-reduce rows within one node")
    return GPU_TOKENS[gpu], [(w, b, float(np.median(t))) for (w, b), t in sorted(times.items())]


def _write_all_reduce(out: Path, slug: str, rows: list[tuple[int, int, float]], licence: Path) -> Path:
    folder = out / slug / ALL_REDUCE_FILE.parent
    folder.mkdir(parents=True, exist_ok=True)
    text = ",".join(ALL_REDUCE_HEADER) + "\n" + "".join(f"{w},{b},{ms:.6g}\n" for w, b, ms in rows)
    write_text(folder / ALL_REDUCE_FILE.name, text)
    shutil.copyfile(licence, folder / licence.name)
    return folder

