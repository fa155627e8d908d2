"""What a real vLLM server and its benchmark client write, read into records:
the server log's per-step lines, the ``/metrics`` counters and
``vllm bench serve`` result files; and :func:`replay_rounds`, what the
speculative counters read for drafts known right or wrong token by token.

Imports: the standard library, numpy and simspec.types / simspec.files.
Never vLLM: these are its output formats, read as text.

The three inputs, as vLLM 0.32-0.33 writes them (file:line in vLLM 0.33's
source; the 0.32.0 CPU wheel writes the same lines):

- **The server log** with ``--enable-logging-iteration-details``: one line a
  engine step (vllm/v1/metrics/loggers.py:199-215)::

      (APIServer pid=5444) INFO 12-01 18:23:42 [loggers.py:199] Engine 000: Iteration(7): 1 context requests,
      64 context tokens, 8 generation requests, 13 generation tokens, iteration elapsed time: 330.24 ms,
      CPU KV cache usage: 1.8%

  (one line in the log). A *context* request is one with no output token
  yet (a prefill, or a chunk of one); the others are *generation* requests,
  whose tokens include the draft tokens being verified, so under
  speculation generation tokens - generation requests = draft tokens
  verified (vllm/v1/utils.py ``compute_iteration_details``). The elapsed
  time runs from after the scheduler has scheduled and submitted the step
  to the model's output (drafting included, as the drafter runs in the
  worker) and leaves out scheduling and output processing
  (vllm/v1/engine/core.py ``capture_iteration_details``, ``step``). Steps
  that schedule no token are not logged. Timestamps are to the second, the
  year left out. Optional tails: `` (dummy)`` after the time (a
  data-parallel padding step) and ``, encoder inputs: N, encoder output
  embeddings: M`` at the end.
- **/metrics** (Prometheus text): the counters
  ``vllm:spec_decode_num_drafts_total``, ``..._num_draft_tokens_total``,
  ``..._num_accepted_tokens_total`` and
  ``..._num_accepted_tokens_per_pos_total{position="j"}``, one series per
  engine; absent when the server runs without speculation. A draft is one
  request's drafted round; ngram may draft fewer than K tokens in it.
- **``vllm bench serve --save-result``** JSON: the summary (``mean_ttft_ms``
  ... named as simspec.metrics names them, for the metrics given in
  ``--percentile-metrics``), the speculative counters' difference over the
  run (``spec_decode_*``, only when the server has them and drafted), and
  per request ``latencies`` and ``queue_times``; only with
  ``--save-detailed`` also ``start_times`` (the client's
  ``time.perf_counter()`` at sending), ``ttfts``, ``itls`` (gaps between
  streamed chunks, one chunk may hold several tokens), ``input_lens``,
  ``output_lens``, ``generated_texts``, ``errors``
  (vllm/benchmarks/serve.py, the result dict and ``--save-detailed``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

import numpy as np

from simspec.files import read_json, read_text
from simspec.types import InputError, require

# --- the server log -----------------------------------------------------------------------------------

_ITERATION = re.compile(
    r"(?:Engine (?P<engine>\d+): )?Iteration\((?P<index>\d+)\): (?P<ctx_req>\d+) context requests, "
    r"(?P<ctx_tok>\d+) context tokens, (?P<gen_req>\d+) generation requests, (?P<gen_tok>\d+) generation "
    r"tokens, iteration elapsed time: (?P<ms>[\d.]+) ms(?P<dummy> \(dummy\))?, (?P<device>\w+) KV cache "
    r"usage: (?P<kv>[\d.]+)%(?:, encoder inputs: (?P<enc_in>\d+), encoder output embeddings: (?P<enc_tok>\d+))?$")
_CLOCK = re.compile(r"^\(\S+ pid=\d+\) [A-Z]+ (\d\d-\d\d \d\d:\d\d:\d\d) ")
_BANNER_VERSION = re.compile(r"\bversion (\S+)\s*$")
_BANNER_MODEL = re.compile(r"\bmodel\s+(\S.*?)\s*$")
_SPEC_CONFIG = re.compile(r"speculative_config=SpeculativeConfig\(method='(\w+)', model=(?:'([^']*)'|None), "
                          r"num_spec_tokens=(\d+)\)")
_CONFIG_FIELD = r"\b{}=([^,]+)"
_KV_TOKENS = re.compile(r"\b(\w+) KV cache size: ([\d,]+) tokens")
_MAX_MODEL_LEN = re.compile(r"Using max model len (\d+)")


@dataclass(frozen=True, slots=True, kw_only=True)
class EngineStep:
    """One ``Iteration(N)`` line: one engine step of the server."""

    engine: int  # data-parallel engine index (0 without data parallelism)
    index: int  # vLLM's iteration counter, per engine
    prefill_requests: int  # "context requests": no output token yet (prefills and their chunks)
    prefill_tokens: int
    decode_requests: int  # "generation requests"
    decode_tokens: int  # one per decode request plus the draft tokens it verifies
    elapsed_ms: float  # the model's part of the step (drafting included, scheduling left out)
    kv_cache_usage: float  # fraction of the KV cache in use after the step, 0..1
    encoder_inputs: int = 0  # multimodal items encoded in the step
    encoder_tokens: int = 0
    dummy: bool = False  # a data-parallel padding step
    clock: str = ""  # the line's "MM-DD HH:MM:SS" (to the second)
    line: int = 0  # 1-based line number in the log


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerLog:
    """A ``vllm serve`` log: its engine steps and what its startup lines say
    (None where the log does not say)."""

    path: str
    steps: tuple[EngineStep, ...]
    version: str | None
    model: str | None
    dtype: str | None  # "torch.float32"
    speculative_method: str | None  # "ngram", "draft_model", "eagle", ...; None without speculation
    speculative_model: str | None
    num_speculative_tokens: int  # K (0 without speculation)
    prefix_caching: bool | None
    chunked_prefill: bool | None
    kv_cache_tokens: int | None
    max_model_len: int | None

    def arrays(self) -> StepArrays:
        """The steps (dummy ones left out) as columns, in log order."""
        steps = [s for s in self.steps if not s.dummy]

        def col(name, dtype):
            return np.array([getattr(s, name) for s in steps], dtype=dtype)

        return StepArrays(prefill_requests=col("prefill_requests", np.int64),
                          prefill_tokens=col("prefill_tokens", np.int64),
                          decode_requests=col("decode_requests", np.int64),
                          decode_tokens=col("decode_tokens", np.int64), elapsed_ms=col("elapsed_ms", np.float64))


@dataclass(frozen=True, slots=True, kw_only=True)
class StepArrays:
    """Engine steps as columns; S steps."""

    prefill_requests: np.ndarray  # [S] int64
    prefill_tokens: np.ndarray  # [S] int64
    decode_requests: np.ndarray  # [S] int64
    decode_tokens: np.ndarray  # [S] int64, draft tokens included
    elapsed_ms: np.ndarray  # [S] float64


def _config_bool(text: str, name: str) -> bool | None:
    m = re.search(_CONFIG_FIELD.format(name), text)
    return None if m is None else m.group(1).strip() == "True"


def server_version(text: str) -> str | None:
    """The version a server log's banner gives (None: no banner line), without parsing its steps."""
    for line in text.splitlines():
        if "api_utils.py" in line and (m := _BANNER_VERSION.search(line)):
            return m.group(1)
    return None


def parse_server_log(text: str, path: str = "server log") -> ServerLog:
    """The steps and startup facts of a ``vllm serve`` log (its stdout and
    stderr together). One-line InputErrors for a log without iteration
    lines, a malformed one, or two server runs in one file."""
    steps: list[EngineStep] = []
    facts: dict[str, object] = {}
    last: dict[int, int] = {}  # engine -> its last iteration index
    for number, line in enumerate(text.splitlines(), start=1):
        if "Iteration(" in line:
            m = _ITERATION.search(line)
            if m is None:
                raise InputError(f"{path} line {number}: an Iteration line vLLM does not write: {line.strip()[:160]}")
            engine, index = int(m["engine"] or 0), int(m["index"])
            if engine in last and index <= last[engine]:
                raise InputError(f"{path} line {number}: Iteration({index}) after Iteration({last[engine]}) of "
                                 f"engine {engine}: the log holds more than one server run (give one run's log)")
            last[engine] = index
            clock = _CLOCK.match(line)
            steps.append(EngineStep(
                engine=engine, index=index, prefill_requests=int(m["ctx_req"]), prefill_tokens=int(m["ctx_tok"]),
                decode_requests=int(m["gen_req"]), decode_tokens=int(m["gen_tok"]), elapsed_ms=float(m["ms"]),
                kv_cache_usage=float(m["kv"]) / 100, encoder_inputs=int(m["enc_in"] or 0),
                encoder_tokens=int(m["enc_tok"] or 0), dummy=bool(m["dummy"]),
                clock=clock.group(1) if clock else "", line=number))
            continue
        if "api_utils.py" in line and "version" not in facts and (m := _BANNER_VERSION.search(line)):
            facts["version"] = m.group(1)
        elif "api_utils.py" in line and "model" not in facts and (m := _BANNER_MODEL.search(line)):
            facts["model"] = m.group(1)
        elif "Initializing a V1 LLM engine" in line and "engine_config" not in facts:
            facts["engine_config"] = line
        elif (m := _KV_TOKENS.search(line)) and "kv_cache_tokens" not in facts:
            facts["kv_cache_tokens"] = int(m.group(2).replace(",", ""))
        elif (m := _MAX_MODEL_LEN.search(line)) and "max_model_len" not in facts:
            facts["max_model_len"] = int(m.group(1))
    if not steps:
        raise InputError(f"{path}: no `Iteration(N): ...` lines (start `vllm serve` with "
                         f"--enable-logging-iteration-details, and give its stdout and stderr)")
    config = str(facts.get("engine_config", ""))
    spec = _SPEC_CONFIG.search(config)
    dtype = re.search(_CONFIG_FIELD.format("dtype"), config)
    return ServerLog(
        path=path, steps=tuple(steps), version=facts.get("version"), model=facts.get("model"),
        dtype=dtype.group(1) if dtype else None, speculative_method=spec.group(1) if spec else None,
        speculative_model=spec.group(2) if spec else None, num_speculative_tokens=int(spec.group(3)) if spec else 0,
        prefix_caching=_config_bool(config, "enable_prefix_caching"),
        chunked_prefill=_config_bool(config, "enable_chunked_prefill"),
        kv_cache_tokens=facts.get("kv_cache_tokens"), max_model_len=facts.get("max_model_len"))


def read_server_log(path: str | Path) -> ServerLog:
    return parse_server_log(read_text(path, "vLLM server log"), str(path))


# --- /metrics -----------------------------------------------------------------------------------------

_SAMPLE = re.compile(r'^(?P<name>[A-Za-z_:][A-Za-z0-9_:]*)(?:\{(?P<labels>.*)\})?\s+(?P<value>\S+)(?:\s+-?\d+)?$')
_LABEL = re.compile(r'\s*([A-Za-z_][A-Za-z0-9_]*)="((?:[^"\\]|\\.)*)"\s*(?:,|$)')


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    """One sample line of the Prometheus text format."""

    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str) -> str | None:
        return next((v for k, v in self.labels if k == key), None)


def parse_prometheus(text: str, path: str = "metrics") -> list[Sample]:
    """Every sample of a Prometheus text exposition (comments skipped)."""
    out = []
    for number, line in enumerate(text.splitlines(), start=1):
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        labels: list[tuple[str, str]] = []
        if m is not None and m["labels"]:
            rest = m["labels"]
            while rest.strip():
                lab = _LABEL.match(rest)
                if lab is None:
                    m = None
                    break
                labels.append((lab.group(1), lab.group(2)))
                rest = rest[lab.end():]
        try:
            value = float(m["value"]) if m is not None else None
        except ValueError:
            value = None
        if value is None:
            raise InputError(f"{path} line {number}: not a Prometheus sample: {line[:160]}")
        out.append(Sample(name=m["name"], labels=tuple(labels), value=value))
    return out


@dataclass(frozen=True, slots=True, kw_only=True)
class SpecDecodeCounters:
    """vLLM's speculative-decoding counters (summed over engines), or their
    difference over a run."""

    num_drafts: int  # drafted rounds: one request's draft in one step
    draft_tokens: int
    accepted_tokens: int
    accepted_per_position: tuple[int, ...]  # [K] drafts whose position j was accepted

    @property
    def acceptance_length(self) -> float:
        """1 + accepted / drafts, as ``vllm bench serve`` reports it (1.0 with no draft)."""
        return 1.0 + self.accepted_tokens / self.num_drafts if self.num_drafts else 1.0

    @property
    def per_position_rates(self) -> tuple[float, ...]:
        """[K] accepted at position j over all drafts."""
        return tuple(a / self.num_drafts if self.num_drafts else math.nan for a in self.accepted_per_position)

    def minus(self, before: SpecDecodeCounters) -> SpecDecodeCounters:
        """What was counted between a scrape ``before`` and this one."""
        k = max(len(self.accepted_per_position), len(before.accepted_per_position))
        pad = (lambda t: t + (0,) * (k - len(t)))
        diff = SpecDecodeCounters(
            num_drafts=self.num_drafts - before.num_drafts, draft_tokens=self.draft_tokens - before.draft_tokens,
            accepted_tokens=self.accepted_tokens - before.accepted_tokens,
            accepted_per_position=tuple(a - b for a, b in zip(pad(self.accepted_per_position),
                                                              pad(before.accepted_per_position))))
        require(min(diff.num_drafts, diff.draft_tokens, diff.accepted_tokens, *diff.accepted_per_position, 0) >= 0,
                "speculative counters went down between the two scrapes (the server restarted between them)")
        return diff


@dataclass(frozen=True, slots=True, kw_only=True)
class ServerMetrics:
    """What simspec reads from one ``/metrics`` scrape."""

    spec_decode: SpecDecodeCounters | None  # None: the server runs without speculation
    prompt_tokens: int
    generation_tokens: int
    preemptions: int
    finished_requests: int  # all finish reasons
    block_size_tokens: int | None  # from vllm:cache_config_info
    kv_cache_tokens: int | None


SPEC_PREFIX = "vllm:spec_decode_"


def parse_metrics(text: str, path: str = "metrics") -> ServerMetrics:
    samples = parse_prometheus(text, path)
    require(any(s.name.startswith("vllm:") for s in samples),
            f"{path}: no vllm: metrics (a scrape of a vLLM server's /metrics, please)")

    def total(name: str) -> int:
        return int(sum(s.value for s in samples if s.name == name))

    spec = None
    if any(s.name.startswith(SPEC_PREFIX) and s.name.endswith("_total") for s in samples):
        per_position: dict[int, int] = {}
        for s in samples:
            if s.name == SPEC_PREFIX + "num_accepted_tokens_per_pos_total":
                position = s.label("position")
                require(position is not None and position.isdigit(),
                        f"{path}: {s.name} without a position label")
                per_position[int(position)] = per_position.get(int(position), 0) + int(s.value)
        k = max(per_position) + 1 if per_position else 0
        spec = SpecDecodeCounters(num_drafts=total(SPEC_PREFIX + "num_drafts_total"),
                                  draft_tokens=total(SPEC_PREFIX + "num_draft_tokens_total"),
                                  accepted_tokens=total(SPEC_PREFIX + "num_accepted_tokens_total"),
                                  accepted_per_position=tuple(per_position.get(j, 0) for j in range(k)))
    info = next((s for s in samples if s.name == "vllm:cache_config_info"), None)

    def info_int(key: str) -> int | None:
        value = info.label(key) if info is not None else None
        return int(value) if value is not None and value.isdigit() else None

    return ServerMetrics(spec_decode=spec, prompt_tokens=total("vllm:prompt_tokens_total"),
                         generation_tokens=total("vllm:generation_tokens_total"),
                         preemptions=total("vllm:num_preemptions_total"),
                         finished_requests=total("vllm:request_success_total"),
                         block_size_tokens=info_int("block_size"), kv_cache_tokens=info_int("kv_cache_size_tokens"))


def read_metrics(path: str | Path) -> ServerMetrics:
    return parse_metrics(read_text(path, "vLLM metrics"), str(path))


def spec_decode(metrics: ServerMetrics, path: str = "metrics") -> SpecDecodeCounters:
    """The speculative counters, or a one-line error where the server has none."""
    if metrics.spec_decode is None:
        raise InputError(f"{path}: no {SPEC_PREFIX}* counters (the server runs without --speculative-config)")
    return metrics.spec_decode


# --- vllm bench serve ---------------------------------------------------------------------------------

LATENCIES = ("ttft", "tpot", "itl", "e2el")
_SUMMARY_KEY = re.compile(r"^(mean|median|std|p\d+(?:\.\d+)?)_(ttft|tpot|itl|e2el)_ms$")
_SUMMARY_FIELDS = ("duration", "completed", "failed", "total_input_tokens", "total_output_tokens",
                   "request_throughput", "output_throughput", "total_token_throughput", "request_goodput",
                   "max_output_tokens_per_s", "max_concurrent_requests")
_DETAILED = ("start_times", "ttfts", "itls", "input_lens", "output_lens", "errors")


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchRequests:
    """Per request, in the order the benchmark sent them (``--save-detailed``); R requests."""

    start_s: np.ndarray  # [R] client clock (perf_counter) at sending
    ttft_s: np.ndarray  # [R] 0 for a failed request
    e2el_s: np.ndarray  # [R]
    itl_s: tuple[np.ndarray, ...]  # R arrays: gaps between streamed chunks
    input_tokens: np.ndarray  # [R] int64
    output_tokens: np.ndarray  # [R] int64, 0 for a failed request
    ok: np.ndarray  # [R] bool: no error

    @property
    def arrival_s(self) -> np.ndarray:
        """[R] sending times from the first, seconds: the run's arrivals, to replay."""
        return self.start_s - self.start_s.min() if len(self.start_s) else self.start_s


@dataclass(frozen=True, slots=True, kw_only=True)
class BenchResult:
    """A ``vllm bench serve --save-result`` file."""

    path: str
    date: str
    model_id: str
    num_prompts: int
    request_rate: float  # per second; inf: all at once
    burstiness: float  # the Gamma shape of the inter-arrival times (1: Poisson)
    max_concurrency: int | None
    summary: dict[str, float]  # vllm bench's own names (mean_e2el_ms, output_throughput, ...), as simspec.metrics
    spec_decode: SpecDecodeCounters | None  # the counters' difference over the run
    requests: BenchRequests | None  # None without --save-detailed

    @property
    def lead_s(self) -> float:
        """Seconds from the benchmark's start to its first request. ``vllm
        bench serve`` starts the clock its ``duration`` is read on before
        its request generator's first sleep, and that sleep is a drawn
        inter-arrival time, not 0 (vllm/benchmarks/serve.py 0.32 l.451-515,
        l.1011, l.1090): at 0.25 req/s about 4 s of a 100 s run, which
        output throughput is divided by. It is not saved, so it is inferred:
        the duration less the span from the first send to the last
        completion (at least 0; the milliseconds after the last completion
        count in it). 0 without per-request arrays."""
        r = self.requests
        if r is None or not r.ok.any():
            return 0.0
        span_s = float(np.max((r.start_s + r.e2el_s)[r.ok]) - np.min(r.start_s))
        return max(0.0, float(self.summary.get("duration", span_s)) - span_s)


def _number(value, key: str, path: str) -> float:
    require(isinstance(value, (int, float)) and not isinstance(value, bool),
            f"{path}: {key} must be a number (got {value!r})")
    return float(value)


def parse_bench(data, path: str = "bench result") -> BenchResult:
    require(isinstance(data, dict), f"{path}: not a `vllm bench serve --save-result` file (not a JSON object)")
    missing = [k for k in ("model_id", "num_prompts", "request_rate", "duration", "completed", "latencies")
               if k not in data]
    require(not missing, f"{path}: not a `vllm bench serve --save-result` file (no {', '.join(missing)})")
    summary = {}
    for key, value in data.items():
        if (key in _SUMMARY_FIELDS or _SUMMARY_KEY.match(key) or key.startswith(SPEC_PREFIX.removeprefix("vllm:"))) \
                and isinstance(value, (int, float)) and not isinstance(value, bool):
            summary[key] = float(value)
    spec = None
    if "spec_decode_num_drafts" in data:
        drafts = int(_number(data["spec_decode_num_drafts"], "spec_decode_num_drafts", path))
        rates = data.get("spec_decode_per_position_acceptance_rates") or []
        require(isinstance(rates, list), f"{path}: spec_decode_per_position_acceptance_rates must be a list")
        spec = SpecDecodeCounters(
            num_drafts=drafts, draft_tokens=int(_number(data.get("spec_decode_draft_tokens"),
                                                        "spec_decode_draft_tokens", path)),
            accepted_tokens=int(_number(data.get("spec_decode_accepted_tokens"), "spec_decode_accepted_tokens", path)),
            accepted_per_position=tuple(round(_number(r, "spec_decode_per_position_acceptance_rates", path) * drafts)
                                        for r in rates))
    requests = _requests(data, path) if all(k in data for k in _DETAILED) else None
    concurrency = data.get("max_concurrency")
    return BenchResult(path=path, date=str(data.get("date", "")), model_id=str(data["model_id"]),
                       num_prompts=int(_number(data["num_prompts"], "num_prompts", path)),
                       request_rate=math.inf if data["request_rate"] in ("inf", float("inf"))  # all at once
                       else _number(data["request_rate"], "request_rate", path),
                       burstiness=_number(data.get("burstiness", 1.0), "burstiness", path),
                       max_concurrency=None if concurrency is None else int(concurrency),
                       summary=summary, spec_decode=spec, requests=requests)


def _requests(data: dict, path: str) -> BenchRequests:
    n = len(data["start_times"])
    for key in _DETAILED + ("latencies",):
        require(isinstance(data[key], list) and len(data[key]) == n,
                f"{path}: {key} has {len(data[key]) if isinstance(data[key], list) else 'no'} entries, "
                f"start_times {n}")

    def floats(key: str) -> np.ndarray:
        try:
            return np.array(data[key], dtype=np.float64).reshape(n)
        except (TypeError, ValueError):
            raise InputError(f"{path}: {key} must be a list of numbers") from None

    try:
        itl = tuple(np.array(gaps, dtype=np.float64).reshape(-1) for gaps in data["itls"])
    except (TypeError, ValueError):
        raise InputError(f"{path}: itls must be a list of lists of numbers") from None
    return BenchRequests(start_s=floats("start_times"), ttft_s=floats("ttfts"), e2el_s=floats("latencies"),
                         itl_s=itl, input_tokens=floats("input_lens").astype(np.int64),
                         output_tokens=floats("output_lens").astype(np.int64),
                         ok=np.array([not e for e in data["errors"]], dtype=bool))


def read_bench(path: str | Path, model: str | None = None) -> BenchResult:
    """A bench result file; with ``model``, one of another model is refused."""
    result = parse_bench(read_json(path, "vllm bench result"), str(path))
    if model is not None and result.model_id != model:
        raise InputError(f"{path}: a benchmark of model {result.model_id!r}, not of {model!r}")
    return result


def steps_during(log: ServerLog, bench: BenchResult) -> tuple[EngineStep, ...]:
    """The log's steps (engine 0, no padding steps) during ``bench``: those
    whose line's clock (to the second) lies from the second the benchmark
    started to the one it ended. Its end is its result's ``date``, which
    ``vllm bench serve`` takes when the benchmark has finished
    (vllm/benchmarks/serve.py 0.32, l.2257), and its start that less its
    ``duration``; the log's clock has no year, the bench's lends it. The
    client and the server must share a clock (one machine), and a step in
    the second before the start or after the end is taken in with the
    run's. Empty when the bench has no date or the log no clock."""
    try:
        end = datetime.strptime(bench.date, "%Y%m%d-%H%M%S")
    except ValueError:
        return ()
    start = (end - timedelta(seconds=float(bench.summary.get("duration", 0.0)))).replace(microsecond=0)
    during = []
    for step in log.steps:
        if step.engine != 0 or step.dummy or not step.clock:
            continue
        try:
            at = datetime.strptime(f"{end.year}-{step.clock}", "%Y-%m-%d %H:%M:%S")
        except ValueError:
            continue
        if start <= at <= end:
            during.append(step)
    return tuple(during)


def replay_rounds(matches: list[list[bool]], depth_tokens: int) -> tuple[list[int], int]:
    """vLLM's rounds of K-token drafts under greedy verification, replayed on
    sequences whose draft is known right or wrong at each output token:
    ``matches[r][i]``: the draft proposed after output token i - 1 is token i
    (``[r][0]`` is never read: the prefill emits token 0). Each round drafts K
    tokens after the last one emitted, accepts them to the first mismatch and
    emits the accepted + 1, until the C = len(row) tokens are out, none
    drafted past them. Returns the accepted count at each depth 1..K and the
    rounds (vLLM's ``accepted_tokens_per_pos`` and ``num_drafts``)."""
    runs = []
    for row in matches:  # runs[i]: the matches in a row from token i on, at most K
        run, count = [0] * len(row), 0
        for i in range(len(row) - 1, -1, -1):
            count = min(count + 1, depth_tokens) if row[i] else 0
            run[i] = count
        runs.append(run)
    return replay_runs(runs, depth_tokens)


def replay_runs(runs: list[list[int]], depth_tokens: int) -> tuple[list[int], int]:
    """:func:`replay_rounds` for drafters whose later drafts are not the
    first draft at later positions (an EAGLE head reads its own outputs):
    ``runs[r][i]``: how many of the K drafts proposed after output token
    i - 1 are right in a row (``[r][0]`` never read)."""
    accepted, drafts = [0] * depth_tokens, 0
    for row in runs:
        emitted = 1  # the prefill's token
        while emitted < len(row):
            n = min(row[emitted], depth_tokens, len(row) - emitted)
            drafts += 1
            for j in range(n):
                accepted[j] += 1
            emitted += n + 1
    return accepted, drafts
