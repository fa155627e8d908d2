"""``simspec validate --against vllm``: calibrate simspec on a running vLLM,
then predict that vLLM's ``vllm bench serve`` results on traffic the
calibration never saw.

Imports: numpy, scipy, simspec.vllm.server (the processes), simspec.vllm.logs
(what they write), simspec.vllm.calibrate (the acceptance mapping and the
replay), simspec.costs.steps (the step fit), simspec.serving.modes, simspec.files,
simspec.runfolder. Never vLLM.

Two phases, so the second can be rerun on kept files (``--from OUT``):

**Live** (:func:`run_live`). For each method (no speculation, ngram, a draft
trained by distillation on the target, the identical-weight draft as an
oracle; the EAGLE-1 head when asked) one ``vllm serve`` of ``simspec vllm-models``' target starts, serves a
few warm-up requests (vLLM's first steps run 5-10x their later cost), then
the held-out traffic ``repeats`` times, going round the held-out loads
(A B C, A B C: drift over minutes falls on every load alike), with the
calibration runs spread evenly among them (:func:`run_order`: drift falls on
the calibration alike too), and stops. Around each benchmark: the server's ``/metrics``
before and after (the speculative counters' difference is the run's), the
log's line count before and after (its iteration lines between are the run's
engine steps), and the load average. Every bench JSON, scrape and server
log stays in the output folder, listed in ``runs.json``.

**Fit and compare** (:func:`analyse`), per method, from its calibration runs
only:

1. *Step costs*: the iteration lines of the calibration runs, fitted by
   :func:`simspec.costs.steps.fit_iteration_costs` (fixed + per target token +
   per sequence; every 5th step held out).
2. *The engine's CPU time outside the logged elapsed time* (scheduling,
   input preparation, output processing; serial with the model on vLLM's
   CPU backend, whose async scheduling is off): in a benchmark that keeps a
   fixed number of requests in flight the engine never idles, so its
   duration is the steps' elapsed time plus this gap, summed over the steps.
   Two such runs of different concurrency give a per-step and a
   per-sequence part (non-negative least squares over the runs' totals),
   added to the step fit's fixed and per-sequence terms.
3. *Acceptance*: the counters' difference over the calibration runs, mapped
   onto simspec's acceptance model (:func:`simspec.vllm.calibrate.fit_chain_acceptance`).
4. *The frontend's per-request latency* (HTTP, tokenization, the first
   chunk's trip back: in TTFT, not in any step): the light calibration run's
   mean live TTFT minus the simulated one with the costs above, as
   ``frontend_s_per_request`` of the vllm engine mode.

Then each held-out run's exact arrivals and lengths (``start_times``,
``input_lens``, ``output_lens``) are replayed into simspec's vllm engine
mode (CPU defaults: 128 sequences, 2048 batched tokens, no async scheduling,
no CUDA graphs; the server's KV cache size and block size), and live and
simulated are compared per load, method and metric, with the live repeats'
spread beside the error.
"""

from __future__ import annotations

import math
import os
import time
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np

from simspec import __version__
from simspec.vllm.calibrate import ChainAcceptance, EngineGap, fit_chain_acceptance, fit_engine_gap, \
    replay_requests, request_rounds, spread_text, with_gap
from simspec.costs.steps import HeldOutError, StepCostFit, fit_iteration_costs
from simspec.files import dump_json, read_json, write_png, write_text
from simspec.runfolder import MARKER, check_target
from simspec.types import require
from simspec.vllm.logs import BenchResult, EngineStep, ServerLog, SpecDecodeCounters, parse_bench, parse_metrics, \
    read_server_log
from simspec.vllm.server import RunningServer, Server, ServeSpec, Traffic, bench, command_line, http_get

METHODS = ("none", "ngram", "draft", "oracle", "eagle")
"""What ``--method`` may name: no speculation, ngram, the distilled draft, the identical-weight draft,
the EAGLE-1 head."""
DEFAULT_METHODS = METHODS[:4]
"""What a validation runs unless ``--method`` says otherwise: each method costs about 15 minutes of
live runs, and the EAGLE head accepts by copying, as the distilled draft does."""
DRAFT_FOLDERS = {"draft": "draft_distilled", "oracle": "draft_same", "eagle": "eagle"}
"""The model folder of ``simspec vllm-models`` each draft-model or EAGLE method serves."""
BOUNDS = {"mean_e2el_ms": 5.0, "mean_tpot_ms": 5.0, "output_throughput": 5.0, "p95_e2el_ms": 10.0,
          "mean_ttft_ms": 10.0, "spec_decode_acceptance_length": 2.0}
"""Metric -> the issue's bound on |simulated / live - 1|, in %."""
RUNS = "runs.json"
REPORT = "report.json"


def speculative_config(method: str, models: str, k: int) -> dict | None:
    """vLLM's ``--speculative-config`` for ``method`` (None: no speculation)."""
    require(method in METHODS, f"method must be one of {', '.join(METHODS)} (got {method!r})")
    if method == "none":
        return None
    if method == "ngram":
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": 3, "prompt_lookup_min": 1}
    config = {"model": str(Path(models).absolute() / DRAFT_FOLDERS[method]), "num_speculative_tokens": k}
    return {"method": "eagle", **config} if method == "eagle" else config


WARMUP = Traffic(name="warmup", prompts=6, input_len=32, output_len=16, max_concurrency=3, seed=1)

# Sized for the 120m model on one core of a 2-core development CPU: it serves about 72
# output tokens/s without speculation, about 45 with the oracle draft and
# less with the distilled one (docs/vllm.md); the held-out loads (10-20
# output tokens/s) stay under the slowest method's capacity.
# The calibration's decode batches reach down to the held-out loads' (1-4
# sequences): a step's cost is concave in its batch on this CPU (none: 49 ms
# at 1, 56 at 2, 75 at 4, 136 at 16), which a line through 4 and 16 alone misses.
# The held-out seeds were 101-103 for the first two whole runs (docs/vllm.md
# section 8), which the fit's later changes were judged on; later runs draw new ones.
CALIBRATION = (
    Traffic(name="cal-sat2", prompts=16, input_len=64, output_len=64, max_concurrency=2, seed=14),
    Traffic(name="cal-sat4", prompts=24, input_len=64, output_len=64, max_concurrency=4, seed=11),
    Traffic(name="cal-sat16", prompts=48, input_len=64, output_len=64, max_concurrency=16, seed=12),
    Traffic(name="cal-light", prompts=16, input_len=64, output_len=64, rate=0.25, seed=13),
)
HELD_OUT = (
    Traffic(name="low", prompts=24, input_len=128, output_len=48, range_ratio=0.5, rate=0.25, seed=201),
    Traffic(name="mid", prompts=24, input_len=48, output_len=80, range_ratio=0.5, rate=0.3, seed=202),
    Traffic(name="bursty", prompts=24, input_len=64, output_len=64, range_ratio=0.5, rate=0.3, burstiness=0.25,
            seed=203),
)
QUICK_CALIBRATION = (
    Traffic(name="cal-sat4", prompts=12, input_len=32, output_len=32, max_concurrency=4, seed=11),
    Traffic(name="cal-sat16", prompts=24, input_len=32, output_len=32, max_concurrency=12, seed=12),
    Traffic(name="cal-light", prompts=8, input_len=32, output_len=32, rate=2.0, seed=13),
)
QUICK_HELD_OUT = (
    Traffic(name="low", prompts=12, input_len=48, output_len=24, range_ratio=0.5, rate=2.0, seed=101),
    Traffic(name="bursty", prompts=12, input_len=32, output_len=32, range_ratio=0.5, rate=4.0, burstiness=0.25,
            seed=103),
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ValidateVllmConfig:
    """What ``simspec validate --against vllm`` runs."""

    vllm_command: str = "vllm"
    models: str = "vllm-models"  # a `simspec vllm-models` folder (built there when missing)
    size: str = "120m"  # the models' size, when they are built
    methods: tuple[str, ...] = DEFAULT_METHODS
    k: int = 3  # num_speculative_tokens
    calibration: tuple[Traffic, ...] = CALIBRATION
    held_out: tuple[Traffic, ...] = HELD_OUT
    repeats: int = 2  # live runs of each held-out load, per method
    port: int = 8041
    kv_cache_gib: float = 1.0  # VLLM_CPU_KVCACHE_SPACE
    iomp: bool = True  # LD_PRELOAD the venv's Intel OpenMP (vLLM's CPU backend asks for it)
    sim_seeds: int = 3  # simulator seeds averaged per replay
    ready_timeout_s: float = 600.0
    server: str | None = None  # --server URL: one running server, its method given by `methods`
    server_log: str | None = None

    def __post_init__(self):
        for m in self.methods:
            require(m in METHODS, f"--method must be one of {', '.join(METHODS)} (got {m!r})")
        require(len(set(self.methods)) == len(self.methods) and self.methods, "--method: give each method once")
        require(1 <= self.k <= 8, f"--num-speculative-tokens must be in 1..8 (got {self.k})")
        require(1 <= self.repeats <= 10, f"--repeats must be in 1..10 (got {self.repeats})")
        require(1 <= self.sim_seeds <= 20, f"--sim-seeds must be in 1..20 (got {self.sim_seeds})")
        require(0.1 <= self.kv_cache_gib <= 64, f"--kv-cache-gib must be in [0.1, 64] (got {self.kv_cache_gib})")
        require(sum(t.saturating for t in self.calibration) >= 1,
                "the calibration needs a run with all requests at once and a fixed number in flight")
        require(any(not t.saturating for t in self.calibration),
                "the calibration needs a run at a request rate (for the frontend's latency)")
        names = [t.name for t in self.calibration + self.held_out]
        require(len(set(names)) == len(names), "traffic names must differ")
        if self.server is not None:
            require(self.server_log is not None, "--server needs --server-log (the log the server writes)")
            require(len(self.methods) == 1, "--server serves one method: give exactly one --method")


QUICK = ValidateVllmConfig(size="tiny", methods=("none", "oracle"), calibration=QUICK_CALIBRATION,
                           held_out=QUICK_HELD_OUT, repeats=1, sim_seeds=2)
"""The CI-sized validation: the tiny model, two methods, a few minutes."""


# --- the live phase -----------------------------------------------------------------------------------

def _env(cfg: ValidateVllmConfig) -> tuple[tuple[str, str], ...]:
    env = {"VLLM_CPU_KVCACHE_SPACE": f"{cfg.kv_cache_gib:g}", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1",
           "DO_NOT_TRACK": "1"}
    if cfg.iomp:
        iomp = _iomp_library(cfg.vllm_command)
        if iomp is not None:
            env["LD_PRELOAD"] = iomp
    return tuple(sorted(env.items()))


def _iomp_library(command: str) -> str | None:
    """The Intel OpenMP beside the vllm command's venv (``DIR/bin/vllm`` -> ``DIR/lib/libiomp5.so``)."""
    first = Path(command_line(command)[0])
    candidate = first.resolve().parent.parent / "lib" / "libiomp5.so" if first.parent != Path(".") else None
    return str(candidate) if candidate is not None and candidate.is_file() else None


def _run_one(server, cfg: ValidateVllmConfig, traffic: Traffic, model: str, folder: Path, stem: str,
             phase: str, method: str, repeat: int, env: dict) -> dict:
    before = server.metrics()
    write_text(folder / f"{stem}.metrics.before.txt", before)
    first, load_before, started = server.last_iteration(), os.getloadavg(), time.time()
    bench(cfg.vllm_command, server.url, model, traffic, folder / f"{stem}.json", env=env)
    wall = time.time() - started
    time.sleep(1.0)  # the engine's last iteration line reaches the log
    last, load_after = server.last_iteration(), os.getloadavg()
    write_text(folder / f"{stem}.metrics.after.txt", server.metrics())
    return {"method": method, "phase": phase, "repeat": repeat, "traffic": traffic.to_json(),
            "bench": f"{folder.name}/{stem}.json", "metrics_before": f"{folder.name}/{stem}.metrics.before.txt",
            "metrics_after": f"{folder.name}/{stem}.metrics.after.txt", "iterations": [first, last],
            "loadavg_before": list(load_before), "loadavg_after": list(load_after), "started": started,
            "wall_s": wall}


def run_order(cfg: ValidateVllmConfig) -> list[tuple[str, Traffic, int]]:
    """The order one server's runs go in: (phase, traffic, repeat). The
    held-out runs go round the loads, repeat by repeat, and the calibration
    runs are spread evenly among them (calibration run j at slot
    floor((j + 1/2) x runs / calibration runs)), so the calibration samples
    the server's step time over its whole life, as the held-out runs do:
    the third whole run's `none` server ran one step shape 27 ms in its
    calibration runs, all first, and 21-26 ms in the held-out runs that
    followed (docs/vllm.md section 8)."""
    held = [("held_out", t, repeat) for repeat in range(cfg.repeats) for t in cfg.held_out]
    cal = [("calibration", t, 0) for t in cfg.calibration]
    total = len(held) + len(cal)
    slots = {int((j + 0.5) * total / len(cal)): run for j, run in enumerate(cal)}
    order, rest = [], iter(held)
    for slot in range(total):
        order.append(slots[slot] if slot in slots else next(rest))
    return order


def run_live(cfg: ValidateVllmConfig, out: Path, say=print) -> dict:
    """Serve and benchmark every method (module docstring); returns the
    ``runs.json`` record, written into ``out`` as the runs finish."""
    from simspec.vllm.server import terminated_as_interrupt

    models = Path(cfg.models)
    target = str(models.absolute() / "target")
    for method in cfg.methods:
        if method in DRAFT_FOLDERS and cfg.server is None:
            require((models / DRAFT_FOLDERS[method] / "config.json").is_file(),
                    f"{models}: no {DRAFT_FOLDERS[method]} model (rebuild the folder with `simspec vllm-models`)")
    env = _env(cfg)
    record = {"format": "simspec-vllm-validation-runs/1", "simspec_version": __version__,
              "config": _config_json(cfg), "env": dict(env), "servers": [], "runs": []}
    with terminated_as_interrupt():
        for method in cfg.methods:
            folder = out / method
            folder.mkdir(parents=True, exist_ok=True)
            spec = ServeSpec(command=cfg.vllm_command, model=target, port=cfg.port, env=env,
                             speculative_config=speculative_config(method, cfg.models, cfg.k))
            log = folder / "server.log"
            server = (RunningServer(cfg.server, Path(cfg.server_log)) if cfg.server is not None
                      else Server(spec, log, ready_timeout_s=cfg.ready_timeout_s))
            say(f"{method}: starting vllm serve" if cfg.server is None else f"{method}: using {cfg.server}")
            with server:
                record["servers"].append({"method": method, "argv": spec.argv() if cfg.server is None else None,
                                          "log": f"{method}/server.log" if cfg.server is None else cfg.server_log,
                                          "ready_after_s": server.ready_after_s})
                bench_model = target if cfg.server is None else _served_model(server)
                bench_env = dict(env)
                bench_env.pop("LD_PRELOAD", None)
                _run_one(server, cfg, WARMUP, bench_model, folder, "warmup", "warmup", method, 0, bench_env)
                for phase, traffic, repeat in run_order(cfg):
                    if phase == "calibration":
                        say(f"{method}: calibration {traffic.name} ({traffic.describe()})")
                        stem = traffic.name
                    else:
                        say(f"{method}: held-out {traffic.name} #{repeat + 1} ({traffic.describe()})")
                        stem = f"{traffic.name}-r{repeat}"
                    record["runs"].append(_run_one(server, cfg, traffic, bench_model, folder, stem, phase, method,
                                                   repeat, bench_env))
                    write_text(out / RUNS, dump_json(record, sort_keys=False))
            write_text(out / RUNS, dump_json(record, sort_keys=False))
    return record


def _served_model(server: RunningServer) -> str:
    import json

    models = json.loads(http_get(server.url + "/v1/models")).get("data") or []
    require(bool(models), f"--server {server.url}: /v1/models lists no model")
    return str(models[0]["id"])


def _config_json(cfg: ValidateVllmConfig) -> dict:
    record = asdict(cfg)
    for key in ("calibration", "held_out"):
        record[key] = [t.to_json() for t in getattr(cfg, key)]
    return record


def config_from_json(record: dict) -> ValidateVllmConfig:
    record = dict(record)
    for key in ("calibration", "held_out"):
        record[key] = tuple(Traffic.from_json(t) for t in record[key])
    record["methods"] = tuple(record["methods"])
    return ValidateVllmConfig(**record)


# --- fit and compare ----------------------------------------------------------------------------------

@dataclass(frozen=True, slots=True, kw_only=True)
class LiveRun:
    """One benchmark as the live phase kept it."""

    method: str
    phase: str
    repeat: int
    traffic: Traffic
    bench: BenchResult
    steps: tuple[EngineStep, ...]  # the server log's iteration lines during the run (engine 0's indices)
    counters: SpecDecodeCounters | None  # the counters' difference over the run
    loadavg: tuple[float, float]  # 1-minute load average before and after


@dataclass(frozen=True, slots=True, kw_only=True)
class MethodCalibration:
    method: str
    policy: str  # the simulator's: ar or linear:k=K
    fit: StepCostFit  # the iteration fit with the gap added
    iteration_fit: StepCostFit  # the iteration fit alone
    held_out: HeldOutError
    gap: EngineGap
    frontend_s: float
    acceptance: ChainAcceptance | None
    kv_cache_tokens: int
    block_size: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One metric of one method at one load."""

    live: float  # mean over the live repeats
    sim: float  # mean over the repeats' replays
    live_runs: tuple[float, ...]
    bound_pct: float
    # simulated with each held-out run's own acceptance (its counters) instead of the calibration's:
    # what the cost model alone gets wrong (None without speculation)
    sim_own_acceptance: float | None = None
    # the acceptance length only: its sampling error over the held-out run's prompts (standard error, % of it;
    # RequestRounds.relative_se), and the calibration's over its prompts; None without per-request timing
    sampling_se_pct: float | None = None
    calibration_se_pct: float | None = None

    @property
    def sampling_z(self) -> float | None:
        """The error in standard errors of the two prompt sets' difference (None: not an acceptance cell)."""
        if self.sampling_se_pct is None or self.calibration_se_pct is None:
            return None
        se = math.hypot(self.sampling_se_pct, self.calibration_se_pct)
        return self.error_pct / se if se > 0 else None  # an oracle's: every request accepts everything

    @property
    def error_pct(self) -> float:
        return (self.sim / self.live - 1) * 100 if self.live else math.nan

    @property
    def spread_pct(self) -> float:
        """The live repeats' (max - min) / mean, %: how far the live side reproduces itself."""
        runs = np.array(self.live_runs)
        return float((runs.max() - runs.min()) / runs.mean() * 100) if len(runs) > 1 and runs.mean() else math.nan

    @property
    def within(self) -> bool:
        return abs(self.error_pct) <= self.bound_pct

    def to_json(self) -> dict:
        own = self.sim_own_acceptance
        return {"live": self.live, "sim": self.sim, "error_pct": self.error_pct, "bound_pct": self.bound_pct,
                "within_bound": self.within, "live_runs": list(self.live_runs), "live_spread_pct": self.spread_pct,
                "sim_own_acceptance": own,
                "error_own_acceptance_pct": None if own is None or not self.live else (own / self.live - 1) * 100,
                **({} if self.sampling_se_pct is None else {
                    "sampling_se_pct": self.sampling_se_pct, "calibration_sampling_se_pct": self.calibration_se_pct,
                    "error_in_standard_errors": self.sampling_z})}


@dataclass(frozen=True, slots=True, kw_only=True)
class StepCheck:
    """One live run's logged steps against the method's fitted step costs:
    what the cost model gets wrong with the right steps, and how much the
    live engine's time for one step shape moves from run to run."""

    run: str  # "cal-sat4", "low #2", ...
    steps: int
    priced_pct: float  # the fit's price of the run's own logged steps / their logged time - 1, %
    shape_ms: float  # median logged time of the method's commonest decode-only shape in this run (nan: none)


@dataclass(frozen=True, slots=True, kw_only=True)
class VllmValidation:
    config: ValidateVllmConfig
    calibrations: dict[str, MethodCalibration]
    table: dict[str, dict[str, dict[str, Cell]]]  # load -> method -> metric -> cell
    loadavg: dict[str, dict[str, float]]  # load -> method -> mean 1-minute load average over its runs
    replays: dict[tuple[str, str], tuple]  # (load, method) -> (live e2el s, simulated e2el s) of the first repeat
    versions: dict[str, str | None] = field(default_factory=dict)
    prefix_notes: tuple[str, ...] = ()  # runs whose prompts the server had cached (prefix_hits)
    step_checks: dict[str, tuple[tuple[int, int], tuple[StepCheck, ...]]] = field(default_factory=dict)
    """method -> ((decode sequences, decode tokens) of its commonest decode-only step, a check per run)"""

    def ranking(self, load: str, side: str) -> list[str]:
        methods = self.table[load]
        return sorted(methods, key=lambda m: getattr(methods[m]["mean_e2el_ms"], side))


def _counters(before_text: str, after_text: str, path: str) -> tuple[SpecDecodeCounters | None, int | None]:
    """The speculative counters' difference over a run, and the server's KV block size."""
    before, after = parse_metrics(before_text, path), parse_metrics(after_text, path)
    if after.spec_decode is None:
        return None, after.block_size_tokens
    empty = SpecDecodeCounters(num_drafts=0, draft_tokens=0, accepted_tokens=0, accepted_per_position=())
    return after.spec_decode.minus(before.spec_decode or empty), after.block_size_tokens


def load_runs(out: Path) -> tuple[ValidateVllmConfig, list[LiveRun], dict[str, ServerLog], int | None]:
    """What the live phase kept in ``out`` (``runs.json`` and the files it lists), and the
    servers' KV block size from their /metrics (None where no scrape says)."""
    record = read_json(out / RUNS, "validation runs")
    require(isinstance(record, dict) and record.get("format") == "simspec-vllm-validation-runs/1",
            f"{out / RUNS}: not a `simspec validate --against vllm` runs file")
    cfg = config_from_json(record["config"])
    logs: dict[str, ServerLog] = {}
    for s in record["servers"]:
        path = Path(s["log"]) if Path(s["log"]).is_absolute() else out / s["log"]
        logs[s["method"]] = read_server_log(path)
    runs, block = [], None
    for r in record["runs"]:
        start, end = r["iterations"]
        log = logs[r["method"]]
        bench_path = out / r["bench"]
        counters, block_size = _counters((out / r["metrics_before"]).read_text(),
                                         (out / r["metrics_after"]).read_text(), str(out / r["metrics_after"]))
        block = block or block_size
        runs.append(LiveRun(
            method=r["method"], phase=r["phase"], repeat=r["repeat"], traffic=Traffic.from_json(r["traffic"]),
            bench=parse_bench(read_json(bench_path, "vllm bench result"), str(bench_path)),
            steps=tuple(s for s in log.steps if start < s.index <= end and not s.dummy),
            counters=counters,
            loadavg=(float(r["loadavg_before"][0]), float(r["loadavg_after"][0]))))
    return cfg, runs, logs, block


def _step_columns(steps) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    tokens = np.array([s.prefill_tokens + s.decode_tokens for s in steps], dtype=float)
    requests = np.array([s.prefill_requests + s.decode_requests for s in steps], dtype=float)
    elapsed = np.array([s.elapsed_ms / 1e3 for s in steps], dtype=float)
    return tokens, requests, elapsed


def fit_gap(runs: list[LiveRun]) -> EngineGap:
    """Per-step and per-sequence time outside the elapsed time, from runs
    that never let the engine idle (step 2 of the module docstring)."""
    saturated = [r for r in runs if r.traffic.saturating]
    require(bool(saturated), "no saturating calibration run to fit the engine's CPU time to")
    for r in saturated:
        require(len(r.steps) > 0, f"{r.bench.path}: no iteration lines in the server log during the run")
    return fit_engine_gap([(Path(r.bench.path).name, r.bench.summary["duration"], r.steps) for r in saturated])


def _engine(kv_tokens: int, block_size: int, frontend_s: float):
    from simspec.serving import modes
    from simspec.serving.config import EngineConfig

    fields = modes.preset("vllm", "cpu")  # vLLM's CPU defaults
    return EngineConfig(**{**fields, "block_size": block_size, "kv_cache_tokens": kv_tokens,
                           "frontend_s_per_request": frontend_s})


def calibrate_method(method: str, runs: list[LiveRun], log: ServerLog, cfg: ValidateVllmConfig,
                     block: int) -> MethodCalibration:
    cal = [r for r in runs if r.method == method and r.phase == "calibration"]
    require(bool(cal), f"{method}: no calibration runs kept")
    steps = [s for r in cal for s in r.steps]
    tokens, requests, elapsed = _step_columns(steps)
    model = f"vllm-models-{cfg.size}"
    label = f"fitted to vLLM {log.version or '?'} iteration lines of {method}'s calibration runs"
    _, iteration_fit, held = fit_iteration_costs(tokens, requests, elapsed, label, model=model, device="cpu",
                                                 hold_out_every=5)
    gap = fit_gap(cal)
    fit = with_gap(iteration_fit, gap)
    chain = None
    if method != "none":
        counters = _sum_counters([r.counters for r in cal])
        require(counters is not None and counters.num_drafts > 0,
                f"{method}: the server drafted nothing in the calibration runs")
        chain = fit_chain_acceptance(counters, cfg.k, f"calibrated:vllm-{method}",
                                     request_rounds([r.bench for r in cal]))
    policy = "ar" if chain is None else f"linear:k={cfg.k}"
    kv_tokens = log.kv_cache_tokens or 1 << 20
    light = next(r for r in cal if not r.traffic.saturating)
    sim, _ = replay_requests(light.bench, policy, fit.cost_model(), chain.model if chain else None,
                             _engine(kv_tokens, block, 0.0), kv_tokens, cfg.sim_seeds)
    frontend = max(0.0, (light.bench.summary["mean_ttft_ms"] - sim["mean_ttft_ms"]) / 1e3)
    return MethodCalibration(method=method, policy=policy, fit=fit, iteration_fit=iteration_fit, held_out=held,
                             gap=gap, frontend_s=frontend, acceptance=chain, kv_cache_tokens=kv_tokens,
                             block_size=block)


def step_checks(cal: MethodCalibration, runs: list[LiveRun]) -> tuple[tuple[int, int], tuple[StepCheck, ...]]:
    """Each of the method's runs (calibration and held out, in the order
    they ran): its logged steps priced by the iteration fit against their
    logged time, and the median time of the method's commonest decode-only
    step shape in it. The first says how far the step costs alone are off
    on a run; the second, how far the live engine is from itself on one
    step shape, which no cost model can follow."""
    shapes = [(s.decode_requests, s.decode_tokens) for r in runs for s in r.steps
              if s.prefill_requests == 0 and s.decode_requests > 0]
    values, counts = np.unique(np.array(shapes or [(0, 0)]), axis=0, return_counts=True)
    common = tuple(int(v) for v in values[int(np.argmax(counts))])
    c = cal.iteration_fit.coefficients_s
    checks = []
    for r in runs:
        tokens, requests, elapsed = _step_columns(r.steps)
        if not len(elapsed):
            continue
        priced = c["overhead"] * len(elapsed) + c["target_token"] * tokens.sum() + c["attn_request"] * requests.sum()
        same = [s.elapsed_ms for s in r.steps
                if s.prefill_requests == 0 and (s.decode_requests, s.decode_tokens) == common]
        name = r.traffic.name if r.phase == "calibration" else f"{r.traffic.name} #{r.repeat + 1}"
        checks.append(StepCheck(run=name, steps=len(elapsed), priced_pct=float((priced / elapsed.sum() - 1) * 100),
                                shape_ms=float(np.median(same)) if len(same) >= 5 else math.nan))
    return common, tuple(checks)


def _sum_counters(parts) -> SpecDecodeCounters | None:
    parts = [p for p in parts if p is not None]
    if not parts:
        return None
    k = max(len(p.accepted_per_position) for p in parts)
    return SpecDecodeCounters(
        num_drafts=sum(p.num_drafts for p in parts), draft_tokens=sum(p.draft_tokens for p in parts),
        accepted_tokens=sum(p.accepted_tokens for p in parts),
        accepted_per_position=tuple(sum(p.accepted_per_position[j] if j < len(p.accepted_per_position) else 0
                                        for p in parts) for j in range(k)))


def prefix_hits(runs: list[LiveRun], block: int | None, spec_tokens: dict[str, int] | None = None
                ) -> tuple[dict[int, np.ndarray], tuple[str, ...]]:
    """The prompt tokens each request of a run found in its server's prefix
    cache (by ``id(run)``; ``runs`` in the order they ran), and a note per
    run that found any. ``spec_tokens``: each method's K (0 or absent: no
    speculation).

    vLLM's random dataset gives the same prompts for the same traffic and
    seed, and the server keeps a served prompt's full KV blocks cached (its
    prefix caching is on by default): a repeat of a traffic computes only
    what is past the last full block of each prompt, at most prompt - 1
    tokens (vllm/v1/core/kv_cache_manager.py 0.33 l.296-302). When it
    speculates, a request left with one prompt token to compute may be
    scheduled as 1 + K rows, K of them placeholder drafts, which the log
    counts as context tokens (vllm/v1/core/sched/scheduler.py 0.32
    l.1131-1152: new requests are padded to the speculative width when no
    other prefill was scheduled before them in the step). The rule is used
    for a run only when it gives exactly the prompt tokens the server logged
    as computed during the run, up to K for each request so left; otherwise
    the note says what the log shows and the run is replayed whole."""
    hits, notes, served = {}, [], {}
    for r in runs:
        seen = served.setdefault(r.method, set())
        req = r.bench.requests
        if req is None:
            continue
        sent = int(req.input_tokens[req.ok].sum())
        computed = sum(s.prefill_tokens for s in r.steps)
        label = f"{r.method} {r.traffic.name} #{r.repeat + 1}"
        if r.traffic in seen and block:
            hit = np.where(req.ok, (req.input_tokens - 1) // block * block, 0)
            k = (spec_tokens or {}).get(r.method, 0)
            padded = computed - (sent - int(hit.sum()))
            one_left = int(np.sum(req.ok & (req.input_tokens - hit == 1)))
            if padded == 0 or (k > 0 and padded % k == 0 and 0 < padded // k <= one_left):
                hits[id(r)] = hit
                if hit.any():
                    pad = (f" ({padded} of them vLLM's placeholder draft rows for {padded // k} request(s) left "
                           f"with one prompt token)" if padded else "")
                    notes.append(f"{label}: {int(hit.sum())} of {sent} prompt tokens found in the prefix cache (its "
                                 f"prompts were served before; {block}-token blocks), as the log's {computed} "
                                 f"computed tokens confirm{pad}: replayed without them")
            else:
                notes.append(f"{label}: the log computed {computed} of {sent} prompt tokens, not the "
                             f"{sent - int(hit.sum())} the block rule says: replayed whole")
        elif computed < sent:
            notes.append(f"{label}: the log computed {computed} of {sent} prompt tokens (a prefix-cache hit not "
                         f"explained by an earlier run): replayed whole")
        seen.add(r.traffic)
    return hits, tuple(notes)


def _live_value(run: LiveRun, metric: str) -> float:
    if metric == "spec_decode_acceptance_length":
        return run.counters.acceptance_length if run.counters is not None else 1.0
    return float(run.bench.summary[metric])


def analyse(out: Path, say=print) -> VllmValidation:
    """Fit every method on its calibration runs and compare its held-out runs (module docstring)."""
    cfg, runs, logs, block = load_runs(out)
    block = block or 16
    calibrations = {method: calibrate_method(method, runs, logs[method], cfg, block)
                    for method in cfg.methods if method in logs}
    table: dict[str, dict[str, dict[str, Cell]]] = {}
    loadavg: dict[str, dict[str, float]] = {}
    replays = {}
    drafts = {m: (speculative_config(m, cfg.models, cfg.k) or {}).get("num_speculative_tokens", 0)
              for m in cfg.methods}  # K per method, as the server was started
    hits, notes = prefix_hits(runs, block, drafts)
    for traffic in cfg.held_out:
        for method, cal in calibrations.items():
            held = [r for r in runs if r.method == method and r.phase == "held_out" and r.traffic.name == traffic.name]
            if not held:
                continue
            engine = _engine(cal.kv_cache_tokens, cal.block_size, cal.frontend_s)
            sims = [replay_requests(r.bench, cal.policy, cal.fit.cost_model(),
                                    cal.acceptance.model if cal.acceptance else None, engine, cal.kv_cache_tokens,
                                    cfg.sim_seeds, hits.get(id(r))) for r in held]
            own, sampling = None, {}
            if cal.acceptance is not None:  # the cost model alone: each run priced with its own counters' acceptance
                rounds = [request_rounds([r.bench]) for r in held]
                own = [replay_requests(r.bench, cal.policy, cal.fit.cost_model(),
                                       fit_chain_acceptance(r.counters, cfg.k, f"own:{method}", rr).model, engine,
                                       cal.kv_cache_tokens, cfg.sim_seeds, hits.get(id(r)))[0]
                       for r, rr in zip(held, rounds)]
                if cal.acceptance.sampling_se is not None and rounds[0] is not None:  # the repeats: the same prompts
                    sampling = {"sampling_se_pct": 100 * rounds[0].relative_se,
                                "calibration_se_pct": 100 * cal.acceptance.sampling_se}
            table.setdefault(traffic.name, {})[method] = {
                m: Cell(live=float(np.mean([_live_value(r, m) for r in held])),
                        sim=float(np.mean([s[m] for s, _ in sims])),
                        live_runs=tuple(_live_value(r, m) for r in held), bound_pct=bound,
                        sim_own_acceptance=None if own is None else float(np.mean([s[m] for s in own])),
                        **(sampling if m == "spec_decode_acceptance_length" else {}))
                for m, bound in BOUNDS.items()}
            loadavg.setdefault(traffic.name, {})[method] = float(np.mean([np.mean(r.loadavg) for r in held]))
            replays[(traffic.name, method)] = (held[0].bench.requests.e2el_s[held[0].bench.requests.ok],
                                               sims[0][1])
    version = next((log.version for log in logs.values() if log.version), None)
    checks = {method: step_checks(cal, [r for r in runs if r.method == method and r.phase != "warmup"])
              for method, cal in calibrations.items()}
    return VllmValidation(config=cfg, calibrations=calibrations, table=table, loadavg=loadavg, replays=replays,
                          versions={"vllm": version, "simspec": __version__}, prefix_notes=notes,
                          step_checks=checks)


# --- output -------------------------------------------------------------------------------------------

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
        from simspec.vllm.calibrate import acceptance_record

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


__all__ = ["BOUNDS", "DEFAULT_METHODS", "METHODS", "QUICK", "ValidateVllmConfig", "analyse", "format_report", "reanalyse", "validate"]
