"""Training defaults of the shipped checkpoints (target and drafter), held once.

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


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterTrainConfig(TrainConfig):
    """The shipped drafter's training (the optimizer fields as the target's)."""

    steps: int = 1200
    batch: int = 24
    lr: float = 2e-3
    warmup_steps: int = 60
    train_examples: int = 3000
    eval_examples: int = 200
    depth: int = 4  # draft steps unrolled in the loss
    rollout_tokens: int = 32  # greedy target tokens after each prompt

    def __post_init__(self) -> None:
        TrainConfig.__post_init__(self)  # zero-argument super() does not work in a slots dataclass
        for name in ("depth", "rollout_tokens"):
            require(getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")


QUICK = TrainConfig(steps=25, batch=16, train_examples=256, eval_examples=20)
"""A seconds-long run for tests (``train_target(..., quick=True)``)."""
