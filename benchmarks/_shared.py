"""The shared data beside the repository (``../shared/data``), for benchmarks."""

from __future__ import annotations

import sys
from pathlib import Path

SHARED_DATA = Path(__file__).resolve().parents[2] / "shared" / "data"


def shared_file(*parts: str) -> Path:
    """A file of the shared data; where it is absent, say which and exit 2 (no traceback)."""
    path = SHARED_DATA.joinpath(*parts)
    if not path.is_file():
        print(f"{Path(sys.argv[0]).name}: needs {path}: the shared data beside the repository (../shared/data) is "
              "absent; pass another file where the benchmark takes one", file=sys.stderr)
        raise SystemExit(2)
    return path
