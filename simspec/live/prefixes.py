"""The live engine's prefix cache contents: the KV, hidden states and image
embeddings of each shared prefix, kept when a request first computes its
prefix's full blocks and copied into a later request's cache slot when
the scheduler admits it with a hit.

Imports: torch, numpy, simspec.types.

Which request hits, and how many tokens, is the scheduler's decision
(simspec.serving.prefixes, the simulator's own rules); this module holds
the tensors behind it. A prefix is a request's first ``prefix_tokens``
tokens: its image's visual tokens, then its text. A hit on a request whose
tokens differ from those the prefix was computed from is refused: the
workload's prefix ids would be wrong, and the output with them.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from simspec.types import Request, require


@dataclass(frozen=True, slots=True)
class _Entry:
    owner: int  # the request that computed it
    tokens: int
    keys: tuple[torch.Tensor, ...]  # per layer [T, H, D]
    values: tuple[torch.Tensor, ...]
    hidden: torch.Tensor  # [T, C] the target's last hidden state at each token
    embeds: torch.Tensor | None  # [V, C] the image's LM inputs
    image: np.ndarray
    prompt: tuple[int, ...]


class PrefixStore:
    """Prefix id -> the tensors of its full blocks (module docstring)."""

    def __init__(self, block_size: int, visual_tokens: int):
        self.block_size, self.visual_tokens = block_size, visual_tokens
        self.entries: dict[int, _Entry] = {}

    def blocks(self, request: Request) -> int:
        """Tokens of the request's prefix in full blocks (0: it shares none)."""
        return request.prefix_tokens // self.block_size * self.block_size if request.prefix_id >= 0 else 0

    def save(self, request: Request, image: np.ndarray, prompt: list[int], cached: int, hidden: list[torch.Tensor],
             embeds: torch.Tensor | None, keys: list[torch.Tensor], values: list[torch.Tensor]) -> None:
        """After a chunk of ``request`` (``cached`` tokens now in its cache,
        ``hidden`` its chunks' hidden states so far, ``keys``/``values`` its
        slot's cache per layer): keep its prefix once computed, if none is kept."""
        tokens = self.blocks(request)
        if not tokens or cached < tokens or request.prefix_id in self.entries:
            return
        self.entries[request.prefix_id] = _Entry(
            owner=request.id, tokens=tokens, keys=tuple(k[:tokens].clone() for k in keys),
            values=tuple(v[:tokens].clone() for v in values), hidden=torch.cat(hidden, 0)[:tokens].clone(),
            embeds=embeds, image=image, prompt=tuple(prompt))

    def restore(self, request: Request, image: np.ndarray, prompt: list[int], hit: int, keys: list[torch.Tensor],
                values: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Copy the first ``hit`` tokens of the request's prefix into its
        slot's cache (``keys``/``values`` per layer); returns their hidden
        states and the image's embeddings."""
        entry = self.entries.get(request.prefix_id)
        require(entry is not None and hit <= entry.tokens,
                f"request {request.id}: a prefix-cache hit of {hit} tokens on prefix {request.prefix_id}, "
                f"which the engine never computed")
        text = max(hit - self.visual_tokens, 0)
        require(np.array_equal(image, entry.image) and tuple(prompt[:text]) == entry.prompt[:text],
                f"request {request.id} shares prefix {request.prefix_id} with request {entry.owner}, but their "
                f"first {hit} tokens differ (prefix_id must name identical content)")
        for layer in range(len(keys)):
            keys[layer][:hit] = entry.keys[layer][:hit]
            values[layer][:hit] = entry.values[layer][:hit]
        return entry.hidden[:hit], entry.embeds


__all__ = ["PrefixStore"]
