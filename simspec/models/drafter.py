"""The drafter: EAGLE-style, with gated cross-attention over kept visual tokens.

Imports: torch, simspec_kernels (cross-attention, selection), simspec.models.vlm.

An *entry* at text position t is the pair (feature f_t, token x_{t+1}): the
target's final-norm hidden state at t and the token that follows it. The
drafter maps an entry to a predicted feature for position t+1 and, through
the target's own (frozen, shared) LM head, to logits for x_{t+2}:

    x = fc([f_t ; embed(x_{t+1})])            (embed: the target's, frozen)
    x = x + self_attention(x)                 (RoPE at position N + t, over earlier entries)
    x = gated_cross_attention(x, kept visual) (simspec_kernels; tanh gate)
    x = x + mlp(x);  f^_{t+1} = norm(x);  logits = target.head(f^_{t+1})

Drafting deeper feeds the predicted feature back: the depth-d node after an
anchor entry at t is (f^_{t+d-1}, x_{t+d}) at position t+d-1, attending to
the true entries up to t and its own chain of draft nodes. Training
(:func:`unrolled_losses`) and the live engine use exactly that attention.

The visual context the drafter sees (``none``, ``selected:K``, ``pooled:K``,
``full``) is chosen at run time: one drafter serves every variant (it is
trained with the context drawn per batch). Visual features are the target's
final hidden states at the visual positions; ``selected:K`` picks them with
the verifier's queries (:func:`select_visual`).

EAGLE (Li et al., 2024) for the feature-level drafter; SpecVLM for online
logit distillation; Uni-LaSpec (Nie et al., arXiv 2611.01617) for the gated
cross-attention and attention-guided selection.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from simspec_kernels.cross_attention import gated_cross_attention
from simspec_kernels.int8_cache import quantize_keys
from simspec_kernels.selection import select_visual_tokens
from simspec.acceptance.context import DraftContext
from simspec.models.vlm import RMSNorm, TargetVLM, rope
from simspec.types import require


@dataclass(frozen=True, slots=True, kw_only=True)
class DrafterConfig:
    width: int = 128  # = the target's width (features are the target's hidden states)
    heads: int = 4
    mlp_hidden: int = 256
    rope_base: float = 10000.0

    def __post_init__(self) -> None:
        require(self.width % self.heads == 0 and (self.width // self.heads) % 2 == 0,
                f"width must be a multiple of 2*heads={2 * self.heads}, got {self.width}")
        require(self.mlp_hidden >= 1, f"mlp_hidden must be >= 1, got {self.mlp_hidden}")


class Drafter(nn.Module):
    """One decoder layer over (feature, token) entries; see the module docstring.

    The target's embedding and LM head are used, not owned: they are frozen
    and stay out of the drafter's state_dict."""

    def __init__(self, config: DrafterConfig, target: TargetVLM):
        super().__init__()
        require(config.width == target.config.width,
                f"drafter width {config.width} must equal the target's width {target.config.width}")
        self.config = c = config
        self.visual_tokens = target.config.visual_tokens
        object.__setattr__(self, "_target", target)  # not a submodule: not saved, not trained
        self.fc = nn.Linear(2 * c.width, c.width, bias=False)
        self.norm1 = RMSNorm(c.width)
        self.qkv = nn.Linear(c.width, 3 * c.width, bias=False)
        self.out = nn.Linear(c.width, c.width, bias=False)
        self.cross = nn.ParameterDict({name: nn.Parameter(torch.randn(c.width, c.width) * c.width**-0.5)
                                       for name in ("wq", "wk", "wv", "wo")})
        self.cross_gate = nn.Parameter(torch.tensor(0.5))
        self.visual_norm = RMSNorm(c.width)
        self.norm2 = RMSNorm(c.width)
        self.gate = nn.Linear(c.width, c.mlp_hidden, bias=False)
        self.up = nn.Linear(c.width, c.mlp_hidden, bias=False)
        self.down = nn.Linear(c.mlp_hidden, c.width, bias=False)
        self.norm = RMSNorm(c.width)
        for module in (self.fc, self.qkv, self.out, self.gate, self.up, self.down):
            nn.init.normal_(module.weight, std=module.weight.shape[-1] ** -0.5)
        nn.init.zeros_(self.down.weight)
        nn.init.zeros_(self.out.weight)

    @property
    def target(self) -> TargetVLM:
        return self._target

    @property
    def head_dim(self) -> int:
        return self.config.width // self.config.heads

    def project(self, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor):
        """Entries -> residual stream ``x [B, Q, C]`` and q, k, v ``[B, Q, H, D]``.

        features: [B, Q, C]; tokens: [B, Q] int64; positions: [B, Q] (absolute, visual tokens first)."""
        with torch.no_grad():
            embedded = self.target.embed(tokens)
        x = self.fc(torch.cat([features, embedded], dim=-1))  # [B, Q, C]
        b, q_len, width = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(b, q_len, 3, self.config.heads, self.head_dim).permute(2, 0, 3, 1, 4)
        q, k = rope(q, positions, self.config.rope_base), rope(k, positions, self.config.rope_base)
        return x, q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def finish(self, x: torch.Tensor, attended: torch.Tensor, visual: torch.Tensor, visual_lengths: torch.Tensor,
               impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
        """Residual ``x [B, Q, C]`` + self-attention output ``attended [B, Q, H, D]``
        -> predicted features ``[B, Q, C]`` and logits ``[B, Q, V]``.

        visual: [B, K, C] kept visual features (K may be 0); visual_lengths: [B]."""
        b, q_len, width = x.shape
        x = x + self.out(attended.reshape(b, q_len, width))
        if visual.shape[1] > 0:
            x = gated_cross_attention(x, self.visual_norm(visual), self.cross["wq"], self.cross["wk"],
                                      self.cross["wv"], self.cross["wo"], self.cross_gate, self.config.heads,
                                      visual_lengths, impl=impl)
        h = self.norm2(x)
        x = x + self.down(F.silu(self.gate(h)) * self.up(h))
        features = self.norm(x)
        return features, self.target.head(features)


# -- visual context -------------------------------------------------------------

def select_visual(context: DraftContext, visual_hidden: torch.Tensor, queries: torch.Tensor,
                  visual_keys: torch.Tensor, impl: str = "auto") -> tuple[torch.Tensor, torch.Tensor]:
    """The kept visual features the drafter cross-attends to.

    visual_hidden: [B, N, C] the target's final hidden states at the visual positions;
    queries: [B, layers, H, D] the verifier's saved queries (last verified token);
    visual_keys: [B, layers, N, H, D] the target's visual keys (quantized here to int8).
    Returns kept ``[B, K, C]`` and lengths ``[B]`` (K = 0 for ``none``)."""
    b, n, width = visual_hidden.shape
    lengths = torch.full((b,), n, dtype=torch.int64, device=visual_hidden.device)
    if context.kind == "none":
        return visual_hidden[:, :0], torch.zeros(b, dtype=torch.int64, device=visual_hidden.device)
    if context.kind == "full" or (context.kind == "selected" and context.kept_tokens >= n):
        return visual_hidden, lengths
    if context.kind == "pooled":
        k = min(context.kept_tokens, n)
        pooled = F.adaptive_avg_pool1d(visual_hidden.transpose(1, 2), k).transpose(1, 2)  # [B, K, C]
        return pooled, torch.full((b,), k, dtype=torch.int64, device=visual_hidden.device)
    layers, heads, dim = visual_keys.shape[1], visual_keys.shape[3], visual_keys.shape[4]
    keys_q, scales = quantize_keys(visual_keys.reshape(b * layers, n, heads, dim), impl=impl)
    chosen = select_visual_tokens(queries, keys_q.view(b, layers, n, heads, dim), scales.view(b, layers, n, heads),
                                  lengths, context.kept_tokens, impl=impl)  # [B, K] ascending
    return visual_hidden.gather(1, chosen[..., None].expand(-1, -1, width)), torch.full(
        (b,), context.kept_tokens, dtype=torch.int64, device=visual_hidden.device)


# -- attention of draft nodes -------------------------------------------------------

def chain_attention(q: torch.Tensor, k_true: torch.Tensor, v_true: torch.Tensor, true_lengths: torch.Tensor,
                    k_chain: torch.Tensor, v_chain: torch.Tensor,
                    chain_lengths: torch.Tensor | None = None) -> torch.Tensor:
    """Attention of draft nodes over their request's true entries and their own chain.

    q: [B, W, H, D] one query per node; k_true / v_true: [B, L, H, D] the
    request's true entries (valid below ``true_lengths [B]``); k_chain /
    v_chain: [B, W, A, H, D] each node's chain of draft nodes (its ancestors
    below depth 1, then itself; A >= 1), front-aligned and valid below
    ``chain_lengths [B]`` (None: all A). Returns [B, W, H, D]."""
    scale = 1.0 / math.sqrt(q.shape[-1])
    s_true = torch.einsum("bwhd,blhd->bhwl", q, k_true) * scale  # [B, H, W, L]
    valid = torch.arange(k_true.shape[1], device=q.device) < true_lengths[:, None]  # [B, L]
    s_true = s_true.masked_fill(~valid[:, None, None, :], float("-inf"))
    s_chain = torch.einsum("bwhd,bwahd->bhwa", q, k_chain) * scale  # [B, H, W, A]
    if chain_lengths is not None:
        in_chain = torch.arange(k_chain.shape[2], device=q.device) < chain_lengths[:, None]  # [B, A]
        s_chain = s_chain.masked_fill(~in_chain[:, None, None, :], float("-inf"))
    p = torch.softmax(torch.cat([s_true, s_chain], dim=-1), dim=-1)
    length = k_true.shape[1]
    return (torch.einsum("bhwl,blhd->bwhd", p[..., :length], v_true)
            + torch.einsum("bhwa,bwahd->bwhd", p[..., length:], v_chain))


# -- training objective -------------------------------------------------------------

def unrolled_losses(drafter: Drafter, trace, tokens: torch.Tensor, valid: torch.Tensor, context: DraftContext,
                    depth: int, feature_weight: float = 0.1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Online-logit distillation unrolled ``depth`` draft steps, with
    acceptance-aware position weights.

    trace: the target's :meth:`TargetVLM.trace` of ``tokens [B, T]`` (text
    after the visual tokens); valid: [B, T] bool, real (not padding) tokens.
    At depth d the node after anchor t predicts the teacher's distribution at
    position t+d; its loss weighs by the (detached) probability that the
    drafter's earlier nodes on the same anchor were accepted, the product of
    its probabilities of the teacher's greedy tokens at depths 1..d-1, so
    later positions count as much as they are likely to be reached.
    Returns the loss and, per depth, whether the drafter's top-1 token is
    the teacher's (``hits``) and which nodes count (``counted``), both
    ``[depth, B, T]`` bool."""
    b, t_len = tokens.shape
    n = drafter.visual_tokens
    anchors = torch.arange(t_len)
    teacher_logp = trace.logits.log_softmax(-1)  # [B, T, V]
    teacher_top = trace.logits.argmax(-1)  # [B, T]
    feats = trace.hidden

    # Kept visual features per anchor: selection uses the queries at the anchor's position.
    if context.kind == "selected" and context.kept_tokens < n:
        layers = trace.queries.shape[1]
        queries = trace.queries.permute(0, 2, 1, 3, 4).reshape(b * t_len, layers, *trace.queries.shape[3:])
        keys = trace.visual_keys[:, None].expand(-1, t_len, -1, -1, -1, -1).reshape(b * t_len, *trace.visual_keys.shape[1:])
        hidden = trace.visual_hidden[:, None].expand(-1, t_len, -1, -1).reshape(b * t_len, n, -1)
        kept, kept_len = select_visual(context, hidden, queries, keys, impl="reference")
        kept = kept.view(b, t_len, -1, kept.shape[-1])  # [B, T, K, C]
        kept_len = kept_len.view(b, t_len)
    else:
        kept, kept_len = select_visual(context, trace.visual_hidden, trace.queries[:, :, 0], trace.visual_keys,
                                       impl="reference")
        kept = kept[:, None].expand(-1, t_len, -1, -1)
        kept_len = kept_len[:, None].expand(-1, t_len)
    k_vis = kept.shape[2]

    def run(x, attended):  # per-anchor visual context: fold anchors into the batch
        feats_out, logits = drafter.finish(x.reshape(b * t_len, 1, -1), attended.reshape(b * t_len, 1, *attended.shape[2:]),
                                           kept.reshape(b * t_len, k_vis, kept.shape[-1]), kept_len.reshape(b * t_len),
                                           impl="reference")
        return feats_out.view(b, t_len, -1), logits.view(b, t_len, -1)

    positions = (n + anchors)[None].expand(b, -1)
    total = torch.zeros(())
    reach = torch.ones(b, t_len)
    hits, counted = [], []
    k_chain, v_chain = [], []
    prev_feats = feats
    k_true = v_true = None
    for d in range(1, depth + 1):
        # node (anchor t, depth d): input (feature for position t+d-1, token x_{t+d}); target at t+d
        shift = d  # tokens x_{t+d}
        in_tokens = torch.zeros_like(tokens)
        in_tokens[:, : t_len - shift] = tokens[:, shift:]
        x, q, k, v = drafter.project(prev_feats, in_tokens, positions + (d - 1))
        if d == 1:
            k_true, v_true = k, v
            mask = anchors[None, :] <= anchors[:, None]  # [T, T] anchor t sees entries <= t
            scores = torch.einsum("bthd,bshd->bhts", q, k) / math.sqrt(q.shape[-1])
            attended = torch.einsum("bhts,bshd->bthd", scores.masked_fill(~mask, float("-inf")).softmax(-1), v)
        else:
            k_chain.append(k)
            v_chain.append(v)
            kc, vc = torch.stack(k_chain, 2), torch.stack(v_chain, 2)  # [B, T, A, H, D]
            scale = 1.0 / math.sqrt(q.shape[-1])
            s_true = torch.einsum("bthd,bshd->bhts", q, k_true) * scale
            s_true = s_true.masked_fill(~(anchors[None, :] <= anchors[:, None]), float("-inf"))
            s_chain = torch.einsum("bthd,btahd->bhta", q, kc) * scale
            p = torch.cat([s_true, s_chain], -1).softmax(-1)
            attended = (torch.einsum("bhts,bshd->bthd", p[..., :t_len], v_true)
                        + torch.einsum("bhta,btahd->bthd", p[..., t_len:], vc))
        pred_feats, logits = run(x, attended)
        target_pos = anchors + d  # [T]
        ok = (target_pos < t_len)[None, :] & valid & valid.roll(-d, 1)  # anchor and its target position real
        ok[:, t_len - d:] = False
        idx = target_pos.clamp(max=t_len - 1)
        teach = teacher_logp[:, idx]  # [B, T, V]
        student = logits.log_softmax(-1)
        kl = (teach.exp() * (teach - student)).sum(-1)  # [B, T]
        feat_loss = F.smooth_l1_loss(pred_feats, feats[:, idx], reduction="none").mean(-1)
        weight = reach * ok
        total = total + ((kl + feature_weight * feat_loss) * weight).sum() / ok.sum().clamp(min=1)
        top = teacher_top[:, idx]
        hits.append(logits.argmax(-1) == top)
        counted.append(ok)
        reach = reach * student.gather(-1, top[..., None]).squeeze(-1).exp().detach()
        prev_feats = pred_feats
    return total, torch.stack(hits), torch.stack(counted)


def chain_acceptance(hits: torch.Tensor, counted: torch.Tensor, k: int) -> float:
    """Mean acceptance length (accepted + 1) of linear drafts of ``k`` tokens
    from teacher-forced hits: a draft's accepted tokens are its leading hits."""
    require(1 <= k <= hits.shape[0], f"k must be in [1, {hits.shape[0]}], got {k}")
    anchors = counted[0]
    leading = torch.cumprod((hits[:k] & counted[:k]).long(), dim=0).sum(0)  # [B, T]
    return float((leading[anchors].float() + 1).mean()) if bool(anchors.any()) else 1.0
