"""Driving vLLM as commands: ``vllm serve`` and ``vllm bench serve``.

Imports: the standard library and simspec.types. Never vLLM: the server and
the benchmark are child processes, found by a command line
(``--vllm-command``, default ``vllm``), and spoken to over HTTP on
127.0.0.1 only.

- :class:`Server` starts ``vllm serve`` in a process group of its own, its
  stdout and stderr into one log file, waits until ``GET /v1/models``
  answers, and is always stopped on leaving its ``with`` block, Ctrl-C and
  SIGTERM included: SIGTERM to the API server first (stopping the group at
  once makes it log an ``EngineDeadError`` traceback), then the group, then
  SIGKILL. :class:`RunningServer` is one already running (``--server URL``):
  never started or stopped, its log read where its owner writes it.
- :func:`bench` runs one ``vllm bench serve`` with the benchmark flags a
  validation needs (greedy sampling, detailed per-request arrays, e2el in
  the percentiles), in its own process group, killed with the server.
- A run's slice of the server log is known by the last iteration index
  the log holds before and after it (:func:`last_iteration`): the engine
  logs nothing while idle, so the iteration lines between are the run's
  steps.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import signal
import subprocess
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

from simspec.types import InputError, require

HOST = "127.0.0.1"


def command_line(command: str) -> list[str]:
    """``--vllm-command`` split as a shell would (a path with arguments is allowed)."""
    parts = shlex.split(command)
    require(bool(parts), "--vllm-command must name a command (got an empty string)")
    return parts


def http_get(url: str, timeout_s: float = 10.0) -> str:
    with urllib.request.urlopen(url, timeout=timeout_s) as reply:  # noqa: S310 (127.0.0.1 or the user's URL)
        return reply.read().decode()


@contextmanager
def terminated_as_interrupt() -> Iterator[None]:
    """SIGTERM raises KeyboardInterrupt inside the block, so the servers'
    ``with`` blocks stop them as on Ctrl-C; the old handler comes back after."""
    def handler(signum, frame):
        raise KeyboardInterrupt(f"signal {signum}")

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread: leave signals alone
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def _stop_group(process: subprocess.Popen, first_wait_s: float = 20.0) -> None:
    """SIGTERM to the process, then to its group, then SIGKILL to the group."""
    if process.poll() is None:
        process.send_signal(signal.SIGTERM)
        try:
            process.wait(first_wait_s)
        except subprocess.TimeoutExpired:
            pass
    for sig, wait_s in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except (ProcessLookupError, PermissionError):
            break
        deadline = time.monotonic() + wait_s
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except (ProcessLookupError, PermissionError):
                break
            time.sleep(0.2)
        else:
            continue
        break
    if process.poll() is None:
        process.wait(5.0)


_ITERATION = re.compile(rb"Iteration\((\d+)\)")


def last_iteration(path: Path) -> int:
    """The index of the last ``Iteration(N)`` line in the log now (-1: none yet)."""
    try:
        data = Path(path).read_bytes()
    except FileNotFoundError:
        return -1
    found = _ITERATION.findall(data)
    return int(found[-1]) if found else -1


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSpec:
    """One ``vllm serve`` of a local model folder."""

    command: str  # --vllm-command
    model: str  # the model folder
    port: int
    speculative_config: dict | None = None  # vLLM's --speculative-config; None: no speculation
    dtype: str = "float32"
    seed: int = 0
    extra_args: tuple[str, ...] = ("--enforce-eager",)
    env: tuple[tuple[str, str], ...] = ()  # added to the environment (VLLM_CPU_KVCACHE_SPACE, LD_PRELOAD, ...)

    def __post_init__(self):
        require(1024 <= self.port <= 65535, f"port must be in 1024..65535 (got {self.port})")

    def argv(self) -> list[str]:
        argv = command_line(self.command) + [
            "serve", self.model, "--host", HOST, "--port", str(self.port), "--dtype", self.dtype,
            "--seed", str(self.seed), "--enable-logging-iteration-details", *self.extra_args]
        if self.speculative_config is not None:
            argv += ["--speculative-config", json.dumps(self.speculative_config, sort_keys=True)]
        return argv

    @property
    def url(self) -> str:
        return f"http://{HOST}:{self.port}"


class Server:
    """``vllm serve`` for the length of a ``with`` block (module docstring)."""

    def __init__(self, spec: ServeSpec, log: Path, ready_timeout_s: float = 600.0):
        self.spec, self.log, self.ready_timeout_s = spec, Path(log), ready_timeout_s
        self.process: subprocess.Popen | None = None
        self.ready_after_s = math.nan

    @property
    def url(self) -> str:
        return self.spec.url

    def __enter__(self) -> Server:
        self._check_port_free()
        env = {**os.environ, **dict(self.spec.env)}
        self.log.parent.mkdir(parents=True, exist_ok=True)
        started = time.monotonic()
        with open(self.log, "wb") as out:
            try:
                self.process = subprocess.Popen(self.spec.argv(), stdout=out, stderr=subprocess.STDOUT,
                                                stdin=subprocess.DEVNULL, env=env, start_new_session=True)
            except OSError as err:
                raise InputError(f"--vllm-command {self.spec.command!r} cannot be run ({err.strerror})") from None
        try:
            self._wait_ready(started)
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def stop(self) -> None:
        if self.process is not None:
            _stop_group(self.process)
            self.process = None

    def _check_port_free(self) -> None:
        try:
            http_get(self.url + "/v1/models", timeout_s=2.0)
        except (urllib.error.URLError, OSError):
            return
        raise InputError(f"port {self.spec.port}: a server already answers at {self.url} (stop it, or give "
                         f"--port another port)")

    def _wait_ready(self, started: float) -> None:
        while True:
            if self.process.poll() is not None:
                tail = " | ".join(self.log.read_text(errors="replace").strip().splitlines()[-3:])
                raise InputError(f"vllm serve {self.spec.model} exited with status {self.process.returncode} "
                                 f"before it was ready (log {self.log}: {tail[-400:]})")
            try:
                http_get(self.url + "/v1/models", timeout_s=2.0)
                self.ready_after_s = time.monotonic() - started
                return
            except (urllib.error.URLError, OSError):
                pass
            if time.monotonic() - started > self.ready_timeout_s:
                raise InputError(f"vllm serve {self.spec.model} was not ready after {self.ready_timeout_s:.0f} s "
                                 f"(log {self.log})")
            time.sleep(0.5)

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")

    def last_iteration(self) -> int:
        return last_iteration(self.log)


class RunningServer:
    """A server someone else started (``--server URL``): read, never started
    or stopped. ``log`` is the file its stdout and stderr go to."""

    def __init__(self, url: str, log: Path):
        require(url.startswith(("http://", "https://")), f"--server must be an http(s) URL (got {url!r})")
        self.url, self.log, self.ready_after_s = url.rstrip("/"), Path(log), 0.0
        require(self.log.is_file(), f"--server-log {log}: no such file (the log the server writes, with "
                                    f"--enable-logging-iteration-details)")

    def __enter__(self) -> RunningServer:
        try:
            http_get(self.url + "/v1/models", timeout_s=10.0)
        except (urllib.error.URLError, OSError) as err:
            raise InputError(f"--server {self.url}: no answer at /v1/models ({err})") from None
        return self

    def __exit__(self, *exc) -> None:
        return None

    def metrics(self) -> str:
        return http_get(self.url + "/metrics")

    def last_iteration(self) -> int:
        return last_iteration(self.log)


@dataclass(frozen=True, slots=True, kw_only=True)
class Traffic:
    """One ``vllm bench serve`` workload: of its random dataset, or of the
    prompts of a JSONL file (``dataset``: its custom dataset, chat-templated,
    each row's ``prompt`` and ``output_tokens``; ``input_len`` and
    ``output_len`` then only describe it)."""

    name: str
    prompts: int
    input_len: int
    output_len: int
    rate: float = math.inf  # requests/s; inf: all at once
    burstiness: float = 1.0  # Gamma shape of the gaps (1: Poisson)
    range_ratio: float = 0.0  # lengths uniform in len x [1 - r, 1 + r]
    max_concurrency: int | None = None
    seed: int = 0
    dataset: str = ""  # a JSONL of prompts (relative: to the run folder); "": the random dataset

    def __post_init__(self):
        require(self.prompts >= 1, f"traffic {self.name}: prompts must be >= 1 (got {self.prompts})")
        require(self.input_len >= 1 and self.output_len >= 1,
                f"traffic {self.name}: input_len and output_len must be >= 1")
        require(self.rate > 0, f"traffic {self.name}: rate must be > 0 requests/s (got {self.rate})")
        require(0 < self.burstiness <= 100, f"traffic {self.name}: burstiness must be in (0, 100]")
        require(0 <= self.range_ratio < 1, f"traffic {self.name}: range_ratio must be in [0, 1)")
        require(self.max_concurrency is None or self.max_concurrency >= 1,
                f"traffic {self.name}: max_concurrency must be >= 1")

    def to_json(self) -> dict:
        """Fields as JSON holds them (an infinite rate as the string "inf")."""
        return {f: (str(v) if isinstance(v, float) and math.isinf(v) else v)
                for f, v in ((f, getattr(self, f)) for f in self.__dataclass_fields__)
                if f != "dataset" or v}  # the random dataset's records as they were

    @classmethod
    def from_json(cls, record: dict) -> Traffic:
        return cls(**{**record, "rate": float(record.get("rate", math.inf))})

    @property
    def saturating(self) -> bool:
        """All requests at once, a fixed number in flight: the engine never idles."""
        return math.isinf(self.rate) and self.max_concurrency is not None

    def describe(self) -> str:
        rate = "all at once" if math.isinf(self.rate) else f"{self.rate:g} req/s" + (
            "" if self.burstiness == 1 else f" burstiness {self.burstiness:g}")
        conc = f", {self.max_concurrency} in flight" if self.max_concurrency else ""
        spread = f" (x[{1 - self.range_ratio:g}, {1 + self.range_ratio:g}])" if self.range_ratio else ""
        what = f"{self.input_len} in" if not self.dataset else f"real-text prompts ({self.dataset})"
        return f"{self.prompts} x {what} / {self.output_len} out{spread}, {rate}{conc}, seed {self.seed}"

    def bench_args(self, root: Path | None = None) -> list[str]:
        """``vllm bench serve``'s arguments for the traffic; ``root``: the folder a relative ``dataset`` is in."""
        if self.dataset:
            path = Path(self.dataset) if root is None else root / self.dataset
            args = ["--dataset-name", "custom", "--dataset-path", str(path), "--custom-output-len", "-1"]
        else:
            args = ["--dataset-name", "random", "--random-input-len", str(self.input_len),
                    "--random-output-len", str(self.output_len), "--random-range-ratio", f"{self.range_ratio:g}"]
        args += ["--num-prompts", str(self.prompts), "--request-rate", "inf" if math.isinf(self.rate)
                 else f"{self.rate:g}", "--burstiness", f"{self.burstiness:g}", "--seed", str(self.seed)]
        if self.max_concurrency is not None:
            args += ["--max-concurrency", str(self.max_concurrency)]
        return args


def bench(command: str, url: str, model: str, traffic: Traffic, result: Path, env: dict[str, str] | None = None,
          timeout_s: float = 3600.0, root: Path | None = None) -> None:
    """One ``vllm bench serve`` of ``traffic`` against ``url``, its JSON
    result written to ``result`` and its output beside it (``.stdout.txt``);
    ``root``: the folder a relative ``traffic.dataset`` is in."""
    argv = command_line(command) + [
        "bench", "serve", "--backend", "openai", "--base-url", url, "--model", model, "--tokenizer", model,
        *traffic.bench_args(root), "--ignore-eos", "--temperature", "0", "--percentile-metrics", "ttft,tpot,itl,e2el",
        "--metric-percentiles", "50,90,95,99", "--save-result", "--save-detailed", "--disable-tqdm",
        "--result-dir", str(result.parent), "--result-filename", result.name]
    stdout = result.with_suffix(".stdout.txt")
    with open(stdout, "wb") as out:
        process = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   env={**os.environ, **(env or {})}, start_new_session=True)
        try:
            code = process.wait(timeout_s)
        except BaseException:
            _stop_group(process, first_wait_s=5.0)
            raise
    if code != 0 or not result.is_file():
        tail = " | ".join(stdout.read_text(errors="replace").strip().splitlines()[-3:])
        raise InputError(f"vllm bench serve ({traffic.name}) failed with status {code} ({stdout}: {tail[-400:]})")
