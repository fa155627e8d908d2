"""``simspec simulate`` (the main job) and ``simspec presets``."""

from __future__ import annotations

import argparse
import time
from dataclasses import replace

import numpy as np

from simspec import __version__, config as configuration, experiment, runfolder
from simspec.serving import modes
from simspec.acceptance import PRESETS, classes, presets
from simspec.acceptance.presets import CONTEXT_RULES
from simspec.cli.scenario import add_scenario_flags, number, scenario_config
from simspec.files import write_png, write_text
from simspec.types import require
from simspec.fleet import groups as fleet_groups, report as fleet_report
from simspec.workloads import WorkloadConfig, image_sizes


def cmd_simulate(args: argparse.Namespace) -> int:
    cfg = scenario_config(args)
    require(args.sensitivity is None or 0.0 < args.sensitivity < 0.5,
            f"--sensitivity must be in (0, 0.5): the share the acceptance length moves (got {args.sensitivity})")
    replacing = runfolder.check_target(args.out) if args.out else None  # a bad --out fails before any work
    started = time.perf_counter()
    # The table, metrics.json, requests.csv and the plots never read the
    # per-chunk and per-round arrays (millions for an hour's trace).
    results = experiment.run(cfg, progress=not args.quiet, event_detail=False)
    wall_s = time.perf_counter() - started
    scenario = results.scenario
    replicas = cfg.fleet_replicas
    fleet = f" | {replicas} replicas ({cfg.router})" if replicas > 1 else ""
    where = "a fleet of groups" if cfg.fleet else scenario.gpu.name
    print(f"simspec {__version__} | {scenario.model.name} on {where}{fleet} | "
          f"{len(scenario.requests)} requests | seed {cfg.seed}")
    if cfg.fleet:
        print(f"fleet: {fleet_groups.describe(cfg.fleet)}")
        if fleet_groups.disaggregated(cfg.fleet):
            link = fleet_groups.parse_link(cfg.kv_link)
            moved = results.fleets[0].transfer_s * 1e3
            print(f"prefill/decode: kv cache over {link.name} ({link.bytes_per_s / 1e9:g} GB/s a GPU each way, "
                  f"{link.latency_s * 1e6:g} us a transfer; {link.source}): a transfer {moved.mean():.2f} ms mean, "
                  f"{np.percentile(moved, 99):.2f} ms p99")
        for m in scenario.members:
            print(f"group {m.group.name} x{m.group.replicas}: {m.gpu.name}, tp {m.config.tp} | "
                  f"{modes.describe(m.config.engine)}")
            print("  " + experiment.cost_model_line(replace(scenario, costs=m.costs), width=None))
    else:
        print(experiment.cost_model_line(scenario))
    print(f"acceptance: {scenario.acceptance.name} | drafter context: {cfg.engine.drafter_context} | "
          f"workload: {_describe(cfg.workload)}")
    if cfg.workload.temperature > 0.0:
        print(_temperature_line(cfg.acceptance, cfg.workload.temperature))
    classed = sum(1 for r in scenario.requests if r.task)
    if classed:
        print(_classes_line(cfg.workload.mix, scenario.acceptance, classed, len(scenario.requests)))
    if not cfg.fleet:
        print(modes.describe(cfg.engine))
    if scenario.clipped_requests:
        print(f"workload: {scenario.clipped_requests} of {len(scenario.requests)} requests cut to the model's "
              f"{scenario.model.max_context_tokens:,}-token context (--over-context error refuses them)")
    print()
    if args.all_columns:
        print(runfolder.format_table(results.metrics, experiment.TABLE_COLUMNS))
    else:
        print(runfolder.compact_table(results.metrics))
    print("\nlatencies in ms, throughputs per second (vllm bench serve's definitions); * lowest mean E2EL")
    print(runfolder.verdict(results.metrics))
    if args.sensitivity is not None:
        from simspec import sensitivity  # only when asked: it serves the run twice more

        print(sensitivity.check(results, args.sensitivity).line())
    extra = {}
    if replicas > 1:
        runs = {log.policy: run for log, run in zip(results.logs, results.fleets)}
        groups = experiment.replica_groups(scenario)
        served = {label: experiment.replica_policies(scenario, label) for label in runs} if cfg.fleet else None
        rows = fleet_report.replica_rows(runs, groups=groups, served=served, empty_as_zero=cfg.engine.kind == "vllm")
        print(fleet_report.describe(rows, replicas, cfg.router))
        extra["replicas.csv"] = lambda path: write_text(path, fleet_report.csv_text(rows))
        extra["fleet_load.png"] = lambda path: write_png(path, fleet_report.plot_load(runs, groups))
        extra["fleet_latency_cdf.png"] = lambda path: write_png(path, fleet_report.plot_latency_by_group(runs, groups))
    print(f"simulated in {wall_s:.1f} s")
    if args.out:
        runfolder.write_run(args.out, logs=list(results.logs), metrics=results.metrics,
                            config_toml=configuration.to_toml(cfg), meta=results.meta, extra=extra)
        print(f"run folder: {args.out}" + (f" ({replacing})" if replacing else ""))
    return 0


def _describe(w: WorkloadConfig) -> str:
    sizes = f", images {image_sizes(w.image_size).describe()}" if w.image_size is not None else ""
    if w.arrival == "trace":
        return f"trace {w.trace_path} x{w.trace_speedup:g}{sizes}"
    shape = {"gamma": f" CV {w.burstiness ** -0.5:.2g}", "onoff": f" on {w.on_s:g}s/off {w.off_s:g}s"}
    return (f"{w.arrival}{shape.get(w.arrival, '')} at {w.rate_per_s:g} req/s, {w.multimodal_share:.0%} multimodal"
            f"{sizes}")


def _temperature_line(spec: str, temperature: float) -> str:
    """What the requests' sampling temperature does to this run's acceptance."""
    if spec.lower() in PRESETS:
        return presets.temperature_line(spec, temperature)
    return f"temperature {temperature:g}: {spec} is the acceptance at this temperature as given"


def _classes_line(mix: str | None, model, classed: int, total: int) -> str:
    """What the request classes do in this run, and on what their levels rest."""
    m = classes.parse_mix(mix) if mix is not None else None
    given = m.describe() if m is not None else f"from the trace's task column ({classed} of {total} requests)"
    if not model.class_logit:
        has = ("its draft cannot hold Spec-Bench's class ratios" if model.name in {p.name for p in PRESETS.values()}
               else "the tree and chain presets have them")
        return f"classes: {given}; {model.name} has no class levels: every class at its level ({has})"
    names = m.names if m is not None else classes.CLASSES
    if model.name not in {p.name for p in PRESETS.values()}:  # a calibrated file (calibrate vllm-classes)
        fitted = dict(model.class_logit)
        missing = [name for name in names if name not in fitted]
        rest = f"; {', '.join(missing)} not calibrated (at the file's own level)" if missing else ""
        return f"classes: {given}; levels calibrated per class in the acceptance file ({model.name}){rest}"
    assumed = [name for name in names if classes.assumed(name)]
    note = f"; {', '.join(assumed)} at the preset's level (an assumption: no published figure)" if assumed else ""
    code = f", code to {classes.CODE_SOURCE}" if "code" in names and not classes.assumed("code") else ""
    return f"classes: {given}; levels fitted to {classes.SPEC_BENCH_SOURCE} per-category speedups{code}{note}"


def cmd_presets(args: argparse.Namespace) -> int:
    print(f"{'preset':32s} {'accept length':>13s} {'speedup':>8s}  draft setting (source)")
    for p in PRESETS.values():
        speedup = f"{p.speedup_vs_ar:8.2f}" if p.speedup_vs_ar == p.speedup_vs_ar else f"{'-':>8s}"
        measured = f", measured at temperature {p.temperature:g}" if p.temperature else ""
        print(f"{p.name:32s} {p.accept_length:13.2f} {speedup}  "
              f"depth {p.draft.depth}, topk {p.draft.topk}, {p.draft.budget} tokens{measured} ({p.source})")
        rule = presets.TEMPERATURE_RULES[p.name]
        print(f"{'':32s} temperature 1: top-1 logit {presets.FITTED_TEMPERATURE_LOGIT[p.name]:+.3f} ({rule.target} "
              f"{rule.greedy:g} -> {rule.sampled:g} at 0 -> 1, {rule.source.split(',')[0]})")
        if p.name in CONTEXT_RULES:
            decay, knee = CONTEXT_RULES[p.name]
            print(f"{'':32s} long contexts: top-1 logit -{decay:g} per 1,000 tokens past {knee:,} (fitted to the "
                  f"source's acceptance against context length)")
    print(f"\nrequest classes (--mix): each class's acceptance length is the preset's times its category's "
          f"speedup over the overall ({classes.SPEC_BENCH_SOURCE}; the EAGLE row):")
    print("  " + "  ".join(f"{name} {classes.length_ratio(name):.3f}" for name in classes.CLASSES))
    print(f"  code: chat's ratio x HumanEval's acceptance length over MT-Bench's ({classes.CODE_SOURCE}); edit: the "
          f"preset's level (no published figure: an assumption; calibrate it with `simspec calibrate vllm-classes`)")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``simulate`` and ``presets``."""
    sim = sub.add_parser("simulate", help="simulate serving with several policies (defaults: the main job)")
    add_scenario_flags(sim)
    sim.add_argument("--out", metavar="DIR", help="write a run folder (metrics.json, requests.csv, plots)")
    sim.add_argument("--quiet", action="store_true", help="no progress bars")
    sim.add_argument("--sensitivity", type=number(float, "--sensitivity"), nargs="?", const=0.10, default=None,
                     metavar="SPREAD", help="serve the policies again with the acceptance length moved by -SPREAD "
                                            "and +SPREAD (default 0.10) and say whether the best policy stays best")
    sim.add_argument("--all-columns", action="store_true",
                     help="print every latency statistic (mean, median, p95, p99 of ttft, tpot, itl, e2el) and the "
                          "request rate; metrics.json always holds every metric")
    sim.set_defaults(handler=cmd_simulate)
    presets = sub.add_parser("presets", help="list the published acceptance presets")
    presets.set_defaults(handler=cmd_presets)
