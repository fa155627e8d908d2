"""A stand-in for ``vllm serve`` with ``--per-request-spec-decode-metrics
detailed``, for the tests of ``simspec calibrate vllm-classes``: chat
completions whose verify steps are drawn from simspec's acceptance model
with known parameters, a class's level read off the prompt's opening words.

    fake_classes_vllm.py serve MODEL --port P ... --per-request-spec-decode-metrics detailed

It refuses to start without that flag (as a server without it would answer
with no per-step statistics). Each request's steps are drawn from a
generator seeded by its prompt, so the same prompts give the same answers
in any order. Only the standard library.

Not a test: a program the tests run (tests/test_vllm_classes.py).
"""

from __future__ import annotations

import hashlib
import json
import math
import random
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

K = 3
LEVELS = {"chat": -0.5, "code": 0.8, "edit": 2.5, "summarize": 0.2}  # the classes' top-1 logits
DECAY, SIGMA, ROUND_SIGMA = 0.4, 0.6, 1.2


def task_of(text: str) -> str:
    return ("code" if "Python function" in text else "edit" if text.startswith("Copy") else
            "summarize" if text.startswith("Summarize") else "chat")


def draw(rng: random.Random, task: str, max_tokens: int, no_match: float = 0.0) -> tuple[list[int], list[int], int]:
    """(accepted, drafted) per verify step and the completion's tokens of one request of ``task``: per request
    z, per round w, a chain of K accepted while sigmoid(level + SIGMA z + ROUND_SIGMA w - DECAY depth); a
    share ``no_match`` of steps drafts nothing (one token, no verify step)."""
    level, z = LEVELS[task], rng.gauss(0.0, 1.0)
    accepted, made = [], 1
    while made < max_tokens:
        if no_match and rng.random() < no_match:
            made += 1
            continue
        w = rng.gauss(0.0, 1.0)
        a = 0
        while a < K and rng.random() < 1.0 / (1.0 + math.exp(-(level + SIGMA * z + ROUND_SIGMA * w - DECAY * a))):
            a += 1
        accepted.append(a)
        made += a + 1
    return accepted, [K] * len(accepted), made


def steps(text: str, max_tokens: int) -> tuple[list[int], list[int], int]:
    """:func:`draw` for this prompt, from a generator seeded by it."""
    return draw(random.Random(hashlib.sha256(text.encode()).hexdigest()), task_of(text), max_tokens)


class Handler(BaseHTTPRequestHandler):
    model = "m"

    def log_message(self, *args):
        return None

    def _send(self, body: bytes, kind: str = "application/json") -> None:
        self.send_response(200)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/v1/models":
            self._send(json.dumps({"data": [{"id": self.model}]}).encode())
        else:
            self._send(b"# HELP vllm:spec_decode_num_drafts_total (fake)\n", "text/plain")

    def do_POST(self):
        request = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        accepted, drafted, made = steps(request["messages"][0]["content"], request["max_tokens"])
        spec = {"per_step_accepted": accepted, "per_step_drafted": drafted, "num_spec_steps": len(accepted)}
        self._send(json.dumps({"choices": [{"message": {"content": "ok"}}],
                               "usage": {"prompt_tokens": 40, "completion_tokens": made},
                               "metrics": {"speculative_decoding": spec}}).encode())


def main(argv: list[str]) -> None:
    assert argv[0] == "serve", argv
    i = argv.index("--per-request-spec-decode-metrics")  # ValueError (exit 1) without it
    assert argv[i + 1] == "detailed", argv
    print("(APIServer pid=1) INFO 12-04 21:00:00 [api_utils.py:1] vLLM API server version 0.32.0", flush=True)
    Handler.model = argv[1]
    ThreadingHTTPServer(("127.0.0.1", int(argv[argv.index("--port") + 1])), Handler).serve_forever()


if __name__ == "__main__":
    main(sys.argv[1:])
