"""Training defaults of the shipped target checkpoint, held once.

Imports: the standard library only, so the CLI can read these defaults
without importing torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from simspec.types import require


@dataclass(frozen=True, slots=True, kw_only=True)
class TrainConfig:
    steps: int = 2200
    seed: int = 0
    batch: int = 64
    lr: float = 1e-3
    warmup_steps: int = 100
    weight_decay: float = 0.01
    train_examples: int = 20_000
    eval_examples: int = 500

    def __post_init__(self) -> None:
        for name in ("steps", "batch", "warmup_steps", "train_examples", "eval_examples"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
        require(self.seed >= 0, f"seed must be >= 0, got {self.seed}")
        require(0 < self.lr < 1, f"lr must be in (0, 1), got {self.lr}")
        require(self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}")


QUICK = TrainConfig(steps=25, batch=16, train_examples=256, eval_examples=20)
"""A seconds-long run for tests (``train_target(..., quick=True)``)."""
