"""benchmarks/gpu_session.sh: the dry run that checks a GPU session on the CPU before a machine is asked for."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "gpu_session.sh"
STEPS = ("describe", "install", "gpu_tests", "kernels", "profile_llava", "profile_qwen", "live")

pytestmark = pytest.mark.skipif(shutil.which("bash") is None or shutil.which("timeout") is None,
                                reason="needs bash and coreutils' timeout")


def session(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), *args], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHON": sys.executable, **env})


def test_dry_run_checks_every_step_and_fits_eight_minutes():
    done = session("--dry-run")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "FAIL" not in done.stdout
    for step in STEPS:
        row = re.search(rf"^  {step}\s+(\d+)\s+(\d+)$", done.stdout, re.M)
        assert row, f"no time-plan row for {step}"
        assert int(row[1]) <= int(row[2])  # the estimate within the step's limit
    total = int(re.search(r"^  total\s+(\d+)$", done.stdout, re.M)[1])
    assert total <= 480


def test_dry_run_refuses_a_plan_over_the_session_limit():
    done = session("--dry-run", SESSION_LIMIT_S="300")
    assert done.returncode == 1
    assert "add up to 480 s, over the session's 300 s" in done.stdout


def test_the_session_refuses_a_machine_without_cuda(tmp_path):
    torch = pytest.importorskip("torch")
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU: the session would run")
    done = session(OUT=str(tmp_path / "out"))
    assert done.returncode == 2
    assert "no CUDA GPU" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_unknown_argument_is_one_line():
    done = session("--dryrun")
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--dry-run" in done.stderr
