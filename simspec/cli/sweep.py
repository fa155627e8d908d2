"""``simspec sweep``: a grid of scenarios into one resumable Parquet table (simspec.sweep)."""

from __future__ import annotations

import argparse
import sys
import time

from simspec import config as configuration, costs
from simspec.sweep import Runner, SweepConfig, describe, from_values, load, run, size
from simspec.sweep.estimate import CONFIRM_ABOVE, estimate
from simspec.types import InputError, require


_LIST_FLAGS = {  # flag -> (axis, kind); values are comma-separated lists
    "load": ("load", float), "rate": ("rate", float), "cv": ("cv", float), "burstiness": ("burstiness", float),
    "multimodal_share": ("multimodal_share", float), "model": ("model", str), "device": ("device", str),
    "acceptance": ("acceptance", str),
}


def _list(text: str, kind: type, flag: str) -> list:
    items = [t.strip() for t in text.split(",")]
    require(all(items), f"--{flag.replace('_', '-')}: empty value in {text!r} (give a comma-separated list)")
    try:
        return [kind(t) for t in items]
    except ValueError:
        kind_name = "integers" if kind is int else "numbers"
        raise InputError(f"--{flag.replace('_', '-')} must be a comma-separated list of {kind_name} "
                         f"(got {text!r})") from None


def sweep_from_args(args: argparse.Namespace) -> SweepConfig:
    data = load(args.config) if args.config else {}
    axes = {}
    for flag, (axis, kind) in _LIST_FLAGS.items():
        given = getattr(args, flag)
        if given:
            axes[axis] = [v for text in given for v in _list(text, kind, flag)]
    if args.cost_model:
        axes["cost_model"] = list(args.cost_model)
    base: dict = {}
    if args.policy:
        axes["policies"] = list(args.policy)
    if args.num_requests is not None:
        count = _list(args.num_requests, int, "num_requests")
        require(len(count) == 1 and count[0] >= 1, f"--num-requests must be an integer >= 1 (got {args.num_requests})")
        base["num_requests"] = count[0]
    if args.tp is not None:
        base["tp"] = args.tp
    base_flags = configuration.flag_overrides(base) if base else {}
    seeds = None
    if args.seeds is not None:
        text = args.seeds.strip()
        seeds = _list(text, int, "seeds") if "," in text else _list(text, int, "seeds")[0]
    return from_values(data, base_flags=base_flags, axis_flags=axes, seeds=seeds,
                       where=str(args.config) if args.config else "sweep")


def cmd_sweep(args: argparse.Namespace) -> int:
    sweep = sweep_from_args(args)
    workers = None
    if args.workers is not None:
        workers = _list(args.workers, int, "workers")
        require(len(workers) == 1, f"--workers must be an integer >= 1 (got {args.workers})")
        workers = workers[0]
    runner = Runner(workers=workers, ray=args.ray, progress=not args.quiet)
    for line in describe(sweep):
        print(line, flush=True)
    tasks = size(sweep) * len(sweep.seed_list)
    if args.dry_run:
        for line in estimate(sweep, runner).lines():
            print(line, flush=True)
        return 0
    require(tasks <= CONFIRM_ABOVE or args.yes,
            f"sweep: {tasks:,} tasks is more than {CONFIRM_ABOVE:,}: see how long it would take with --dry-run, "
            f"then add --yes to run it")
    require(args.out is not None, "--out is required (the results table, e.g. results.parquet)")
    started = time.perf_counter()
    try:
        outcome = run(sweep, args.out, runner, log=lambda line: print(line, flush=True))
    except KeyboardInterrupt:
        print(f"interrupted: the finished tasks are in {args.out}; the same command resumes", file=sys.stderr)
        raise
    if outcome.tasks_run == 0:
        print(f"nothing to run: all {outcome.tasks_total} tasks are in {outcome.path}")
    else:
        print(f"wrote {outcome.rows} rows ({outcome.tasks_run} tasks run now, "
              f"{outcome.tasks_total - outcome.tasks_run} already there) to {outcome.path} in "
              f"{time.perf_counter() - started:.1f} s")
    print(f"next: simspec report {outcome.path}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register the ``sweep`` subcommand."""
    defaults = Runner()
    p = sub.add_parser("sweep", help="a grid of scenarios x policies x seeds into one Parquet table (resumable)",
                       description="Run a grid of scenarios (axes x seeds), each serving every policy on the same "
                                   "requests, into one Parquet table. Flags override the sweep file; list flags "
                                   "take comma-separated values and replace the file's axis.")
    p.add_argument("--config", metavar="SWEEP.toml", help="sweep file: [base] (a simulate config), [axes], seeds")
    p.add_argument("--out", metavar="RESULTS.parquet", help="results table; rerunning resumes it")
    p.add_argument("--load", action="append", metavar="X,...", help="axis: multiples of the AR saturation rate")
    p.add_argument("--rate", action="append", metavar="R,...", help="axis: request rates, requests/s")
    p.add_argument("--cv", action="append", metavar="CV,...", help="axis: inter-arrival CV (gamma arrivals)")
    p.add_argument("--burstiness", action="append", metavar="B,...", help="axis: Gamma shape (CV = 1/sqrt)")
    p.add_argument("--multimodal-share", action="append", metavar="S,...", help="axis: share of requests with images")
    p.add_argument("--model", action="append", metavar="NAME,...", help=f"axis: models (catalog names, {', '.join(costs.MODELS)}, or config.json paths)")
    p.add_argument("--device", action="append", metavar="GPU,...", help=f"axis: devices ({', '.join(costs.GPUS)})")
    p.add_argument("--acceptance", action="append", metavar="PRESET,...", help="axis: acceptance presets or iid:P")
    p.add_argument("--cost-model", action="append", metavar="SPEC",
                   help=f"axis: cost model (repeat; not comma-split): {costs.COST_MODEL_FORMS}")
    p.add_argument("--policy", action="append", metavar="NAME[:k=v,...]", help="policy served in every task (repeat)")
    p.add_argument("--seeds", metavar="N|S,...", help="N seeds (0..N-1) or a comma-separated list")
    p.add_argument("--num-requests", metavar="N", help="requests per simulation")
    p.add_argument("--tp", type=int, metavar="N", help="tensor-parallel GPUs per replica of every scenario "
                                                        "(1, 2, 4 or 8; not an axis)")
    p.add_argument("--workers", metavar="N", help="local processes (default: every core; 1 = serial)")
    p.add_argument("--ray", metavar="ADDRESS", help="run on Ray: local, auto, HOST:PORT or ray://HOST:PORT "
                   f"(an address that does not answer fails within {defaults.probe_timeout_s:g} s)")
    p.add_argument("--dry-run", action="store_true",
                   help="print the grid, its task count and an estimated time (one timed sample task), and stop")
    p.add_argument("--yes", action="store_true", help=f"run a sweep of more than {CONFIRM_ABOVE:,} tasks")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_sweep)
