"""Acceptance models: what the drafter proposes, how sure it is, and what
the target actually accepts.

Imports: numpy, simspec.compiled (numba), simspec.types, simspec.acceptance.context.

Semantics (DESIGN.md "The serving model"): at each draft depth the target's
token has a rank among the drafter's candidates (1..15, or none). A draft
node is accepted when its token is the target's and its parent was accepted,
so linear drafts (rank-1 chains) and trees are priced by one model.

Per request i, round, and depth d (all on the logit scale):

    logit p1 = top1_logit + z_i + w_ir - fall(d) + e,
    z_i  ~ N(0, request_sigma)       per-request difficulty
    w_ir ~ N(0, round_sigma)         per-round variation, shared by the round's every node
    e    ~ N(0, token_sigma)         per-position variation
    fall(d) = depth_decay_logit * (d - 1), or the fitted ``depth_profile`` (depths 1..), then on by the decay

The round term is what makes a round all or nothing while the request's
share of good rounds stays moderate: a drafter that copies runs the target
repeats (ngram, or a draft that agrees only where the target repeats itself)
accepts its whole draft or none of it, round by round. It is 0 in the
presets; ``simspec calibrate vllm`` fits it from the benchmark's
per-request token timing (simspec.vllm.calibrate). Only a model with it
draws the B extra normals a round (:func:`normals_per_round`).

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

from simspec.acceptance.context import SELECTION_SCALES, DraftContext
from simspec.compiled import jit
from simspec.types import MAX_DEPTH, MAX_RANK, check_types, require

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
    large blocks: one numpy call per block instead of several per step.

    Each kind lives in two buffers used in turn: a refill copies the unread
    numbers into the other buffer and draws the fresh block after them (the
    same draws, in the same order, as one array a refill; without a new
    array, and its fresh pages, for each). A window's numbers therefore stay
    as they were until the next-but-one refill of their kind, which is
    longer than any reader keeps one (``normals`` then ``uniforms`` in one
    call: the second may refill the normals once)."""

    BLOCK = 1 << 16

    def __init__(self, rng: np.random.Generator):
        self._rng = rng
        self._buffers = [[np.empty(0), np.empty(0)], [np.empty(0), np.empty(0)]]  # [kind][turn]
        self._turn = [0, 0]
        self._filled = [0, 0]  # numbers held in each kind's current buffer
        self._used = np.zeros(2, dtype=np.int64)  # consumed from the front of each

    def _refill(self, k: int, n: int) -> None:
        used, filled, turn = int(self._used[k]), self._filled[k], self._turn[k]
        left, fresh = filled - used, max(self.BLOCK, n)
        target = self._buffers[k][1 - turn]
        if len(target) < left + fresh:
            target = self._buffers[k][1 - turn] = np.empty(2 * (left + fresh))
        target[:left] = self._buffers[k][turn][used:filled]
        if k == 0:
            self._rng.standard_normal(out=target[left:left + fresh])
        else:
            self._rng.random(out=target[left:left + fresh])
        self._turn[k], self._filled[k], self._used[k] = 1 - turn, left + fresh, 0

    def window(self, n: int) -> "Randoms":
        """At least ``n`` unread normals and uniforms, with a cursor that the
        reader advances; hand it back to :meth:`consume`."""
        for k in (0, 1):
            if self._filled[k] - self._used[k] < n:
                self._refill(k, n)
        normal, uniform = self._buffers[0][self._turn[0]], self._buffers[1][self._turn[1]]
        return Randoms(normal[self._used[0]:self._filled[0]], uniform[self._used[1]:self._filled[1]],
                       np.zeros(2, dtype=np.int64))

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


class Draws(NamedTuple):
    """An AcceptanceModel's numbers, for compiled code (same meaning)."""

    fall: np.ndarray  # [MAX_DEPTH + 1] logit fall at each depth (0-based): depth_decay_logit x d, or the profile
    token_sigma: float
    confidence_sigma: float
    visual_share: float
    tail: np.ndarray  # [MAX_RANK - 1] P(rank = r | not rank 1), r = 2..
    conf_tail: np.ndarray  # [MAX_RANK - 1] the drafter's confidence beyond its first candidate, as shares
    round_sigma: float


@jit
def normals_per_round(model: Draws, b: int, depth: int) -> int:
    """Standard normals one round of ``b`` requests ``depth`` deep reads:
    two a node (token and confidence noise), and one a request for the round
    term when the model has one (so a model without it reads what it always
    did). Uniforms: two a node."""
    return 2 * b * depth + (b if model.round_sigma > 0.0 else 0)


@jit
def draw_round(request_logit: np.ndarray, retention: np.ndarray, depth: int, ranks: int, model: Draws,
               normals: np.ndarray, uniforms: np.ndarray):
    """Compiled draw (see AcceptanceModel.draw) for B requests: their top-1
    logits and visual retention [B], ``depth`` x ``ranks`` confidences;
    ``normals`` holds normals_per_round(model, B, depth) numbers and
    ``uniforms`` 2 * B * depth."""
    fall, token_sigma, confidence_sigma, visual_share = (model.fall, model.token_sigma, model.confidence_sigma,
                                                          model.visual_share)
    round_sigma = model.round_sigma
    tail, conf_tail = model.tail, model.conf_tail
    b = len(request_logit)
    n = b * depth
    conf = np.empty((b, depth, ranks))
    true_ranks = np.zeros((b, depth), dtype=np.int64)
    p1s = np.empty((b, depth))
    cdf = np.cumsum(tail)
    for i in range(b):
        shared = request_logit[i] + round_sigma * normals[2 * n + i] if round_sigma > 0.0 else request_logit[i]
        for d in range(depth):
            k = i * depth + d
            logit = shared - fall[d] + token_sigma * normals[k]
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
    round_sigma: float = 0.0
    token_sigma: float = 1.5
    confidence_sigma: float = 0.5
    visual_share: float = 0.3
    retention_none: float = 0.55
    # The drafter's confidences beyond its first candidate, as shares of
    # 1 - conf(rank 1); None: shaped as the true ranks' tail (presets).
    conf_tail_mass: float | None = None
    conf_tail_decay: float | None = None
    # Request classes (simspec.acceptance.classes): (class, logit offset from
    # top1_logit) pairs, sorted; a request of another class (or none) keeps top1_logit.
    class_logit: tuple = ()
    # (class, request_sigma) pairs, sorted: a class's own per-request spread
    # (calibrate vllm-classes fits it); a request of another class keeps request_sigma.
    class_sigma: tuple = ()
    # Long contexts: the top-1 logit falls by this much per 1,000 tokens of a
    # request's context beyond context_knee_tokens (0: no fall).
    context_decay_logit: float = 0.0
    context_knee_tokens: int = 2048
    # The fall of the top-1 logit at depths 2, 3, ... from depth 1's (fitted
    # to per-position acceptance rates); beyond it the last fall grows by
    # depth_decay_logit a depth. (): depth_decay_logit x (depth - 1).
    depth_profile: tuple = ()

    def __post_init__(self):
        check_types(self)
        require(all(isinstance(c, str) and isinstance(v, float) for c, v in self.class_logit),
                f"class_logit must be (class, logit offset) pairs (got {self.class_logit!r})")
        require(all(isinstance(c, str) and isinstance(v, float) and v >= 0.0 for c, v in self.class_sigma),
                f"class_sigma must be (class, spread >= 0) pairs (got {self.class_sigma!r})")
        require(self.context_decay_logit >= 0.0, f"context_decay_logit must be >= 0 (got {self.context_decay_logit})")
        require(self.context_knee_tokens >= 1, f"context_knee_tokens must be >= 1 (got {self.context_knee_tokens})")
        require(len(self.depth_profile) < MAX_DEPTH and all(isinstance(v, float) for v in self.depth_profile),
                f"depth_profile must be at most {MAX_DEPTH - 1} numbers (got {self.depth_profile!r})")
        require(0.0 <= self.tail_mass <= 1.0, f"tail_mass must be in [0, 1] (got {self.tail_mass})")
        require(0.0 < self.tail_decay < 1.0, f"tail_decay must be in (0, 1) (got {self.tail_decay})")
        for field in ("request_sigma", "round_sigma", "token_sigma", "confidence_sigma", "depth_decay_logit"):
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
        require(0.0 < p < 1.0, f"acceptance iid:P: the acceptance probability P must be in (0, 1) (got {p})")
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

    def request_logits(self, rng: np.random.Generator, n: int, classes=None, context_tokens=None) -> np.ndarray:
        """Per-request difficulty: the top-1 logit of each of ``n`` requests,
        moved by each one's class (``classes``: a name a request, "" for
        none) and its context length (``context_tokens``) where the model
        has those terms. The normals drawn are the same whatever they are."""
        z = rng.standard_normal(n)
        if classes is None or not (self.class_logit or self.class_sigma):
            logits = self.top1_logit + self.request_sigma * z
        else:  # each request at its class's spread and level
            spread, offset = dict(self.class_sigma), dict(self.class_logit)
            sigma = np.array([spread.get(c, self.request_sigma) for c in classes], dtype=float)
            logits = self.top1_logit + sigma * z + np.array([offset.get(c, 0.0) for c in classes], dtype=float)
        if context_tokens is not None and self.context_decay_logit > 0.0:
            beyond = np.maximum(np.asarray(context_tokens, dtype=float) - self.context_knee_tokens, 0.0)
            logits = logits - self.context_decay_logit * beyond / 1000.0
        return logits

    @property
    def by_request(self) -> bool:
        """Whether a request's class or context moves its level (request_logits then reads them)."""
        return bool(self.class_logit or self.class_sigma) or self.context_decay_logit > 0.0

    def class_offset(self, name: str) -> float:
        """The logit offset of class ``name`` (0 for one the model does not move)."""
        return dict(self.class_logit).get(name, 0.0)

    def class_spread(self, name: str) -> float:
        """The per-request spread of class ``name`` (request_sigma for one without its own)."""
        return dict(self.class_sigma).get(name, self.request_sigma)

    def draw(self, rand: "RandomBlocks", request_logit: np.ndarray, retention: np.ndarray,
             depth: int, ranks: int) -> Round:
        """Draw one round for a batch: confidences up to ``depth`` x ``ranks``
        and the target's true rank at each depth. Consumes 2·B·depth normals
        (and B more with a round term) and 2·B·depth uniforms whatever the
        other parameters (common random numbers)."""
        b = len(request_logit)
        draws = self.draws
        conf, true_ranks, p1 = draw_round(
            np.ascontiguousarray(request_logit, dtype=np.float64), np.ascontiguousarray(retention, dtype=np.float64),
            depth, ranks, draws, rand.normals(normals_per_round(draws, b, depth)), rand.uniforms(2 * b * depth))
        return Round(conf=conf, true_ranks=true_ranks, top1_p=p1)

    @property
    def draws(self) -> Draws:
        """The model as compiled draws read it."""
        return Draws(self.fall, self.token_sigma, self.confidence_sigma, self.visual_share,
                     np.ascontiguousarray(self.tail), np.ascontiguousarray(self.conf_tail), self.round_sigma)

    @property
    def fall(self) -> np.ndarray:
        """The top-1 logit's fall at each depth (0-based), [MAX_DEPTH + 1]."""
        depth = np.arange(MAX_DEPTH + 1)
        fall = self.depth_decay_logit * depth
        if self.depth_profile:
            given = np.array((0.0, *self.depth_profile))
            fall = np.where(depth < len(given), given[np.minimum(depth, len(given) - 1)],
                            given[-1] + self.depth_decay_logit * (depth - len(given) + 1))
        return np.ascontiguousarray(fall, dtype=np.float64)

    def with_top1_logit(self, value: float) -> "AcceptanceModel":
        return replace(self, top1_logit=float(value))


def mean_chain_tokens(p: float, k: int) -> float:
    """Closed form: expected tokens per round of a k-token linear draft under
    i.i.d. acceptance p, bonus included: (1 - p^(k+1)) / (1 - p)."""
    return (1.0 - p ** (k + 1)) / (1.0 - p) if p != 1.0 else float(k + 1)
