"""Measure a profile: time every operator at every grid point, resumably.

Imports: torch, simspec.costs, simspec.profiling. ``run_profile`` is what
``simspec profile-gpu`` calls; ``profile_model`` measures one model spec
(tests call it with a tiny spec and grid).

Timing: after warm-up, each sample is one call, timed by CUDA events on a
GPU and by ``time.perf_counter`` on a CPU; a point takes enough samples for
about ``TARGET_MS`` of measured time, at least ``MIN_SAMPLES`` and at most
``MAX_SAMPLES``, and records their median, 10th and 90th percentile. A point
that does not fit (CUDA out of memory, or on a CPU more than
``CPU_MAX_BYTES`` of tensors) gets a row whose ``skipped`` says why, and the
run goes on. Rows are flushed one by one; a rerun measures only the points
its CSVs lack. A CPU is profiled with ``CPU_THREADS`` torch threads (recorded
in meta.json): with torch's default, intra-op threading switches on at some
sizes and not others, and shared cores make the timings jump.

A forward pass calls each per-layer operator (decoder-layer pieces,
attention) once per layer, each time on that layer's weights and KV cache,
so the operator seldom finds its data in cache. Timing one set of tensors
over and over would: a 7B model's attention over a short context then
measures cache bandwidth on a CPU (several times DRAM's), and L2 on a GPU.
Per-layer operators therefore go round copies of their tensors, one per
layer up to ``ROTATE_BYTES`` in all (triton's do_bench flushes L2 between
calls for the same reason); a small model whose layers all fit in cache
keeps them there, as it does when served.
"""

from __future__ import annotations

import gc
import importlib.metadata
import math
import os
import platform
import shutil
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from simspec.costs import ModelSpec, model_spec
from simspec.costs.attention import ATTENTION_OPS
from simspec.costs.profiles import LAYER_OPS
from simspec.profiling import ops as operators
from simspec.profiling.grid import Grid, grid_for, ops_for, points
from simspec.profiling.store import ProfileMeta, Table, Timing, device_slug, git_commit, utc_now, write_meta
from simspec.types import InputError

TARGET_MS = 50.0  # measured time per point
MIN_SAMPLES = 5  # the median of 5 shrugs off one disturbed call (shared CPUs)
MAX_SAMPLES = 200
CPU_MAX_BYTES = 4 << 30  # CPU size guard: points needing more tensor bytes are skipped
CUDA_WARMUP_CALLS = 3
CPU_WARMUP_MS = 5.0  # warm-up calls on a CPU until this much time has passed (at least one per copy)
ROTATE_BYTES = 1 << 30  # per-layer operators go round copies of their tensors, one per layer up to this
CPU_THREADS = 1  # torch threads while profiling a CPU: one core gives timings without threading cliffs
PER_LAYER_OPS = frozenset((*LAYER_OPS, *ATTENTION_OPS))  # called once per layer, on that layer's tensors
SOURCE = "measured by simspec profile-gpu"


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileRun:
    """What one ``profile_model`` call did."""

    folder: Path  # <out>/<device-slug>/<model>
    measured_points: int  # points timed by this call
    skipped_points: int  # points this call recorded as skipped (out of memory, size guard)
    kept_points: int  # points already in the CSVs (a resumed run's earlier work)


def _samples_for(estimate_ms: float) -> int:
    if estimate_ms <= 0:
        return MAX_SAMPLES
    return int(min(MAX_SAMPLES, max(MIN_SAMPLES, math.ceil(TARGET_MS / estimate_ms))))


def _stats(samples_ms: list[float]) -> Timing:
    p10, median, p90 = np.percentile(np.asarray(samples_ms), [10, 50, 90])
    return Timing(median_ms=float(median), p10_ms=float(p10), p90_ms=float(p90), samples=len(samples_ms))


def measure_cuda(calls: list[operators.Timed]) -> Timing:
    """Per-call CUDA-event times after warm-up, going round ``calls`` (one
    per copy of the tensors) in turn, one call per sample."""
    for _ in range(CUDA_WARMUP_CALLS):
        for call in calls:
            call()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    calls[0]()
    end.record()
    end.synchronize()
    n = _samples_for(start.elapsed_time(end))
    events = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(n)]
    for j, (begin, finish) in enumerate(events):
        call = calls[(j + 1) % len(calls)]  # calls[0] ran last
        begin.record()
        call()
        finish.record()
    torch.cuda.synchronize()
    return _stats([begin.elapsed_time(finish) for begin, finish in events])


def measure_cpu(calls: list[operators.Timed]) -> Timing:
    """Per-call wall times after warm-up, going round ``calls`` (one per
    copy of the tensors) in turn, one call per sample."""
    warm_until = time.perf_counter() + CPU_WARMUP_MS / 1e3
    j = 0
    while True:
        call = calls[j % len(calls)]
        began = time.perf_counter()
        call()
        estimate_ms = (time.perf_counter() - began) * 1e3
        j += 1
        if j >= len(calls) and time.perf_counter() >= warm_until:
            break
    samples = []
    for _ in range(_samples_for(estimate_ms)):
        call = calls[j % len(calls)]
        began = time.perf_counter()
        call()
        samples.append((time.perf_counter() - began) * 1e3)
        j += 1
    return _stats(samples)


def is_out_of_memory(err: BaseException) -> bool:
    """CUDA out of memory, or an allocation the CPU could not serve."""
    text = str(err).lower()
    return isinstance(err, torch.OutOfMemoryError) or (
        isinstance(err, RuntimeError) and ("out of memory" in text or "can't allocate memory" in text))


def _free(device: torch.device, *, collect: bool = False) -> None:
    """Hand freed memory back (tensors die with their last reference; a full
    garbage collection, slow with torch loaded, only after out of memory)."""
    if collect:
        gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _version(package: str) -> str | None:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return None


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "cpu"


def _ram_bytes() -> int | None:
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def _nvidia_driver() -> str | None:
    if shutil.which("nvidia-smi") is None:
        return None
    try:
        done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                              capture_output=True, text=True, timeout=20, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    lines = done.stdout.strip().splitlines()
    return lines[0].strip() if done.returncode == 0 and lines else None


def describe_device(device: str) -> tuple[str, str, int | None, str | None]:
    """(name, slug, memory bytes, driver) of the "cuda" or "cpu" device."""
    if device == "cuda":
        name = torch.cuda.get_device_name(0)
        return name, device_slug(name, "cuda"), torch.cuda.get_device_properties(0).total_memory, _nvidia_driver()
    name = _cpu_name()
    return name, device_slug(name, "cpu"), _ram_bytes(), None


def _notes(device: str, max_bytes: int | None) -> str:
    notes = ["times are per layer for per-layer operators; drafter_step has one draft position per request "
             "(tokens requests, each cross-attending to kept_tokens visual tokens) and its decoder layer "
             "attends only to the step's own position; vision_encoder excludes the patch embedding; select "
             f"picks {operators.SELECT_KEPT_TOKENS} tokens by {operators.SELECT_LAYERS} voting layers with one "
             "query per KV head; int8_quantize quantizes all layers' keys of one request; decoder-layer pieces "
             f"and attention go round one copy of their tensors per layer (at most {ROTATE_BYTES / 2**30:g} GiB "
             "in all), as a forward pass does, so no sample finds data a real step would have evicted"]
    if device == "cpu":
        notes.append(f'{", ".join(operators.KERNEL_OPS)}: simspec_kernels with impl="auto" runs its plain-PyTorch '
                     'references on a CPU')
    if max_bytes is not None:
        notes.append(f"CPU size guard: points needing more than {max_bytes / 2**30:g} GiB of tensors are skipped")
    return "; ".join(notes)


def copies(op: str, layers: int, need: int) -> int:
    """Sets of tensors a point of ``op`` goes round: one per layer for a
    per-layer operator, as many as fit in ``ROTATE_BYTES`` (at least one)."""
    return max(1, min(layers, ROTATE_BYTES // max(need, 1))) if op in PER_LAYER_OPS else 1


class _Operator:
    """One operator of a run: its case, and its weights (a set per copy) once a point needs them."""

    def __init__(self, op: str, bench: operators.Bench):
        self.op, self.case, self.bench = op, operators.CASES[op], bench
        self._makes = []

    def measure(self, point: tuple[int, ...], max_bytes: int | None) -> tuple[Timing | None, str]:
        """(timing, "") for a point that ran, (None, why) for one skipped."""
        need = self.case.nbytes(self.bench.model, self.bench.dtype.itemsize, *point)
        if max_bytes is not None and need > max_bytes:
            return None, f"size guard: needs {need / 2**30:.1f} GiB > {max_bytes / 2**30:g} GiB"
        measure = measure_cuda if self.bench.device.type == "cuda" else measure_cpu
        n = copies(self.op, self.bench.model.layers, need)
        try:
            while len(self._makes) < n:
                self._makes.append(self.case.setup(self.bench))
            return measure([make(*point) for make in self._makes[:n]]), ""
        except RuntimeError as err:
            if not is_out_of_memory(err):
                raise
        _free(self.bench.device, collect=True)  # outside the except: its traceback held the tensors
        return None, "out of memory"


def profile_model(model: ModelSpec, *, device: str, grid: Grid, out: Path, progress: bool = True,
                  max_bytes: int | None = None, threads: int = CPU_THREADS) -> ProfileRun:
    """Measure ``model``'s operators on ``grid`` into ``out/<device-slug>/<model>/``,
    resuming from the CSVs already there. ``max_bytes`` is the size guard
    (default: ``CPU_MAX_BYTES`` on a CPU, none on a GPU); ``threads`` the
    torch CPU threads while measuring a CPU (restored afterwards)."""
    cuda = device == "cuda"
    if not cuda:
        before = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            return _profile_model(model, device=device, grid=grid, out=out, progress=progress, max_bytes=max_bytes)
        finally:
            torch.set_num_threads(before)
    return _profile_model(model, device=device, grid=grid, out=out, progress=progress, max_bytes=max_bytes)


def _profile_model(model: ModelSpec, *, device: str, grid: Grid, out: Path, progress: bool,
                   max_bytes: int | None) -> ProfileRun:
    cuda = device == "cuda"
    if max_bytes is None and not cuda:
        max_bytes = CPU_MAX_BYTES
    name, slug, memory, driver = describe_device(device)
    folder = Path(out) / slug / model.name
    tables = [Table(folder / f"{op.name}.csv", op) for op in ops_for(model)]  # refuses foreign CSVs first
    todo = [(table, [p for p in points(table.op, grid, model) if p not in table.done]) for table in tables]
    kept = sum(len(points(table.op, grid, model)) - len(pending) for table, pending in todo)
    dtype = torch.bfloat16 if cuda else torch.float32
    write_meta(folder, ProfileMeta(
        device=name, device_slug=slug, memory_bytes=memory, kind=device, driver=driver,
        cuda=torch.version.cuda if cuda else None, torch=torch.__version__, triton=_version("triton"),
        date=utc_now(), git_commit=git_commit(), model=model.name, grid=grid.name,
        dtype=str(dtype).removeprefix("torch."), source=SOURCE, licence=None,
        kernels="simspec_kernels",
        notes=_notes(device, max_bytes), threads=None if cuda else torch.get_num_threads(),
        thp_mem_alloc_enable=None if cuda else os.environ.get("THP_MEM_ALLOC_ENABLE")))

    bench = operators.Bench(model=model, device=torch.device(device), dtype=dtype)
    measured = skipped = 0
    bar = tqdm(total=sum(len(p) for _, p in todo), desc=f"{slug}/{model.name}", unit="point", disable=not progress)
    torch.manual_seed(0)
    try:
        with torch.inference_mode():
            for table, pending in todo:
                op = _Operator(table.op.name, bench)
                for point in pending:
                    bar.set_postfix_str(f"{table.op.name} {point}")
                    timing, reason = op.measure(point, max_bytes)
                    table.write(point, timing, reason)
                    measured += timing is not None
                    skipped += timing is None
                    bar.update()
                del op  # its weights
                table.close()
                _free(bench.device)
    finally:
        bar.close()
        for table in tables:
            table.close()
    return ProfileRun(folder=folder, measured_points=measured, skipped_points=skipped, kept_points=kept)


def run_profile(*, device: str, models: list[str], quick: bool, out: Path, progress: bool) -> list[Path]:
    """``simspec profile-gpu``: profile each model (a simspec.costs.MODELS
    name) on ``device`` ("cuda" or "cpu") into ``out``; returns the folders."""
    specs = [model_spec(name) for name in models]  # InputError for an unknown name, before any work
    if device not in ("cuda", "cpu"):
        raise InputError(f"--device must be cuda or cpu (got {device!r})")
    if device == "cuda" and not torch.cuda.is_available():
        raise InputError("--device cuda: no CUDA device; use --device cpu")
    grid = grid_for(device, quick)
    return [profile_model(spec, device=device, grid=grid, out=Path(out), progress=progress).folder for spec in specs]
