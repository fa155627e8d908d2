"""Acceptance by request class from a vLLM server (simspec.vllm.classes,
simspec.vllm.texts, ``simspec calibrate vllm-classes``), without vLLM: the
per-request statistics come from the acceptance model itself (known
parameters, to be recovered) or from a fake server that answers as vLLM's
OpenAI server does with ``--per-request-spec-decode-metrics detailed``."""

from __future__ import annotations

import random
import sys
import threading
from http.server import ThreadingHTTPServer
from pathlib import Path

import numpy as np
import pytest

from conftest import invoke
from simspec.acceptance import load_acceptance
from simspec.types import InputError
from simspec.vllm import classes as vc
from simspec.vllm import texts

NEEDS_PROSE = pytest.mark.skipif(not texts._prose_files(), reason="no licence or README prose under "
                                 f"{', '.join(texts.PROSE_ROOTS)} to build prompts from")
FAKE = Path(__file__).resolve().parent / "data" / "vllm" / "fake_classes_vllm.py"


def _fake():
    import importlib.util

    spec = importlib.util.spec_from_file_location("fake_classes_vllm", FAKE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


GENERATOR = _fake()  # the acceptance model with known parameters, as the fake server draws it
K, LEVELS = GENERATOR.K, GENERATOR.LEVELS
SHAPE = {"decay": GENERATOR.DECAY, "sigma": GENERATOR.SIGMA, "round_sigma": GENERATOR.ROUND_SIGMA}


def _one(rng: random.Random, index: int, task: str, tokens: int = 64, no_match: float = 0.0) -> vc.Response:
    accepted, drafted, made = GENERATOR.draw(rng, task, tokens, no_match)
    return vc.Response(index=index, task=task, prompt_tokens=50, completion_tokens=made, steps_accepted=tuple(accepted),
                       steps_drafted=tuple(drafted), seconds=0.1, text="")


def _responses(per_class: int, seed: int = 0, no_match: float = 0.0) -> list[vc.Response]:
    rng = random.Random(seed)
    out = []
    for i in range(per_class):
        for task in LEVELS:
            out.append(_one(rng, len(out), task, no_match=no_match))
    return out


@NEEDS_PROSE
def test_prompts_are_real_text_deterministic_interleaved_and_sourced():
    a, b = texts.build(3, seed=1), texts.build(3, seed=1)
    assert a == b
    assert [p.task for p in a[:6]] == list(texts.LIVE_CLASSES)
    assert len({p.text for p in a}) == len(a)
    for p in a:
        assert Path(p.source).is_file() and len(p.sha256) == 64
    assert texts.build(3, seed=2) != a
    code = next(p for p in a if p.task == "code")
    assert "def " in code.text and '"""' in code.text or "'''" in code.text
    with pytest.raises(InputError, match="math"):
        texts.build(2, tasks=("math",))


def test_a_step_without_a_draft_is_a_round_that_accepted_nothing():
    r = vc.Response(index=0, task="chat", prompt_tokens=5, completion_tokens=1 + 4 + 1 + 3, steps_accepted=(3, 0),
                    steps_drafted=(3, 3), seconds=0.0, text="")
    # 8 tokens after the first: 4 + 1 from the two verify steps, 3 from steps that drafted nothing
    assert vc._rounds(r) == [(3, 3), (0, 3), (0, 0), (0, 0), (0, 0)]
    c = vc.counters([r], K)
    assert (c.num_drafts, c.accepted_tokens, c.accepted_per_position) == (5, 3, (1, 1, 1))
    assert vc.live_length([r, r])[0] == pytest.approx(1 + 3 / 5)


def test_fit_recovers_the_levels_and_shape_it_was_generated_with():
    fit = vc.fit_classes(_responses(400), K, "test")
    m = fit.model
    for task, level in LEVELS.items():
        assert m.top1_logit + m.class_offset(task) == pytest.approx(level, abs=0.25), task
    assert m.depth_decay_logit == pytest.approx(SHAPE["decay"], abs=0.2)
    assert m.round_sigma == pytest.approx(SHAPE["round_sigma"], abs=0.5)
    # the classes keep their order, and the model's rates are the data's
    lengths = {t: fit.predicted_length(t) for t in LEVELS}
    assert sorted(lengths, key=lengths.get) == sorted(LEVELS, key=LEVELS.get)
    for t in LEVELS:
        assert np.allclose(fit.model_rates[t], fit.rates[t], atol=0.02)


def test_held_out_halves_predict_each_other_within_two_standard_errors():
    fit, rows = vc.held_out(_responses(120, seed=3), K, "test")
    assert {r.task for r in rows} == set(LEVELS)
    for r in rows:
        assert r.fit_requests == r.held_requests == 60
        assert r.within, r
    # a class the fit half never saw moves is refused with the count it needs
    few = _responses(120)[:4 * 5]
    with pytest.raises(InputError, match="needs at least 8"):
        vc.fit_classes(few, K, "test")


def test_every_nth_prompt_of_a_class_is_held_out_and_a_run_is_reanalysed_with_its_own_split(tmp_path):
    import json

    responses = _responses(120, seed=5)
    fit, rows = vc.held_out(responses, K, "test", every=4)
    for r in rows:
        assert (r.fit_requests, r.held_requests) == (90, 30)
        assert r.within, r
    # the held-out ones are each class's 4th, 8th, ... prompts: the prediction is the fit on the rest
    rest = [r for r in responses if (r.index // len(LEVELS)) % 4 != 3]
    assert {t: fit.predicted_length(t) for t in LEVELS} == \
        {t: vc.fit_classes(rest, K, "test").predicted_length(t) for t in LEVELS}
    with pytest.raises(InputError, match="hold_out_every"):
        vc.held_out(responses, K, "test", every=1)
    (tmp_path / "responses.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in responses))
    (tmp_path / "run.json").write_text(json.dumps({"k": K, "settings": {"fitted_to": "m", "hold_out_every": 4}}))
    assert vc.reanalyse(tmp_path).rows == tuple(rows)
    assert "every 4th prompt" in (tmp_path / "report.txt").read_text()
    assert vc.reanalyse(tmp_path, hold_out_every=2).rows == tuple(vc.held_out(responses, K, "test")[1])


def _kept_run(folder: Path, responses: list[vc.Response], texts_of: list[str]) -> Path:
    import json

    folder.mkdir()
    (folder / "responses.jsonl").write_text("".join(json.dumps(r.to_json()) + "\n" for r in responses))
    texts.write([texts.Prompt(index=r.index, task=r.task, text=t, source="test", span=(0, 0), sha256="")
                 for r, t in zip(responses, texts_of)], folder / "prompts.jsonl")
    (folder / "run.json").write_text(json.dumps({"k": K, "settings": {"fitted_to": "m"}}))
    return folder


def test_a_fit_on_one_run_predicts_another_runs_requests_on_prompts_it_never_served(tmp_path):
    first = _responses(120, seed=7)
    second = _responses(120, seed=8)
    # the second run repeats the first's first 60 prompts of each class: those are not held out
    repeated = 60 * len(LEVELS)
    a = _kept_run(tmp_path / "a", first, [f"a{r.index}" for r in first])
    b = _kept_run(tmp_path / "b", second, [f"a{r.index}" if r.index < repeated else f"b{r.index}" for r in second])
    fit, rows = vc.across_runs(a, b)
    assert fit.requests == {t: 120 for t in LEVELS}
    fresh = [r for r in second if r.index >= repeated]
    for row in rows:
        assert row.held_requests == 60 and row.fit_requests == 120
        assert row.live == vc.live_length([r for r in fresh if r.task == row.task])[0]
        assert row.predicted == vc.fit_classes(first, K, "m").predicted_length(row.task)
    within = sum(r.within_live for r in rows)
    code, printed, _ = invoke(["calibrate", "vllm-classes", "--from", str(b), "--fit-on", str(a)])
    assert code == (0 if all(r.within for r in rows) else 1)
    assert "never served" in printed and f"{within}/{len(LEVELS)} classes" in printed
    assert sorted(p.name for p in b.iterdir()) == ["prompts.jsonl", "responses.jsonl", "run.json"]  # nothing written
    # a run whose every prompt the fit served holds nothing out
    with pytest.raises(InputError, match="--fit-on"):
        vc.across_runs(a, a)


def test_no_match_steps_lower_the_length_a_step():
    plain, sparse = vc.fit_classes(_responses(100), K, "x"), vc.fit_classes(_responses(100, no_match=0.5), K, "x")
    for t in LEVELS:
        assert sparse.predicted_length(t) < plain.predicted_length(t)


@pytest.fixture
def fake_server():
    server = ThreadingHTTPServer(("127.0.0.1", 0), GENERATOR.Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@NEEDS_PROSE
def test_calibrate_vllm_classes_against_a_server_then_from_its_folder(fake_server, tmp_path):
    out = tmp_path / "run"
    argv = ["calibrate", "vllm-classes", "--server", fake_server, "--model", "m", "--out", str(out),
            "--classes", "chat,code,edit,summarize", "--per-class", "40", "--max-tokens", "48",
            "--fitted-to", "LLaVA-1.5-7B"]
    code, printed, _ = invoke(argv)
    assert code in (0, 1)  # 1: a class missed its held-out check (chance); the files are written either way
    for name in ("prompts.jsonl", "responses.jsonl", "run.json", "report.txt", "acceptance.json", "metrics.txt"):
        assert (out / name).is_file(), name
    assert len((out / "responses.jsonl").read_text().splitlines()) == 160
    report = (out / "report.txt").read_text()
    assert "held out" in report and "edit" in report
    model = load_acceptance(out / "acceptance.json", "LLaVA-1.5-7B")
    assert model.class_offset("edit") > model.class_offset("chat")
    before = (out / "acceptance.json").read_bytes()
    code2, printed2, _ = invoke(["calibrate", "vllm-classes", "--from", str(out)])
    assert code2 == code and (out / "acceptance.json").read_bytes() == before
    assert (out / "report.txt").read_text() == report
    mix = next(line for line in printed.splitlines() if "--mix" in line).split("--mix ")[1].split()[0]
    code3, sim, _ = invoke(["simulate", "--acceptance", str(out / "acceptance.json"), "--mix", mix,
                            "--num-requests", "30", "--policy", "linear:k=3", "--quiet"])
    assert code3 == 0, sim


def test_a_class_spread_moves_only_its_requests_and_leaves_the_draw_alone():
    from dataclasses import replace

    from simspec.acceptance import AcceptanceModel

    plain = AcceptanceModel(name="m", top1_logit=1.0, request_sigma=0.5)
    spread = replace(plain, class_sigma=(("edit", 3.0),))
    tasks = ["edit", "chat"] * 2000
    a = plain.request_logits(np.random.default_rng(1), len(tasks), classes=tasks)
    b = spread.request_logits(np.random.default_rng(1), len(tasks), classes=tasks)
    chat = np.array(tasks) == "chat"
    assert np.array_equal(a[chat], b[chat])  # the same normals, chat at the model's spread
    assert np.allclose((b[~chat] - 1.0), 6.0 * (a[~chat] - 1.0))
    assert np.array_equal(plain.request_logits(np.random.default_rng(1), 5),
                          1.0 + 0.5 * np.random.default_rng(1).standard_normal(5))
    with pytest.raises(InputError, match="class_sigma"):
        replace(plain, class_sigma=(("edit", -1.0),))


@NEEDS_PROSE
def test_calibrate_vllm_classes_starts_the_server_with_per_request_metrics(tmp_path):
    """The command starts `vllm serve` itself (here the fake, which refuses to start without
    --per-request-spec-decode-metrics detailed), and stops it."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    out = tmp_path / "run"
    code, printed, err = invoke(["calibrate", "vllm-classes", "--vllm-command", f"{sys.executable} {FAKE}",
                                 "--model", str(model), "--out", str(out), "--port", "8097", "--classes",
                                 "chat,edit", "--per-class", "24", "--max-tokens", "40"])
    assert code in (0, 1), err
    run = (out / "run.json").read_text()
    assert '"vllm": "0.32.0"' in run
    assert len((out / "responses.jsonl").read_text().splitlines()) == 48
    assert "vLLM API server version" in (out / "server.log").read_text()


def test_a_server_without_per_request_metrics_is_one_line(tmp_path):
    """A server that answers without metrics.speculative_decoding (started without the flag) is refused."""
    from http.server import BaseHTTPRequestHandler

    class Plain(BaseHTTPRequestHandler):
        def log_message(self, *args):
            return None

        def do_GET(self):
            body = b'{"data": []}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            body = b'{"choices": [{"message": {"content": "x"}}], "usage": {"completion_tokens": 3}}'
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Plain)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        code, _, err = invoke(["calibrate", "vllm-classes", "--server", f"http://127.0.0.1:{server.server_address[1]}",
                               "--model", "m", "--out", str(tmp_path / "run"), "--classes", "chat",
                               "--per-class", "16"])
    finally:
        server.shutdown()
    assert code == 2 and "per-request-spec-decode-metrics detailed" in err and not (tmp_path / "run").exists()
