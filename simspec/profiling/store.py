"""Profile folders on disk: operator CSVs written row by row, meta.json, device slugs.

Imports: the standard library, simspec.costs and simspec.types (never
torch): the Vidur importer and the CLI use it on machines without torch.

Layout (profiles/README.md): ``<out>/<device-slug>/<model>/<op>.csv`` and
``meta.json``. A measured table is appended one row at a time and flushed,
so an interrupted run keeps every point it measured and a rerun skips them;
whole files (meta.json, imported tables) are written to a temporary file
and renamed, so none is ever left half-written.
"""

from __future__ import annotations

import csv
import json
import os
import re
import subprocess
from dataclasses import asdict, dataclass
from datetime import datetime, timezone
from pathlib import Path

from simspec.files import write_text
from simspec.profiling.grid import Op
from simspec.types import InputError

META_FILE = "meta.json"
REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """Latency statistics of one measured point."""

    median_ms: float
    p10_ms: float
    p90_ms: float
    samples: int  # timed repetitions behind the statistics


@dataclass(frozen=True, slots=True, kw_only=True)
class ProfileMeta:
    """meta.json of one profile folder (keys as profiles/README.md lists them)."""

    device: str  # "NVIDIA H100 80GB HBM3", or the CPU's model name
    device_slug: str  # folder name: "h100-sxm", "cpu-intel-xeon-processor"
    memory_bytes: int | None  # device memory (GPU) or RAM (CPU)
    kind: str  # "cuda" or "cpu"
    driver: str | None  # NVIDIA driver version, from nvidia-smi
    cuda: str | None  # torch.version.cuda
    torch: str | None
    triton: str | None
    date: str  # UTC, ISO 8601: "2026-11-30T01:02:03Z"
    git_commit: str | None  # simspec's commit that measured (or imported) it
    model: str  # simspec.costs.MODELS name
    grid: str  # "full", "quick", or where imported data came from ("vidur")
    dtype: str | None  # "bfloat16" (CUDA), "float32" (CPU); None if unknown
    source: str  # "measured by simspec profile-gpu", or the imported data's origin
    licence: str | None  # licence file beside the data, for imported profiles
    kernels: str | None  # "simspec_kernels", or "reference" where plain-torch stand-ins timed them
    notes: str = ""  # conventions and approximations a reader must know
    threads: int | None = None  # torch CPU threads while measuring (CPU timings depend on it)
    # $THP_MEM_ALLOC_ENABLE while measuring a CPU ("1": torch puts large tensors on transparent huge
    # pages, which changes CPU timings); null when unset or on a GPU
    thp_mem_alloc_enable: str | None = None


def utc_now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def git_commit() -> str | None:
    """``git rev-parse --short HEAD`` of simspec's checkout, or None."""
    try:
        done = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
                              capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    commit = done.stdout.strip()
    return commit if done.returncode == 0 and commit else None


def slugify(text: str) -> str:
    """Lower-case ``[a-z0-9-]``: "Intel(R) Xeon(R) Gold 6448Y" -> "intel-xeon-gold-6448y"."""
    text = re.sub(r"\((r|tm|c)\)", " ", text.lower())
    return re.sub(r"[^a-z0-9]+", "-", text).strip("-") or "unknown"


def gpu_slug(name: str) -> str:
    """The GPUS slug of a CUDA device name, else a slug of the name itself."""
    upper = name.upper()
    if "H200" in upper:
        return "h200"
    if "B200" in upper:
        return "b200"
    if "H100" in upper and "PCIE" not in upper:  # H100 PCIe has other bandwidth than the SXM part
        return "h100-sxm"
    if "A100" in upper and "80G" in upper:
        return "a100-80gb"
    if "L40S" in upper:
        return "l40s"
    return slugify(re.sub(r"^\s*nvidia\s+", "", name, flags=re.IGNORECASE))


def device_slug(name: str, kind: str) -> str:
    """Folder name of a device: a GPUS slug, or ``cpu-`` + the CPU model's slug."""
    return f"cpu-{slugify(name)}" if kind == "cpu" else gpu_slug(name)


def write_meta(folder: Path, meta: ProfileMeta) -> Path:
    path = folder / META_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_text(path, json.dumps(asdict(meta), indent=2) + "\n")
    return path


def read_meta(folder: Path) -> dict | None:
    """A folder's meta.json as written, or None if it has none."""
    path = folder / META_FILE
    if not path.exists():
        return None
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as err:
        raise InputError(f"{path}: not a readable meta.json ({err})") from None


def format_ms(value: float) -> str:
    return f"{value:.5g}"


def row_cells(point: tuple[int, ...], timing: Timing | None, skipped: str) -> list[str]:
    """One CSV row: shape, then timing (empty for a skipped point), then why skipped."""
    if timing is None:
        return [str(v) for v in point] + ["", "", "", "", skipped]
    return [str(v) for v in point] + [format_ms(timing.median_ms), format_ms(timing.p10_ms),
                                      format_ms(timing.p90_ms), str(timing.samples), ""]


class Table:
    """One operator's CSV, opened for appending; ``done`` holds the points
    already in it (measured or skipped), which a resumed run does not redo."""

    def __init__(self, path: Path, op: Op):
        self.path = path
        self.op = op
        self.done: set[tuple[int, ...]] = set()
        self._file = None
        if path.exists():
            self._read()

    def _read(self) -> None:
        raw = self.path.read_bytes()
        if raw and not raw.endswith(b"\n"):  # killed mid-row: drop the partial last line
            raw = raw[: raw.rfind(b"\n") + 1]
            with open(self.path, "r+b") as f:
                f.truncate(len(raw))
        lines = raw.decode().splitlines()
        if not lines:
            return
        header = tuple(next(csv.reader(lines[:1])))
        if header != self.op.header:
            raise InputError(f"{self.path}: columns {','.join(header)} are not {','.join(self.op.header)}; "
                             "move the file away to profile it again")
        width = len(self.op.columns)
        for cells in csv.reader(lines[1:]):
            try:
                self.done.add(tuple(int(c) for c in cells[:width]))
            except ValueError:
                raise InputError(f"{self.path}: shape cells {cells[:width]} are not integers; "
                                 "move the file away to profile it again") from None

    def write(self, point: tuple[int, ...], timing: Timing | None, skipped: str = "") -> None:
        """Append one point's row and flush it to disk."""
        if self._file is None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            fresh = not self.path.exists() or self.path.stat().st_size == 0
            self._file = open(self.path, "a", newline="")
            if fresh:
                csv.writer(self._file).writerow(self.op.header)
        csv.writer(self._file).writerow(row_cells(point, timing, skipped))
        self._file.flush()
        os.fsync(self._file.fileno())
        self.done.add(point)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None

    def __enter__(self) -> "Table":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
