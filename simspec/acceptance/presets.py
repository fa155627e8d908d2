"""Published acceptance figures as acceptance models (``--acceptance PRESET``).

Imports: numpy, scipy (root finding), simspec.types, simspec.trees,
simspec.acceptance.model.

A preset is a (method, model, setting) row of a paper. Its top-1 logit is
fitted so that the preset's own draft setting (an EAGLE-2 tree) at
concurrency 1 gives the published acceptance length; the fits ship in
``FITTED_TOP1_LOGIT`` so the CLI starts at once, and a test refits them.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from simspec import trees
from simspec.acceptance import classes
from simspec.acceptance.model import AcceptanceModel, RandomBlocks
from simspec.types import InputError, require

@dataclass(frozen=True, slots=True, kw_only=True)
class DraftSetting:
    """An EAGLE-2 tree as papers report it."""

    depth: int
    topk: int
    budget: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Preset:
    """A published (method, model, setting) acceptance figure."""

    name: str
    method: str
    model: str
    setting: str
    accept_length: float  # emitted tokens per round, bonus token included
    speedup_vs_ar: float
    draft: DraftSetting
    source: str
    drafter: str = "eagle1"  # the drafter kind it was measured with, as --drafter names it (an EAGLE-2 tree: eagle1)
    # The sampling temperature it was measured at: 0 (greedy), or 1, where the
    # shipped top-1 logit is the greedy one its temperature rule's fall leads to
    # the published length from (:func:`fit_preset`).
    temperature: float = 0.0


_SPECVLM_TREE = DraftSetting(depth=7, topk=10, budget=60)  # "tree topk 10, 60 draft tokens, depth 7"
_EAGLE2_TREE = DraftSetting(depth=6, topk=10, budget=60)  # EAGLE-2's defaults ("dynamic tree")
_SPECVLM = "SpecVLM, Huang et al., arXiv 2509.11815"
_VISPEC = "ViSpec, NeurIPS 2025, arXiv 2509.15235"


def _preset(method, model, setting, length, includes_bonus, speedup, source, suffix=""):
    draft = _SPECVLM_TREE if "depth 7" in setting else _EAGLE2_TREE
    return Preset(name=f"{method}/{model}{suffix}", method=method, model=model, setting=setting,
                  accept_length=length if includes_bonus else length + 1.0, speedup_vs_ar=speedup,
                  draft=draft, source=source)


_NEBIUS = "huggingface.co/nebius/EAGLE3-Llama-3.3-70B-Instruct, model card: public checkpoints compared"
_ONE = "1 epoch; tree topk 10, 60 draft tokens, depth 7"
_FIVE = "5 epochs; tree topk 10, 60 draft tokens, depth 7"
PRESETS: dict[str, Preset] = {
    p.name.lower(): p
    for p in (
        _preset("EagleVLM", "LLaVA-1.5-7B", _ONE, 3.59, True, 2.01, _SPECVLM),
        _preset("SpecVLM", "LLaVA-1.5-7B", _ONE, 3.67, True, 2.11, _SPECVLM),
        _preset("EagleVLM", "LLaVA-1.6-7B", _ONE, 3.53, True, 1.88, _SPECVLM),
        _preset("SpecVLM", "LLaVA-1.6-7B", _ONE, 3.69, True, 2.03, _SPECVLM),
        _preset("EagleVLM", "LLaVA-1.5-13B", _ONE, 3.64, True, 2.15, _SPECVLM),
        _preset("SpecVLM", "LLaVA-1.5-13B", _ONE, 3.71, True, 2.27, _SPECVLM),
        _preset("EagleVLM", "LLaVA-1.6-13B", _ONE, 4.09, True, 2.26, _SPECVLM),
        _preset("SpecVLM", "LLaVA-1.6-13B", _ONE, 4.15, True, 2.39, _SPECVLM),
        _preset("SpecVLM", "LLaVA-1.5-7B", _FIVE, 5.27, True, 2.66, _SPECVLM, "@5ep"),
        _preset("SpecVLM", "LLaVA-1.6-13B", _FIVE, 5.34, True, 2.82, _SPECVLM, "@5ep"),
        _preset("EAGLE-2", "LLaVA-1.6-7B", "dynamic tree", 1.31, False, 1.62, _VISPEC),
        _preset("ViSpec", "LLaVA-1.6-7B", "dynamic tree", 2.98, False, 2.58, _VISPEC),
        _preset("EAGLE-2", "LLaVA-1.6-13B", "dynamic tree", 1.89, False, 1.86, _VISPEC),
        _preset("ViSpec", "LLaVA-1.6-13B", "dynamic tree", 2.89, False, 2.38, _VISPEC),
        _preset("EAGLE-2", "Qwen2.5-VL-7B", "dynamic tree", 1.34, False, 1.40, _VISPEC),
        _preset("ViSpec", "Qwen2.5-VL-7B", "dynamic tree", 2.24, False, 1.80, _VISPEC),
        _preset("ViSpec", "Qwen2.5-VL-3B", "dynamic tree", 2.19, False, 1.87, _VISPEC),
        # Acceptance length (vLLM's: bonus included) of an EAGLE-3 head on
        # Qwen3-8B against context length, longbench-v2 truncated to each
        # length, greedy: 2.295 at 2k falling to 1.09 at 16k. The draft
        # length is not given there: a 3-token chain is assumed.
        Preset(name="EAGLE-3/Qwen3-8B", method="EAGLE-3", model="Qwen3-8B",
               setting="longbench-v2 truncated to 2k tokens, greedy; 3-token chain assumed", accept_length=2.295,
               speedup_vs_ar=float("nan"), draft=DraftSetting(depth=3, topk=1, budget=3),
               source="vllm-project/speculators PR 684, acceptance length vs context length", drafter="eagle3"),
        # Per-position acceptance of a vanilla EAGLE-3 head at K=8 (the PR's first
        # table, MT-Bench by its summary, which names MT-Bench and HumanEval):
        # 0.63, 0.38, 0.23, 0.14, 0.09, 0.05, 0.03, 0.02; length 1 + their sum.
        Preset(name="EAGLE-3/gpt-oss-120b", method="EAGLE-3", model="gpt-oss-120b",
               setting="MT-Bench, K=8 chain, per-position rates", accept_length=2.57, speedup_vs_ar=float("nan"),
               draft=DraftSetting(depth=8, topk=1, budget=8),
               source="vllm-project/vllm PR 32628, vanilla EAGLE-3 per-position acceptance", drafter="eagle3"),
        # The public EAGLE-3 heads vLLM serves for Llama 3.x, as the nebius
        # EAGLE3-Llama-3.3-70B-Instruct model card compares them ("Comparison
        # with Public Checkpoints", measured at temperature 1 with K = 7, with
        # rejection sampling): acceptance length on MT-bench, HumanEval and
        # GSM8K, their mean here.
        *(Preset(name=f"EAGLE-3/{model}", method="EAGLE-3", model=model,
                 setting=f"{head}: MT-bench {mt:g}, HumanEval {he:g}, GSM8K {gsm:g} (their mean); K=7 chain; "
                         f"temperature 1", accept_length=round((mt + he + gsm) / 3, 4), speedup_vs_ar=float("nan"),
                 draft=DraftSetting(depth=7, topk=1, budget=7), source=_NEBIUS, drafter="eagle3", temperature=1.0)
          for model, head, mt, he, gsm in (("Llama-3.1-8B", "yuhuili/EAGLE3-LLaMA3.1-Instruct-8B", 2.77, 3.49, 3.34),
                                          ("Llama-3.3-70B", "RedHatAI/Llama-3.3-70B-Instruct-speculator.eagle3",
                                           2.88, 3.62, 3.29))),
        # DeepSeek-V3's own MTP module drafting one token: "the acceptance rate
        # of the second token prediction ranges between 85% and 90% across
        # various generation topics", for 1.8 times the tokens per second; the
        # range's middle, the temperature not stated (taken as greedy).
        Preset(name="MTP/DeepSeek-V3", method="MTP", model="DeepSeek-V3",
               setting="second-token acceptance 85-90% across generation topics (0.875 taken); 1-token chain",
               accept_length=1.875, speedup_vs_ar=1.8, draft=DraftSetting(depth=1, topk=1, budget=1),
               source="DeepSeek-V3 technical report, arXiv 2412.19437, Multi-Token Prediction Evaluation",
               drafter="mtp"),
    )
}
POSITION_RATES: dict[str, tuple[float, ...]] = {
    "EAGLE-3/gpt-oss-120b": (0.63, 0.38, 0.23, 0.14, 0.09, 0.05, 0.03, 0.02),
}
"""Published per-position acceptance rates a preset's depth profile is fitted to (``fit_depth_profile``)."""
CONTEXT_RULES: dict[str, tuple[float, int]] = {
    # (top-1 logit fall per 1,000 tokens beyond the knee, knee tokens): fitted by least squares to the
    # logits that reproduce PR 684's ten lengths (2k..20k) under the preset's draft; acceptance length
    # within 0.048 RMS, 0.10 at worst (8k). Below the knee (its first point) the level is taken as flat.
    "EAGLE-3/Qwen3-8B": (0.2543, 2048),
}
_EAGLE2_T1 = "EAGLE-2, arXiv 2406.16858v2, Table 1: EAGLE-2 rows, mean of six datasets"
_EAGLE3_T1 = "EAGLE-3, arXiv 2503.01840, Table 1: EAGLE-3 rows, mean of five datasets"


@dataclass(frozen=True, slots=True)
class TemperatureRule:
    """A published pair of acceptance lengths at temperature 0 and 1 for the
    same head, target, draft setting and datasets (strict speculative
    sampling at 1). The pair is read as a fall of the top-1 logit: the logit
    at which the source's draft setting gives the length at 1 less the one
    at which it gives the length at 0, and a preset at temperature 1 moves
    by that fall (the fall, not the ratio of lengths, carries over to
    another draft: a short chain loses less than a deep tree)."""

    greedy: float  # acceptance length at temperature 0, bonus included
    sampled: float  # at temperature 1
    target: str  # the source's target model the pair was measured on
    draft: DraftSetting  # the source's draft setting
    source: str

    @property
    def ratio(self) -> float:
        return self.sampled / self.greedy


# The pair each preset moves by, from the source's target nearest the
# preset's (the LLaVA models' language model is Vicuna; Qwen2.5-VL has no
# published pair, so its size's Vicuna pair is used, an assumption; DeepSeek-V3's
# MTP neither, so the largest published target's, LLaMA-3.3-70B's). EAGLE-2's
# trees: depth 6, 10 nodes expanded, 60 draft tokens at 7B and 50 at 13B
# (its appendix A); EAGLE-3's paper does not give its tree: the EAGLE
# repository's defaults (60 tokens, depth 7, top-k 10) are assumed.
_VICUNA_7B = TemperatureRule(4.68, 4.20, "Vicuna-7B", DraftSetting(depth=6, topk=10, budget=60), _EAGLE2_T1)
_VICUNA_13B = TemperatureRule(4.65, 4.26, "Vicuna-13B", DraftSetting(depth=6, topk=10, budget=50), _EAGLE2_T1)
_EAGLE3_TREE = DraftSetting(depth=7, topk=10, budget=60)
_LLAMA31_8B = TemperatureRule(6.23, 4.92, "LLaMA-3.1-8B", _EAGLE3_TREE, _EAGLE3_T1)
_LLAMA33_70B = TemperatureRule(5.88, 5.66, "LLaMA-3.3-70B", _EAGLE3_TREE, _EAGLE3_T1)
TEMPERATURE_RULES: dict[str, TemperatureRule] = {
    **{name: _VICUNA_13B if "13B" in name else _VICUNA_7B
       for name in (p.name for p in PRESETS.values()) if not name.startswith("EAGLE-3/")},
    "EAGLE-3/Qwen3-8B": _LLAMA31_8B,
    "EAGLE-3/gpt-oss-120b": _LLAMA33_70B,
    "EAGLE-3/Llama-3.1-8B": _LLAMA31_8B,
    "EAGLE-3/Llama-3.3-70B": _LLAMA33_70B,
    "MTP/DeepSeek-V3": _LLAMA33_70B,
}
"""Each preset's temperature pair (see :class:`TemperatureRule`)."""
ASSUMED_TEMPERATURE_TARGETS = ("Qwen2.5-VL", "DeepSeek-V3")
"""Preset targets whose temperature pair is another model's of their size (no published pair of their own)."""
DEFAULT_PRESET = "SpecVLM/LLaVA-1.5-7B"
FIT_ROUNDS = 3000
FIT_SEED = 20251115


def expected_length(model: AcceptanceModel, draft: DraftSetting, *, rounds: int = FIT_ROUNDS,
                    seed: int = FIT_SEED) -> float:
    """Monte-Carlo acceptance length (bonus included) of ``draft`` at
    concurrency 1 with the full image in the drafter's view."""
    rng = np.random.default_rng(seed)
    logits = model.request_logits(rng, rounds)
    rnd = model.draw(RandomBlocks(rng), logits, np.ones(rounds), draft.depth, draft.topk)
    plan = trees.eagle_tree(rnd.conf, draft.depth, draft.topk, draft.budget)
    return 1.0 + float(trees.accepted_length(plan, rnd.true_ranks).mean())


POSITION_REQUESTS, POSITION_ROUNDS = 400, 16  # the profile fit's Monte Carlo: requests, rounds each


def chain_rates(model: AcceptanceModel, k: int, *, seed: int = FIT_SEED) -> np.ndarray:
    """Monte-Carlo per-position acceptance rates of a k-token chain at
    concurrency 1 as a server counts them (drafts accepted at least that
    deep over drafts, every round counted), [k]. A request that accepts
    less needs more rounds for the same output, so each request's rounds
    weigh in inversely to its tokens per round (requests of one length)."""
    rng = np.random.default_rng(seed)
    n, m = POSITION_REQUESTS, POSITION_ROUNDS
    logits = np.repeat(model.request_logits(rng, n), m)
    rnd = model.draw(RandomBlocks(rng), logits, np.ones(n * m), k, 1)
    kept = np.cumprod(rnd.true_ranks == 1, axis=1).reshape(n, m, k)
    per_round = 1.0 + kept.sum(axis=2).mean(axis=1)  # [n] tokens a round
    weight = 1.0 / per_round
    return (kept.mean(axis=1) * weight[:, None]).sum(axis=0) / weight.sum()


def fit_depth_profile(template: AcceptanceModel, rates) -> AcceptanceModel:
    """``template`` with its top-1 logit and depth profile fitted, position by
    position, so that a chain reproduces the per-position acceptance
    ``rates`` (common random numbers: each rate a monotone function of its
    position's fall, fitted exactly by a bracketing root finder)."""
    from scipy import optimize  # only when fitting

    k = len(rates)

    def at(model, j):
        return float(chain_rates(model, k)[j])

    top1 = optimize.brentq(lambda x: at(template.with_top1_logit(x), 0) - rates[0], -6.0, 8.0, xtol=1e-4)
    model = template.with_top1_logit(top1)
    falls: list[float] = []
    for j in range(1, k):
        def gap(f, j=j):
            return at(replace(model, depth_profile=tuple(falls) + (f,)), j) - rates[j]
        falls.append(round(optimize.brentq(gap, -4.0, 12.0, xtol=1e-4), 4))
        model = replace(model, depth_profile=tuple(falls))
    return replace(model, top1_logit=round(top1, 4))


def fit_top1_logit(template: AcceptanceModel, draft: DraftSetting, target_length: float) -> float:
    """Top-1 logit at which ``draft`` reaches ``target_length``. Common
    random numbers make the Monte-Carlo length a deterministic, monotone step
    function of the logit, so a bracketing root finder fits it exactly."""
    def gap(logit: float) -> float:
        return expected_length(template.with_top1_logit(logit), draft) - target_length

    from scipy import optimize  # only when fitting: simulating needs no scipy.optimize

    lo, hi = -4.0, 8.0
    if not gap(lo) <= 0 <= gap(hi):
        raise InputError(f"accept_length {target_length} is out of reach of draft setting {draft}")
    return float(optimize.brentq(gap, lo, hi, xtol=2e-4))


# Top-1 logits fitted by ``fit_preset`` (FIT_ROUNDS rounds, FIT_SEED) under each
# preset's own draft setting, greedy (a preset measured at temperature 1: the
# logit that gives its length there, less its rule's fall); shipped so the CLI
# starts at once. A test refits them and checks both the values and the
# simulated acceptance length.
FITTED_TOP1_LOGIT: dict[str, float] = {
    'EagleVLM/LLaVA-1.5-7B': 0.4965,
    'SpecVLM/LLaVA-1.5-7B': 0.5698,
    'EagleVLM/LLaVA-1.6-7B': 0.4339,
    'SpecVLM/LLaVA-1.6-7B': 0.5837,
    'EagleVLM/LLaVA-1.5-13B': 0.5407,
    'SpecVLM/LLaVA-1.5-13B': 0.6053,
    'EagleVLM/LLaVA-1.6-13B': 0.9773,
    'SpecVLM/LLaVA-1.6-13B': 1.0336,
    'SpecVLM/LLaVA-1.5-7B@5ep': 1.9779,
    'SpecVLM/LLaVA-1.6-13B@5ep': 2.0332,
    'EAGLE-2/LLaVA-1.6-7B': -1.7233,
    'ViSpec/LLaVA-1.6-7B': 0.9661,
    'EAGLE-2/LLaVA-1.6-13B': -0.3899,
    'ViSpec/LLaVA-1.6-13B': 0.8816,
    'EAGLE-2/Qwen2.5-VL-7B': -1.6306,
    'ViSpec/Qwen2.5-VL-7B': 0.1243,
    'ViSpec/Qwen2.5-VL-3B': 0.0559,
    'EAGLE-3/Qwen3-8B': 0.8643,
    'EAGLE-3/gpt-oss-120b': 0.9597,
    'EAGLE-3/Llama-3.1-8B': 2.3827,
    'EAGLE-3/Llama-3.3-70B': 1.5339,
    'MTP/DeepSeek-V3': 2.7317,
}
# Each depth profile (``fit_depth_profile`` on POSITION_RATES), shipped as the top-1 logits are; a test refits it.
# The published rates have two digits, so the deep falls carry their rounding (0.05 vs 0.03 is 40%).
DEPTH_PROFILES: dict[str, tuple[float, ...]] = {
    'EAGLE-3/gpt-oss-120b': (0.1985, 0.3184, 0.2227, 0.2329, 0.8589, 0.1741, 0.5152),
}


def _preset_entry(name: str) -> Preset:
    key = name.lower()
    if key not in PRESETS:
        raise InputError(f"acceptance must be iid:P or a preset: {', '.join(p.name for p in PRESETS.values())} "
                         f"(got {name!r})")
    return PRESETS[key]


def fit_preset(name: str) -> AcceptanceModel:
    """Fit a preset's top-1 logit (and depth profile, where it has per-position rates) afresh (seconds)."""
    p = _preset_entry(name)
    template = AcceptanceModel(name=p.name, top1_logit=0.0)
    if p.name in POSITION_RATES:
        return fit_depth_profile(template, POSITION_RATES[p.name])
    measured = fit_top1_logit(template, p.draft, p.accept_length)
    fall = fit_temperature_logit(name) if p.temperature else 0.0
    return template.with_top1_logit(measured - p.temperature * fall)


def class_lengths(name: str) -> dict[str, float]:
    """Each class's acceptance length under the preset's draft setting at
    concurrency 1: the preset's, times its Spec-Bench ratio (simspec.acceptance.classes)."""
    p = _preset_entry(name)
    # A preset fitted to per-position rates counts rounds as a server does (chain_rates); the class fit prices
    # a request's rounds alike (expected_length), so its classes move from that measure of its own level.
    own = expected_length(preset(name), p.draft) if name in POSITION_RATES else p.accept_length
    return {c: own * classes.length_ratio(c) for c in classes.CLASSES}


def fit_class_logits(name: str) -> dict[str, float]:
    """Each class's top-1 logit offset from the preset's, fitted afresh
    (about a second a class) so that the preset's draft setting gives
    :func:`class_lengths` (a class whose level is assumed keeps the preset's: 0)."""
    p = _preset_entry(name)
    template = replace(preset(name), top1_logit=0.0, class_logit=())
    base = FITTED_TOP1_LOGIT[p.name] + temperature_offset(name, p.temperature)  # the level it was measured at
    return {c: round(fit_top1_logit(template, p.draft, length) - base, 4)
            for c, length in class_lengths(name).items() if not classes.assumed(c)}


def fit_temperature_logit(name: str) -> float:
    """The top-1 logit offset at temperature 1 of preset ``name``, fitted
    afresh (a few seconds): the fall of :class:`TemperatureRule`, on the
    preset's own model shape (its tails, spreads and depth profile)."""
    p = _preset_entry(name)
    rule = TEMPERATURE_RULES[p.name]
    template = replace(preset(name), top1_logit=0.0, class_logit=())
    greedy = fit_top1_logit(template, rule.draft, rule.greedy)
    return round(fit_top1_logit(template, rule.draft, rule.sampled) - greedy, 4)


def temperature_offset(name: str, temperature: float) -> float:
    """The top-1 logit offset of preset ``name`` at ``temperature`` in [0, 1]:
    the fitted offset at 1 times the temperature (between the published
    points a straight line in the logit, an assumption)."""
    require(0.0 <= temperature <= 1.0, f"temperature must be in [0, 1]: published acceptance figures pair "
                                       f"temperature 0 with 1 (got {temperature})")
    return temperature * FITTED_TEMPERATURE_LOGIT[_preset_entry(name).name]


def temperature_line(name: str, temperature: float) -> str:
    """What the run's temperature does to preset ``name``'s level, and on what it rests."""
    p = _preset_entry(name)
    rule = TEMPERATURE_RULES[p.name]
    between = "" if temperature == 1.0 else "; between 0 and 1 a straight line in the logit (an assumption)"
    assumed = (f"; {p.model} has no published pair: {rule.target}'s (an assumption)"
               if any(t in p.model for t in ASSUMED_TEMPERATURE_TARGETS) else "")
    return (f"temperature {temperature:g}: top-1 logit {temperature_offset(name, temperature):+.3f}, the fall "
            f"that takes {rule.target}'s acceptance length {rule.greedy:g} at 0 to {rule.sampled:g} at 1 "
            f"({rule.source}){between}{assumed}")


def check_drafter(spec: str, drafter: str) -> None:
    """Refuse an acceptance preset measured with another drafter than the
    run's ``--drafter`` (one line naming both and what to give instead);
    ``iid:P`` and calibrated files pass (a file is checked by its model)."""
    entry = PRESETS.get(spec.lower())
    if entry is not None and entry.drafter != drafter:
        raise InputError(f"acceptance preset {entry.name} was measured with a {entry.drafter} drafter; the run drafts "
                         f"with {drafter}: give --drafter {entry.drafter}, or --acceptance iid:P or a calibrated "
                         f"acceptance.json for {drafter}")


def preset(name: str, temperature: float = 0.0) -> AcceptanceModel:
    """The acceptance model of a published preset, with its shipped fits, at
    the requests' sampling ``temperature`` (0: greedy, as the presets were
    measured; up to 1, :func:`temperature_offset`)."""
    p = _preset_entry(name)
    offsets = FITTED_CLASS_LOGIT.get(p.name, {})
    decay, knee = CONTEXT_RULES.get(p.name, (0.0, 2048))
    shift = temperature_offset(name, temperature) if temperature != 0.0 else 0.0
    return AcceptanceModel(name=p.name, top1_logit=FITTED_TOP1_LOGIT[p.name] + shift,
                           class_logit=tuple(sorted((c, float(v)) for c, v in offsets.items())),
                           context_decay_logit=decay, context_knee_tokens=knee,
                           depth_profile=DEPTH_PROFILES.get(p.name, ()))


# Each class's top-1 logit offset (``fit_class_logits``), shipped as the
# top-1 logits are; a test refits some. MTP/DeepSeek-V3 has none: its
# 1-token draft at 1.875 tokens a round cannot take Spec-Bench's ratios
# (chat's and math's 1.17x would need more than 2). Regenerate:
# python -c "from simspec.acceptance import presets as p; print({n: p.fit_class_logits(n) for n in p.FITTED_CLASS_LOGIT})"
FITTED_CLASS_LOGIT: dict[str, dict[str, float]] = {
    'EagleVLM/LLaVA-1.5-7B': {'chat': 0.5612, 'translate': -0.5396, 'summarize': -0.1045,
        'qa': -0.2952, 'math': 0.5612, 'rag': -0.4484, 'code': 1.2027},
    'SpecVLM/LLaVA-1.5-7B': {'chat': 0.5733, 'translate': -0.5308, 'summarize': -0.0912,
        'qa': -0.2958, 'math': 0.5733, 'rag': -0.4351, 'code': 1.2136},
    'EagleVLM/LLaVA-1.6-7B': {'chat': 0.567, 'translate': -0.554, 'summarize': -0.106,
        'qa': -0.3022, 'math': 0.567, 'rag': -0.4434, 'code': 1.2077},
    'SpecVLM/LLaVA-1.6-7B': {'chat': 0.5788, 'translate': -0.5235, 'summarize': -0.0818,
        'qa': -0.2918, 'math': 0.5788, 'rag': -0.4192, 'code': 1.2276},
    'EagleVLM/LLaVA-1.5-13B': {'chat': 0.5733, 'translate': -0.53, 'summarize': -0.0896,
        'qa': -0.2971, 'math': 0.5733, 'rag': -0.4374, 'code': 1.2104},
    'SpecVLM/LLaVA-1.5-13B': {'chat': 0.5777, 'translate': -0.5243, 'summarize': -0.0881,
        'qa': -0.2806, 'math': 0.5777, 'rag': -0.4212, 'code': 1.2319},
    'EagleVLM/LLaVA-1.6-13B': {'chat': 0.5747, 'translate': -0.5174, 'summarize': -0.1047,
        'qa': -0.2866, 'math': 0.5747, 'rag': -0.4306, 'code': 1.2979},
    'SpecVLM/LLaVA-1.6-13B': {'chat': 0.5791, 'translate': -0.521, 'summarize': -0.1026,
        'qa': -0.2942, 'math': 0.5791, 'rag': -0.4442, 'code': 1.3078},
    'SpecVLM/LLaVA-1.5-7B@5ep': {'chat': 0.7005, 'translate': -0.5806, 'summarize': -0.1293,
        'qa': -0.3283, 'math': 0.7005, 'rag': -0.4818, 'code': 2.0693},
    'SpecVLM/LLaVA-1.6-13B@5ep': {'chat': 0.7282, 'translate': -0.5816, 'summarize': -0.1232,
        'qa': -0.3379, 'math': 0.7282, 'rag': -0.4902, 'code': 2.2086},
    'EAGLE-2/LLaVA-1.6-7B': {'chat': 0.9836, 'translate': -1.9053, 'summarize': -0.2327,
        'qa': -0.7873, 'math': 0.9836, 'rag': -1.3804, 'code': 1.7766},
    'ViSpec/LLaVA-1.6-7B': {'chat': 0.6658, 'translate': -0.5787, 'summarize': -0.0995,
        'qa': -0.3029, 'math': 0.6658, 'rag': -0.4698, 'code': 1.5573},
    'EAGLE-2/LLaVA-1.6-13B': {'chat': 0.6721, 'translate': -0.746, 'summarize': -0.1265,
        'qa': -0.3801, 'math': 0.6721, 'rag': -0.5877, 'code': 1.3666},
    'ViSpec/LLaVA-1.6-13B': {'chat': 0.6466, 'translate': -0.5869, 'summarize': -0.109,
        'qa': -0.3156, 'math': 0.6466, 'rag': -0.4839, 'code': 1.4812},
    'EAGLE-2/Qwen2.5-VL-7B': {'chat': 0.9467, 'translate': -1.716, 'summarize': -0.1959,
        'qa': -0.7247, 'math': 0.9467, 'rag': -1.2586, 'code': 1.7422},
    'ViSpec/Qwen2.5-VL-7B': {'chat': 0.6368, 'translate': -0.6398, 'summarize': -0.1068,
        'qa': -0.3282, 'math': 0.6368, 'rag': -0.5228, 'code': 1.3339},
    'ViSpec/Qwen2.5-VL-3B': {'chat': 0.6446, 'translate': -0.6528, 'summarize': -0.1159,
        'qa': -0.3417, 'math': 0.6446, 'rag': -0.5297, 'code': 1.3355},
    'EAGLE-3/Qwen3-8B': {'chat': 0.6383, 'translate': -0.5858, 'summarize': -0.1132,
        'qa': -0.3238, 'math': 0.6383, 'rag': -0.4887, 'code': 1.5962},
    'EAGLE-3/gpt-oss-120b': {'chat': 0.3886, 'translate': -0.3789, 'summarize': -0.0763,
        'qa': -0.218, 'math': 0.3886, 'rag': -0.31, 'code': 0.7751},
    'EAGLE-3/Llama-3.1-8B': {'chat': 0.4297, 'translate': -0.3838, 'summarize': -0.0727,
        'qa': -0.2222, 'math': 0.4297, 'rag': -0.3141, 'code': 0.9248},
    'EAGLE-3/Llama-3.3-70B': {'chat': 0.4052, 'translate': -0.4005, 'summarize': -0.0797,
        'qa': -0.2336, 'math': 0.4052, 'rag': -0.3348, 'code': 0.9163},
}

# Each preset's top-1 logit offset at temperature 1 (``fit_temperature_logit``),
# shipped as the top-1 logits are; a test refits some. Regenerate:
# python -c "from simspec.acceptance import presets as p; print({n: p.fit_temperature_logit(n) for n in p.FITTED_TOP1_LOGIT})"
FITTED_TEMPERATURE_LOGIT: dict[str, float] = {
    'EagleVLM/LLaVA-1.5-7B': -0.4835,
    'SpecVLM/LLaVA-1.5-7B': -0.4835,
    'EagleVLM/LLaVA-1.6-7B': -0.4835,
    'SpecVLM/LLaVA-1.6-7B': -0.4835,
    'EagleVLM/LLaVA-1.5-13B': -0.3866,
    'SpecVLM/LLaVA-1.5-13B': -0.3866,
    'EagleVLM/LLaVA-1.6-13B': -0.3866,
    'SpecVLM/LLaVA-1.6-13B': -0.3866,
    'SpecVLM/LLaVA-1.5-7B@5ep': -0.4835,
    'SpecVLM/LLaVA-1.6-13B@5ep': -0.3866,
    'EAGLE-2/LLaVA-1.6-7B': -0.4835,
    'ViSpec/LLaVA-1.6-7B': -0.4835,
    'EAGLE-2/LLaVA-1.6-13B': -0.3866,
    'ViSpec/LLaVA-1.6-13B': -0.3866,
    'EAGLE-2/Qwen2.5-VL-7B': -0.4835,
    'ViSpec/Qwen2.5-VL-7B': -0.4835,
    'ViSpec/Qwen2.5-VL-3B': -0.4835,
    'EAGLE-3/Qwen3-8B': -1.0887,
    'EAGLE-3/gpt-oss-120b': -0.1552,
    'EAGLE-3/Llama-3.1-8B': -1.0887,
    'EAGLE-3/Llama-3.3-70B': -0.172,
    'MTP/DeepSeek-V3': -0.172,
}
