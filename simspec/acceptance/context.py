"""What of the image the drafter sees (``--drafter-context``).

Imports: numpy and simspec.types (no numba, simpy or torch: the engine
config, the models and the live engine all read it).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simspec.types import InputError, require

MAX_KEPT = 16384  # kept visual tokens at most (more than any model's image has)
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
            require(k.isdigit() and 1 <= int(k) <= MAX_KEPT,
                    f"drafter_context {kind}:K needs K in 1..{MAX_KEPT} kept visual tokens (got {text!r})")
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
