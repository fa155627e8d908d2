"""What tuning is asked to do and what it finds: its records, and the paired
intervals it compares them with."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simspec.config import SimConfig
from simspec.types import check_types, require


FORMAT = "simspec-tuned/1"


FAMILIES = ("linear", "tree", "truncate", "marginal")


FIXED = ("linear", "tree", "truncate")  # the fixed verification strategies marginal is compared with


OBJECTIVES = {"mean_e2el": ("mean_e2el_ms", "minimize"), "p95_e2el": ("p95_e2el_ms", "minimize"),
              "goodput": ("request_goodput", "maximize")}


SPACES: dict[str, dict[str, tuple]] = {  # each family's search space, values in order
    "linear": {"k": tuple(range(1, 9))},
    "tree": {"depth": tuple(range(2, 9)), "topk": tuple(range(2, 9)), "budget": (8, 16, 24, 32, 48, 64, 96)},
    "truncate": {"k_max": tuple(range(2, 11)), "threshold": tuple(round(0.05 * i, 2) for i in range(1, 19))},
    "marginal": {"depth": tuple(range(2, 11)), "topk": tuple(range(1, 11)), "max_nodes": (64, 128, 256, 512, 1024)},
}


LEVEL = 0.95  # confidence of every interval tune reports


@dataclass(frozen=True, slots=True, kw_only=True)
class TuneConfig:
    """What to tune and how hard; the scenario itself is a SimConfig."""

    loads: tuple[float, ...] = (0.25, 0.5, 0.75)  # x the scenario's AR saturation rate
    rates_per_s: tuple[float, ...] = ()  # absolute request rates instead of loads
    cvs: tuple[float, ...] = ()  # inter-arrival CVs (1 = Poisson); empty: the scenario's
    objective: str = "mean_e2el"
    families: tuple[str, ...] = FAMILIES
    trials: int = 16  # per family and cell; a family with fewer settings is enumerated
    search_seeds: int = 2  # seeds every candidate is simulated on
    confirm_seeds: int = 8  # fresh seeds the top candidates are re-run on
    top: int = 2  # candidates per family re-run on the confirm seeds
    saturation_requests: int = 400  # requests of the AR saturation measurement
    jobs: int = 1  # cells tuned in parallel (processes)

    def __post_init__(self):
        check_types(self)
        require(self.objective in OBJECTIVES,
                f"objective must be one of {', '.join(OBJECTIVES)} (got {self.objective!r})")
        require(len(self.families) >= 1 and all(f in FAMILIES for f in self.families),
                f"families must be among {', '.join(FAMILIES)} (got {', '.join(self.families) or 'none'})")
        require(len(set(self.families)) == len(self.families), f"families must be distinct (got {self.families})")
        for name, flag in (("loads", "--load"), ("rates_per_s", "--rates"), ("cvs", "--cv")):
            values = getattr(self, name)
            require(all(math.isfinite(v) and v > 0 for v in values),
                    f"{name} ({flag}) must be > 0 (got {list(values)})")
            require(len(set(values)) == len(values), f"{name} ({flag}) must be distinct (got {list(values)})")
        require(len(self.loads) + len(self.rates_per_s) >= 1, "loads or rates_per_s must name a load level")
        require(all(v <= 1.5 for v in self.loads),
                f"loads (--load) must be <= 1.5 x saturation (got {list(self.loads)})")
        for name, low in (("trials", 1), ("search_seeds", 1), ("confirm_seeds", 2), ("top", 1),
                          ("saturation_requests", 50), ("jobs", 1)):
            require(getattr(self, name) >= low,
                    f"{name} (--{name.replace('_', '-')}) must be >= {low} (got {getattr(self, name)})")

    @property
    def metric(self) -> str:
        return OBJECTIVES[self.objective][0]

    @property
    def maximize(self) -> bool:
        return OBJECTIVES[self.objective][1] == "maximize"


@dataclass(frozen=True, slots=True, kw_only=True)
class Run:
    """One candidate on one seed."""

    value: float  # the objective's metric
    score: float  # what is ranked, larger is better (see _score)
    batch: float  # time-weighted mean decode batch size
    slo_gap: float  # the median request's worst latency / SLO ratio (nan without SLOs)
    ar_share: float  # share of rounds planned without a draft


@dataclass(frozen=True, slots=True, kw_only=True)
class Candidate:
    """A spec with its runs on the confirm seeds."""

    spec: str
    family: str
    values: tuple[float, ...]  # objective metric per confirm seed
    scores: tuple[float, ...]  # ranking score per confirm seed
    batch: float  # mean decode batch size over the confirm runs
    slo_gap: float  # mean over the confirm runs
    ar_share: float = math.nan  # share of rounds planned without a draft, over the confirm runs

    @property
    def mean(self) -> float:
        return float(np.mean(self.values))

    @property
    def score(self) -> float:
        return float(np.mean(self.scores))


@dataclass(frozen=True, slots=True, kw_only=True)
class Paired:
    """Paired (CRN) t-interval of mean(a - b) over shared seeds."""

    diff: float
    low: float
    high: float

    @property
    def separable(self) -> bool:
        return self.low > 0 or self.high < 0


@dataclass(frozen=True, slots=True, kw_only=True)
class Cell:
    """One load level x CV: each family's best, in ranking order overall."""

    load: float  # x AR saturation
    rate_per_s: float
    cv: float
    families: dict[str, Candidate]  # family -> its best spec
    best: Candidate
    runner_up: Candidate | None  # second best of all confirmed candidates
    meets_slo: bool | None  # goodput objective: did any candidate serve a request within the SLOs
    adaptive: tuple[float, ...] = ()  # the CV's staged policy, objective per confirm seed


@dataclass(frozen=True, slots=True, kw_only=True)
class Stage:
    min_batch: int
    spec: str
    load: float  # the cell it comes from


@dataclass(frozen=True, slots=True, kw_only=True)
class Schedule:
    """The load-adaptive policy of one CV: each cell's best from the decode
    batch size its load produced."""

    cv: float
    stages: tuple[Stage, ...]

    @property
    def policy(self) -> str:
        if len(self.stages) == 1:
            return self.stages[0].spec
        return "staged:stages=" + ";".join(f"{s.min_batch}:{s.spec}" for s in self.stages)


@dataclass(frozen=True, slots=True, kw_only=True)
class Tuned:
    """A tuned file: what :func:`tune` returns and :func:`load` reads."""

    objective: str
    scenario: SimConfig  # the scenario tuned (policies are not part of it)
    saturation_rate_per_s: float
    search_seeds: tuple[int, ...]
    confirm_seeds: tuple[int, ...]
    trials: int
    cells: tuple[Cell, ...]
    schedules: tuple[Schedule, ...]

    @property
    def maximize(self) -> bool:
        return OBJECTIVES[self.objective][1] == "maximize"


def paired(a, b, level: float = LEVEL) -> Paired:
    """The t-interval of mean(a - b) over paired seeds."""
    from scipy import stats  # imported when needed: keeps `simspec --help` fast

    d = np.asarray(a, dtype=float) - np.asarray(b, dtype=float)
    mean = float(d.mean())
    if len(d) < 2:
        return Paired(diff=mean, low=-math.inf, high=math.inf)
    half = float(stats.t.ppf(0.5 + level / 2, len(d) - 1) * d.std(ddof=1) / math.sqrt(len(d)))
    return Paired(diff=mean, low=mean - half, high=mean + half)
