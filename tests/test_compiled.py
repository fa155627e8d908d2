"""The compile cache: keyed by every compiled module's source, never beside the sources."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from simspec import compiled

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture()
def package_copy(tmp_path) -> Path:
    copy = tmp_path / "simspec"
    shutil.copytree(compiled.PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    return copy


def _flip_last_byte(path: Path) -> None:
    """The final newline becomes a space: one byte, still valid Python."""
    data = path.read_bytes()
    assert data.endswith(b"\n")
    path.write_bytes(data[:-1] + b" ")


def test_the_key_of_an_identical_copy_is_the_same(package_copy):
    assert compiled.cache_key(package_copy) == compiled.cache_key()


@pytest.mark.parametrize("module", ["trees/__init__.py", "trees/eagle.py", "sim/steps.py", "costs/base.py", "types.py"])
def test_one_byte_of_a_compiled_module_or_its_constants_changes_the_key(package_copy, module):
    before = compiled.cache_key(package_copy)
    _flip_last_byte(package_copy / module)
    assert compiled.cache_key(package_copy) != before


def test_a_module_no_compiled_code_reads_leaves_the_key_alone(package_copy):
    keyed = {p.relative_to(package_copy).as_posix() for p in compiled.keyed_sources(package_copy)}
    assert "metrics.py" not in keyed and "sim/replica.py" not in keyed
    before = compiled.cache_key(package_copy)
    _flip_last_byte(package_copy / "metrics.py")
    assert compiled.cache_key(package_copy) == before


def test_every_module_that_defines_compiled_code_is_keyed():
    keyed = set(compiled.keyed_sources())
    for path in compiled.PACKAGE.rglob("*.py"):
        text = path.read_text()
        if "@jit" in text or "numba.njit" in text:
            assert path in keyed, path
    assert not [p for p in compiled.PACKAGE.rglob("*.py") if "numba.njit" in p.read_text()
                and p.name != "compiled.py"], "one jit for the whole package: simspec.compiled.jit"


def test_compiled_code_is_cached_under_the_cache_dir_and_never_beside_the_sources(tmp_path):
    env = {**os.environ, "SIMSPEC_CACHE_DIR": str(tmp_path / "cache")}
    code = "from simspec import compiled, trees; import numpy as np; trees.accepted_length(np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64)); print(compiled.CACHE_DIR)"
    out = subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True, capture_output=True, text=True)
    folder = Path(out.stdout.strip())
    assert folder.parent == tmp_path / "cache" and folder.name.startswith("numba-")
    assert any(folder.glob("*accepted_length*.nbi"))
    assert not list(compiled.PACKAGE.rglob("*.nbi")) and not list(compiled.PACKAGE.rglob("*.nbc"))


def test_an_unwritable_cache_dir_compiles_without_caching(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    env = {**os.environ, "SIMSPEC_CACHE_DIR": str(blocker / "cache")}
    code = "from simspec import compiled, trees; import numpy as np; assert not compiled.CACHING; trees.accepted_length(np.zeros((1, 1), np.int64), np.zeros((1, 1), np.int64))"
    subprocess.run([sys.executable, "-c", code], env=env, cwd=REPO, check=True)
    assert not list(compiled.PACKAGE.rglob("*.nbi"))


def _imports_by_ast(root: Path, path: Path) -> set[Path]:
    """The reference for compiled._imports: the same resolution from ``ast``."""
    import ast

    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for alias in node.names:
                sub = f"{node.module}.{alias.name}"
                names.append(sub if compiled._module_file(root, sub) else node.module)
    found = {compiled._module_file(root, n) for n in names if n == "simspec" or n.startswith("simspec.")}
    return found - {None}


def test_the_import_scan_reads_at_least_what_ast_reads_in_every_module():
    for path in sorted(compiled.PACKAGE.rglob("*.py")):
        by_ast = _imports_by_ast(compiled.PACKAGE, path)
        assert by_ast <= compiled._imports(compiled.PACKAGE, path), path


@pytest.mark.parametrize("source", [
    "from simspec.costs import (base,  # the tables\n    roofline)\n",
    "from simspec.costs import base, \\\n    roofline\n",
    "def f():\n    from simspec.costs import base as b, roofline\n",
    "import simspec.costs.base, simspec.costs.roofline as r\n",
])
def test_the_import_scan_reads_multiline_aliased_and_nested_imports(tmp_path, source):
    path = tmp_path / "m.py"
    path.write_text(source)
    assert {"base.py", "roofline.py"} <= {p.name for p in compiled._imports(compiled.PACKAGE, path)}
