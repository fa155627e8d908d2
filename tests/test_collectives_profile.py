"""``simspec profile-gpu --collectives``: torch.distributed all-reduce timed
over worker processes (gloo on a CPU here; NCCL on a multi-GPU machine)
into the table the tensor-parallel cost model reads."""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

pytest.importorskip("torch")

from simspec.costs import collectives, gpu_spec  # noqa: E402
from simspec.profiling import collectives as measure  # noqa: E402
from simspec.types import InputError  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
SIZES = (1 << 12, 1 << 22)


def test_two_workers_time_each_size():
    sizes = (1 << 12, 1 << 25)
    rows = measure.measure(2, device="cpu", sizes=sizes, samples=7)
    assert [(w, b) for w, b, _ in rows] == [(2, sizes[0]), (2, sizes[1])]
    small, large = rows[0][2], rows[1][2]
    assert 0 < small < large  # 32 MiB moves 8,192 times the bytes of 4 KiB: tens of ms against a shared CPU's jitter


def test_table_is_what_the_cost_model_reads(tmp_path, monkeypatch):
    monkeypatch.setattr(measure, "QUICK_SIZES", SIZES)
    monkeypatch.setattr(measure, "SAMPLES", 5)
    folder = measure.run_collectives(device="cpu", name="test CPU", slug="cpu-test", out=tmp_path, workers=None,
                                     quick=True, progress=lambda _: None)
    assert folder == tmp_path / "cpu-test" / "collectives"
    with open(folder / "all_reduce.csv", newline="") as f:
        rows = list(csv.DictReader(f))
    assert [int(r["bytes"]) for r in rows] == list(SIZES) and {r["workers"] for r in rows} == {"2"}
    meta = json.loads((folder / "meta.json").read_text())
    assert meta["source"] == measure.SOURCE and meta["backend"] == "gloo" and meta["workers"] == [2]
    device = replace(gpu_spec("h100-sxm"), slug="cpu-test")  # the table's device, with a link for the prior
    priced = collectives.all_reduce(device, 2, tmp_path)
    assert priced.label.startswith("all-reduce measured")
    for row in rows:
        assert priced.seconds([int(row["bytes"])])[0] == pytest.approx(float(row["median_ms"]) * 1e-3, rel=1e-9)
    # a rerun replaces its own table
    again = measure.run_collectives(device="cpu", name="test CPU", slug="cpu-test", out=tmp_path, workers=[2],
                                    quick=True, progress=lambda _: None)
    assert again == folder


def test_refuses_to_overwrite_an_imported_table(tmp_path):
    shutil.copytree(REPO / "profiles" / "h100-sxm" / "collectives", tmp_path / "h100-sxm" / "collectives")
    with pytest.raises(InputError, match="from elsewhere"):
        measure.table_folder(tmp_path, "h100-sxm")


def test_degrees():
    assert measure.degrees("cpu", None) == [2]
    assert measure.degrees("cpu", [4, 2, 4]) == [2, 4]
    with pytest.raises(InputError, match="2, 4, 8"):
        measure.degrees("cpu", [3])
