"""Published GPU measurements of speculative decoding vs simspec's predictions.

Reads ``validation/published/speculative_decoding.csv`` (one row per
published measurement; its README says how the rows were gathered), predicts
each row's speedup over autoregressive decoding (AR) with simspec, and prints
published vs predicted with the relative error, then per split (``fit`` /
``held_out``, a hash of the row id fixed before any prediction was looked at)
the median |relative error| and the share of predictions above the published
value. :func:`predict` takes rows and returns predictions, so the prior's
constants in ``simspec/costs/roofline.py`` can be changed and the table
rerun (``--split fit`` while fitting, ``--split held_out`` to report).

How a row becomes a simulation (assumptions of this script, not of the rows):

- Model and GPU: the row's names as simspec's specs spell them; the cost
  model is ``--cost-model`` (default ``auto``: a profile where the device has
  one, else the roofline prior). A row whose model or GPU simspec has no spec
  of is skipped with the reason printed and counted, never faked.
- Engine: ``vllm`` -> ``--engine vllm``, ``sglang`` -> ``--engine sglang``
  (simspec's modes follow vLLM 0.33 and SGLang 0.5.23), ``paper/hf``
  (research code on Hugging Face transformers, eager PyTorch) -> ``--engine
  simspec`` (no CUDA-graph or overlap terms). One setting follows the
  version the row measured, because it moved between versions and each
  row's AR and speculative runs paid it differently: whether the engine's
  CPU step time overlapped the GPU (async scheduling, SGLang's overlap
  scheduler; :func:`overlapped` cites when each engine turned it on, for
  plain decoding and with speculation). The AR and speculative runs of a
  row are two simulations of the same requests, each with its own overlap.
- Drafter (``--drafter``, simspec.costs.roofline.drafting says how each
  is priced): EAGLE-1 and EAGLE-2 rows -> ``eagle1`` (one decoder layer
  plus the target's LM head a draft step), EAGLE-3 -> ``eagle3``, Medusa
  -> ``medusa`` (its heads in one pass a round), a separate draft model
  ``draft=NAME`` -> ``draft-model:NAME`` (its own layers and LM head a draft
  step; a NAME simspec has no spec of is skipped), n-gram / prompt lookup
  -> ``ngram`` (no GPU work).
- Draft shape (:func:`draft_setting`): a chain ``k=K`` is ``linear:k=K``.
  A tree (``tree:nodes=N,depth=D`` for a static tree, SGLang's
  ``topk=T,steps=S,tokens=N``) is simspec's EAGLE-2 tree of that many draft
  nodes, that deep (``tree:depth=D,topk=T,budget=N``; TREE_TOPK children a
  node for a static tree): every node is verified and priced, and the
  drafter runs a level per depth over the tree's width. Where a row gives
  no K, the defaults of the code that measured it stand in (ASSUMED_DEPTH):
  Spec-Bench's SpS runs Hugging Face assisted generation, whose draft
  starts at num_assistant_tokens = 5 and then adapts (+2 after a fully
  accepted draft, -1 otherwise; the adaptation is not simulated: a fixed
  5-chain with the row's acceptance length); its PLD proposes
  draft_num_candidate_tokens = 10 (evaluation/inference_pld.py), simulated
  as a 10-chain (a round without an n-gram match verifies one placeholder
  token there, a 10-chain here).
- Acceptance (:func:`acceptance_model`): for a chain, i.i.d. per position
  with probability a solving tau = (1 - a^(K+1)) / (1 - a), tau the
  acceptance length the row reports; for a tree, simspec's rank model with
  no spread (i.i.d. across positions and requests) whose top-1 logit is
  fitted so the tree emits tau at batch 1 (a sibling holds the target's
  token where the top candidate does not). tau counts the bonus token, as
  every source entered does (a source that excluded it would have 1 added
  in the table). A row that reports none names in ``acceptance_proxy``
  another row of the same model, head, dataset and K whose tau is used; a
  row with neither is skipped. Temperature is not modelled separately: tau
  carries its effect.
- Batch or concurrency N: simspec has no closed loop, so the replica runs with
  ``max_num_seqs = N`` and ``max(MIN_REQUESTS, REQUESTS_PER_SEQ * N)``
  requests that all arrive at once (Poisson at 10^6 requests/s); the queue
  keeps N requests running until it empties, as a client holding N in flight
  does, and the drain at the end (a shrinking batch) is included: 32
  requests up to batch 4 (served one after another at batch 1), 8 N above.
- Prompt and output lengths from the dataset (lognormal, CV 0.5), assumed,
  not measured: MT-Bench 100 prompt / 256 output tokens (short chat
  questions; 256 is vLLM's MTBenchDataset.DEFAULT_OUTPUT_LEN, benchmarks/datasets.py);
  Spec-Bench 300 / 300 (its summarization and RAG prompts are long).
- Speedup: the row's ``speedup_metric``: ``tpot`` = AR mean TPOT /
  speculative mean TPOT; ``throughput`` = speculative output throughput / AR
  output throughput (tokens/s over the run, prefill included, as offline
  benchmarks and per-batch throughput tables measure). AR and speculation see
  the same requests (one seed, common random numbers).

About 46 rows x 2 simulations take about a minute on one core once
simspec's compiled kernels are cached (a first run compiles them: a minute
or two); ``--fit`` evaluates the fit rows about 100 times (10-20 minutes).

    python benchmarks/published.py [--split fit|held_out|all] [--cost-model auto|roofline|...]
"""

from __future__ import annotations

import argparse
import csv
import re
import statistics
import time
from dataclasses import dataclass, fields
from functools import partial
from pathlib import Path

import dataclasses
import importlib
import math

import numpy as np
from scipy import optimize

from simspec import config as configuration
from simspec import costs as cost_models
from simspec import experiment
from simspec.acceptance import AcceptanceModel, DraftSetting, fit_top1_logit
from simspec.costs import GPUS, MODELS
from simspec.costs.specs import TP_DEGREES
from simspec.types import InputError

prior = importlib.import_module("simspec.costs.roofline")  # the module (simspec.costs.roofline is also its function)

TABLE = Path(__file__).resolve().parents[1] / "validation" / "published" / "speculative_decoding.csv"
SPLITS = ("fit", "held_out")
ENGINES = {"vllm": "vllm", "sglang": "sglang", "paper/hf": "simspec"}
DRAFTERS = {"eagle1": "eagle1", "eagle2": "eagle1", "eagle3": "eagle3", "medusa": "medusa", "ngram": "ngram",
            "draft_model": "draft-model"}  # method -> simspec drafter kind (EAGLE-2 runs an EAGLE-1 head)
# Draft positions where a row states none, by (engine, method): the defaults
# of the code that measured it (module docstring).
ASSUMED_DEPTH = {("paper/hf", "draft_model"): 5, ("paper/hf", "ngram"): 10}
TREE_TOPK = 10  # children a node may have in a static tree's stand-in (EAGLE-2's default top-k)
METRICS = ("tpot", "throughput")
DATASETS = {"mt-bench": (100.0, 256.0), "spec-bench": (300.0, 300.0)}  # (prompt, output) mean tokens, assumed
LENGTH_CV = 0.5
REQUESTS_PER_SEQ = 8  # requests per running slot at batch N: the queue keeps N running most of the run
MIN_REQUESTS = 32
ARRIVAL_RATE_PER_S = 1e6  # all requests arrive at once (within microseconds)
NUMERIC = ("batch", "temperature", "acceptance_length", "speedup", "tpot_ms", "ar_tpot_ms", "throughput_tok_s",
           "ar_throughput_tok_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class Row:
    """One published measurement (the CSV's columns; README.md defines each)."""

    id: str
    source_url: str
    where: str
    model: str
    gpu: str
    gpu_stated: str
    tp: int | None = None  # GPUs the model is sharded over; None: one GPU (the rows entered before the column)
    engine: str
    engine_version: str
    method: str
    draft: str
    batch: float | None  # None where the source does not give it (the row is skipped)
    temperature: float | None
    dataset: str
    acceptance_length: float | None  # emitted tokens per round, bonus included
    acceptance_includes_bonus: str
    acceptance_proxy: str  # id of the row whose acceptance length stands in, or ""
    speedup: float  # over AR, same engine and setting
    speedup_metric: str  # tpot | throughput
    speedup_derived: str
    tpot_ms: float | None
    ar_tpot_ms: float | None
    throughput_tok_s: float | None
    ar_throughput_tok_s: float | None
    split: str
    notes: str


COLUMNS = tuple(f.name for f in fields(Row))


def read_rows(path: Path = TABLE) -> list[Row]:
    """The table's rows; numeric columns as floats (None where empty)."""
    with open(path, newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        missing = set(COLUMNS) - set(reader.fieldnames or ())
        if missing:
            raise ValueError(f"{path}: missing columns {sorted(missing)}")
        rows = []
        for record in reader:
            values = {name: record[name] for name in COLUMNS}
            for name in NUMERIC:
                values[name] = float(values[name]) if values[name].strip() else None
            values["tp"] = int(values["tp"]) if values["tp"].strip() else None
            rows.append(Row(**values))
    return rows


@dataclass(frozen=True, slots=True, kw_only=True)
class Prediction:
    """simspec's prediction of one row, or why it was skipped."""

    row: Row
    speedup: float | None = None  # predicted, over AR
    acceptance_length: float | None = None  # tau the simulation was matched to
    simulated_acceptance_length: float | None = None  # what the simulated run accepted
    skipped: str | None = None

    @property
    def relative_error(self) -> float | None:
        return None if self.speedup is None else self.speedup / self.row.speedup - 1.0


def draft_depth(draft: str) -> int | None:
    """Draft positions per round: K of a chain ``k=K``, S of SGLang's
    ``steps=S``, D of a static tree ``depth=D``; None where not given."""
    match = re.search(r"\b(?:k|steps|depth)=(\d+)\b", draft)
    return int(match.group(1)) if match else None


def chain_tokens(alpha: float, k: int) -> float:
    """Expected tokens per round of a K-chain with i.i.d. acceptance alpha, bonus included."""
    return (1.0 - alpha ** (k + 1)) / (1.0 - alpha)


def iid_alpha(tau: float, k: int) -> float:
    """The per-position acceptance alpha at which a K-chain emits tau tokens a round."""
    if not 1.0 < tau < k + 1:
        raise ValueError(f"acceptance length {tau} is out of a {k}-chain's reach (1, {k + 1})")
    return float(optimize.brentq(lambda a: chain_tokens(a, k) - tau, 1e-9, 1.0 - 1e-9, xtol=1e-12))


def _acceptance(row: Row, table: dict[str, Row]) -> float | None:
    if row.acceptance_length is not None:
        return row.acceptance_length
    proxy = table.get(row.acceptance_proxy) if row.acceptance_proxy else None
    return proxy.acceptance_length if proxy is not None else None


def row_tp(row: Row) -> int:
    """The row's tensor-parallel degree (one GPU where the row gives none)."""
    return 1 if row.tp is None else row.tp


def is_moe(row: Row) -> bool:
    """Whether the row's target model is a mixture of experts in simspec's catalog."""
    spec = {m.lower(): s for m, s in MODELS.items()}.get(row.model.lower())
    return bool(spec is not None and spec.experts)


def skip_reason(row: Row, table: dict[str, Row]) -> str | None:
    """Why simspec cannot predict ``row`` honestly, or None."""
    if row.batch is None:
        return "batch (requests in flight) not reported"
    if row_tp(row) not in TP_DEGREES:
        return f"tp {row.tp} is not one of simspec's degrees {', '.join(map(str, TP_DEGREES))}"
    if row.model.lower() not in {m.lower() for m in MODELS}:
        return f"model {row.model} has no spec in simspec.costs.specs"
    if row.gpu.lower() not in GPUS:
        return f"GPU {row.gpu} has no datasheet in simspec.costs.specs"
    if row.engine not in ENGINES:
        return f"engine {row.engine} has no simspec mode"
    if row.method not in DRAFTERS:
        return f"method {row.method} has no simspec drafter kind"
    if row.method == "draft_model" and draft_model_name(row) is None:
        return f"draft model of {row.draft!r} has no spec in simspec.costs.specs"
    if row.speedup_metric not in METRICS:
        return f"speedup metric {row.speedup_metric} is not one of {', '.join(METRICS)}"
    depth = row_depth(row)
    if depth is None:
        return "draft shape not reported"
    tau = _acceptance(row, table)
    if tau is None:
        return "acceptance length not reported and no proxy row"
    if not 1.0 < tau < depth + 1:
        return f"acceptance length {tau} out of a {depth}-chain's reach"
    if not row.dataset.strip():
        return "dataset not reported"
    if row.dataset not in DATASETS:
        return f"no prompt/output length assumption for dataset {row.dataset!r}"
    return None


def draft_setting(row: Row) -> DraftSetting | None:
    """The row's draft shape as simspec drafts it: a K-chain ``k=K`` (or a
    code's default depth, ASSUMED_DEPTH) is (K, top-1, K nodes); a static
    tree ``tree:nodes=N,depth=D`` is EAGLE-2's dynamic tree of N nodes, D
    deep, TREE_TOPK children a node at most (the N nodes of highest path
    confidence: what a static tree chosen for its expected acceptance, as
    Medusa's and EAGLE's default trees were, holds on average); SGLang's
    ``topk=T,steps=S,tokens=N`` is that tree with N - 1 draft nodes (its
    count includes the verified root). None where the row gives no shape."""
    tree = re.search(r"\bnodes=(\d+),depth=(\d+)\b", row.draft)
    if tree:
        return DraftSetting(depth=int(tree.group(2)), topk=TREE_TOPK, budget=int(tree.group(1)))
    sglang = re.search(r"\btopk=(\d+),steps=(\d+),tokens=(\d+)\b", row.draft)
    if sglang and int(sglang.group(1)) > 1:
        return DraftSetting(depth=int(sglang.group(2)), topk=int(sglang.group(1)), budget=int(sglang.group(3)) - 1)
    depth = row_depth(row)
    return None if depth is None else DraftSetting(depth=depth, topk=1, budget=depth)


def policy_of(draft: DraftSetting) -> str:
    """simspec's policy for a draft shape: a chain or an EAGLE-2 tree."""
    if draft.topk == 1:
        return f"linear:k={draft.depth}"
    return f"tree:depth={draft.depth},topk={draft.topk},budget={draft.budget}"


def acceptance_model(draft: DraftSetting, tau: float) -> AcceptanceModel:
    """The acceptance model with which ``draft`` emits ``tau`` tokens a round
    at batch 1: i.i.d. per position for a chain (the closed form), and for a
    tree the i.i.d. model with the rank tail simspec's models share (a
    sibling holds the target's token when the top candidate does not), its
    top-1 logit fitted so the tree emits tau (simspec.acceptance.fit_top1_logit)."""
    if draft.topk == 1:
        return AcceptanceModel.iid(iid_alpha(tau, draft.depth))
    template = AcceptanceModel.iid(0.5)
    return template.with_top1_logit(fit_top1_logit(template, draft, tau))


def overlapped(row: Row, speculative: bool) -> bool:
    """Whether the engine version the row measured hid its CPU step time
    behind the GPU (async scheduling in vLLM, the overlap scheduler in
    SGLang), for its AR or its speculative run. simspec's modes follow
    today's defaults (vLLM 0.33: async on; SGLang 0.5.23: overlap on);
    the rows measured older ones:

    - vLLM: async scheduling arrived in June 2025 as an opt-in that could
      not run speculative decoding (github.com/vllm-project/vllm/pull/19970),
      became the default in the plan of vllm#27679 (opened 2025-10-28;
      the default itself in vllm#27614), and the default with EAGLE/MTP
      drafts in January 2026 (vllm#31998, which keeps it off for other
      drafters). A vLLM row of 2025 (a version naming 2024 or 2025, or a
      release up to 0.11) ran without it, AR and speculation alike.
    - SGLang: the overlap scheduler is on by default since 0.4 (December
      2024) but could not run with speculative decoding through 2025
      (sgl-project/sglang#9588 of 2025-08-25 made it an experimental
      opt-in; #11762 tracks it): a 0.4 row's AR run overlapped, its EAGLE
      run did not.
    - paper/hf (simspec's own mode): no overlap."""
    version = row.engine_version.lower()
    if row.engine == "vllm":
        release = re.search(r"\b0\.(\d+)(?:\.\d+)?\b", version)
        old = re.search(r"\b202[45]\b", version) or (release and int(release.group(1)) <= 11)
        return False if old else ENGINE_OVERLAP["vllm"](row, speculative)
    if row.engine == "sglang":
        release = re.search(r"\b0\.(\d+)(?:\.\d+)?\b", version)
        old = re.search(r"\b202[45]\b", version) or (release and int(release.group(1)) <= 4)
        return not speculative if old else True
    return False


ENGINE_OVERLAP = {  # today's default where the row's version is not older (overlapped's docstring)
    "vllm": lambda row, speculative: not speculative or row.method in ("eagle1", "eagle2", "eagle3"),
}


def scenario(row: Row, tau: float, *, speculative: bool, requests_per_seq: int, min_requests: int, seed: int,
             cost_model: str):
    """The simspec scenario of ``row``'s AR run or its speculative run (one
    policy each: the two may differ in overlap) at the row's batch, the
    speculative one with the acceptance model that emits the row's tau.
    Both serve the same requests (the seed's)."""
    draft = draft_setting(row)
    batch = int(row.batch)
    prompt, output = DATASETS[row.dataset]
    workload = {"arrival": "poisson", "rate_per_s": ARRIVAL_RATE_PER_S,
                "num_requests": max(min_requests, requests_per_seq * batch), "multimodal_share": 0.0,
                "prompt_mean_tokens": prompt, "prompt_cv": LENGTH_CV,
                "output_mean_tokens": output, "output_cv": LENGTH_CV}
    flags = {"model": row.model, "device": row.gpu.lower(), "tp": row_tp(row), "cost_model": cost_model,
             "drafter": drafter(row),
             "seed": seed, "policies": [policy_of(draft) if speculative else "ar"], "workload": workload,
             "engine": {"kind": ENGINES[row.engine], "max_num_seqs": batch,
                        "async_scheduling": overlapped(row, speculative)}}
    resolved = experiment.resolve(configuration.build({}, flags))
    return dataclasses.replace(resolved, acceptance=acceptance_model(draft, tau)) if speculative else resolved


def row_depth(row: Row) -> int | None:
    """The row's draft positions per round, or ASSUMED_DEPTH's where it states none."""
    depth = draft_depth(row.draft)
    return depth if depth is not None else ASSUMED_DEPTH.get((row.engine, row.method))


def draft_model_name(row: Row) -> str | None:
    """simspec's spec name of the row's separate draft model (``draft=NAME``, any case), or None."""
    match = re.search(r"\bdraft=([\w.-]+)", row.draft)
    names = {m.lower(): m for m in MODELS}
    return names.get(match.group(1).lower()) if match else None


def drafter(row: Row) -> str:
    """The drafter simspec prices for the row's method (DRAFTERS; a draft model by its spec)."""
    kind = DRAFTERS[row.method]
    return f"{kind}:{draft_model_name(row)}" if kind == "draft-model" else kind


def speedup_of(metrics: dict[str, dict[str, float]], spec: str, metric: str) -> float:
    ar, sd = metrics["ar"], metrics[spec]
    if metric == "tpot":
        return ar["mean_tpot_ms"] / sd["mean_tpot_ms"]
    return sd["output_throughput"] / ar["output_throughput"]


def predict(rows: list[Row], *, table: list[Row] | None = None, requests_per_seq: int = REQUESTS_PER_SEQ,
            min_requests: int = MIN_REQUESTS, seed: int = 0, cost_model: str = "auto",
            ar_cache: dict | None = None) -> list[Prediction]:
    """Predict each row's speedup over AR. ``table`` (default: ``rows``) is
    where acceptance proxies are looked up; ``ar_cache`` (row id -> AR
    metrics) keeps AR runs across calls that change only the speculation
    round's terms (which AR never pays)."""
    by_id = {r.id: r for r in (table if table is not None else rows)}
    out = []
    for row in rows:
        reason = skip_reason(row, by_id)
        if reason:
            out.append(Prediction(row=row, skipped=reason))
            continue
        tau = _acceptance(row, by_id)
        try:  # a setting simspec refuses (a model that does not fit at the row's tp) is skipped with its message
            scenario(row, tau, speculative=False, requests_per_seq=requests_per_seq, min_requests=min_requests,
                     seed=seed, cost_model=cost_model)
        except InputError as error:
            out.append(Prediction(row=row, skipped=str(error)))
            continue
        runs = {speculative: partial(scenario, row, tau, speculative=speculative, requests_per_seq=requests_per_seq,
                                     min_requests=min_requests, seed=seed, cost_model=cost_model)
                for speculative in (False, True)}
        if ar_cache is None or row.id not in ar_cache:
            ar = experiment.run_scenario(runs[False]()).metrics["ar"]
            if ar_cache is not None:
                ar_cache[row.id] = ar
        ar = ar_cache[row.id] if ar_cache is not None else ar
        speculative = runs[True]()
        spec = speculative.config.policies[0]
        metrics = {"ar": ar, **experiment.run_scenario(speculative).metrics}
        out.append(Prediction(row=row, speedup=speedup_of(metrics, spec, row.speedup_metric), acceptance_length=tau,
                              simulated_acceptance_length=metrics[spec]["spec_decode_acceptance_length"]))
    return out


def summary(predictions: list[Prediction], split: str) -> str:
    """One line: predicted and skipped counts, median |relative error|, share above published."""
    done = [p for p in predictions if p.speedup is not None]
    skipped = len(predictions) - len(done)
    if not done:
        return f"{split}: 0 predicted ({skipped} skipped)"
    errors = [p.relative_error for p in done]
    above = sum(e > 0 for e in errors)
    batched = [abs(p.relative_error) for p in done if p.row.batch > 1]
    extra = f"; batch > 1: {len(batched)} rows, median |error| {statistics.median(batched):.1%}" if batched else ""
    return (f"{split}: {len(done)} predicted ({skipped} skipped), median |relative error| "
            f"{statistics.median(abs(e) for e in errors):.1%}, above published {above}/{len(done)} "
            f"({above / len(done):.0%}){extra}")


def table_text(predictions: list[Prediction]) -> str:
    header = (f"{'id':20s} {'model':13s} {'gpu':9s} {'tp':>2s} {'engine':8s} {'method':11s} {'draft':26s} "
              f"{'batch':>5s} {'tau':>5s} {'published':>9s} {'predicted':>9s} {'rel.err':>8s} split")
    lines = [header, "-" * len(header)]
    for p in predictions:
        r = p.row
        tau = f"{p.acceptance_length:5.2f}" if p.acceptance_length else f"{'':5s}"
        pred = f"{p.speedup:9.3f}" if p.speedup is not None else f"{'skip':>9s}"
        err = f"{p.relative_error:+8.1%}" if p.speedup is not None else f"{'':8s}"
        batch = f"{int(r.batch):5d}" if r.batch is not None else f"{'?':>5s}"
        lines.append(f"{r.id:20s} {r.model:13s} {r.gpu:9s} {row_tp(r):2d} {r.engine:8s} {r.method:11s} "
                     f"{r.draft[:26]:26s} {batch} {tau} {r.speedup:9.3f} {pred} {err} {r.split}")
    return "\n".join(lines)


GROUPS = {"tp > 1": lambda row: row_tp(row) > 1, "mixture of experts": is_moe}  # summarised apart


FITTED = ("draft_step_s", "draft_round_s", "draft_round_request_s")  # the prior's terms --fit refits


def with_fixed(values: dict[str, float]) -> None:
    """Make the prior price with these FITTED terms (and forget models built before)."""
    prior.FIXED = dataclasses.replace(prior.FIXED, **values)
    cost_models._build.cache_clear()


def fit(rows: list[Row], table: list[Row], seed: int, cost_model: str) -> dict[str, float]:
    """The FITTED terms (seconds, >= 0) minimising the mean squared log error
    of predicted speedups over ``rows`` (the fit split): Nelder-Mead over
    log10 seconds from the shipped values (at least 0.1 us each), AR runs
    kept (they pay none of the terms)."""
    ar_cache: dict = {}
    start = prior.FIXED

    def loss(x: np.ndarray) -> float:
        with_fixed(dict(zip(FITTED, 10.0 ** x)))
        done = [p for p in predict(rows, table=table, seed=seed, cost_model=cost_model, ar_cache=ar_cache)
                if p.speedup is not None]
        return float(np.mean([math.log(p.speedup / p.row.speedup) ** 2 for p in done]))

    x0 = np.log10([max(getattr(start, name), 1e-7) for name in FITTED])
    result = optimize.minimize(loss, x0, method="Nelder-Mead",
                               options={"xatol": 0.02, "fatol": 1e-5, "maxfev": 150})
    prior.FIXED = start
    cost_models._build.cache_clear()
    return dict(zip(FITTED, 10.0 ** result.x))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--split", choices=(*SPLITS, "all"), default="all", help="which rows to predict")
    parser.add_argument("--cost-model", default="auto", help="simspec cost model (default: auto)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--table", type=Path, default=TABLE, help="the CSV of published measurements")
    parser.add_argument("--id-prefix", action="append", default=[], metavar="PREFIX",
                        help="predict only rows whose id starts with PREFIX (repeatable; default: every row)")
    parser.add_argument("--fit", action="store_true", help="refit the prior's speculation-round terms "
                        f"({', '.join(FITTED)}) on the fit split, print them, then predict with them")
    args = parser.parse_args()
    started = time.perf_counter()
    table = read_rows(args.table)
    if args.fit:
        found = fit([r for r in table if r.split == "fit"], table, args.seed, args.cost_model)
        print("fitted on the fit split: " + ", ".join(f"{k} = {v * 1e6:.1f} us" for k, v in found.items()))
        with_fixed(found)
    rows = [r for r in table if (args.split == "all" or r.split == args.split)
            and (not args.id_prefix or r.id.startswith(tuple(args.id_prefix)))]
    predictions = predict(rows, table=table, seed=args.seed, cost_model=args.cost_model)
    print(table_text(predictions))
    skipped = [p for p in predictions if p.skipped]
    if skipped:
        print(f"\nskipped {len(skipped)} of {len(predictions)} rows:")
        for p in skipped:
            print(f"  {p.row.id}: {p.skipped}")
    pairs = sorted({(p.row.model, p.row.gpu, row_tp(p.row)) for p in predictions if p.speedup is not None})
    print("\ncost models:")
    for model, gpu, tp in pairs:
        cfg = configuration.build({}, {"model": model, "device": gpu, "tp": tp, "cost_model": args.cost_model,
                                       "workload": {"num_requests": 1, "multimodal_share": 0.0}})
        print(f"  {experiment.cost_model_line(experiment.resolve(cfg), width=None)}")
    print()
    for split in (SPLITS if args.split == "all" else (args.split,)):
        print(summary([p for p in predictions if p.row.split == split], split))
    if args.split == "all":
        print(summary(predictions, "all"))
    for name, keep in GROUPS.items():
        group = [p for p in predictions if keep(p.row)]
        if group:
            for split in (SPLITS if args.split == "all" else (args.split,)):
                print(summary([p for p in group if p.row.split == split], f"{name}, {split}"))
    sims = sum(p.speedup is not None for p in predictions)
    print(f"\n{sims} rows x 2 simulations (AR, speculative), {REQUESTS_PER_SEQ} requests per running slot "
          f"(at least {MIN_REQUESTS}); {time.perf_counter() - started:.1f} s")


if __name__ == "__main__":
    main()
