"""The ``simspec`` command.

Imports: argparse and simspec's library. Each flag maps to one config field
(defaults come from the config dataclasses, never written here); each
handler builds a config and calls one library function. Bad input ends with
one line on stderr and exit status 2, never a traceback.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from dataclasses import dataclass, fields, replace

from simspec import __version__, config as configuration, experiment, runfolder
from simspec import dashboard, export, report, sweep, tune
from simspec.acceptance import PRESETS
from simspec.costs import COST_MODEL_FORMS, GPUS, MODELS
from simspec.files import write_text
from simspec.models.config import TrainConfig
from simspec.policies import POLICIES
from simspec.profiling import add_cli as add_profile_cli
from simspec.sim import EngineConfig
from simspec.types import AcceptanceTrace, InputError
from simspec.workloads import WorkloadConfig, arrival_cv, cv_to_burstiness


@dataclass(frozen=True, slots=True)
class Flag:
    name: str  # --kebab-case
    path: tuple[str, ...]  # config field, e.g. ("workload", "rate_per_s")
    type: type
    help: str


def _default(path: tuple[str, ...]):
    record = {"workload": configuration.DEFAULT_WORKLOAD, "engine": EngineConfig()}.get(path[0])
    if record is None:
        return {f.name: f.default for f in fields(configuration.SimConfig)}.get(path[0])
    return getattr(record, path[1])


FLAGS = (
    Flag("--model", ("model",), str, f"model spec: {', '.join(MODELS)}"),
    Flag("--device", ("device",), str, f"GPU: {', '.join(GPUS)}"),
    Flag("--cost-model", ("cost_model",), str, f"cost model: {COST_MODEL_FORMS}"),
    Flag("--acceptance", ("acceptance",), str, "acceptance preset (see `simspec presets`) or iid:P"),
    Flag("--seed", ("seed",), int, "random seed of the run"),
    Flag("--slo-ttft-ms", ("slo_ttft_ms",), float, "TTFT SLO for request_goodput"),
    Flag("--slo-tpot-ms", ("slo_tpot_ms",), float, "TPOT SLO for request_goodput"),
    Flag("--arrival", ("workload", "arrival"), str, "poisson, gamma, onoff or trace"),
    Flag("--rate", ("workload", "rate_per_s"), float, "mean request rate, requests/s"),
    Flag("--burstiness", ("workload", "burstiness"), float, "Gamma shape as vLLM's --burstiness (CV = 1/sqrt)"),
    Flag("--num-requests", ("workload", "num_requests"), int, "requests to serve"),
    Flag("--duration", ("workload", "duration_s"), float, "or: seconds of arrivals to serve"),
    Flag("--multimodal-share", ("workload", "multimodal_share"), float, "share of requests with images"),
    Flag("--images-min", ("workload", "images_min"), int, "images per multimodal request, at least"),
    Flag("--images-max", ("workload", "images_max"), int, "images per multimodal request, at most"),
    Flag("--prompt-mean", ("workload", "prompt_mean_tokens"), float, "mean text prompt tokens"),
    Flag("--output-mean", ("workload", "output_mean_tokens"), float, "mean output tokens"),
    Flag("--trace", ("workload", "trace_path"), str, "replay a trace (Azure CSV or Mooncake JSONL)"),
    Flag("--trace-speedup", ("workload", "trace_speedup"), float, "divide trace arrival times by this"),
    Flag("--on-s", ("workload", "on_s"), float, "onoff: mean burst length, s"),
    Flag("--off-s", ("workload", "off_s"), float, "onoff: mean gap between bursts, s"),
    Flag("--max-num-seqs", ("engine", "max_num_seqs"), int, "requests in the running batch"),
    Flag("--max-num-batched-tokens", ("engine", "max_num_batched_tokens"), int, "token budget per step"),
    Flag("--gpu-memory-utilization", ("engine", "gpu_memory_utilization"), float, "share of GPU memory used"),
    Flag("--kv-cache-tokens", ("engine", "kv_cache_tokens"), int, "override the KV-cache size in tokens"),
    Flag("--drafter-context", ("engine", "drafter_context"), str, "drafter's view: full, none, selected:K, pooled:K"),
)


def _number(kind: type, flag: str):
    def convert(text: str):
        try:
            return kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag} must be a{'n integer' if kind is int else ' number'} "
                                             f"(got {text!r})") from None
    return convert


def _add_scenario_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", metavar="FILE.toml", help="config file; flags override it")
    parser.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                        help=f"policy to compare (repeat); one of {', '.join(POLICIES)}; "
                             f"default: {' '.join(configuration.DEFAULT_POLICIES)}")
    parser.add_argument("--policy-file", metavar="TUNED.toml",
                        help="add the policies `simspec tune` chose: the load-adaptive one of the nearest CV and "
                             "each family's best at the nearest load (after --policy / the config's, else after ar)")
    parser.add_argument("--cv", type=_number(float, "--cv"), help="inter-arrival CV (sets --burstiness)")
    for flag in FLAGS:
        kind = flag.type if flag.type is str else _number(flag.type, flag.name)
        parser.add_argument(flag.name, type=kind, default=None, help=f"{flag.help} (default: {_default(flag.path)})")


def _flag_values(args: argparse.Namespace) -> dict:
    values: dict = {}
    for flag in FLAGS:
        value = getattr(args, flag.name[2:].replace("-", "_"))
        if value is None:
            continue
        if len(flag.path) == 1:
            values[flag.path[0]] = value
        else:
            values.setdefault(flag.path[0], {})[flag.path[1]] = value
    workload = values.setdefault("workload", {})
    if args.cv is not None:
        workload["burstiness"] = cv_to_burstiness(args.cv)
    if args.trace is not None and "arrival" not in workload:
        workload["arrival"] = "trace"
    if args.policy:
        values["policies"] = args.policy
    return values


def build_config(args: argparse.Namespace) -> configuration.SimConfig:
    file_values = configuration.load(args.config) if args.config else {}
    config = configuration.build(file_values, _flag_values(args))
    if getattr(args, "policy_file", None):
        config = tune.with_policy_file(config, args.policy_file, keep=bool(args.policy) or "policies" in file_values)
    return config


def cmd_simulate(args: argparse.Namespace) -> int:
    cfg = build_config(args)
    if args.out:
        runfolder.check_target(args.out)  # refuse a bad --out before spending time
    started = time.perf_counter()
    results = experiment.run(cfg, progress=not args.quiet)
    wall_s = time.perf_counter() - started
    scenario = results.scenario
    print(f"simspec {__version__} | {scenario.model.name} on {scenario.gpu.name} | "
          f"{len(scenario.requests)} requests | seed {cfg.seed}")
    print(experiment.cost_model_line(scenario))
    print(f"acceptance: {scenario.acceptance.name} | drafter context: {cfg.engine.drafter_context} | "
          f"workload: {_describe(cfg.workload)}")
    print()
    print(runfolder.format_table(results.metrics, experiment.TABLE_COLUMNS))
    print(f"\nlatencies in ms; throughputs per second; simulated in {wall_s:.1f} s")
    if args.out:
        meta = {"simspec_version": __version__, "seed": cfg.seed, "cost_model": scenario.costs.label,
                "calibrated": scenario.costs.calibrated,
                "calibration": scenario.costs.calibration, "acceptance": scenario.acceptance.name,
                "model": scenario.model.name, "device": scenario.gpu.slug, "policies": list(cfg.policies),
                "kind": "simulate", "kv_budget_tokens": scenario.kv_budget_tokens}
        runfolder.write_run(args.out, logs=list(results.logs), metrics=results.metrics,
                            config_toml=configuration.to_toml(cfg), meta=meta)
        print(f"run folder: {args.out}")
    return 0


def _describe(w: WorkloadConfig) -> str:
    if w.arrival == "trace":
        return f"trace {w.trace_path} x{w.trace_speedup:g}"
    shape = {"gamma": f" CV {w.burstiness ** -0.5:.2g}", "onoff": f" on {w.on_s:g}s/off {w.off_s:g}s"}
    return f"{w.arrival}{shape.get(w.arrival, '')} at {w.rate_per_s:g} req/s, {w.multimodal_share:.0%} multimodal"


def cmd_presets(args: argparse.Namespace) -> int:
    print(f"{'preset':32s} {'accept length':>13s} {'speedup':>8s}  draft setting (source)")
    for p in PRESETS.values():
        print(f"{p.name:32s} {p.accept_length:13.2f} {p.speedup_vs_ar:8.2f}  "
              f"depth {p.draft.depth}, topk {p.draft.topk}, {p.draft.budget} tokens ({p.source})")
    return 0


def cmd_costs_report(args: argparse.Namespace) -> int:
    from simspec import costs
    from simspec.costs import report
    from simspec.files import write_png

    root = Path(args.profiles) if args.profiles else None
    device, model = costs.gpu_spec(args.device, root), costs.model_spec(args.model)
    found, result = report.fit_for(device, model, root)
    repeat = report.load_repeat(Path(args.repeat), device, model) if args.repeat else None
    print(f"{result.cost_model.label}")
    print(f"profiles: {', '.join(str(p.folder) for p in found)}")
    if repeat is not None:
        print(f"repeat: {repeat.folder} (difference: |repeat - profile| / profile at the points both measured)")
    print()
    print(report.table(result, report.repeat_differences(found, repeat) if repeat else None))
    png = Path(args.png) if args.png else found[0].folder / "fit_report.png"
    png.parent.mkdir(parents=True, exist_ok=True)
    write_png(png, report.figure(found, result))
    print(f"\nmeasured vs fitted: {png}")
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from simspec.models.drafter_train import DrafterTrainConfig, train_drafter  # torch only when asked
    from simspec.models.train import train_target

    if args.what in ("all", "target"):
        meta = train_target(Path(args.target), steps=args.steps, seed=args.seed, quick=args.quick)
        print(f"target: held-out accuracy {meta['heldout_accuracy']:.3f} after {meta['steps']} steps "
              f"({meta['train_wall_s']:.0f} s); wrote {args.target}/model.pt and meta.json")
    if args.what in ("all", "drafter"):
        config = None if args.quick else DrafterTrainConfig(seed=args.seed)
        meta = train_drafter(Path(args.drafter), Path(args.target), config=config, quick=args.quick,
                             progress=not args.quiet)
        acc = meta["acceptance_teacher_forced"]
        depth = str(meta["train"]["depth"])
        print(f"drafter: {meta['train']['steps']} steps ({meta['train_wall_s']:.0f} s); teacher-forced acceptance "
              f"length of linear:k={depth}: " + ", ".join(
                  f"{v} {acc[v]['acceptance_length_linear'][depth]:.2f}" for v in acc)
              + f"; wrote {args.drafter}/drafter.pt and meta.json")
    return 0


def cmd_live(args: argparse.Namespace) -> int:
    from simspec.engine import validate as live  # torch only when asked
    from simspec.engine.live import LiveConfig
    from simspec import metrics
    from simspec.costs import steps as step_costs
    from simspec.costs import affine

    workload = WorkloadConfig(arrival=args.arrival, rate_per_s=args.rate, burstiness=args.burstiness,
                              num_requests=args.num_requests, output_mean_tokens=args.output_mean)
    specs = _live_policies(args, ("ar", "linear:k=3", "marginal"), workload)
    config = LiveConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                        drafter_context=args.drafter_context)
    device = live.torch_device(args.device)
    replay = None
    if args.timing_only:
        models, requests, examples, cost_model, replay = _timing_setup(args, workload, config, device)
    else:
        cost_model = step_costs.load_step_costs(args.step_costs) if args.step_costs else affine(1.0, 0.05)
        requests, examples = live.live_workload(workload, args.seed)
        models = live.load_models(args.target, args.drafter, args.device)
        live.warm_up(models, specs, config)
    logs, table, traces = [], {}, []
    interrupted = False
    for spec in specs:
        result = live.serve_live(models, spec, requests, examples, cost_model, config, replay=replay)
        logs.append(result.log)
        table[spec] = metrics.summarize(result.log)
        traces += [replace(t, policy=spec) for t in result.traces]
        for note in result.log.notes:
            print(f"{spec}: {note}", file=sys.stderr)
        if any(note.startswith("interrupted") for note in result.log.notes):
            interrupted = True
            break
    print(runfolder.format_table(table, list(experiment.TABLE_COLUMNS)))
    if args.out:
        import json

        runfolder.write_run(args.out, logs=logs, metrics=table, config_toml="", meta={
            "kind": "live", "seed": args.seed, "policies": specs, "drafter_context": args.drafter_context,
            "complete": not interrupted and all(log.complete for log in logs),
            "notes": [f"{log.policy}: {note}" for log in logs for note in log.notes]})
        write_text(Path(args.out) / "acceptance_traces.jsonl", "".join(json.dumps(t.to_json()) + "\n" for t in traces))
        print(f"wrote {args.out}" + (" (incomplete: interrupted)" if interrupted else ""))
    return 130 if interrupted else 0


def _live_policies(args: argparse.Namespace, default: tuple[str, ...], workload: WorkloadConfig) -> list[str]:
    """``--policy`` (repeatable) and ``--policy-file`` (the tuned load-adaptive
    policy for ``workload``'s arrivals) of ``live`` and ``validate``, checked."""
    from simspec import policies

    specs = list(args.policy or ([] if args.policy_file else default))
    if args.policy_file:
        specs.append(tune.adaptive_policy(tune.load(args.policy_file), cv=arrival_cv(workload)).label)
    for spec in specs:
        policies.parse(spec)
    return list(dict.fromkeys(specs))


def _timing_setup(args: argparse.Namespace, workload: WorkloadConfig, config, device):
    """``simspec live --timing-only MODEL``: random weights at the spec's
    shape, acceptance replayed from a model fitted to traces (or a preset)."""
    import torch

    from simspec import acceptance, costs
    from simspec.acceptance import fit as acceptance_fit
    from simspec.acceptance import DraftContext
    from simspec.engine import timing, validate as live

    spec = costs.model_spec(args.timing_only)
    dtype = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}[
        args.dtype or ("bfloat16" if device.type == "cuda" else "float32")]
    if args.traces:
        path = Path(args.traces)
        if not path.is_file():
            raise InputError(f"--traces {path}: no such file")
        import json

        try:
            traces = [AcceptanceTrace.from_json(json.loads(line)) for line in path.read_text().splitlines()
                      if line.strip()]
        except ValueError as err:
            raise InputError(f"--traces {path}: not JSON lines ({err})") from None
        model = acceptance_fit.fit_acceptance(traces, name=f"fitted to {path.name}")
    else:
        model = acceptance.build(args.acceptance)
    gpu = costs.gpu_spec(args.gpu)
    cost_model = costs.build(args.cost_model, spec, gpu)
    target, drafter = timing.shaped_models(spec, device=device, dtype=dtype, seed=args.seed)
    models = live.Models(target=target, drafter=drafter, target_dir="", drafter_dir="")
    requests, examples = timing.shaped_workload(workload, spec, args.seed, max_context_tokens=spec.max_context_tokens)
    replay = timing.AcceptanceReplay(model, DraftContext.parse(config.drafter_context), seed=args.seed)
    print(f"timing-only: random-weight {spec.name} shape ({dtype}, {device}); acceptance {model.name}; "
          f"policies priced by {cost_model.label}", file=sys.stderr)
    return models, requests, examples, cost_model, replay


def cmd_validate(args: argparse.Namespace) -> int:
    from simspec.engine import validate as live  # torch only when asked

    v = live.QUICK if args.quick else live.ValidateConfig()
    if args.policy or args.policy_file:
        v = replace(v, policies=tuple(_live_policies(args, (), live.validation_workload(v))))
    if args.repeats is not None:
        if not 1 <= args.repeats <= 10:
            raise InputError(f"--repeats must be in [1, 10] (got {args.repeats})")
        v = replace(v, repeats=args.repeats)
    models = live.load_models(args.target, args.drafter, args.device)
    report = live.validate(models, v, Path(args.out) if args.out else None, progress=not args.quiet)
    print(live.format_report(report))
    fit = report["calibration"]["cost_fit"]
    wake = fit["wake"]
    print(f"cost fit on the calibration steps: median {fit['median_abs_pct_error']:.1f}% per step; waking from idle"
          f" {wake['wake_s'] * 1e3:.1f} ms x (1 - exp(-idle / {wake['wake_tau_s']:.2f} s)), from {wake['steps']} steps;"
          f" live AR saturation {report['ar_saturation_req_s']:.1f} req/s; {report['wall_s']:.0f} s")
    if args.out:
        print(f"wrote {args.out}/validation.json, report.json, latency_cdf.png, acceptance.json, step_costs.json,"
              " calibration_steps.parquet")
    return 0


def _add_live_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="DIR", default="checkpoints/target", help="target checkpoint folder")
    p.add_argument("--drafter", metavar="DIR", default="checkpoints/drafter", help="drafter checkpoint folder")
    p.add_argument("--out", metavar="DIR", help="write results here")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--device", default="cpu", help="where the models run: cpu or cuda[:N] (default: cpu)")
    p.add_argument("--policy-file", metavar="TUNED.toml", help="also serve the load-adaptive policy `simspec tune` "
                   "wrote (for the arrivals' CV)")


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="simspec", description="Which speculative-decoding verification "
                                  "strategy should a VLM server use, and what latency will users see?")
    top.add_argument("--version", action="version", version=f"simspec {__version__}")
    sub = top.add_subparsers(dest="command", metavar="COMMAND")
    sim = sub.add_parser("simulate", help="simulate serving with several policies (defaults: the main job)")
    _add_scenario_flags(sim)
    sim.add_argument("--out", metavar="DIR", help="write a run folder (metrics.json, requests.csv, plots)")
    sim.add_argument("--quiet", action="store_true", help="no progress bars")
    sim.set_defaults(handler=cmd_simulate)
    presets = sub.add_parser("presets", help="list the published acceptance presets")
    presets.set_defaults(handler=cmd_presets)
    cost_cmd = sub.add_parser("costs", help="cost models fitted from profiles")
    cost_sub = cost_cmd.add_subparsers(dest="costs_command", metavar="SUBCOMMAND", required=True)
    rep = cost_sub.add_parser("report", help="held-out error of the fitted cost model of a device and model")
    rep.add_argument("--device", required=True, help="device slug (profiles/<device>/)")
    rep.add_argument("--model", required=True, help="model spec name")
    rep.add_argument("--profiles", metavar="DIR", help="profiles folder (default: the repository's profiles/)")
    rep.add_argument("--png", metavar="FILE", help="where to draw measured vs fitted (default: in the profile)")
    rep.add_argument("--repeat", metavar="DIR",
                     help="a second profile of the same device and model (its folder, or a profiles folder "
                          "holding it): print each operator's run-to-run difference, the timing's noise floor")
    rep.set_defaults(handler=cmd_costs_report)
    train = sub.add_parser("train", help="train the shipped checkpoints (target VLM, drafter) on CPU, deterministically")
    train.add_argument("what", nargs="?", choices=("all", "target", "drafter"), default="all",
                       help="which checkpoints (default: all, the target first)")
    train.add_argument("--target", metavar="DIR", default="checkpoints/target", help="target checkpoint folder")
    train.add_argument("--drafter", metavar="DIR", default="checkpoints/drafter", help="drafter checkpoint folder")
    train.add_argument("--steps", type=int, default=TrainConfig().steps, help="target optimizer steps")
    train.add_argument("--seed", type=int, default=TrainConfig().seed, help="data and init seed")
    train.add_argument("--quick", action="store_true", help="seconds-long runs on a few examples (tests)")
    train.add_argument("--quiet", action="store_true", help="no progress bars")
    train.set_defaults(handler=cmd_train)
    live_cmd = sub.add_parser("live", help="serve a workload with the live engine (real models, wall clock)")
    _add_live_flags(live_cmd)
    live_cmd.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                          help="policy to serve with (repeat; default: ar, linear:k=3, marginal)")
    live_cmd.add_argument("--arrival", default="gamma", help="poisson, gamma or onoff")
    live_cmd.add_argument("--rate", type=float, default=20.0, help="mean request rate, requests/s")
    live_cmd.add_argument("--burstiness", type=float, default=0.25, help="Gamma shape (CV = 1/sqrt)")
    live_cmd.add_argument("--num-requests", type=int, default=60, help="requests to serve")
    live_cmd.add_argument("--output-mean", type=float, default=40.0, help="mean output tokens")
    live_cmd.add_argument("--seed", type=int, default=0, help="workload seed")
    live_cmd.add_argument("--max-num-seqs", type=int, default=16, help="requests in the running batch")
    live_cmd.add_argument("--max-num-batched-tokens", type=int, default=512, help="token budget per step")
    live_cmd.add_argument("--drafter-context", default="selected:8", help="none, full, selected:K or pooled:K")
    live_cmd.add_argument("--step-costs", metavar="FILE", help="cost model the policies price with "
                          "(a step_costs.json from `simspec validate`; default a rough affine guess)")
    live_cmd.add_argument("--timing-only", metavar="MODEL", help="random weights at MODEL's shape (a model spec, "
                          "e.g. LLaVA-1.5-7B; meant for a GPU), acceptance replayed from --traces or --acceptance")
    live_cmd.add_argument("--traces", metavar="FILE.jsonl", help="timing-only: fit the replayed acceptance to these "
                          "acceptance traces (a live run's acceptance_traces.jsonl)")
    live_cmd.add_argument("--acceptance", default="SpecVLM/LLaVA-1.5-7B",
                          help="timing-only without --traces: acceptance preset, iid:P or FILE.json")
    live_cmd.add_argument("--dtype", choices=("bfloat16", "float16", "float32"),
                          help="timing-only: weights' dtype (default: bfloat16 on CUDA, float32 on CPU)")
    live_cmd.add_argument("--gpu", default="h100-sxm", help="timing-only: device spec whose cost model prices "
                          "the policies' plans")
    live_cmd.add_argument("--cost-model", default="auto", help="timing-only: cost model form for that device")
    live_cmd.set_defaults(handler=cmd_live)
    val = sub.add_parser("validate", help="calibrate on one workload, then compare live and simulated serving "
                         "on another")
    _add_live_flags(val)
    val.add_argument("--quick", action="store_true", help="the CI-sized validation (a few minutes)")
    val.add_argument("--policy", action="append", metavar="NAME[:k=v,...]",
                     help="policy to validate (repeat; default: five)")
    val.add_argument("--repeats", type=_number(int, "--repeats"), metavar="N",
                     help="live runs of each policy and load, averaged (1-10; default 1): on a machine whose "
                          "speed drifts, more runs narrow the live side's noise")
    val.set_defaults(handler=cmd_validate)
    add_profile_cli(sub)
    for command in (sweep, report, tune, export, dashboard):  # each registers its own subcommand
        command.add_cli(sub)
    return top


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if not getattr(args, "handler", None):
        parser().print_help()
        return 2
    try:
        return args.handler(args)
    except InputError as err:
        print(f"simspec: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("simspec: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
