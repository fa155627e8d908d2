"""The golden outputs (tests/golden/): the main job, a short sweep and a
tiny tune, regenerated and compared byte for byte; and the README's example
output is the golden main job's table.

Regenerate with ``python tests/golden/regenerate.py`` only when a result is
meant to change (tests/golden/regenerate.py says what each file holds).
"""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

GOLDEN = Path(__file__).resolve().parent / "golden"
README = Path(__file__).resolve().parents[1] / "README.md"
FILES = ("simulate.json", "simulate.txt", "sweep.jsonl", "tune.toml")


def _regenerate_module():
    spec = importlib.util.spec_from_file_location("golden_regenerate", GOLDEN / "regenerate.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def fresh(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("golden")
    _regenerate_module().regenerate(folder)
    return folder


@pytest.mark.parametrize("name", FILES)
def test_golden_output_is_unchanged(fresh, name):
    assert (fresh / name).read_bytes() == (GOLDEN / name).read_bytes(), (
        f"{name} differs from tests/golden/{name}; if the change is meant, regenerate with "
        f"`python tests/golden/regenerate.py` and say why in the commit")


def test_readme_example_output_is_the_golden_main_job():
    text = README.read_text()
    blocks = re.findall(r"```\n(simspec \d[^\n]*\n.*?)```", text, flags=re.S)
    assert blocks, "README.md has no example output block starting with the run header"
    assert blocks[0] == (GOLDEN / "simulate.txt").read_text()
