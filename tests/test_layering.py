"""The package's import graph: no cycles, and the layers of DESIGN.md."""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "simspec"

# DESIGN.md "Layout and layering": imports point one way.
FOUNDATION = ("simspec.types", "simspec.compiled", "simspec.files", "simspec.pool", "simspec.logs",
              "simspec.seeds")
CORE = ("simspec.trees", "simspec.workloads", "simspec.acceptance", "simspec.costs", "simspec.policies",
        "simspec.serving", "simspec.metrics")
ABOVE_CORE = ("simspec.sim", "simspec.live", "simspec.models", "simspec.cli", "simspec.config",
              "simspec.experiment", "simspec.sweep", "simspec.tune", "simspec.report", "simspec.export",
              "simspec.runfolder", "simspec.profiling", "simspec.vllm", "simspec.validation", "simspec.fleet",
              "simspec.plan", "simspec.sensitivity")
# Outside the layers: the package itself (its version).
UNLAYERED = ("simspec",)


def modules() -> dict[str, Path]:
    out = {}
    for path in PACKAGE.rglob("*.py"):
        parts = list(path.relative_to(REPO).with_suffix("").parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        out[".".join(parts)] = path
    return out


def imports(name: str, path: Path) -> set[str]:
    """Every module ``name`` imports (at any place in the file), as written."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([base] if base else []))
            found.add(base)
            found |= {f"{base}.{a.name}" for a in node.names}
    return found


def graph() -> dict[str, set[str]]:
    """Module -> the simspec modules it imports (a name resolved to the
    module that holds it; a package and its own submodules are not edges)."""
    known = modules()

    def resolve(name: str) -> str | None:
        while name and name not in known:
            name = name.rpartition(".")[0]
        return name or None

    edges = {}
    for name, path in known.items():
        targets = {resolve(i) for i in imports(name, path) if i.split(".")[0] == "simspec"}
        edges[name] = {t for t in targets if t and t != name and not name.startswith(t + ".")
                       and not t.startswith(name + ".")}
    return edges


def _within(name: str, groups) -> bool:
    return any(name == g or name.startswith(g + ".") for g in groups)


def test_the_import_graph_has_no_cycle():
    edges = graph()
    state: dict[str, int] = {}  # 1 on the current path, 2 done

    def visit(node: str, path: list[str]) -> None:
        state[node] = 1
        for nxt in sorted(edges[node]):
            if state.get(nxt) == 1:
                pytest.fail("import cycle: " + " -> ".join(path[path.index(nxt):] + [node, nxt]))
            if nxt not in state:
                visit(nxt, path + [node])
        state[node] = 2

    for node in sorted(edges):
        if node not in state:
            visit(node, [])


def test_every_module_is_in_a_layer():
    """A new package or module is placed in DESIGN.md's layers, not beside them."""
    layered = FOUNDATION + CORE + ABOVE_CORE
    loose = sorted(name for name in modules() if not _within(name, layered) and name not in UNLAYERED)
    assert not loose, f"modules in no layer: {loose}"


def test_types_imports_nothing_of_the_package_and_the_foundation_only_types():
    edges = graph()
    assert edges["simspec.types"] == set()
    for name in FOUNDATION:
        assert edges[name] <= {"simspec.types"}, (name, edges[name])


@pytest.mark.parametrize("layer", CORE)
def test_the_core_never_imports_what_is_built_on_it(layer):
    for name, targets in graph().items():
        if _within(name, (layer,)):
            above = sorted(t for t in targets if _within(t, ABOVE_CORE))
            assert not above, f"{name} imports {above}"


def test_only_the_cli_imports_argparse_and_nothing_imports_the_cli():
    edges = graph()
    for name, path in modules().items():
        if not _within(name, ("simspec.cli",)):
            assert "argparse" not in imports(name, path), name
            assert not [t for t in edges[name] if _within(t, ("simspec.cli",))], name


def test_the_simulator_imports_no_torch_and_the_engine_no_simulator():
    edges = graph()
    for name, targets in edges.items():
        if _within(name, ("simspec.live",)):
            assert not [t for t in targets if _within(t, ("simspec.sim",))], (name, targets)
    for name, path in modules().items():
        if _within(name, ("simspec.sim", "simspec.serving", "simspec.acceptance", "simspec.policies")):
            assert not {i for i in imports(name, path) if i.split(".")[0] in ("torch", "simspec_kernels")}, name


def test_every_package_folder_is_installed():
    packages = set(tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    folders = {".".join(p.parent.relative_to(REPO).parts) for p in PACKAGE.rglob("__init__.py")}
    assert folders <= packages, f"pyproject.toml does not install {sorted(folders - packages)}"
