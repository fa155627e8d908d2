"""The live engine's settings (:class:`LiveConfig`), apart from the engine
so that the ``live`` and ``validate`` flags read their defaults from it
without loading torch.

Imports: simspec.acceptance.context, simspec.serving.config (the bounds),
simspec.types.
"""

from __future__ import annotations

from dataclasses import dataclass

from simspec.acceptance.context import DraftContext
from simspec.serving.config import MAX_BATCHED_TOKENS, MAX_BLOCK_SIZE, MAX_NUM_SEQS
from simspec.types import require


@dataclass(frozen=True, slots=True, kw_only=True)
class LiveConfig:
    """How the live engine batches and drafts: the one home of these
    defaults (the ``simspec live`` flags read theirs from here)."""

    max_num_seqs: int = 16
    max_num_batched_tokens: int = 512
    drafter_context: str = "selected:8"
    impl: str = "auto"  # simspec_kernels implementation; auto: Triton on CUDA, the PyTorch reference on a CPU
    prior_top1: float = 0.5  # top-1 acceptance assumed before any history (the simulator uses its model's)
    # vLLM's scheduling rules, as the simulator's EngineConfig has them:
    # automatic prefix caching over KV blocks of block_size tokens (a
    # request admitted while its prefix is cached starts with that KV),
    # and the encoder budget ("vllm": a chunk stops short of an image the
    # step's vision-encoder budget cannot take; "none": a request's image is
    # encoded when its prefill starts).
    prefix_caching: bool = False
    block_size: int = 1
    encoder_budget: str = "none"

    def __post_init__(self):
        require(1 <= self.max_num_seqs <= MAX_NUM_SEQS,
                f"max_num_seqs must be in 1..{MAX_NUM_SEQS} (got {self.max_num_seqs})")
        require(16 <= self.max_num_batched_tokens <= MAX_BATCHED_TOKENS,
                f"max_num_batched_tokens must be in 16..{MAX_BATCHED_TOKENS} (got {self.max_num_batched_tokens})")
        require(0.0 < self.prior_top1 < 1.0, f"prior_top1 must be in (0, 1) (got {self.prior_top1})")
        require(1 <= self.block_size <= MAX_BLOCK_SIZE,
                f"block_size must be in 1..{MAX_BLOCK_SIZE} (got {self.block_size})")
        require(self.encoder_budget in ("none", "vllm"),
                f"encoder_budget must be one of none, vllm (got {self.encoder_budget!r})")
        DraftContext.parse(self.drafter_context)
