"""Does the answer survive? The run's policies served again with the
acceptance level moved down and up, and whether the best policy stays best.

Imports: numpy, simspec.acceptance, simspec.experiment, simspec.runfolder.

An acceptance preset is one paper's figure on its own evaluation set; the
same drafter on another set, or on another category of requests, accepts
more or less (Spec-Bench's categories span -13% to +17% of the overall
acceptance length for EAGLE). So the ranking is checked over a stated
range, by default +-10% of the acceptance length: the model's top-1 logit
(and with it every class's) is moved until its draft setting's length at
concurrency 1 is 0.9x and 1.1x the model's own (a preset's draft setting;
a 3-token chain for a model without one), and the run's policies serve
the same requests on the same seeds again. "robust" when the best policy
by mean E2EL is the same at both ends; otherwise the end where another
policy wins, and by how much.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from simspec import acceptance
from simspec.acceptance import presets
from simspec.experiment import Results, run_scenario
from simspec.runfolder import best_policy
from simspec.types import require

DEFAULT_SPREAD = 0.10
CHAIN = presets.DraftSetting(depth=3, topk=1, budget=3)


@dataclass(frozen=True, slots=True)
class End:
    """The run at one end of the range."""

    scale: float  # acceptance length x this
    top1_logit: float
    best: str | None
    metrics: dict[str, dict[str, float]]


@dataclass(frozen=True, slots=True)
class Sensitivity:
    spread: float
    best: str | None  # at the model's own level
    ends: tuple[End, End]

    @property
    def robust(self) -> bool:
        return all(end.best == self.best for end in self.ends)

    def line(self) -> str:
        lo, hi = self.ends
        if self.robust:
            return (f"sensitivity: robust: {self.best} has the lowest mean E2EL at {lo.scale:.2f}x, 1x and "
                    f"{hi.scale:.2f}x the acceptance length (the model's level moved, same requests and seeds)")
        parts = []
        for end in self.ends:
            if end.best != self.best:
                ours, theirs = end.metrics[self.best]["mean_e2el_ms"], end.metrics[end.best]["mean_e2el_ms"]
                parts.append(f"at {end.scale:.2f}x the acceptance length {end.best} wins ({theirs:.0f} ms mean E2EL "
                             f"against {self.best}'s {ours:.0f})")
        return f"sensitivity: not robust: {self.best} is best at the model's level, but " + "; ".join(parts)


def _draft_of(model: acceptance.AcceptanceModel) -> presets.DraftSetting:
    entry = presets.PRESETS.get(model.name.lower())
    return entry.draft if entry is not None else CHAIN


def shifted_logit(model: acceptance.AcceptanceModel, scale: float) -> float:
    """The top-1 logit at which the model's draft setting reaches ``scale`` x its own acceptance length."""
    draft = _draft_of(model)
    length = presets.expected_length(model, draft)
    target = length * scale
    if target <= 1.0 + 1e-3:  # a drafter that keeps almost nothing: scale what it keeps instead
        target = 1.0 + (length - 1.0) * scale
    return presets.fit_top1_logit(model, draft, target)


def check(results: Results, spread: float = DEFAULT_SPREAD) -> Sensitivity:
    """Serve ``results``' scenario again at (1 - spread) and (1 + spread) x the acceptance length."""
    require(0.0 < spread < 0.5, f"sensitivity spread must be in (0, 0.5) (got {spread})")
    scenario = results.scenario
    model = scenario.acceptance
    ends = []
    for scale in (1.0 - spread, 1.0 + spread):
        logit = shifted_logit(model, scale)
        moved = run_scenario(replace(scenario, acceptance=model.with_top1_logit(logit)), event_detail=False)
        ends.append(End(scale=scale, top1_logit=logit, best=best_policy(moved.metrics), metrics=moved.metrics))
    return Sensitivity(spread=spread, best=best_policy(results.metrics), ends=(ends[0], ends[1]))


__all__ = ["Sensitivity", "End", "check", "shifted_logit", "DEFAULT_SPREAD"]
