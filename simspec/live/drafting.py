"""The live engine's drafter side: its KV cache, the rank-1 chains drafted
level by level, and the plan's off-chain parents drafted depth by depth.

Imports: torch, numpy, simspec.models.drafter, simspec.trees, simspec.types.
The engine (simspec.live.engine) owns the requests; a :class:`DraftCache`
owns the drafter's cache slots and runs the drafter on draft nodes.

A request enters drafting with *entries*: the target's features of the
tokens it committed since it last drafted (its prompt, the first time),
each with the token that follows it and its position. A round's first
drafter call absorbs them into the drafter's cache and gives the drafter's
candidates after the request's pending token; each deeper call runs one
draft node (the rank-1 chain's next node, or an off-chain parent whose
children the plan holds) for its own candidates.

Shape letters: R rows (requests or draft nodes), T absorbed entries, A
chain length, H heads, D head dim, C width, K kept visual tokens.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch

from simspec import trees
from simspec.acceptance.context import DraftContext
from simspec.models.drafter import Drafter, chain_attention, select_visual
from simspec.live.timing import other_token
from simspec.types import MAX_RANK


class Node:
    """A draft node: its rank-path code, depth, parent (None: a child of the
    pending token) and token; once run through the drafter, its feature,
    keys and values, and the drafter's candidates after it with their
    probabilities."""

    __slots__ = ("code", "depth", "parent", "token", "feature", "k", "v", "conf", "cand")

    def __init__(self, code: int, depth: int, parent: "Node | None", token: int):
        self.code, self.depth, self.parent, self.token = code, depth, parent, token
        self.feature = self.k = self.v = self.conf = self.cand = None

    def path(self) -> list["Node"]:
        """This node and its ancestors below the pending token, depth 1 first."""
        out = [self]
        while out[-1].parent is not None:
            out.append(out[-1].parent)
        return out[::-1]


class RowNode:
    """A plan node in a verification row: its token, depth, parent's row (0:
    the pending token) and rank among its parent's drafted candidates."""

    __slots__ = ("token", "depth", "parent", "rank")

    def __init__(self, token: int, depth: int, parent: int, rank: int):
        self.token, self.depth, self.parent, self.rank = token, depth, parent, rank


@dataclass(slots=True)
class Drafting:
    """What one request's drafter knows in this round."""

    entries: list[tuple[torch.Tensor, int, int]] = field(default_factory=list)  # (feature, next token, position) not yet cached
    cache: int = 0  # drafter KV entries
    cand: list[int] | None = None  # candidates after the pending token, best first
    conf: np.ndarray | None = None  # their probabilities
    feature: torch.Tensor | None = None  # the drafter's predicted feature after the pending token
    position: int = 0  # position of the pending token's entry


class DraftCache:
    """The drafter's KV cache (one slot per running request) and its calls.

    ``visual(request)`` gives a request's kept visual features for this
    round ([K, C] and its length), selected once per round by the engine.
    """

    def __init__(self, drafter: Drafter, slots: int, max_len: int, impl: str):
        self.drafter, self.impl = drafter, impl
        weight = next(drafter.parameters())
        heads = drafter.config.heads
        like = dict(device=weight.device, dtype=weight.dtype)
        self.device = weight.device
        self.k = torch.zeros(slots, max_len, heads, drafter.config.width // heads, **like)  # [S, L, H, D]
        self.v = torch.zeros_like(self.k)

    def absorb(self, states: list[Drafting], slots: list[int], visual) -> None:
        """Run each request's new entries through the drafter (a chain after
        its cache), commit them, and keep the last one's candidates. The
        entries are packed for the drafter's GEMMs, and only each request's
        last entry attends (the others only need their keys and values): a
        request just out of prefill brings its whole prompt, and padding
        every row to it would cost batch x prompt."""
        lengths = [len(s.entries) for s in states]
        entries = [e for s in states for e in s.entries]
        feats = torch.stack([f for f, _, _ in entries])[None]  # [1, T, C]
        tokens = torch.tensor([[tok for _, tok, _ in entries]], device=self.device)  # [1, T]
        positions = torch.tensor([[pos for _, _, pos in entries]], device=self.device)  # [1, T]
        x, q, k, v = self.drafter.project(feats, tokens, positions)  # [1, T, C], [1, T, H, D]
        ends = np.cumsum(lengths)
        starts = ends - np.array(lengths)
        last = torch.tensor(ends - 1, device=self.device)
        k_chain = k.new_zeros(len(states), 1, max(lengths), *k.shape[-2:])  # [R, 1, A, H, D]
        v_chain = torch.zeros_like(k_chain)
        for r, (a, e) in enumerate(zip(starts, ends)):
            k_chain[r, 0, :e - a], v_chain[r, 0, :e - a] = k[0, a:e], v[0, a:e]
        index = torch.tensor(slots, device=self.device)
        cache_len = torch.tensor([s.cache for s in states], device=self.device)
        top = int(cache_len.max())
        y = chain_attention(q[0, last][:, None], self.k[index, :top], self.v[index, :top], cache_len, k_chain,
                            v_chain, torch.tensor(lengths, device=self.device))  # [R, 1, H, D]
        kept, kept_len = _stack(visual)
        feats_out, logits = self.drafter.finish(x[0, last][:, None], y, kept, kept_len, impl=self.impl)
        for r, (s, slot, a, e) in enumerate(zip(states, slots, starts, ends)):
            n = lengths[r]
            self.k[slot, s.cache:s.cache + n] = k[0, a:e]
            self.v[slot, s.cache:s.cache + n] = v[0, a:e]
            s.cache += n
            s.entries = []
            probs = logits[r, 0].softmax(-1)
            p, cand = probs.topk(min(MAX_RANK, probs.shape[-1]))
            s.cand, s.conf, s.feature = cand.tolist(), p.float().cpu().numpy().astype(float), feats_out[r, 0]
            s.position = int(positions[0, e - 1])

    def run_nodes(self, states: list[Drafting], slots: list[int], nodes: list[Node], visual) -> None:
        """A drafter step on draft nodes (one per row): each attends to its
        request's drafter cache and its own chain; stores its features,
        keys, candidates and confidences on the node."""
        rows = len(nodes)
        paths = [nd.path() for nd in nodes]
        feats = torch.stack([s.feature if nd.parent is None else nd.parent.feature
                             for s, nd in zip(states, nodes)])[:, None]  # [R, 1, C]
        tokens = torch.tensor([[nd.token] for nd in nodes], device=self.device)  # [R, 1]
        positions = torch.tensor([[s.position + nd.depth] for s, nd in zip(states, nodes)], device=self.device)
        x, q, k, v = self.drafter.project(feats, tokens, positions)  # [R, 1, C], [R, 1, H, D]
        for r, nd in enumerate(nodes):
            nd.k, nd.v = k[r, 0], v[r, 0]
        a = max(len(p) for p in paths)
        hd = q.shape[-2:]
        k_chain = k.new_zeros(rows, 1, a, *hd)  # [R, 1, A, H, D]
        v_chain = k.new_zeros(rows, 1, a, *hd)
        for r, path in enumerate(paths):  # front-aligned; masked past each row's chain length
            for j, p in enumerate(path):
                k_chain[r, 0, j], v_chain[r, 0, j] = p.k, p.v
        index = torch.tensor(slots, device=self.device)
        lens = torch.tensor([s.cache for s in states], device=self.device)
        top = int(lens.max())
        y = chain_attention(q, self.k[index, :top], self.v[index, :top], lens, k_chain, v_chain,
                            torch.tensor([len(p) for p in paths], device=self.device))  # [R, 1, H, D]
        kept, kept_len = _stack(visual)
        feats_out, logits = self.drafter.finish(x, y, kept, kept_len, impl=self.impl)
        probs = logits[:, 0].softmax(-1)
        p, cand = probs.topk(min(MAX_RANK, probs.shape[-1]))
        for r, nd in enumerate(nodes):
            nd.feature, nd.cand, nd.conf = feats_out[r, 0], cand[r].tolist(), p[r].float().cpu().numpy().astype(float)


def _stack(visual) -> tuple[torch.Tensor, torch.Tensor]:
    """Rows' kept visual features [R, K, C] (zero-padded) and lengths [R]."""
    k = max(v[0].shape[0] for v in visual)
    c = visual[0][0].shape[-1]
    kept = visual[0][0].new_zeros(len(visual), k, c)
    for r, (v, _) in enumerate(visual):
        kept[r, :v.shape[0]] = v
    return kept, torch.stack([v[1] for v in visual])


def walk(nodes: list[RowNode], best: list[int], replayed_ranks: np.ndarray | None) -> list[int]:
    """The accepted path's rows (0: the pending token) down the tree,
    following the target's token (``best``, per row; in timing-only runs
    the replayed rank picks it among the drafted children)."""
    children: dict[int, list[int]] = {}
    for j, nd in enumerate(nodes):
        children.setdefault(nd.parent, []).append(j + 1)
    path, at = [0], 0
    while True:
        kids = children.get(at, [])
        if replayed_ranks is not None:
            d = 0 if at == 0 else nodes[at - 1].depth
            want = int(replayed_ranks[d]) if d < len(replayed_ranks) else 0
            match = [c for c in kids if nodes[c - 1].rank == want]
            best[at] = nodes[match[0] - 1].token if match else other_token(best[at],
                                                                           {nodes[c - 1].token for c in kids})
        nxt = [c for c in kids if nodes[c - 1].token == best[at]]
        if not nxt:
            return path
        at = nxt[0]
        path.append(at)


def select_kept(context: DraftContext, visual_hidden, queries, visual_keys, impl: str):
    """One request's kept visual features for a round ([K, C], length)."""
    kept, length = select_visual(context, visual_hidden[None], queries[None], visual_keys[None], impl=impl)
    return kept[0], length[0]


def plan_rows(codes: list[int]) -> list[int]:
    """A request's planned codes, parents before children (by depth, then code)."""
    return sorted(codes, key=lambda c: (trees.depth(c), c))


__all__ = ["Node", "RowNode", "Drafting", "DraftCache", "select_kept", "plan_rows", "walk"]
