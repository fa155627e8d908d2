"""Kernel tests: the Triton kernels against their PyTorch references.

Without a GPU the kernels run in the Triton interpreter (TRITON_INTERPRET=1,
set here before anything imports triton). A test that takes ``device`` runs
once on "cpu" (the interpreter) and once on "cuda" (marked ``gpu``: skipped
without a GPU, where it repeats the comparison on real hardware). The whole
folder is skipped (its tests are not collected) when torch or triton is
missing.

Tolerances per input dtype, on outputs of order 1 (``tol`` fixture):
fp32 1e-5 (same fp32 math, another summation order); fp16 2e-3 and bf16 2e-2
(inputs of each product rounded to 11 / 8 significant bits, output rounded
once more).
"""

from __future__ import annotations

import os

import pytest

try:
    torch = pytest.importorskip("torch", exc_type=ImportError)
    if not torch.cuda.is_available():
        os.environ.setdefault("TRITON_INTERPRET", "1")  # read when triton is imported: set it first
    pytest.importorskip("triton", exc_type=ImportError)  # a broken install counts as missing
    MISSING = ""
except pytest.skip.Exception as missing:
    # A skip raised by a conftest aborts `pytest tests/kernel_tests`; ignore the folder's tests instead.
    MISSING = str(missing)
    collect_ignore_glob = ["test_*.py"]

INTERPRET = os.environ.get("TRITON_INTERPRET", "0") == "1"
TOLERANCES = {  # by input dtype, see the module docstring
    "float32": dict(atol=1e-5, rtol=1e-5),
    "float16": dict(atol=2e-3, rtol=2e-3),
    "bfloat16": dict(atol=2e-2, rtol=2e-2),
}


def pytest_report_header(config):
    return f"kernel tests skipped: {MISSING}" if MISSING else None


def pytest_generate_tests(metafunc):
    if "device" in metafunc.fixturenames:
        metafunc.parametrize("device", [
            pytest.param("cpu", id="interp",
                         marks=pytest.mark.skipif(not INTERPRET, reason="Triton on CPU needs TRITON_INTERPRET=1")),
            pytest.param("cuda", id="cuda", marks=pytest.mark.gpu),
        ])


@pytest.fixture(autouse=True)
def _gpu_marker_needs_cuda(request):
    if request.node.get_closest_marker("gpu") and not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU")


@pytest.fixture
def tol(dtype):
    """assert_close tolerances for outputs computed from ``dtype`` inputs."""
    return TOLERANCES[str(dtype).removeprefix("torch.")]


@pytest.fixture
def gen():
    """A seeded CPU generator: every test draws the same numbers on every run."""
    return torch.Generator().manual_seed(0)
