"""Regenerate the golden outputs: ``python tests/golden/regenerate.py [DIR]``.

Writes into DIR (default: this folder) what three commands produce, at
full precision, with nothing that depends on the machine or the clock:

- ``simulate.json`` / ``simulate.txt``: the main job (``simspec simulate``
  on its embedded defaults): every metric of every policy (metrics.json of
  its run folder), and what it prints without the timing line;
- ``sweep.jsonl``: a short ``simspec sweep`` (two loads x two policies, 150
  requests): the results table, one JSON object a row, then its metadata;
- ``tune.toml``: ``simspec tune`` on a tiny grid (one load, two families,
  two trials, one search and two confirm seeds, 120 requests).

``tests/test_golden.py`` runs the same into a temporary folder and compares
the bytes; a change that moves a simulated number shows up there. Run this
script only when a result is meant to change, and say why in the commit.
"""

from __future__ import annotations

import contextlib
import io
import json
import shutil
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SWEEP = ["--load", "0.5,1.0", "--policy", "ar", "--policy", "linear:k=3", "--num-requests", "150", "--seeds", "1",
         "--workers", "1", "--quiet"]
TUNE = ["--load", "0.5", "--families", "linear,truncate", "--trials", "2", "--search-seeds", "1",
        "--confirm-seeds", "2", "--top", "1", "--num-requests", "120", "--quiet"]
VARYING = ("simulated in ", "run folder: ")  # printed lines that depend on the clock or the paths


def _simspec(argv: list[str]) -> str:
    """``simspec ARGV`` in this process; its stdout (it must succeed)."""
    from simspec import cli

    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = cli.main(argv)
    if code != 0:
        raise SystemExit(f"simspec {' '.join(argv)} exited {code}")
    return out.getvalue()


def simulate(folder: Path, scratch: Path) -> None:
    printed = _simspec(["simulate", "--quiet", "--out", str(scratch / "run")])
    kept = [line for line in printed.splitlines() if not any(v in line for v in VARYING)]
    (folder / "simulate.txt").write_text("\n".join(kept).rstrip("\n") + "\n")
    shutil.copyfile(scratch / "run" / "metrics.json", folder / "simulate.json")


def sweep(folder: Path, scratch: Path) -> None:
    import pyarrow.parquet as pq

    table_path = scratch / "sweep.parquet"
    _simspec(["sweep", *SWEEP, "--out", str(table_path)])
    table = pq.read_table(table_path)
    meta = json.loads(table.schema.metadata[b"simspec.sweep"])
    lines = [json.dumps(row, sort_keys=True) for row in table.to_pylist()]
    lines.append(json.dumps({"metadata": meta}, sort_keys=True))
    (folder / "sweep.jsonl").write_text("\n".join(lines) + "\n")


def tune(folder: Path, scratch: Path) -> None:
    _simspec(["tune", *TUNE, "--out", str(scratch / "tuned.toml")])
    shutil.copyfile(scratch / "tuned.toml", folder / "tune.toml")


def regenerate(folder: Path) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        for make in (simulate, sweep, tune):
            make(folder, Path(scratch))


if __name__ == "__main__":
    regenerate(Path(sys.argv[1]) if len(sys.argv) > 1 else HERE)
