"""Acceptance models: what the drafter proposes, how sure it is, and what
the target actually accepts.

Imports: numpy, numba, scipy (root finding), simspec.types, simspec.trees.

Semantics (DESIGN.md "The serving model"): at each draft depth the target's
token has a rank among the drafter's candidates (1..15, or none). A draft
node is accepted when its token is the target's and its parent was accepted,
so linear drafts (rank-1 chains) and trees are priced by one model.

Per request i, round, and depth d (all on the logit scale):

    logit p1 = top1_logit + z_i - depth_decay_logit * (d - 1) + e,
    z_i ~ N(0, request_sigma)        per-request difficulty
    e   ~ N(0, token_sigma)          per-position variation

p1 is the chance the target's token is the drafter's top candidate; given it
is not, it is among ranks 2..15 with probability ``tail_mass``, geometrically
decaying by ``tail_decay``. The drafter's confidence in its top candidate is
``sigmoid(logit p1 + c)``, c ~ N(0, confidence_sigma): policies see the
confidence, acceptance follows p1, and the two correlate through e.

Visual grounding: in a multimodal request a share ``visual_share`` of
positions depend on the image. There p1 is multiplied by the retention of the
drafter's visual context: 1 with the full image, ``retention_none`` with no
visual tokens, and 1 - (1 - retention_none) * exp(-K / scale) with K kept
tokens (attention-guided selection, Uni-LaSpec; pooling keeps less).

Presets reproduce published acceptance lengths (``PRESETS``): the top-1
logit is fitted so that the preset's own draft setting (an EAGLE-2 tree) at
concurrency 1 gives the published length.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace
from typing import NamedTuple

import numpy as np
from scipy import optimize

from simspec import trees
from simspec.compiled import jit
from simspec.types import MAX_RANK, InputError, require

SELECTION_SCALES = {"selected": 2.0, "pooled": 6.0}  # kept tokens at which the loss shrinks by e


@dataclass(frozen=True, slots=True, kw_only=True)
class DraftContext:
    """What of the image the drafter sees: ``full``, ``none``, ``selected:K``
    (top-K tokens by the verifier's attention) or ``pooled:K``."""

    kind: str = "selected"
    kept_tokens: int = 8

    @classmethod
    def parse(cls, text: str) -> "DraftContext":
        kind, _, k = text.strip().lower().partition(":")
        if kind in ("full", "none") and not k:
            return cls(kind=kind, kept_tokens=0)
        if kind in SELECTION_SCALES:
            require(k.isdigit() and int(k) >= 1,
                    f"drafter_context {kind}:K needs K >= 1 kept visual tokens (got {text!r})")
            return cls(kind=kind, kept_tokens=int(k))
        raise InputError(f"drafter_context must be full, none, selected:K or pooled:K (got {text!r})")

    def __str__(self) -> str:
        return self.kind if self.kind in ("full", "none") else f"{self.kind}:{self.kept_tokens}"

    def kept(self, visual_tokens: np.ndarray) -> np.ndarray:
        """Visual tokens the drafter cross-attends to, per request."""
        visual_tokens = np.asarray(visual_tokens)
        if self.kind == "full":
            return visual_tokens.copy()
        if self.kind == "none":
            return np.zeros_like(visual_tokens)
        return np.minimum(visual_tokens, self.kept_tokens)


@dataclass(frozen=True, slots=True, kw_only=True)
class Round:
    """One round's draw for a batch."""

    conf: np.ndarray  # [B, D, R] drafter confidence of the rank-r candidate at depth d
    true_ranks: np.ndarray  # [B, D] int rank of the target's token (0 = none of the candidates)
    top1_p: np.ndarray  # [B, D] true chance the top candidate is the target's token


@functools.lru_cache(maxsize=64)
def _tail(mass: float, decay: float) -> np.ndarray:
    """P(rank = r | not rank 1) for r = 2..MAX_RANK: [MAX_RANK - 1]."""
    shape = decay ** np.arange(MAX_RANK - 1)
    tail = mass * shape / shape.sum()
    tail.flags.writeable = False
    return tail


class RandomBlocks:
    """Standard normals and uniforms from one Generator, served in order from
    large blocks: one numpy call per block instead of several per step."""

    BLOCK = 1 << 16

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._normal = np.empty(0)
        self._uniform = np.empty(0)
        self._used = np.zeros(2, dtype=np.int64)  # consumed from the front of each block

    def window(self, n: int) -> "Randoms":
        """At least ``n`` unread normals and uniforms, with a cursor that the
        reader advances; hand it back to :meth:`consume`."""
        for k, name in enumerate(("_normal", "_uniform")):
            block = getattr(self, name)
            if len(block) - self._used[k] < n:
                fresh = self._rng.standard_normal if k == 0 else self._rng.random
                setattr(self, name, np.concatenate([block[self._used[k]:], fresh(max(self.BLOCK, n))]))
                self._used[k] = 0
        return Randoms(self._normal[self._used[0]:], self._uniform[self._used[1]:], np.zeros(2, dtype=np.int64))

    def consume(self, window: "Randoms") -> None:
        self._used += window.used

    def normals(self, n: int) -> np.ndarray:
        window = self.window(n)
        self._used[0] += n
        return window.normals[:n]

    def uniforms(self, n: int) -> np.ndarray:
        window = self.window(n)
        self._used[1] += n
        return window.uniforms[:n]


class Randoms(NamedTuple):
    """A window of unread random numbers; ``used`` counts what was read."""

    normals: np.ndarray
    uniforms: np.ndarray
    used: np.ndarray  # [2] int


@jit
def draw_round(request_logit, retention, depth, ranks, decay, token_sigma, confidence_sigma, visual_share, tail,
               conf_tail, normals, uniforms):
    """Compiled draw (see AcceptanceModel.draw): ``normals`` and ``uniforms``
    hold 2 * B * depth numbers each; ``tail`` shapes the true ranks beyond 1,
    ``conf_tail`` the drafter's confidences beyond its first candidate."""
    b = len(request_logit)
    n = b * depth
    conf = np.empty((b, depth, ranks))
    true_ranks = np.zeros((b, depth), dtype=np.int64)
    p1s = np.empty((b, depth))
    cdf = np.cumsum(tail)
    for i in range(b):
        for d in range(depth):
            k = i * depth + d
            logit = request_logit[i] - decay * d + token_sigma * normals[k]
            p1 = 1.0 / (1.0 + np.exp(-logit))
            if uniforms[k] < visual_share:  # a position grounded in the image
                p1 *= retention[i]
                p1 = min(max(p1, 1e-9), 1.0 - 1e-9)
                logit = np.log(p1) - np.log1p(-p1)
            c1 = 1.0 / (1.0 + np.exp(-(logit + confidence_sigma * normals[n + k])))
            conf[i, d, 0] = c1
            for r in range(1, ranks):  # ranks are the drafter's own order: confidence never rises with rank
                conf[i, d, r] = min(conf[i, d, r - 1], (1.0 - c1) * conf_tail[r - 1])
            u = uniforms[n + k]
            p1s[i, d] = p1
            if u < p1:
                true_ranks[i, d] = 1
            else:
                beyond = (u - p1) / max(1.0 - p1, 1e-12)
                for r in range(len(cdf)):
                    if beyond < cdf[r]:
                        true_ranks[i, d] = r + 2
                        break
    return conf, true_ranks, p1s


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _logit(p):
    p = np.clip(p, 1e-9, 1 - 1e-9)
    return np.log(p) - np.log1p(-p)


@dataclass(frozen=True, slots=True, kw_only=True)
class AcceptanceModel:
    name: str
    top1_logit: float
    depth_decay_logit: float = 0.1
    tail_mass: float = 0.6
    tail_decay: float = 0.5
    request_sigma: float = 0.5
    token_sigma: float = 1.5
    confidence_sigma: float = 0.5
    visual_share: float = 0.3
    retention_none: float = 0.55
    # The drafter's confidences beyond its first candidate, as shares of
    # 1 - conf(rank 1); None: shaped as the true ranks' tail (presets).
    conf_tail_mass: float | None = None
    conf_tail_decay: float | None = None

    def __post_init__(self):
        require(0.0 <= self.tail_mass <= 1.0, f"tail_mass must be in [0, 1] (got {self.tail_mass})")
        require(0.0 < self.tail_decay < 1.0, f"tail_decay must be in (0, 1) (got {self.tail_decay})")
        for field in ("request_sigma", "token_sigma", "confidence_sigma", "depth_decay_logit"):
            value = getattr(self, field)
            require(value >= 0.0, f"{field} must be >= 0 (got {value})")
        require(0.0 <= self.visual_share <= 1.0, f"visual_share must be in [0, 1] (got {self.visual_share})")
        require(0.0 <= self.retention_none <= 1.0, f"retention_none must be in [0, 1] (got {self.retention_none})")
        require(self.conf_tail_mass is None or 0.0 <= self.conf_tail_mass <= 1.0,
                f"conf_tail_mass must be in [0, 1] (got {self.conf_tail_mass})")
        require(self.conf_tail_decay is None or 0.0 < self.conf_tail_decay < 1.0,
                f"conf_tail_decay must be in (0, 1) (got {self.conf_tail_decay})")

    @classmethod
    def iid(cls, p: float) -> "AcceptanceModel":
        """Every draft position accepted with probability ``p``, independently;
        no difficulty spread, no visual loss. The closed forms hold here."""
        require(0.0 < p < 1.0, f"acceptance probability must be in (0, 1) (got {p})")
        return cls(name=f"iid:{p:g}", top1_logit=float(_logit(p)), depth_decay_logit=0.0, request_sigma=0.0,
                   token_sigma=0.0, confidence_sigma=0.0, visual_share=0.0)

    @property
    def tail(self) -> np.ndarray:
        """P(rank = r | not rank 1) for r = 2..MAX_RANK: [MAX_RANK - 1]."""
        return _tail(self.tail_mass, self.tail_decay)

    @property
    def conf_tail(self) -> np.ndarray:
        """conf(rank r) / (1 - conf(rank 1)) for r = 2..MAX_RANK: [MAX_RANK - 1]."""
        if self.conf_tail_mass is None or self.conf_tail_decay is None:
            return self.tail
        return _tail(self.conf_tail_mass, self.conf_tail_decay)

    def retention(self, context: DraftContext, visual_tokens: np.ndarray) -> np.ndarray:
        """Multiplier on p1 at grounded positions, per request: [B]."""
        visual_tokens = np.asarray(visual_tokens)
        if context.kind == "full":
            kept_share = np.ones(visual_tokens.shape)
        elif context.kind == "none":
            kept_share = np.zeros(visual_tokens.shape)
        else:
            kept_share = 1.0 - np.exp(-context.kept_tokens / SELECTION_SCALES[context.kind])
        loss = (1.0 - self.retention_none) * (1.0 - kept_share)
        return np.where(visual_tokens > 0, 1.0 - loss, 1.0)

    def request_logits(self, rng: np.random.Generator, n: int) -> np.ndarray:
        """Per-request difficulty: the top-1 logit of each of ``n`` requests."""
        return self.top1_logit + self.request_sigma * rng.standard_normal(n)

    def draw(self, rand: "RandomBlocks", request_logit: np.ndarray, retention: np.ndarray,
             depth: int, ranks: int) -> Round:
        """Draw one round for a batch: confidences up to ``depth`` x ``ranks``
        and the target's true rank at each depth. Consumes 2·B·depth normals
        and uniforms whatever the parameters (common random numbers)."""
        n = len(request_logit) * depth
        conf, true_ranks, p1 = draw_round(
            np.ascontiguousarray(request_logit, dtype=np.float64), np.ascontiguousarray(retention, dtype=np.float64),
            depth, ranks, self.depth_decay_logit, self.token_sigma, self.confidence_sigma, self.visual_share,
            self.tail, self.conf_tail, rand.normals(2 * n), rand.uniforms(2 * n))
        return Round(conf=conf, true_ranks=true_ranks, top1_p=p1)

    def with_top1_logit(self, value: float) -> "AcceptanceModel":
        return replace(self, top1_logit=float(value))


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


_SPECVLM_TREE = DraftSetting(depth=7, topk=10, budget=60)  # "tree topk 10, 60 draft tokens, depth 7"
_EAGLE2_TREE = DraftSetting(depth=6, topk=10, budget=60)  # EAGLE-2's defaults ("dynamic tree")
_SPECVLM = "SpecVLM, Huang et al., arXiv 2509.11815"
_VISPEC = "ViSpec, NeurIPS 2025, arXiv 2509.15235"


def _preset(method, model, setting, length, includes_bonus, speedup, source, suffix=""):
    draft = _SPECVLM_TREE if "depth 7" in setting else _EAGLE2_TREE
    return Preset(name=f"{method}/{model}{suffix}", method=method, model=model, setting=setting,
                  accept_length=length if includes_bonus else length + 1.0, speedup_vs_ar=speedup,
                  draft=draft, source=source)


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
    )
}
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


def fit_top1_logit(template: AcceptanceModel, draft: DraftSetting, target_length: float) -> float:
    """Top-1 logit at which ``draft`` reaches ``target_length``. Common
    random numbers make the Monte-Carlo length a deterministic, monotone step
    function of the logit, so a bracketing root finder fits it exactly."""
    def gap(logit: float) -> float:
        return expected_length(template.with_top1_logit(logit), draft) - target_length

    lo, hi = -4.0, 8.0
    if not gap(lo) <= 0 <= gap(hi):
        raise InputError(f"accept_length {target_length} is out of reach of draft setting {draft}")
    return float(optimize.brentq(gap, lo, hi, xtol=2e-4))


# Top-1 logits fitted by ``fit_preset`` (FIT_ROUNDS rounds, FIT_SEED) under each
# preset's own draft setting; shipped so the CLI starts at once. A test refits
# them and checks both the values and the simulated acceptance length.
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
}


def _preset_entry(name: str) -> Preset:
    key = name.lower()
    if key not in PRESETS:
        raise InputError(f"acceptance must be iid:P or a preset: {', '.join(p.name for p in PRESETS.values())} "
                         f"(got {name!r})")
    return PRESETS[key]


def fit_preset(name: str) -> AcceptanceModel:
    """Fit a preset's top-1 logit afresh (about two seconds)."""
    p = _preset_entry(name)
    template = AcceptanceModel(name=p.name, top1_logit=0.0)
    return template.with_top1_logit(fit_top1_logit(template, p.draft, p.accept_length))


def preset(name: str) -> AcceptanceModel:
    """The acceptance model of a published preset, with its shipped fit."""
    p = _preset_entry(name)
    return AcceptanceModel(name=p.name, top1_logit=FITTED_TOP1_LOGIT[p.name])


def build(spec: str) -> AcceptanceModel:
    """``--acceptance``: a preset name, ``iid:P`` for i.i.d. acceptance, or
    the path of a calibrated model file (``simspec validate`` writes one)."""
    if spec.lower().endswith(".json"):
        from simspec.calibration import load_acceptance  # calibration imports this module

        return load_acceptance(spec)
    if spec.lower().startswith("iid:"):
        try:
            p = float(spec[4:])
        except ValueError:
            raise InputError(f"acceptance iid:P needs a number P in (0, 1) (got {spec!r})") from None
        return AcceptanceModel.iid(p)
    return preset(spec)


def mean_chain_tokens(p: float, k: int) -> float:
    """Closed form: expected tokens per round of a k-token linear draft under
    i.i.d. acceptance p, bonus included: (1 - p^(k+1)) / (1 - p)."""
    return (1.0 - p ** (k + 1)) / (1.0 - p) if p != 1.0 else float(k + 1)


