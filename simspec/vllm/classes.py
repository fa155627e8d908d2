"""Acceptance by request class from a real vLLM: ``simspec calibrate
vllm-classes``.

Imports: the standard library, numpy, scipy (inside the fits),
simspec.acceptance, simspec.files, simspec.types, simspec.vllm.acceptance,
simspec.vllm.logs, simspec.vllm.server, simspec.vllm.texts. Never vLLM.

A run sends prompts of known classes (simspec.vllm.texts) to a vLLM
server started with ``--per-request-spec-decode-metrics detailed``
(vLLM's ObservabilityConfig, ``vllm/config/observability.py``), greedy,
a fixed number in flight, and keeps each response's
``metrics.speculative_decoding``: for every verify step of that request
the draft tokens proposed and accepted (``per_step_drafted``,
``per_step_accepted``; ``vllm/v1/metrics/stats.py``,
RequestSpecDecodeMetrics). Those are per request what the server's
``/metrics`` counters are for the whole run, so each class has its own
per-position rates and its own requests' spread of tokens a round.

A request's rounds are its decode steps: a step in which the drafter
proposed nothing (prompt lookup found no match) is a round that accepted
nothing, so the acceptance length is the output tokens a decode step, what
the simulator, which drafts every round, must reproduce to price latency.

The fit (:func:`fit_classes`): the decay per depth and the round term are
shared, each class has its own level (top-1 logit) and its own per-request
spread, all fitted together by least squares to every class's per-position
rates and its requests' standard deviation of tokens a step (the chain
mapping of simspec.vllm.acceptance, with token and confidence noise off).
The model's own level is the one that matches all requests together; the
classes' are its ``class_logit`` offsets and their spreads ``class_sigma``.
The check (:func:`held_out`): within each class, every ``hold_out_every``-th
prompt is held out (2, the default: the odd ones) and the rest fitted; the
model fitted on them predicts each class's acceptance length on the held-out
ones, compared with the
live one (a ratio estimator over the held-out requests) within 2 of its
standard errors, and within 2 standard errors of the difference (the fit
half is a sample of the class's prompts too). ``acceptance.json`` is then
fitted on every request, for ``simspec simulate --acceptance FILE --mix ...``.
"""

from __future__ import annotations

import json
import math
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simspec.acceptance import AcceptanceModel
from simspec.acceptance.fit import ACCEPTANCE_FORMAT
from simspec.types import InputError, require
from simspec.vllm.acceptance import RequestRounds, chain_rates
from simspec.vllm.logs import SpecDecodeCounters, server_version
from simspec.vllm.texts import LIVE_CLASSES, Prompt

MIN_CLASS_REQUESTS = 8  # requests with decode steps a class needs to fit its level
HOLD_OUT_EVERY = 2  # each class's every n-th prompt held out, the rest fitted (2: the odd against the even)
SE_TARGET = 0.03  # the held-out acceptance's relative standard error a sized run reaches


@dataclass(frozen=True, slots=True, kw_only=True)
class Response:
    """One request's answer and its speculative statistics."""

    index: int
    task: str
    prompt_tokens: int
    completion_tokens: int
    steps_accepted: tuple[int, ...]  # per verify step, draft tokens accepted
    steps_drafted: tuple[int, ...]  # per verify step, draft tokens proposed
    seconds: float  # wall time of the request, sent to answered
    text: str

    def to_json(self) -> dict:
        return {"index": self.index, "task": self.task, "prompt_tokens": self.prompt_tokens,
                "completion_tokens": self.completion_tokens, "steps_accepted": list(self.steps_accepted),
                "steps_drafted": list(self.steps_drafted), "seconds": self.seconds, "text": self.text}

    @classmethod
    def from_json(cls, r: dict) -> Response:
        return cls(**{**r, "steps_accepted": tuple(r["steps_accepted"]), "steps_drafted": tuple(r["steps_drafted"])})


def ask(url: str, model: str, prompt: Prompt, max_tokens: int, timeout_s: float = 600.0) -> Response:
    """One greedy chat completion of ``prompt`` and its per-request speculative metrics."""
    body = {"model": model, "messages": [{"role": "user", "content": prompt.text}], "max_tokens": max_tokens,
            "temperature": 0.0, "seed": 0}
    request = urllib.request.Request(url + "/v1/chat/completions", json.dumps(body).encode(),
                                     {"Content-Type": "application/json"})
    started = time.monotonic()
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as answer:
            record = json.load(answer)
    except urllib.error.HTTPError as err:
        detail = err.read().decode(errors="replace")[:300]
        raise InputError(f"{url}: prompt {prompt.index + 1} ({prompt.task}) answered HTTP {err.code}: {detail}") from None
    except (urllib.error.URLError, OSError) as err:
        raise InputError(f"{url}: prompt {prompt.index + 1} got no answer ({err})") from None
    spec = ((record.get("metrics") or {}).get("speculative_decoding") or {})
    require(bool(spec) and ("per_step_accepted" in spec or spec.get("num_spec_steps", 0) == 0),
            f"{url}: the answers carry no per-step speculative metrics (metrics.speculative_decoding."
            f"per_step_accepted): start the server with speculation and --per-request-spec-decode-metrics detailed")
    usage = record.get("usage") or {}
    return Response(index=prompt.index, task=prompt.task, prompt_tokens=int(usage.get("prompt_tokens", 0)),
                    completion_tokens=int(usage.get("completion_tokens", 0)),
                    steps_accepted=tuple(spec.get("per_step_accepted") or ()),
                    steps_drafted=tuple(spec.get("per_step_drafted") or ()),
                    seconds=time.monotonic() - started, text=record["choices"][0]["message"]["content"] or "")


def send(url: str, model: str, prompts: list[Prompt], max_tokens: int, concurrency: int,
         progress=None) -> list[Response]:
    """Every prompt, ``concurrency`` in flight, answers in prompt order."""
    with ThreadPoolExecutor(concurrency) as pool:
        futures = [pool.submit(ask, url, model, p, max_tokens) for p in prompts]
        out = []
        for f in futures:
            out.append(f.result())
            if progress is not None:
                progress()
    return out


# -- per class: counters, spread, fits ------------------------------------------------

def _rounds(r: Response) -> list[tuple[int, int]]:
    """The request's decode steps as (accepted, drafted): its verify steps, and a step that drafted nothing
    (prompt lookup found no match) as (0, 0). Its output after the first token (the prefill's) is one token a
    step that did not draft plus 1 + accepted a verify step, so the steps without a draft are what is left."""
    steps = [(a, d) for a, d in zip(r.steps_accepted, r.steps_drafted) if d > 0]
    plain = r.completion_tokens - 1 - sum(a + 1 for a, _ in steps)
    return steps + [(0, 0)] * max(plain, 0)


def counters(responses: list[Response], k: int) -> SpecDecodeCounters:
    """The requests' decode steps as the simulator's rounds: every step drafts (a step that drafted nothing
    counts as a draft of which nothing was accepted), so the acceptance length is the output tokens a step."""
    per_pos = [0] * k
    drafts = draft_tokens = accepted = 0
    for r in responses:
        for a, d in _rounds(r):
            drafts += 1
            draft_tokens += d
            accepted += a
            for j in range(min(a, k)):
                per_pos[j] += 1
    return SpecDecodeCounters(num_drafts=drafts, draft_tokens=draft_tokens, accepted_tokens=accepted,
                              accepted_per_position=tuple(per_pos))


def _per_request(responses: list[Response], min_steps: int) -> RequestRounds:
    """Each request of ``min_steps`` decode steps or more: its output tokens a step and after its first."""
    per, after = [], []
    for r in responses:
        steps = _rounds(r)
        if len(steps) >= min_steps:
            tokens = sum(a + 1 for a, _ in steps)
            per.append(tokens / len(steps))
            after.append(float(tokens))
    return RequestRounds(tokens_per_round=np.array(per), tokens_after_first=np.array(after))


def rounds(responses: list[Response]) -> RequestRounds | None:
    """Each request's output tokens a decode step, over its steps; None with fewer than 8 requests of two
    steps or more."""
    found = _per_request(responses, 2)
    return found if len(found.tokens_per_round) >= MIN_CLASS_REQUESTS else None


def live_length(responses: list[Response]) -> tuple[float, float]:
    """(output tokens a decode step, its standard error) over the requests: RequestRounds' pooled ratio and
    its standard error (a ratio estimator's, each request's steps a cluster)."""
    found = _per_request(responses, 1)
    n = len(found.tokens_per_round)
    if n < 2:
        return (found.pooled if n else math.nan), math.nan
    return found.pooled, found.relative_se * found.pooled


def _class_logit(shape: AcceptanceModel, c: SpecDecodeCounters, k: int) -> float:
    """The top-1 logit that, with ``shape``'s decay and spreads held, matches the class's per-position rates."""
    from scipy.optimize import minimize_scalar  # only when fitting

    target = np.clip(np.array(c.per_position_rates[:k]), 1e-6, 1 - 1e-6)

    def loss(a):
        return float(np.sum((chain_rates(a, shape.depth_decay_logit, shape.request_sigma, k, shape.round_sigma)
                             - target) ** 2))

    return float(minimize_scalar(loss, bounds=(-13.8, 13.8), method="bounded", options={"xatol": 1e-5}).x)


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassFit:
    """The shape fitted to all classes and each class's level."""

    model: AcceptanceModel  # class_logit holds the classes' offsets from model.top1_logit
    k: int
    requests: dict[str, int]  # requests with verify steps per class
    rates: dict[str, tuple[float, ...]]  # per class, the live per-position rates
    model_rates: dict[str, tuple[float, ...]]  # per class, the model's
    spreads: dict[str, tuple[float, float]]  # per class, the requests' s.d. of tokens a step: live, model

    def predicted_length(self, task: str) -> float:
        m = self.model
        return 1.0 + float(chain_rates(m.top1_logit + m.class_offset(task), m.depth_decay_logit,
                                       m.class_spread(task), self.k, m.round_sigma).sum())


def fit_classes(responses: list[Response], k: int, name: str) -> ClassFit:
    """The shared decay and round term, each class's level and request spread, fitted together by least
    squares to every class's per-position rates and its requests' spread of tokens a step (module docstring);
    the model's own level (and spread, the classes' weighted by requests) for a request of no class."""
    from scipy.optimize import least_squares  # only when fitting

    from simspec.vllm.acceptance import LOGIT_LIMIT, SIGMA_LIMIT, _chains, _rates, _spread

    tasks = sorted({r.task for r in responses})
    per = {t: [r for r in responses if r.task == t] for t in tasks}
    rates, spreads, counts = {}, {}, {}
    for t in tasks:
        n = sum(1 for r in per[t] if _rounds(r))
        if n < MIN_CLASS_REQUESTS:
            raise InputError(f"class {t}: {n} requests with decode steps; a class's fit needs at least "
                             f"{MIN_CLASS_REQUESTS} (give more --per-class)")
        rates[t] = tuple(float(x) for x in counters(per[t], k).per_position_rates[:k])
        spreads[t] = rounds(per[t])
        counts[t] = n
    targets = {t: np.clip(np.array(rates[t]), 1e-6, 1 - 1e-6) for t in tasks}

    c_n = len(tasks)

    def residual(theta):
        decay, round_sigma = theta[:2]
        out = []
        for level, sigma, t in zip(theta[2:2 + c_n], theta[2 + c_n:], tasks):
            chains = _chains(level, decay, sigma, k, round_sigma)
            out.append(_rates(chains) - targets[t])
            if spreads[t] is not None:
                model = _spread(chains, spreads[t].tokens_after_first)[1]
                out.append([(model - spreads[t].spread) / (1.0 + k)])
        return np.concatenate(out)

    start = [0.1, 1.0] + [float(np.clip(np.log(targets[t][0] / (1 - targets[t][0])), -LOGIT_LIMIT, LOGIT_LIMIT))
                          for t in tasks] + [0.5] * c_n
    lower = [0.0, 0.0] + [-LOGIT_LIMIT] * c_n + [0.0] * c_n
    upper = [5.0, SIGMA_LIMIT] + [LOGIT_LIMIT] * c_n + [SIGMA_LIMIT] * c_n
    theta = least_squares(residual, start, bounds=(lower, upper)).x
    decay, round_sigma = float(theta[0]), float(theta[1])
    levels = {t: float(v) for t, v in zip(tasks, theta[2:2 + c_n])}
    sigmas = {t: float(v) for t, v in zip(tasks, theta[2 + c_n:])}
    sigma = float(sum(sigmas[t] * counts[t] for t in tasks) / sum(counts.values()))  # a request of no class
    shape = AcceptanceModel(name=name, top1_logit=0.0, depth_decay_logit=decay, request_sigma=sigma,
                            round_sigma=round_sigma, token_sigma=0.0, visual_share=0.0)
    base = _class_logit(shape, counters(responses, k), k)
    model_rates, spread = {}, {}
    for t in tasks:
        chains = _chains(levels[t], decay, sigmas[t], k, round_sigma)
        model_rates[t] = tuple(float(x) for x in _rates(chains))
        if spreads[t] is not None:
            spread[t] = (spreads[t].spread, _spread(chains, spreads[t].tokens_after_first)[1])
    model = AcceptanceModel(name=name, top1_logit=base, depth_decay_logit=decay, request_sigma=sigma,
                            round_sigma=round_sigma, token_sigma=0.0, visual_share=0.0,
                            class_logit=tuple((t, round(levels[t] - base, 6)) for t in tasks),
                            class_sigma=tuple((t, round(sigmas[t], 6)) for t in tasks))
    return ClassFit(model=model, k=k, requests=counts, rates=rates, model_rates=model_rates, spreads=spread)


@dataclass(frozen=True, slots=True, kw_only=True)
class HeldOut:
    task: str
    fit_requests: int
    held_requests: int
    predicted: float
    live: float
    se: float  # standard error of live
    fit_se: float  # standard error of the fit half's own acceptance length (the prediction's sampling error)

    @property
    def within_live(self) -> bool:
        """Within 2 standard errors of the held-out live acceptance."""
        return abs(self.predicted - self.live) <= 2.0 * self.se

    @property
    def se_difference(self) -> float:
        """Standard error of prediction - live: both halves are samples of the class's prompts."""
        return math.hypot(self.se, self.fit_se)

    @property
    def within(self) -> bool:
        """Within 2 standard errors of the difference (the fit half's sampling counted too)."""
        return abs(self.predicted - self.live) <= 2.0 * self.se_difference

    @property
    def relative_se(self) -> float:
        return self.se / self.live


def held_out(responses: list[Response], k: int, name: str,
             every: int = HOLD_OUT_EVERY) -> tuple[ClassFit, list[HeldOut]]:
    """Fit on each class's prompts but every ``every``-th, predict those (module docstring)."""
    require(every >= 2, f"hold_out_every must be >= 2 (got {every})")
    order: dict[str, int] = {}
    fit_half, held_half = [], []
    for r in sorted(responses, key=lambda r: r.index):
        i = order.get(r.task, 0)
        order[r.task] = i + 1
        (held_half if i % every == every - 1 else fit_half).append(r)
    fit = fit_classes(fit_half, k, name)
    return fit, [_held_out_row(fit, t, fit_half, [r for r in held_half if r.task == t]) for t in sorted(fit.requests)]


def _held_out_row(fit: ClassFit, task: str, fitted: list[Response], held: list[Response]) -> HeldOut:
    """Class ``task``'s check: ``fit`` (on ``fitted``) against its ``held`` requests' live acceptance."""
    live, se = live_length(held)
    return HeldOut(task=task, fit_requests=fit.requests[task], held_requests=len(held),
                   predicted=fit.predicted_length(task), live=live, se=se,
                   fit_se=live_length([r for r in fitted if r.task == task])[1])


def across_runs(fit_folder: str | Path, folder: str | Path) -> tuple[ClassFit, list[HeldOut]]:
    """Fit on every request of one run (``fit_folder``), predict another's: each request of ``folder`` whose
    prompt ``fit_folder`` never served (by its text), class by class. The two runs are served apart (another
    server, another day), so this holds out the prompts, the server and the day together."""
    from simspec.vllm import texts

    fitted, record = read_responses(fit_folder)
    served = {p.text for p in texts.read(Path(fit_folder, "prompts.jsonl"))}
    prompts = {p.index: p.text for p in texts.read(Path(folder, "prompts.jsonl"))}
    responses, _ = read_responses(folder)
    fresh = [r for r in responses if prompts[r.index] not in served]
    fit = fit_classes(fitted, int(record["k"]), record["settings"]["fitted_to"])
    held = {t: [r for r in fresh if r.task == t] for t in sorted(fit.requests)}
    rows = [_held_out_row(fit, t, fitted, h) for t, h in held.items() if len(h) >= MIN_CLASS_REQUESTS]
    require(rows, f"--fit-on {fit_folder}: no class has {MIN_CLASS_REQUESTS} requests in {folder} on prompts "
                  f"it did not serve")
    return fit, rows


def acceptance_record(fit: ClassFit, fitted_to: str, source: str) -> dict:
    """``acceptance.json`` with the class levels, as simspec.acceptance.load_acceptance reads it."""
    from dataclasses import asdict

    return {"format": ACCEPTANCE_FORMAT, "model": asdict(fit.model), "source": {
        "model": fitted_to, "from": source, "num_speculative_tokens": fit.k,
        "requests_per_class": fit.requests,
        "per_position_rates": {t: list(v) for t, v in fit.rates.items()},
        "model_per_position_rates": {t: list(v) for t, v in fit.model_rates.items()},
        "requests_sd_of_tokens_a_step": {t: {"live": v[0], "model": v[1]} for t, v in fit.spreads.items()},
        "approximations": "one decay and round term for every class, each class its own level and request "
                          "spread; chain rates fitted with token and confidence noise off; a step that drafted "
                          "nothing is a round that accepted nothing"}}


# -- a run: serve, send, keep, fit, report ------------------------------------------------

DEFAULT_SPECULATION = '{"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3}'
FILES = ("prompts.jsonl", "responses.jsonl", "run.json")


@dataclass(frozen=True, slots=True, kw_only=True)
class ClassRun:
    """What ``calibrate vllm-classes`` serves and sends."""

    command: str = "vllm"
    model: str = ""
    server: str | None = None
    speculative_config: str = DEFAULT_SPECULATION
    tasks: tuple[str, ...] = LIVE_CLASSES
    per_class: int = 40
    hold_out_every: int = HOLD_OUT_EVERY
    prompts: str | None = None
    max_tokens: int = 128
    concurrency: int = 8
    port: int = 8051
    kv_cache_gib: float = 2.0
    seed: int = 0
    fitted_to: str = ""

    @classmethod
    def from_args(cls, args) -> ClassRun:
        from simspec.acceptance.classes import CLASSES

        require(args.hold_out_every is None or 2 <= args.hold_out_every <= 10,
                f"--hold-out-every must be in 2..10 (got {args.hold_out_every})")
        require(args.fit_on is None or args.from_folder, "--fit-on needs --from (the run whose requests it predicts)")
        if args.fit_on:
            for folder in (args.fit_on, args.from_folder):
                for name in ("responses.jsonl", "prompts.jsonl", "run.json"):
                    require(Path(folder, name).is_file(), f"--fit-on/--from {folder}: no {name} (not a calibrate "
                                                          f"vllm-classes folder)")
        if args.from_folder:
            require(args.out is None, f"--from {args.from_folder} re-analyses that folder in place: leave --out out")
            require(Path(args.from_folder, "responses.jsonl").is_file(),
                    f"--from {args.from_folder}: no responses.jsonl (not a calibrate vllm-classes folder)")
            return cls(fitted_to=args.fitted_to or "")
        require(args.out is not None, "--out is required (or --from DIR to re-analyse a run)")
        require(args.model is not None, "--model is required: the model folder to serve (or, with --server, "
                                        "the model name it serves)")
        tasks = tuple(t.strip() for t in args.classes.split(",") if t.strip())
        for t in tasks:
            require(t in CLASSES, f"--classes: unknown class {t!r} (allowed: {', '.join(CLASSES)})")
        require(tasks, "--classes names no class")
        try:
            spec = json.loads(args.speculative_config or DEFAULT_SPECULATION)
        except json.JSONDecodeError:
            raise InputError(f"--speculative-config must be JSON (got {args.speculative_config!r})") from None
        require(isinstance(spec, dict) and isinstance(spec.get("num_speculative_tokens"), int)
                and 1 <= spec["num_speculative_tokens"] <= 16,
                "--speculative-config needs num_speculative_tokens, an integer in 1..16")
        every = args.hold_out_every or HOLD_OUT_EVERY
        low = min_per_class(every)
        require(low <= args.per_class <= 10_000, f"--per-class must be in {low}..10000 with --hold-out-every {every} "
                                                 f"(each class's held-out and fitted prompts need "
                                                 f"{MIN_CLASS_REQUESTS} each; got {args.per_class})")
        require(1 <= args.max_tokens <= 8192, f"--max-tokens must be in 1..8192 (got {args.max_tokens})")
        require(1 <= args.concurrency <= 256, f"--concurrency must be in 1..256 (got {args.concurrency})")
        require(1024 <= args.port <= 65535, f"--port must be in 1024..65535 (got {args.port})")
        require(args.kv_cache_gib > 0, f"--kv-cache-gib must be > 0 (got {args.kv_cache_gib:g})")
        require(args.server is None or args.server.startswith(("http://", "https://")),
                f"--server must be an http(s) URL (got {args.server!r})")
        require(args.server is not None or Path(args.model, "config.json").is_file(),
                f"--model {args.model}: no config.json there (a Hugging Face model folder to serve)")
        return cls(command=args.vllm_command, model=args.model, server=args.server,
                   speculative_config=json.dumps(spec, sort_keys=True), tasks=tasks, per_class=args.per_class,
                   hold_out_every=every, prompts=args.prompts, max_tokens=args.max_tokens,
                   concurrency=args.concurrency, port=args.port, kv_cache_gib=args.kv_cache_gib, seed=args.seed,
                   fitted_to=args.fitted_to or _served_name(args.model))

    @property
    def k(self) -> int:
        return int(json.loads(self.speculative_config)["num_speculative_tokens"])


def min_per_class(every: int) -> int:
    """Prompts a class needs for ``MIN_CLASS_REQUESTS`` held out (every ``every``-th) and as many fitted."""
    return every * MIN_CLASS_REQUESTS


def _served_name(model: str) -> str:
    """The name ``simspec simulate --model FOLDER`` gives the served folder: its config's ``_name_or_path``, else
    the folder's name (simspec.costs.hfconfig's rule)."""
    try:
        name = json.loads(Path(model, "config.json").read_text()).get("_name_or_path")
    except (OSError, ValueError, AttributeError):
        name = None
    return str(name or Path(model.rstrip("/")).name)


def _prompts(run: ClassRun) -> list[Prompt]:
    from simspec.acceptance.classes import CLASSES
    from simspec.vllm import texts

    if run.prompts is None:
        return texts.build(run.per_class, run.seed, run.tasks)
    prompts = texts.read(run.prompts)
    for p in prompts:
        require(p.task in CLASSES, f"--prompts {run.prompts}: prompt {p.index + 1} has unknown class {p.task!r} "
                                   f"(allowed: {', '.join(CLASSES)})")
    for task in sorted({p.task for p in prompts}):
        n = sum(p.task == task for p in prompts)
        low = min_per_class(run.hold_out_every)
        require(n >= low, f"--prompts {run.prompts}: {n} prompts of class {task}; a class needs at least {low} "
                          f"(every {run.hold_out_every}th held out, the rest fitted)")
    return prompts


def collect(run: ClassRun, out: str | Path) -> Report:
    """Serve (or use ``run.server``), send every prompt, keep the answers, fit and report, into ``out``."""
    import os
    import sys

    from simspec.files import staged_folder, write_json, write_text
    from simspec.runfolder import MARKER
    from simspec.vllm import texts
    from simspec.vllm.server import RunningServer, Server, ServeSpec

    prompts = _prompts(run)
    with staged_folder(out) as tmp:
        texts.write(prompts, tmp / "prompts.jsonl")
        started = time.monotonic()
        if run.server is not None:
            log = tmp / "server.log"
            log.write_text("(a server this command did not start: its log is its owner's)\n")
            server = RunningServer(run.server, log)
        else:
            venv = Path(run.command).resolve().parent.parent
            iomp = venv / "lib" / "libiomp5.so"
            env = (("VLLM_CPU_KVCACHE_SPACE", f"{run.kv_cache_gib:g}"), ("HF_HUB_OFFLINE", "1"),
                   *((("LD_PRELOAD", str(iomp)),) if iomp.is_file() else ()))
            server = Server(ServeSpec(command=run.command, model=run.model, port=run.port,
                                      speculative_config=json.loads(run.speculative_config),
                                      extra_args=("--enforce-eager", "--per-request-spec-decode-metrics", "detailed"),
                                      env=env), tmp / "server.log")
        with server as s:
            ready = time.monotonic() - started
            done = [0]

            def tick():
                done[0] += 1
                if done[0] % 20 == 0 or done[0] == len(prompts):
                    print(f"  {done[0]}/{len(prompts)} answered, {time.monotonic() - started:.0f} s",
                          file=sys.stderr, flush=True)

            responses = send(s.url, run.model, prompts, run.max_tokens, run.concurrency, tick)
            write_text(tmp / "metrics.txt", s.metrics())
        write_text(tmp / "responses.jsonl", "".join(json.dumps(r.to_json(), sort_keys=True) + "\n" for r in responses))
        built = Path(run.model).parent / "simspec-smollm2.json"  # scripts/smollm2-checkpoint's record, if it made it
        record = {"settings": {f: getattr(run, f) for f in run.__dataclass_fields__}, "k": run.k,
                  "vllm": server_version((tmp / "server.log").read_text(errors="replace"))
                  if run.server is None else None,
                  "model_record": json.loads(built.read_text()) if built.is_file() else None,
                  "server_ready_s": round(ready, 1), "wall_s": round(time.monotonic() - started, 1),
                  "date": time.strftime("%Y-%m-%d", time.gmtime()), "python": sys.version.split()[0],
                  "cpus": os.cpu_count()}
        write_json(tmp / "run.json", record)
        report = analyse(responses, run.k, run.fitted_to, f"calibrate vllm-classes ({len(responses)} requests)",
                         run.hold_out_every)
        write_text(tmp / "report.txt", report.text + "\n")
        write_json(tmp / "acceptance.json", report.record)
        write_json(tmp / MARKER, {"command": "calibrate vllm-classes"})
    return report


def read_responses(folder: str | Path) -> tuple[list[Response], dict]:
    folder = Path(folder)
    record = json.loads((folder / "run.json").read_text())
    lines = (folder / "responses.jsonl").read_text().splitlines()
    return [Response.from_json(json.loads(line)) for line in lines if line.strip()], record


def reanalyse(folder: str | Path, fitted_to: str | None = None, hold_out_every: int | None = None) -> Report:
    """Fit and check again on a run's kept responses (``--from``), its report and acceptance.json rewritten;
    the held-out split the run was made with (its run.json; 2 for a run that predates the setting) unless
    ``hold_out_every`` is given."""
    from simspec.files import write_json, write_text

    responses, record = read_responses(folder)
    name = fitted_to or record["settings"]["fitted_to"]
    every = hold_out_every or int(record["settings"].get("hold_out_every", HOLD_OUT_EVERY))  # a run before the setting
    report = analyse(responses, int(record["k"]), name, f"calibrate vllm-classes ({len(responses)} requests)", every)
    write_text(Path(folder) / "report.txt", report.text + "\n")
    write_json(Path(folder) / "acceptance.json", report.record)
    return report


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    text: str
    passed: bool
    mix: str  # the run's class mix, as --mix takes it
    record: dict  # acceptance.json
    rows: tuple[HeldOut, ...]


def held_out_table(rows: list[HeldOut], which: str) -> list[str]:
    """The held-out check as lines of text: each class's live and predicted acceptance length and the miss."""
    lines = [f"held out ({which}): acceptance length",
             f"{'class':10s} {'fit':>4s} {'held':>4s} {'live':>7s} {'s.e.':>6s} {'rel':>6s} {'model':>7s} "
             f"{'diff/se':>7s} {'diff/sd':>7s}  (se: the held-out live's; sd: the difference's, the fit half's "
             f"sampling counted too)"]
    for r in rows:
        lines.append(f"{r.task:10s} {r.fit_requests:4d} {r.held_requests:4d} {r.live:7.3f} {r.se:6.3f} "
                     f"{100 * r.relative_se:5.1f}% {r.predicted:7.3f} {(r.predicted - r.live) / r.se:+7.2f} "
                     f"{(r.predicted - r.live) / r.se_difference:+7.2f}")
    sized = all(r.relative_se <= SE_TARGET for r in rows)
    lines.append(f"within 2 s.e. of the held-out live: {sum(r.within_live for r in rows)}/{len(rows)} classes; "
                 f"within 2 s.e. of the difference: {sum(r.within for r in rows)}/{len(rows)}; every held-out s.e. "
                 f"{'<=' if sized else 'NOT <='} {100 * SE_TARGET:.0f}%")
    return lines


def analyse(responses: list[Response], k: int, name: str, source: str, every: int = HOLD_OUT_EVERY) -> Report:
    """The held-out check (every ``every``-th prompt of a class) and the fit on every request, as text and
    acceptance.json."""
    fit_half, rows = held_out(responses, k, name, every)
    which = "each class's odd prompts; the fit on its even ones" if every == 2 else \
        f"each class's every {every}th prompt; the fit on the rest"
    full = fit_classes(responses, k, name)
    m = full.model
    lines = [f"{len(responses)} requests, K={k}; fitted to every request: top-1 logit {m.top1_logit:.3f} "
             f"(each class's offset below), decay {m.depth_decay_logit:.3f} a depth and round term "
             f"{m.round_sigma:.3f} shared, each class its own request spread",
             "", *held_out_table(rows, which)]
    lines += ["", "every request: per-position acceptance, live / model; requests' s.d. of tokens a step, live / "
                  "model; class level (logit offset), request spread"]
    for t in sorted(full.requests):
        live = ", ".join(f"{x:.3f}" for x in full.rates[t])
        model = ", ".join(f"{x:.3f}" for x in full.model_rates[t])
        sd = "  s.d. {:.3f} / {:.3f}".format(*full.spreads[t]) if t in full.spreads else ""
        lines.append(f"{t:10s} {full.requests[t]:4d} requests  {live}  /  {model}{sd}   {m.class_offset(t):+.3f}, "
                     f"{m.class_spread(t):.3f}")
    shares = {t: sum(r.task == t for r in responses) / len(responses) for t in sorted({r.task for r in responses})}
    mix = ",".join(f"{t}:{v:.12g}" for t, v in shares.items())
    return Report(text="\n".join(lines), passed=all(r.within for r in rows), mix=mix,
                  record=acceptance_record(full, name, source), rows=tuple(rows))
