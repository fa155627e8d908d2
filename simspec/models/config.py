"""Training defaults of the shipped checkpoints (target and drafter), held
once, and the records of how a checkpoint was made.

Imports: the standard library only, so the CLI can read these defaults
without importing torch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields

from simspec.types import InputError, require


LIVE_MODEL = "simspec-tiny-vlm"
"""The model spec (simspec.costs.specs) of the shipped checkpoints: what the live engine serves."""


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


class _Meta:
    """A checkpoint's ``meta.json`` as a frozen record (fields in file order)."""

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, record: dict, where: str):
        """The record of a parsed ``meta.json``; a missing, unknown or
        mistyped field raises InputError naming ``where`` (the file)."""
        names = {f.name for f in fields(cls)}
        require(isinstance(record, dict) and names == set(record),
                f"checkpoint file {where} is corrupt: expected the keys {sorted(names)}"
                + (f" (missing {sorted(names - set(record))}, unknown {sorted(set(record) - names)})"
                   if isinstance(record, dict) else ""))
        try:
            return cls(**record)
        except (TypeError, ValueError) as error:
            raise InputError(f"checkpoint file {where} is corrupt: {error}") from None


@dataclass(frozen=True, slots=True, kw_only=True)
class TargetMeta(_Meta):
    """How the target checkpoint was made (``checkpoints/target/meta.json``)."""

    config: dict  # VLMConfig's fields
    vocab: list  # the task's words, in id order
    seed: int
    train_examples: int
    data_hash: str  # of the training examples
    eval_seed: int
    eval_examples: int
    steps: int
    batch: int
    lr: float
    warmup_steps: int
    weight_decay: float
    quick: bool
    loss_first: float  # mean of the first steps' losses
    loss_last: float  # ... and of the last
    train_wall_s: float
    wall_s: float
    heldout_accuracy: float  # answer accuracy on the held-out examples
    heldout_accuracy_by_kind: dict  # question kind -> accuracy
    torch_version: str


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterMeta(_Meta):
    """How the drafter checkpoint was made (``checkpoints/drafter/meta.json``)."""

    config: dict  # DrafterConfig's fields
    train: dict  # DrafterTrainConfig's fields
    quick: bool
    contexts: list  # visual contexts trained with, in turn
    target_checkpoint_sha256: str  # of the target it was trained against
    data_hash: str
    rollout_hash: str
    loss_first: float
    loss_last: float
    train_wall_s: float
    acceptance_teacher_forced: dict  # visual context -> top-1 by depth, acceptance lengths of linear drafts
    selected8_share_of_full: float  # linear acceptance length with 8 selected tokens over the full image's
    torch_version: str
