"""Peak memory and wall time of long runs: ``simspec simulate --out`` with
Poisson arrivals (the default scenario otherwise) at 100k, 300k and 1M
requests, with ``ar`` and ``marginal``, each in a fresh process. Target:
under 2 GB peak RSS at 1M requests.

    python benchmarks/memory.py [--requests 100000,300000,1000000] [--policy ar --policy marginal]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import json, resource, sys, time
from simspec.cli import main
started = time.perf_counter()
code = main(sys.argv[1:])
print(json.dumps({"code": code, "peak_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "wall_s": time.perf_counter() - started}), file=sys.stderr)
"""


def measure(requests: int, policy: str, folder: Path) -> dict:
    argv = ["simulate", "--arrival", "poisson", "--num-requests", str(requests), "--policy", policy,
            "--out", str(folder / f"{policy}-{requests}"), "--quiet"]
    done = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    line = done.stderr.strip().splitlines()[-1] if done.stderr.strip() else "{}"
    result = json.loads(line) if line.startswith("{") else {"code": done.returncode, "error": line}
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", default="100000,300000,1000000")
    parser.add_argument("--policy", action="append")
    args = parser.parse_args()
    sizes = [int(x) for x in args.requests.split(",")]
    policies = args.policy or ["ar", "marginal"]
    measure(100, policies[0], Path(tempfile.mkdtemp()))  # compile (or load) the step kernels first
    print(f"{'policy':10s} {'requests':>10s} {'peak RSS MB':>12s} {'wall s':>8s} {'requests/s':>11s}")
    with tempfile.TemporaryDirectory() as scratch:
        for policy in policies:
            for n in sizes:
                r = measure(n, policy, Path(scratch))
                if r.get("code") != 0:
                    print(f"{policy:10s} {n:10d}  failed: {r.get('error', r)}")
                    continue
                print(f"{policy:10s} {n:10d} {r['peak_mb']:12.0f} {r['wall_s']:8.1f} {n / r['wall_s']:11.0f}",
                      flush=True)


if __name__ == "__main__":
    main()
