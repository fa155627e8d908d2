"""``simspec plan``: the cheapest fleet that meets the SLOs (simspec.plan)."""

from __future__ import annotations

import argparse
import time

from simspec import __version__, plan as planning
from simspec.types import require
from simspec.cli.scenario import add_scenario_flags, number, scenario_config
from simspec.files import check_writable


def _list(kind, flag: str):
    def convert(text: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a comma-separated list of "
                                             f"{'integers' if kind is int else 'numbers'} (got {text!r})") from None
    return convert


def _bound(slo: planning.Slo) -> str:
    return f"{slo.metric} {'>=' if slo.metric == planning.GOODPUT else '<='} {slo.bound:g}"


def cmd_plan(args: argparse.Namespace) -> int:
    args.tp = args.max_num_seqs = args.device = None  # lists here: the candidates, not the scenario's one value
    base = scenario_config(args)
    require(not base.fleet, "plan: --fleet (or a config's [fleet]) names a fleet; plan searches for one: give the "
                            "traffic and the candidates instead")
    slos = tuple(planning.parse_slo(s) for s in args.slo or [])
    d = planning.PlanConfig.__dataclass_fields__
    pc = planning.PlanConfig(devices=args.devices or d["devices"].default, tps=args.tps or d["tps"].default,
                             policies=tuple(args.policies.split(",")) if args.policies else d["policies"].default,
                             engines=tuple(e.strip() for e in args.engines.split(",") if e.strip()) if args.engines else (),
                             batch_limits=args.batch_limits or (), routers=args.routers or (),
                             splits=planning.parse_splits(args.splits or ""),
                             prefill_devices=args.prefill_devices or (),
                             prefill_tps=args.prefill_tps or (), kv_link=args.kv_link, slos=slos, growth=args.growth,
                             requests=args.requests, confirm_seeds=args.confirm_seeds, finalists=args.finalists,
                             jobs=args.jobs, ray=args.ray, prices=planning.load_prices(args.prices))
    require(args.sensitivity is None or 0.0 < args.sensitivity < 0.5,
            f"--sensitivity must be in (0, 0.5): the share the acceptance length moves (got {args.sensitivity})")
    if args.out:
        check_writable(args.out, f"--out {args.out}")  # before the search, not after
    started = time.perf_counter()
    result = planning.plan(base, pc, progress=not args.quiet)
    wall_s = time.perf_counter() - started
    n = len(result.rows)
    print(f"simspec {__version__} | plan | {base.model} | {result.target_per_s:.3g} req/s "
          f"({base.workload.arrival}{f' x{pc.growth:g} growth' if pc.growth != 1 else ''}) | "
          f"{'routers ' + ', '.join(pc.routers) if pc.routers else 'router ' + base.router} | "
          f"SLOs: {', '.join(_bound(s) for s in slos)}")
    print(f"{n} candidates: {result.unfit} do not fit, {result.pruned} cannot meet the SLOs at any count, "
          f"{sum(r.status in ('confirmed', 'missed') for r in result.rows)} confirmed as whole fleets "
          f"on {pc.confirm_seeds} seeds")
    if result.left_out:
        print(f"left out (the engine cannot run the policy): {', '.join(result.left_out)}")
    print(f"prices: {args.prices if args.prices else planning.PRICES_SOURCE}")
    print()
    print(planning.markdown(result), end="")
    print()
    print(planning.verdict(result))
    if result.ranking:
        print(result.ranking)
    command = planning.launch(result, base)
    if command:
        w = result.winner
        c, behind = w.candidate, result.router_of(w.candidate)
        what = (f"each unit's replicas ({w.replicas} unit{'s' * (w.replicas > 1)} of {c.split[0]} prefill + "
                f"{c.split[1]} decode, each side behind {behind})" if c.split else
                f"one replica (of {w.replicas}, behind {behind})")
        print(f"launch {what}:\n{command}")
    print(f"planned in {wall_s:.1f} s ({result.simulated_requests / wall_s:,.0f} simulated requests/s)")
    if args.sensitivity is not None and result.winner is not None:
        print(_sensitivity(base, pc, result, args.sensitivity))
    if args.out:
        paths = planning.write(result, args.out)
        print(f"wrote {', '.join(str(p) for p in paths)}")
    return 0 if result.winner is not None else 1


def _sensitivity(base, pc, result, spread: float) -> str:
    """Whether the winner's fleet still meets every SLO with the acceptance length moved by -/+ ``spread``."""
    w = result.winner
    ends = [(scale, *planning.winner_at(base, pc, result, scale)) for scale in (1.0 - spread, 1.0 + spread)]
    parts = [f"at {scale:.2f}x the acceptance length its tightest SLO ({metric}) is at {ratio:.3f} of its bound"
             + ("" if ratio <= 1.0 else f": it misses by {ratio - 1:.1%}") for scale, ratio, metric in ends]
    verdict = "robust" if all(ratio <= 1.0 for _, ratio, _ in ends) else "not robust"
    return (f"sensitivity: {verdict}: the winner ({w.replicas} x {w.candidate.label}, on the confirmation seeds) "
            + "; ".join(parts))


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simspec plan`` (scenario flags as ``simulate``'s; --device, --tp and --max-num-seqs take lists)."""
    fields = planning.PlanConfig.__dataclass_fields__
    p = sub.add_parser("plan", conflict_handler="resolve",
                       help="the cheapest fleet (GPUs, TP, replicas, policy, router, prefill/decode split) that "
                            "meets the SLOs at the traffic")
    add_scenario_flags(p)
    p.add_argument("--slo", action="append", metavar="METRIC=BOUND",
                   help="e.g. p99_ttft_ms=2000, p99_tpot_ms=50, goodput_share=0.9 (repeat; at least one)")
    p.add_argument("--devices", "--device", type=_list(str, "--devices"), metavar="GPU,...",
                   help=f"candidate GPUs (default: {','.join(fields['devices'].default)})")
    p.add_argument("--tp", dest="tps", type=_list(int, "--tp"), metavar="T,...",
                   help=f"candidate tensor-parallel degrees (default: {','.join(map(str, fields['tps'].default))})")
    p.add_argument("--policies", metavar="SPEC,...",
                   help=f"candidate policies (default: {','.join(fields['policies'].default)})")
    p.add_argument("--engines", metavar="MODE,...",
                   help="candidate engine modes: simspec, vllm, sglang (each with its own batch defaults on each GPU; "
                        "a policy an engine cannot run is left out of its candidates) (default: --engine's)")
    p.add_argument("--max-num-seqs", dest="batch_limits", type=_list(int, "--max-num-seqs"), metavar="B,...",
                   help="candidate batch limits (default: the engine's)")
    p.add_argument("--routers", type=_list(str, "--routers"), metavar="ROUTER,...",
                   help="candidate routers, each fleet confirmed behind each (one replica's capacity is measured once "
                        "for all of them) (default: --router's)")
    p.add_argument("--splits", metavar="P:D,...",
                   help="disaggregated candidates beside the colocated ones: units of P prefill and D decode replicas "
                        "of each setup (e.g. 1:1,1:3), the fleet as many units as the traffic needs (default: none)")
    p.add_argument("--prefill-devices", type=_list(str, "--prefill-devices"), metavar="GPU,...",
                   help="GPUs searched for a --splits unit's prefill side (default: the decode side's)")
    p.add_argument("--prefill-tp", dest="prefill_tps", type=_list(int, "--prefill-tp"), metavar="T,...",
                   help="tensor-parallel degrees searched for a --splits unit's prefill side (default: the decode "
                        "side's)")
    p.add_argument("--kv-link", default=fields["kv_link"].default,
                   help="what a disaggregated fleet's KV cache moves over: nvlink, ib-400g, ethernet-100g or "
                        "GB_PER_S:LATENCY_US (default: %(default)s)")
    p.add_argument("--growth", type=float, default=fields["growth"].default,
                   help="traffic growth factor over --rate or the trace (default: %(default)s)")
    p.add_argument("--prices", metavar="FILE.toml", help="your own [prices] table, GPU = $/GPU-hour, instead of the shipped one")
    p.add_argument("--requests", type=int, default=fields["requests"].default,
                   help="requests per capacity probe, and per replica in a confirmation (default: %(default)s)")
    p.add_argument("--confirm-seeds", type=int, default=fields["confirm_seeds"].default,
                   help="fresh seeds each finalist fleet is served on (default: %(default)s)")
    p.add_argument("--sensitivity", type=number(float, "--sensitivity"), nargs="?", const=0.10, default=None,
                   metavar="SPREAD", help="serve the winner's fleet again with the acceptance length moved by "
                                          "-SPREAD and +SPREAD (default 0.10) and say whether it still meets every SLO")
    p.add_argument("--finalists", type=int, default=fields["finalists"].default,
                   help="cheapest candidates confirmed as whole fleets (default: %(default)s)")
    p.add_argument("--jobs", type=int, default=fields["jobs"].default,
                   help="processes (default: %(default)s; with --ray, the CPUs of a local Ray)")
    p.add_argument("--ray", metavar="ADDRESS", help="run the jobs on Ray: local, auto, HOST:PORT or ray://HOST:PORT")
    p.add_argument("--out", metavar="DIR", help="write plan.csv, plan.parquet, pareto.csv and pareto.png here")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.set_defaults(handler=cmd_plan)
