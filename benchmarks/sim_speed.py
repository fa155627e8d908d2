"""How much faster than real time the simulator replays a real trace.

Replays the whole Azure LLM 2023 conversation trace (19,366 requests, one
hour; shared/data/traces) on the default scenario (LLaVA-1.5-7B, H100
roofline prior, half the requests with one image) with each policy, on one
core, and prints simulated seconds per wall second twice: the simulation
alone (``simulate`` in this process) and the whole ``simspec simulate
--trace T --policy X --out DIR`` process (imports, reading the trace,
metrics, the run folder), timed as a subprocess after a warm-up run of the
same command has loaded or built the compile cache. Targets:
>= 1,000x real time for marginal, tree and truncate, >= 3,000x for ar and
linear, measured as the whole process.

``--floor`` times what every such process pays before it simulates
anything, as separate processes (best of ``--repeat``, at least 3): the
interpreter, numpy, numba with one cached compiled function called (its
import and the first load of compiled code, which builds numba's typing
and target registries), matplotlib's Figure and Agg canvas on top, and a
whole ``simspec simulate --num-requests 1 --policy ar --out DIR``
process. Each is printed with the most x real time a process that pays it
could reach over the hour (3,502 s / its seconds), to set beside the
targets.

``--poisson N`` instead times one ``simspec simulate --arrival poisson
--num-requests N --policy marginal --out DIR`` process (target: a
million requests in under 10 minutes on one core).

    python benchmarks/sim_speed.py [--trace PATH] [--policy NAME ...] [--repeat R] [--no-process]
    python benchmarks/sim_speed.py --poisson 1000000 [--policy marginal]
    python benchmarks/sim_speed.py --floor [--repeat R]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("NUMBA_NUM_THREADS", "1")  # one core, as the target says

from simspec import config as configuration, policies  # noqa: E402
from simspec.experiment import resolve  # noqa: E402
from simspec.sim import simulate  # noqa: E402

from _shared import shared_file  # noqa: E402

TRACE = ("traces", "azure_llm_2023_conv.csv")  # in the shared data
HOUR_S = 3502.0  # the Azure conv trace's span: the targets' x real time are of this
CACHED = """import numba


@numba.njit(cache=True)
def total(values):
    s = 0.0
    for v in values:
        s += v
    return s
"""  # one small compiled function, cached by numba beside it (the floor's numba line)


def process_s(flags: list[str], out: Path) -> float:
    """Wall seconds of one ``simspec simulate ... --out out --quiet`` process."""
    return timed_s([sys.executable, "-m", "simspec.cli", "simulate", *flags, "--out", str(out), "--quiet"])


def timed_s(argv: list[str]) -> float:
    """Wall seconds of one process; a failed one stops the benchmark with its error."""
    started = time.perf_counter()
    done = subprocess.run(argv, capture_output=True, text=True)
    seconds = time.perf_counter() - started
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({done.returncode}):\n{done.stderr[-2000:]}")
    return seconds


def sim_s(scenario, cfg, requests, spec: str):
    """(wall seconds, log) of ``simulate`` alone in this process."""
    started = time.perf_counter()
    log = simulate(requests, policy=policies.parse(spec), costs=scenario.costs, acceptance=scenario.acceptance,
                   engine=cfg.engine, kv_budget_tokens=scenario.kv_budget_tokens, seed=cfg.seed)
    return time.perf_counter() - started, log


def replay(args) -> None:
    cfg = configuration.from_flags({"trace": args.trace})
    scenario = resolve(cfg)
    requests = scenario.requests
    span_s = requests[-1].arrival_s - requests[0].arrival_s
    specs = args.policy or configuration.DEFAULT_POLICIES
    for spec in specs:  # warm the compiled kernels (their first call compiles or loads a cache)
        sim_s(scenario, cfg, requests[:20], spec)
    print(f"trace: {args.trace} ({len(requests)} requests over {span_s:.0f} s); best of {args.repeat}; "
          f"load average {open('/proc/loadavg').read().split()[0]}")
    print(f"{'policy':14s} {'simulated s':>12s} {'sim wall s':>11s} {'x real':>7s} {'process s':>10s} "
          f"{'x real':>7s} {'steps/wall s':>13s}")
    with tempfile.TemporaryDirectory() as scratch:
        for spec in specs:
            wall_s, log = min((sim_s(scenario, cfg, requests, spec) for _ in range(args.repeat)), key=lambda r: r[0])
            simulated_s = log.end_s - log.start_s
            line = (f"{spec:14s} {simulated_s:12.0f} {wall_s:11.2f} {simulated_s / wall_s:7.0f}")
            if args.process:
                flags = ["--trace", args.trace, "--policy", spec]
                process_s([*flags, "--num-requests", "20"], Path(scratch) / "warm")  # the compile cache exists
                whole_s = min(process_s(flags, Path(scratch) / "run") for _ in range(args.repeat))
                line += f" {whole_s:10.2f} {simulated_s / whole_s:7.0f}"
            else:
                line += f" {'-':>10s} {'-':>7s}"
            print(f"{line} {log.steps.steps / wall_s:13.0f}", flush=True)


def floor(args) -> None:
    """What a simulate process pays before simulating: each step a process of its own."""
    repeat = max(args.repeat, 3)
    with tempfile.TemporaryDirectory() as scratch:
        (Path(scratch) / "cached.py").write_text(CACHED)
        numba_call = f"import sys; sys.path.insert(0, {scratch!r}); import numpy, cached; cached.total(numpy.ones(3))"
        steps = [
            ("python (the interpreter, site)", [sys.executable, "-c", "pass"]),
            ("+ import numpy", [sys.executable, "-c", "import numpy"]),
            ("+ numba: one cached function called", [sys.executable, "-c", numba_call]),
            ("+ matplotlib Figure and Agg canvas", [sys.executable, "-c", numba_call + "; import matplotlib.figure, "
                                                    "matplotlib.backends.backend_agg"]),
            ("simspec simulate, 1 request, ar, --out", [sys.executable, "-m", "simspec.cli", "simulate",
                                                        "--num-requests", "1", "--policy", "ar",
                                                        "--out", str(Path(scratch) / "run"), "--quiet"]),
        ]
        timed_s(steps[2][1])  # numba compiles and caches the function
        timed_s(steps[-1][1])  # simspec's compile cache exists
        print(f"what every simulate process pays, best of {repeat}; load average "
              f"{open('/proc/loadavg').read().split()[0]}")
        print(f"{'process':42s} {'wall s':>7s} {'at most x real (3,502 s hour)':>30s}")
        for name, argv in steps:
            best = min(timed_s(argv) for _ in range(repeat))
            print(f"{name:42s} {best:7.2f} {HOUR_S / best:30.0f}", flush=True)


def poisson(args) -> None:
    spec = (args.policy or ["marginal"])[0]
    flags = ["--arrival", "poisson", "--policy", spec]
    with tempfile.TemporaryDirectory() as scratch:
        process_s([*flags, "--num-requests", "100"], Path(scratch) / "warm")
        whole_s = process_s([*flags, "--num-requests", str(args.poisson)], Path(scratch) / "run")
    print(f"{spec}: {args.poisson} Poisson requests (default scenario), whole process {whole_s:.1f} s "
          f"({args.poisson / whole_s:.0f} requests/s); load average {open('/proc/loadavg').read().split()[0]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trace", help="the trace to replay (default: the shared data's Azure conversation trace)")
    parser.add_argument("--policy", action="append")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each measurement; the fastest counts")
    parser.add_argument("--no-process", dest="process", action="store_false",
                        help="time the simulation alone, not the whole simspec simulate process")
    parser.add_argument("--poisson", type=int, metavar="N",
                        help="time one simspec simulate process of N Poisson requests instead (default policy: marginal)")
    parser.add_argument("--floor", action="store_true",
                        help="time what every simspec simulate process pays before simulating, and stop")
    args = parser.parse_args()
    if args.floor:
        floor(args)
        return
    if args.poisson:
        poisson(args)
        return
    args.trace = args.trace or str(shared_file(*TRACE))
    replay(args)


if __name__ == "__main__":
    main()
