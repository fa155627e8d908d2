"""Shared fixtures: small scenarios built from the library's own records."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import sys
from pathlib import Path

import numpy as np
import pytest

from simspec import acceptance, costs
from simspec.sim import EngineConfig, simulate
from simspec.types import Request

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"
"""Real data nobody here wrote (traces, external profiles, published figures), beside the repository."""


def shared(*parts: str) -> Path:
    """A file of the shared data; the test is skipped, naming the file, where it is absent."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.exists():
        pytest.skip(f"needs {path}: the shared data beside the repository (../shared/data) is absent")
    return path
H100 = costs.gpu_spec("h100-sxm")
LLAVA = costs.model_spec("LLaVA-1.5-7B")


@pytest.fixture(scope="session")
def roofline():
    return costs.build("roofline", LLAVA, H100)


def requests_at(arrivals_s, *, prompt=64, output=32, images=()) -> list[Request]:
    """Requests arriving at the given times, all alike."""
    return [Request(id=i, arrival_s=float(t), prompt_tokens=prompt, image_tokens=tuple(images), output_tokens=output)
            for i, t in enumerate(arrivals_s)]


def run(requests, policy, *, cost_model=None, accept=None, engine=None, seed=0, kv_tokens=200_000):
    return simulate(requests, policy=policy, costs=cost_model or costs.build("constant:10", LLAVA, H100),
                    acceptance=accept or acceptance.preset(acceptance.DEFAULT_PRESET),
                    engine=engine or EngineConfig(), kv_budget_tokens=kv_tokens, seed=seed)


def per_request_tokens(log) -> np.ndarray:
    return np.bincount(log.chunk_request, weights=log.chunk_tokens, minlength=len(log.requests))


def invoke(argv) -> tuple[int, str, str]:
    """``simspec ARGV`` in this process: (exit status, stdout, stderr).
    argparse's own errors exit through SystemExit; any other exception
    would reach the user as a traceback, so it fails the test."""
    from simspec import cli

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main([str(a) for a in argv])
        except SystemExit as exit_:
            code = exit_.code
        except Exception as exc:  # noqa: BLE001 - reported as the failure
            pytest.fail(f"simspec {' '.join(map(str, argv))} raised {type(exc).__name__}: {exc}")
    return code, out.getvalue(), err.getvalue()


def load_benchmark(name: str):
    """benchmarks/NAME.py as a module (the benchmarks are scripts, not a package)."""
    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"{name}_benchmark", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while the class is built
    spec.loader.exec_module(module)
    return module
