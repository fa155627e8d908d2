"""Measure a machine's tensor-parallel all-reduce: ``torch.distributed``'s
``all_reduce`` over the message sizes a sharded step makes, at each GPU
count the machine holds, into ``<out>/<device>/collectives/all_reduce.csv``
(the table simspec.costs.collectives prices a step's all-reduces from).

Imports: torch (torch.distributed, torch.multiprocessing), numpy,
simspec.costs.collectives (the table's path and header), simspec.files,
simspec.profiling.store. ``simspec profile-gpu --collectives`` calls
:func:`run_collectives`.

One process per GPU (NCCL, each on its own device) or, on a CPU, per
worker (gloo, for testing the pipeline: a CPU's numbers price nothing a
GPU serves). The processes meet through a file in a temporary folder, so
no port is taken. Each sample is one all-reduce between two barriers,
timed on every rank (CUDA events on a GPU, ``perf_counter`` on a CPU);
the sample's time is the slowest rank's (what the next layer waits for),
and a size's figure is the median of its samples. Messages are bfloat16 on
a GPU (as the models are served), float32 on a CPU (gloo sums no bfloat16);
sizes are bytes either way.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from simspec.costs.collectives import ALL_REDUCE_FILE, HEADER
from simspec.costs.specs import TP_DEGREES
from simspec.files import read_json, write_text
from simspec.profiling.store import git_commit, utc_now
from simspec.types import InputError, require

SIZES = tuple(1 << p for p in range(12, 29))  # 4 KiB .. 256 MiB: a step's tokens x hidden x 2 bytes, 1..16k tokens
QUICK_SIZES = tuple(1 << p for p in range(12, 23, 2))  # 4 KiB .. 4 MiB
SAMPLES = 20
WARMUP = 5
META = "meta.json"
SOURCE = "simspec profile-gpu --collectives"


def _worker(rank: int, workers: int, device: str, sizes: tuple[int, ...], samples: int, rendezvous: str,
            result: str) -> None:
    """One rank: time ``samples`` all-reduces of each size; rank 0 writes
    ``{size: [seconds per sample]}`` (each sample the slowest rank's) to ``result``."""
    cuda = device == "cuda"
    if cuda:
        torch.cuda.set_device(rank)
    dist.init_process_group("nccl" if cuda else "gloo", init_method=f"file://{rendezvous}", rank=rank,
                            world_size=workers)
    try:
        where = torch.device("cuda", rank) if cuda else torch.device("cpu")
        dtype = torch.bfloat16 if cuda else torch.float32
        out = {}
        for nbytes in sizes:
            buffer = torch.ones(max(nbytes // dtype.itemsize, 1), dtype=dtype, device=where)
            times = [_timed(buffer, cuda) for _ in range(WARMUP + samples)][WARMUP:]
            slowest = torch.tensor(times, dtype=torch.float64, device=where)
            dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
            out[nbytes] = slowest.cpu().tolist()
        if rank == 0:
            Path(result).write_text(json.dumps(out))
    finally:
        dist.destroy_process_group()


def _timed(buffer: torch.Tensor, cuda: bool) -> float:
    """Seconds of one all-reduce of ``buffer``, started after a barrier."""
    dist.barrier()
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        dist.all_reduce(buffer)
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) * 1e-3
    begin = time.perf_counter()
    dist.all_reduce(buffer)
    return time.perf_counter() - begin


def measure(workers: int, *, device: str, sizes: tuple[int, ...],
            samples: int = SAMPLES) -> list[tuple[int, int, float]]:
    """[(workers, bytes, median ms)] of an all-reduce over ``workers`` ranks."""
    with tempfile.TemporaryDirectory(prefix="simspec-collectives-") as tmp:
        result = Path(tmp) / "result.json"
        mp.start_processes(_worker, args=(workers, device, sizes, samples, str(Path(tmp) / "rendezvous"),
                                          str(result)), nprocs=workers, join=True, start_method="spawn")
        timed = json.loads(result.read_text())
    return [(workers, int(size), statistics.median(times) * 1e3) for size, times in timed.items()]


def degrees(device: str, asked: list[int] | None) -> list[int]:
    """The worker counts to measure: those asked for, else every
    tensor-parallel degree the machine's GPUs allow (2 on a CPU)."""
    available = torch.cuda.device_count() if device == "cuda" else None
    if asked is None:
        asked = [n for n in TP_DEGREES if 2 <= n <= available] if device == "cuda" else [2]
    for n in asked:
        require(n in TP_DEGREES and n >= 2, f"--workers must be among 2, 4, 8 (got {n})")
        require(available is None or n <= available, f"--workers {n}: this machine has {available} CUDA devices")
    require(asked, f"--collectives needs at least 2 CUDA devices (this machine has {available})")
    return sorted(set(asked))


def table_folder(out: Path, slug: str) -> Path:
    """Where the table goes; refuses to overwrite one imported from elsewhere
    (Vidur's: a folder without our meta.json)."""
    folder = out / slug / ALL_REDUCE_FILE.parent
    meta = read_json(folder / META, "collectives meta") if (folder / META).is_file() else None
    if (folder / ALL_REDUCE_FILE.name).is_file() and (meta is None or meta.get("source") != SOURCE):
        raise InputError(f"{folder}: holds an all-reduce table from elsewhere (e.g. --import-vidur); refusing to "
                         f"overwrite it (choose another --out)")
    return folder


def run_collectives(*, device: str, name: str, slug: str, out: Path, workers: list[int] | None, quick: bool,
                    progress=print) -> Path:
    """Measure every worker count and write the table and its meta.json; returns the folder."""
    folder = table_folder(out, slug)
    counts = degrees(device, workers)
    sizes = QUICK_SIZES if quick else SIZES
    rows = []
    for n in counts:
        progress(f"all-reduce over {n} {'GPUs' if device == 'cuda' else 'CPU workers'}: {len(sizes)} sizes")
        rows += measure(n, device=device, sizes=sizes)
    text = ",".join(HEADER) + "\n" + "".join(f"{w},{b},{ms:.6g}\n" for w, b, ms in rows)
    folder.mkdir(parents=True, exist_ok=True)
    write_text(folder / META, json.dumps({
        "source": SOURCE, "device": name, "device_slug": slug, "backend": "nccl" if device == "cuda" else "gloo",
        "workers": counts, "samples": SAMPLES, "torch": torch.__version__, "date": utc_now(),
        "git_commit": git_commit()}, indent=2) + "\n")
    write_text(folder / ALL_REDUCE_FILE.name, text)
    return folder


__all__ = ["measure", "run_collectives", "degrees", "table_folder", "SIZES", "QUICK_SIZES", "SOURCE"]
