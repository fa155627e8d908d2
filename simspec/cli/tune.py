"""``simspec tune``: each policy family's best parameters per load and burstiness (simspec.tune)."""

from __future__ import annotations

import argparse
from dataclasses import replace
from pathlib import Path

from simspec import __version__, config as configuration
from simspec.cli.scenario import add_scenario_flags, number
from simspec.files import check_writable, write_text
from simspec.tune import FAMILIES, OBJECTIVES, TuneConfig, dumps, notes, table_csv, table_markdown, tune
from simspec.acceptance.presets import check_drafter
from simspec.types import InputError, require
from simspec.workloads import image_sizes


def _floats(flag: str):
    def convert(text: str) -> tuple[float, ...]:
        try:
            return tuple(float(x) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be comma-separated numbers (got {text!r})") from None
    return convert


def _slos(entries: list[str] | None) -> dict:
    out = {}
    for entry in entries or []:
        name, sep, value = entry.partition(":")
        require(sep and name in ("ttft", "tpot", "e2el"),
                f"--slo must look like ttft:MS, tpot:MS or e2el:MS (got {entry!r})")
        try:
            out[f"slo_{name}_ms"] = float(value)
        except ValueError:
            raise InputError(f"--slo {name} must be a number of milliseconds (got {value!r})") from None
    return out


def cmd_tune(args: argparse.Namespace) -> int:
    require(not args.policy, "tune chooses the policies itself; name families with --families (not --policy)")
    require(not args.policy_file, "tune writes a policy file; --policy-file is for simulate")
    require(not (args.load and args.rates), "give --load or --rates, not both")
    base = configuration.from_flags({**vars(args), "cv": None}, args.config)  # --cv here lists the CVs to tune
    if args.acceptance is not None or (args.config and "acceptance" in configuration.load(args.config)):
        check_drafter(base.acceptance, base.drafter)
    require(not base.fleet, "tune: --fleet (or a config's [fleet]) is a fleet of groups; tune tunes one setup's "
                            "policy: give that setup's --device, --tp and engine flags (and --replicas N)")
    require(base.engine.kind == "simspec",
            f"tune builds a load-adaptive (staged) policy, which only --engine simspec runs (got --engine "
            f"{base.engine.kind}); tune on the simspec engine, then `simspec export --format {base.engine.kind}` "
            f"simulates the exported settings on {base.engine.kind}")
    require(args.sensitivity is None or 0.0 < args.sensitivity < 0.5,
            f"--sensitivity must be in (0, 0.5): the share the acceptance length moves (got {args.sensitivity})")
    slos = _slos(args.slo)
    if slos:
        base = replace(base, **slos)
    defaults = TuneConfig()
    rates = args.rates or ((args.rate,) if args.rate is not None and not args.load else ())
    tc = TuneConfig(loads=args.load or (() if rates else defaults.loads), rates_per_s=rates, cvs=args.cv or (),
                    objective=args.objective, families=tuple(args.families.split(",")) if args.families else FAMILIES,
                    trials=args.trials, search_seeds=args.search_seeds, confirm_seeds=args.confirm_seeds,
                    top=args.top, jobs=args.jobs)
    require(tc.objective != "goodput" or base.slo_ttft_ms or base.slo_tpot_ms or base.slo_e2el_ms,
            "objective goodput needs an SLO: --slo ttft:MS, tpot:MS and/or e2el:MS")
    out = Path(args.out)
    require(not out.is_dir(), f"--out {out} is a folder; name the tuned file (e.g. {out}/tuned.toml)")
    check_writable(out.parent, f"--out {out}")  # before the tuning, not after
    tuned = tune(base, tc, progress=not args.quiet)
    out.parent.mkdir(parents=True, exist_ok=True)
    write_text(out.with_suffix(".csv"), table_csv(tuned))
    write_text(out.with_suffix(".md"), table_markdown(tuned))
    write_text(out, dumps(tuned))  # last: a tuned file there means its table is too
    metric = OBJECTIVES[tc.objective][0]
    print(f"simspec {__version__} | tune {metric} ({OBJECTIVES[tc.objective][1]}) | {base.model} on {base.device} | "
          f"AR saturation {tuned.saturation_rate_per_s:.3g} req/s | {tc.trials} trials/family, "
          f"{tc.search_seeds} search + {tc.confirm_seeds} confirm seeds"
          + (f" | images {image_sizes(base.workload.image_size).describe()}" if base.workload.image_size else ""))
    print()
    print(table_markdown(tuned), end="")
    print()
    for s in tuned.schedules:
        print(f"adaptive (CV {s.cv:g}): {s.policy}")
    for line in notes(tuned):
        print(f"note: {line}")
    if args.sensitivity is not None:
        from simspec.tune.search import sensitivity  # only when asked: it serves every cell's bests twice more

        for line in sensitivity(tuned, tc, args.sensitivity):
            print(line)
    print(f"wrote {out}, {out.with_suffix('.csv')}, {out.with_suffix('.md')}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simspec tune`` (scenario flags as ``simulate``'s)."""
    d = TuneConfig()
    p = sub.add_parser("tune", conflict_handler="resolve",
                       help="find each policy family's best parameters per load level and burstiness")
    add_scenario_flags(p)
    p.add_argument("--load", type=_floats("--load"), metavar="X,...",
                   help=f"load levels as multiples of the AR saturation rate (default: {','.join(map(str, d.loads))})")
    p.add_argument("--rates", type=_floats("--rates"), metavar="R,...", help="or: request rates, requests/s")
    p.add_argument("--cv", type=_floats("--cv"), metavar="CV,...",
                   help="inter-arrival CVs to tune for: 1 = Poisson, >1 bursty Gamma (default: the scenario's)")
    p.add_argument("--objective", default=d.objective, help=f"one of {', '.join(OBJECTIVES)} (default: %(default)s)")
    p.add_argument("--slo", action="append", metavar="ttft:MS|tpot:MS|e2el:MS", help="SLO for goodput (repeat)")
    p.add_argument("--families", metavar="F,...", help=f"families to tune (default: {','.join(FAMILIES)})")
    p.add_argument("--trials", type=int, default=d.trials, help="Optuna trials per family and cell (%(default)s)")
    p.add_argument("--search-seeds", type=int, default=d.search_seeds, help="seeds per trial (%(default)s)")
    p.add_argument("--confirm-seeds", type=int, default=d.confirm_seeds,
                   help="fresh seeds the top candidates are re-run on (%(default)s)")
    p.add_argument("--top", type=int, default=d.top, help="candidates per family re-run (%(default)s)")
    p.add_argument("--jobs", type=int, default=d.jobs, help="cells tuned in parallel processes (%(default)s)")
    p.add_argument("--out", default="tuned.toml", metavar="FILE.toml",
                   help="tuned file; the table goes beside it as .csv and .md (default: %(default)s)")
    p.add_argument("--sensitivity", type=number(float, "--sensitivity"), nargs="?", const=0.10, default=None,
                   metavar="SPREAD", help="each cell's tuned bests served again on the confirm seeds with the "
                                          "acceptance length moved by -SPREAD and +SPREAD (default 0.10): whether "
                                          "the cell's winner stays best")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(handler=cmd_tune)
