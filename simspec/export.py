"""``simspec export``: a tuned policy as a serving engine's own settings,
and the simulated gain lost where the engine cannot express it.

Imports: json, numpy, simspec.tune (the tuned file, the CRN bench, paired
intervals) and simspec.policies.

A tuned file's load-adaptive policy (``staged``: a spec per decode-batch
range) is mapped stage by stage:

- vLLM: ``--speculative-config`` with ``num_speculative_tokens`` and
  ``num_speculative_tokens_per_batch_size`` (inclusive ``[lo, hi, K]``
  batch-size ranges; vLLM's dynamic speculative decoding). Only a draft
  length per range: a tree, confidence truncation or marginal's per-request
  allocation becomes that cell's tuned linear draft length.
- SGLang: ``--speculative-num-steps / --speculative-eagle-topk /
  --speculative-num-draft-tokens`` are one setting for the server's
  lifetime; per batch size only chains (top-k 1) can vary, through
  ``--speculative-adaptive`` and its config file of per-batch-size
  ``candidate_steps``. Exported: one step count per range (a single
  candidate each), and, where the tuned schedule holds a tree, the static
  tree setting of its first stage as the alternative.

Each approximation is a simspec policy (``batch_table`` for per-range draft
lengths, a fixed spec for static settings), simulated against the tuned
policy on every tuned cell of the CV with the tuned file's confirm seeds
(common random numbers), reported as a paired 95% interval.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace


from simspec import policies, tune
from simspec.serving import modes
from simspec.serving.config import EngineConfig
from simspec.types import require

FORMATS = ("vllm", "sglang")


@dataclass(frozen=True, slots=True, kw_only=True)
class Range:
    """One batch-size range of an export: [lo, hi] decode requests."""

    lo: int
    hi: int
    tuned: str  # the tuned spec of the range
    draft_tokens: int  # the engine's draft length (K / num_steps)
    exact: bool  # the engine runs the tuned spec itself


@dataclass(frozen=True, slots=True, kw_only=True)
class Export:
    format: str
    cv: float
    ranges: tuple[Range, ...]
    settings: dict  # the engine's config (JSON-able)
    flags: str  # the launch flags
    approximation: str  # the exported settings as a simspec policy
    alternatives: dict[str, str]  # other expressible settings: name -> simspec policy
    cannot: tuple[str, ...]  # what the engine cannot express, one line each


def _cell_linear(tuned: tune.Tuned, cv: float, load: float) -> int | None:
    """The tuned linear draft length of the cell a stage comes from."""
    for c in tuned.cells:
        if c.cv == cv and math.isclose(c.load, load) and "linear" in c.families:
            return policies.parse(c.families["linear"].spec).k
    return None


def _draft_length(tuned: tune.Tuned, cv: float, stage: tune.Stage, fmt: str) -> tuple[int, bool, str | None]:
    """(draft length, exact?, why not) of one stage in ``fmt``."""
    p = policies.parse(stage.spec)
    linear = _cell_linear(tuned, cv, stage.load)
    if p.name == "linear":
        return p.k, True, None
    if p.name == "ar":
        if fmt == "vllm":
            return 0, True, None
        return 1, False, "a batch-size range without speculation (SGLang's adaptive candidate_steps are >= 1): 1 step"
    fallback = linear if linear is not None else p.max_depth
    source = "the cell's tuned linear length" if linear is not None else "its depth"
    why = {
        "tree": ("a draft tree (vLLM 0.33 has none: no speculative_token_tree or tree attention in its source; "
                 "its ranges set only a chain length)" if fmt == "vllm" else
                 "a draft tree per batch-size range (SGLang varies only top-k-1 chains by batch size)"),
        "truncate": "confidence truncation (a per-round dynamic head cutting the chain)",
        "marginal": "marginal's per-request, per-round node allocation (trees when idle, short chains when busy)",
        "goodput": "goodput's per-request draft length from each request's acceptance history",
    }[p.name]
    return fallback, False, f"{why}: {stage.spec} runs as {fallback} draft tokens ({source})"


def _static_sglang(spec: str) -> tuple[str, str] | None:
    """SGLang's static flags for a tree or chain spec, and the simspec spec they run."""
    p = policies.parse(spec)
    if p.name == "tree":
        return (f"--speculative-algorithm EAGLE --speculative-num-steps {p.depth} --speculative-eagle-topk {p.topk} "
                f"--speculative-num-draft-tokens {p.budget + 1}", p.label)
    if p.name == "linear":
        return (f"--speculative-algorithm EAGLE --speculative-num-steps {p.k} --speculative-eagle-topk 1 "
                f"--speculative-num-draft-tokens {p.k + 1}", p.label)
    return None


def build(tuned: tune.Tuned, fmt: str, cv: float | None = None) -> Export:
    """The export of ``tuned``'s load-adaptive policy for traffic of ``cv``
    (default: the first tuned CV)."""
    require(fmt in FORMATS, f"format must be one of {', '.join(FORMATS)} (got {fmt!r})")
    want = tuned.schedules[0].cv if cv is None else tune.nearest_cv(tuned, cv)
    schedule = next(s for s in tuned.schedules if s.cv == want)
    max_batch = tuned.scenario.engine.max_num_seqs
    stages = [s for s in schedule.stages if s.min_batch <= max_batch]
    ranges, cannot = [], []
    for i, stage in enumerate(stages):
        hi = stages[i + 1].min_batch - 1 if i + 1 < len(stages) else max_batch
        k, exact, why = _draft_length(tuned, want, stage, fmt)
        ranges.append(Range(lo=stage.min_batch, hi=hi, tuned=stage.spec, draft_tokens=k, exact=exact))
        if why:
            cannot.append(f"batch {stage.min_batch}-{hi}: {why}")
    merged: list[Range] = []
    for r in ranges:  # neighbouring ranges with one draft length are one range to the engine
        if merged and merged[-1].draft_tokens == r.draft_tokens:
            last = merged.pop()
            r = Range(lo=last.lo, hi=r.hi, tuned=f"{last.tuned} | {r.tuned}", draft_tokens=r.draft_tokens,
                      exact=last.exact and r.exact)
        merged.append(r)
    table = ",".join(f"{r.lo}:{r.draft_tokens}" for r in merged)
    approximation = f"batch_table:table={table}"
    alternatives: dict[str, str] = {}
    top = max(r.draft_tokens for r in merged)
    if fmt == "vllm":
        schedule_json = [[r.lo, r.hi, r.draft_tokens] for r in merged]
        settings = {"method": "eagle", "model": "<your EAGLE drafter>", "num_speculative_tokens": max(top, 1),
                    "num_speculative_tokens_per_batch_size": schedule_json}
        flags = f"--max-num-seqs {max_batch} --speculative-config '{json.dumps(settings)}'"
        if top == 0:
            cannot.append("every range drafts 0 tokens: run vLLM without --speculative-config")
        cannot.append("per-request or per-round adaptivity of any kind: vLLM picks one K per step from the batch size")
    else:
        settings = {str(r.lo): {"candidate_steps": [r.draft_tokens]} for r in merged}
        flags = (f"--max-running-requests {max_batch} --speculative-algorithm EAGLE --speculative-eagle-topk 1 "
                 f"--speculative-num-steps {top} --speculative-num-draft-tokens {top + 1} "
                 f"--speculative-adaptive --speculative-adaptive-config ADAPTIVE.json")
        cannot.append("per-batch-size speculative_num_steps / speculative_eagle_topk / speculative_num_draft_tokens: "
                      "SGLang sets those three once per server; only --speculative-adaptive varies the step count "
                      "by batch size, for top-k 1 chains")
        cannot.append("SGLang's adaptive mode switches steps by an acceptance EMA within each batch-size range; "
                      "one candidate per range pins the exported length (per-range keys need a recent SGLang; "
                      "older versions take one flat candidate_steps list)")
        trees = [s for s in stages if policies.parse(s.spec).name == "tree"]
        if trees:
            static, spec = _static_sglang(trees[0].spec)
            alternatives[f"static tree ({static})"] = spec
            cannot.append(f"trees only as one server-wide setting: {static}")
    return Export(format=fmt, cv=want, ranges=tuple(merged), settings=settings, flags=flags,
                  approximation=approximation, alternatives=alternatives, cannot=tuple(cannot))


@dataclass(frozen=True, slots=True, kw_only=True)
class Loss:
    """The exported approximation against the tuned policy on one cell."""

    load: float
    rate_per_s: float
    tuned: float  # objective mean, tuned policy
    exported: float  # objective mean, engine approximation
    gap: tune.Paired  # exported - tuned, objective units

    @property
    def pct(self) -> float:
        return 100.0 * self.gap.diff / abs(self.tuned) if self.tuned else math.nan


def target_engine(tuned: tune.Tuned, fmt: str) -> EngineConfig:
    """The engine an export targets, as simspec's mode for it
    (simspec.serving.modes): its preset on the tuned device, with the batch limit
    the exported flags set (--max-num-seqs / --max-running-requests)."""
    scenario = tuned.scenario
    preset = modes.preset(fmt, scenario.device)
    return replace(scenario.engine, **{**preset, "max_num_seqs": scenario.engine.max_num_seqs})


def losses(tuned: tune.Tuned, export: Export, approximation: str, seeds: int | None = None,
           engine: EngineConfig | None = None) -> list[Loss]:
    """Simulate ``approximation`` on ``engine`` (default: the one the export
    targets, :func:`target_engine`) and the tuned policy on the tuned
    scenario's engine, on each cell of the export's CV with the tuned
    confirm seeds (or the first ``seeds``)."""
    chosen = tuned.confirm_seeds[:seeds] if seeds else tuned.confirm_seeds
    require(len(chosen) >= 2, f"seeds must be >= 2 (got {len(chosen)})")
    policy = next(s.policy for s in tuned.schedules if s.cv == export.cv)
    engine = engine or target_engine(tuned, export.format)
    modes.check_policy(engine.kind, approximation)
    tc = tune.TuneConfig(objective=tuned.objective, confirm_seeds=len(chosen))
    out = []
    for c in tuned.cells:
        if c.cv != export.cv:
            continue
        cell = tune.cell_config(tuned.scenario, c.rate_per_s, c.cv)
        mine = tune.Bench(cell, tc).candidate(policy, "staged", chosen)
        theirs = tune.Bench(replace(cell, engine=engine, policies=(approximation,)), tc).candidate(
            approximation, "export", chosen)
        out.append(Loss(load=c.load, rate_per_s=c.rate_per_s, tuned=mine.mean, exported=theirs.mean,
                        gap=tune.paired(theirs.values, mine.values)))
    return out


def format_losses(name: str, rows: list[Loss], metric: str, maximize: bool) -> str:
    lines = [f"{name}: simulated {metric}, exported vs tuned (paired over seeds, 95% CI)",
             f"{'load':>6} {'rate/s':>8} {'tuned':>10} {'exported':>10} {'change %':>9}  {'95% CI %':>18}  verdict"]
    for r in rows:
        scale = 100.0 / abs(r.tuned) if r.tuned else math.nan
        worse = r.gap.low > 0 if not maximize else r.gap.high < 0
        better = r.gap.high < 0 if not maximize else r.gap.low > 0
        verdict = "gain lost" if worse else "export better" if better else "no separable loss"
        lines.append(f"{r.load:6.2f} {r.rate_per_s:8.3g} {r.tuned:10.4g} {r.exported:10.4g} {r.pct:+9.2f}  "
                     f"[{r.gap.low * scale:+7.2f}, {r.gap.high * scale:+7.2f}]  {verdict}")
    return "\n".join(lines)


__all__ = ["Export", "Range", "Loss", "build", "losses", "format_losses", "FORMATS"]
