"""``simspec validate --against vllm``, its settings and its live phase: calibrate simspec on a running vLLM,
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

import os
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path


from simspec import __version__
from simspec.files import dump_json, write_text
from simspec.types import require
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
# Real-text prompts (--texts): the six live classes of simspec.vllm.texts in
# turn, chat-templated by the bench (60-160 prompt tokens), each traffic its
# own prompts (its seed); the loads of the random-dataset sets, for a 135M
# model with a 49,152-token vocabulary on the same CPU.
TEXT_CALIBRATION = tuple(replace(t, dataset=f"prompts/{t.name}.jsonl") for t in CALIBRATION)
TEXT_HELD_OUT = (
    Traffic(name="low", prompts=24, input_len=100, output_len=48, range_ratio=0.5, rate=0.2, seed=301,
            dataset="prompts/low.jsonl"),
    Traffic(name="mid", prompts=24, input_len=100, output_len=80, range_ratio=0.5, rate=0.3, seed=302,
            dataset="prompts/mid.jsonl"),
    Traffic(name="bursty", prompts=24, input_len=100, output_len=64, range_ratio=0.5, rate=0.3, burstiness=0.25,
            seed=303, dataset="prompts/bursty.jsonl"),
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
    texts: bool = False  # the traffic's datasets are real-text prompts, written into the run folder

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
    bench(cfg.vllm_command, server.url, model, traffic, folder / f"{stem}.json", env=env, root=folder.parent)
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


def write_datasets(cfg: ValidateVllmConfig, out: Path) -> None:
    """Each real-text traffic's prompts (simspec.vllm.texts.bench_dataset, its
    seed), at its ``dataset`` path under ``out``, written whole or not at all."""
    import json

    from simspec.vllm.texts import bench_dataset

    for t in cfg.calibration + cfg.held_out:
        if t.dataset:
            rows = bench_dataset(t.prompts, t.seed, t.output_len, t.range_ratio)
            path = out / t.dataset
            path.parent.mkdir(parents=True, exist_ok=True)
            write_text(path, "".join(json.dumps(r, sort_keys=True) + "\n" for r in rows))


def run_live(cfg: ValidateVllmConfig, out: Path, say=print) -> dict:
    """Serve and benchmark every method (module docstring); returns the
    ``runs.json`` record, written into ``out`` as the runs finish."""
    from simspec.vllm.server import terminated_as_interrupt

    write_datasets(cfg, out)
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


def target_name(cfg: ValidateVllmConfig) -> str:
    """What the fits name the model: ``vllm-models-SIZE`` for a `simspec
    vllm-models` folder, else the served target's own name (its config's
    ``_name_or_path``); ``vllm-models-SIZE`` too where the folder cannot be read
    (a run re-analysed on another machine)."""
    import json

    from simspec.vllm.models import MANIFEST

    models = Path(cfg.models)
    if (models / MANIFEST).is_file():
        return f"vllm-models-{cfg.size}"
    try:
        name = json.loads((models / "target" / "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError):
        name = None
    return str(name) if name else f"vllm-models-{cfg.size}"


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


__all__ = ["BOUNDS", "DEFAULT_METHODS", "METHODS", "QUICK", "RUNS", "REPORT", "TEXT_CALIBRATION", "TEXT_HELD_OUT",
           "ValidateVllmConfig", "config_from_json", "run_live", "run_order", "speculative_config", "target_name",
           "write_datasets"]
