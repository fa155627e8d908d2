"""Request classes: what a request asks for changes how much of a draft the
target keeps (chat and maths speculate well, translation poorly; prompt
lookup copies summaries and little else).

Imports: the standard library and simspec.types.

A class is a task category. A workload declares a mix of them
(``--mix code:0.3,chat:0.5,summarize:0.2``; ``[workload] mix``; a trace's
``task`` column), and each request draws its class from the mix. A class
moves a request's top-1 acceptance level (its logit: ``class_level``);
the per-request spread, the depth profile and the visual grounding stay
the preset's. A request with images keeps its class: the image's effect is
the visual grounding's (DESIGN.md), so every class exists with and without
an image.

The levels are fitted to Spec-Bench's per-category speedups (Xia et al.,
ACL Findings 2024; the leaderboard of github.com/hemingkx/Spec-Bench,
Leaderboard.md, "Leaderboard on A100", Vicuna-7B-v1.3, greedy, batch 1):
a class's acceptance length is the preset's times its category's speedup
over the method's overall speedup. That ratio is an assumption: it holds
when a round costs the same in every category, which at batch 1 on a 7B
model it nearly does (a longer prompt adds attention, a few per cent of
the step). ``code`` has no Spec-Bench category: for a model-based drafter
it is ``chat``'s level times HumanEval's acceptance length over MT-Bench's
for one EAGLE-3 head (vllm-project/vllm PR 32628, gpt-oss-120b, K=8: the
per-position rates 0.71, 0.49, 0.32, 0.21, 0.14, 0.09, 0.05, 0.03 on
HumanEval against 0.63, 0.38, 0.23, 0.14, 0.09, 0.05, 0.03, 0.02 on the
PR's other set, MT-Bench by its summary: lengths 3.04 and 2.57), which
assumes that ratio carries from that drafter to the preset's; for prompt
lookup it keeps the preset's level (no figure: an assumption), as ``edit``
does for every drafter.
"""

from __future__ import annotations

from dataclasses import dataclass

from simspec.types import InputError, require

CLASSES = ("chat", "translate", "summarize", "qa", "math", "rag", "code", "edit")
"""Spec-Bench's six categories (multi-turn conversation, translation,
summarization, question answering, mathematical reasoning,
retrieval-augmented generation), code, and edit (copy a text with changes:
the task prompt lookup speculates best on, vllm-project/vllm PR 24344; no
published per-category figure, so its level is the preset's, an assumption,
until calibrated: ``simspec calibrate vllm-classes``)."""
SPEC_BENCH = ("chat", "translate", "summarize", "qa", "math", "rag")
SPEC_BENCH_SOURCE = ("Spec-Bench leaderboard (github.com/hemingkx/Spec-Bench Leaderboard.md), A100, "
                     "Vicuna-7B-v1.3, greedy, batch 1")

# Per-category speedup over AR and the overall speedup, as the leaderboard gives them.
SPEEDUPS = {
    "eagle": ({"chat": 2.67, "translate": 1.99, "summarize": 2.23, "qa": 2.12, "math": 2.67, "rag": 2.04}, 2.29),
    "ngram": ({"chat": 1.64, "translate": 1.04, "summarize": 2.43, "qa": 1.14, "math": 1.61, "rag": 1.71}, 1.59),
}
"""``eagle``: the EAGLE row (for every model-based drafter: EAGLE, EAGLE-2/3, MTP, a draft model);
``ngram``: the PLD row (prompt lookup, vLLM's ngram)."""


def family(drafter: str) -> str:
    """The Spec-Bench row a drafter's classes follow: ``ngram`` for prompt lookup, else ``eagle``."""
    return "ngram" if drafter == "ngram" else "eagle"


CODE_OVER_CHAT = (1 + 0.71 + 0.49 + 0.32 + 0.21 + 0.14 + 0.09 + 0.05 + 0.03) / (
    1 + 0.63 + 0.38 + 0.23 + 0.14 + 0.09 + 0.05 + 0.03 + 0.02)
"""HumanEval's acceptance length over MT-Bench's, EAGLE-3 on gpt-oss-120b at K=8 (vllm-project/vllm PR 32628)."""
CODE_SOURCE = "vllm-project/vllm PR 32628 (EAGLE-3, HumanEval over MT-Bench)"


def length_ratio(name: str, drafter: str = "eagle1") -> float:
    """A class's acceptance length over the preset's (module docstring)."""
    per_category, overall = SPEEDUPS[family(drafter)]
    if name == "code" and family(drafter) == "eagle":
        return per_category["chat"] / overall * CODE_OVER_CHAT
    return per_category[name] / overall if name in per_category else 1.0


def assumed(name: str, drafter: str = "eagle1") -> bool:
    """Whether a class's level is an assumption rather than fitted to a published figure."""
    return name not in SPEC_BENCH and not (name == "code" and family(drafter) == "eagle")


@dataclass(frozen=True, slots=True)
class Mix:
    """Shares of the request classes, in CLASSES' order (those with a share)."""

    shares: tuple[tuple[str, float], ...]

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.shares)

    def describe(self) -> str:
        if self == UNIFORM:
            return "spec-bench (its six categories alike)"
        return ",".join(f"{name}:{share:g}" for name, share in self.shares)


UNIFORM = Mix(tuple((name, 1.0 / len(SPEC_BENCH)) for name in SPEC_BENCH))
"""Spec-Bench's own mix: 80 prompts of each of its six categories."""


def parse_mix(text: str, where: str = "mix") -> Mix:
    """``code:0.3,chat:0.5,summarize:0.2``: each a known class once, shares >= 0 summing to 1 (within 1e-6);
    ``spec-bench``: :data:`UNIFORM`."""
    if text.strip().lower() == "spec-bench":
        return UNIFORM
    shares: dict[str, float] = {}
    for part in text.split(","):
        name, sep, value = part.strip().partition(":")
        require(sep == ":" and name, f"{where} must look like code:0.3,chat:0.7 (got {text!r})")
        require(name in CLASSES, f"{where}: unknown class {name!r} (allowed: {', '.join(CLASSES)})")
        require(name not in shares, f"{where}: class {name} given twice")
        try:
            share = float(value)
        except ValueError:
            raise InputError(f"{where}: share of {name} must be a number (got {value!r})") from None
        require(0.0 <= share <= 1.0, f"{where}: share of {name} must be in [0, 1] (got {share:g})")
        shares[name] = share
    total = sum(shares.values())
    require(abs(total - 1.0) <= 1e-6, f"{where}: shares must sum to 1 (got {total:g})")
    return Mix(tuple((name, shares[name]) for name in CLASSES if shares.get(name, 0.0) > 0.0))


__all__ = ["CLASSES", "SPEC_BENCH", "SPEC_BENCH_SOURCE", "SPEEDUPS", "CODE_OVER_CHAT", "CODE_SOURCE", "Mix", "UNIFORM",
           "parse_mix", "length_ratio", "family", "assumed"]
