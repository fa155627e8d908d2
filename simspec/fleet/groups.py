"""A fleet of replica groups: ``simspec simulate --fleet FILE.toml``, or
``[fleet]`` in a config file.

Imports: the standard library, simspec.types, simspec.files, simspec.fleet.routers.

A group is some identical replicas of one setup; the groups of a fleet may
differ in GPU, tensor-parallel degree, cost model, engine fields and
policy, and one router sends each request of the run's one arrival stream
to a replica of any group. Every key of a group but ``replicas`` is
optional and defaults to the run's own setting (its flags and config);
a group that names a ``policy`` serves with it whatever the run's
``--policy`` list says, the others serve each of the run's policies in
turn. A fleet file::

    router = "least_requests"          # optional: else the run's --router
    router_staleness_ms = 0            # optional

    [[group]]
    name = "h100"                      # optional: g0, g1, ... by position
    replicas = 4
    device = "h100-sxm"
    policy = "linear:k=3"

    [[group]]
    name = "a100"
    replicas = 2
    device = "a100-80gb"
    tp = 2
    [group.engine]                     # [engine] keys for this group's replicas
    max_num_seqs = 64

In a config file the same keys sit under ``[fleet]`` (``[[fleet.group]]``).
A group that changes the engine kind, device or degree starts from that
engine's preset there (as ``--engine`` does), then takes its own
``[group.engine]`` keys.

A disaggregated fleet gives every group a ``role``, ``prefill`` or
``decode`` (both present): prefill replicas compute the prompts and serve
``ar``, the KV cache moves over ``kv_link`` (a name of :data:`LINKS`, or
``GB_PER_S:LATENCY_US``), and decode replicas generate with the run's
policies (simspec.fleet.disagg).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

from simspec.files import read_toml
from simspec.fleet import routers
from simspec.types import InputError, check_types, require

GROUP_KEYS = ("name", "replicas", "role", "device", "tp", "draft_tp", "cost_model", "policy", "engine")
FILE_KEYS = ("router", "router_staleness_ms", "kv_link", "group")
ROLES = ("prefill", "decode")  # simspec.fleet.disagg


@dataclass(frozen=True, slots=True, kw_only=True)
class Group:
    """Some identical replicas of one setup; None: the run's own setting."""

    name: str
    replicas: int
    role: str | None = None  # prefill or decode (a disaggregated fleet); None: both
    device: str | None = None
    tp: int | None = None
    draft_tp: int | None = None
    cost_model: str | None = None
    policy: str | None = None
    engine: tuple = ()  # (key, value) pairs of EngineConfig fields, sorted by key

    def __post_init__(self):
        check_types(self)
        require(bool(self.name.strip()) and self.name == self.name.strip() and "," not in self.name,
                f"fleet group name must be a non-empty name without commas or edge spaces (got {self.name!r})")
        require(1 <= self.replicas <= routers.MAX_REPLICAS,
                f"fleet group {self.name}: replicas must be in 1..{routers.MAX_REPLICAS} (got {self.replicas})")
        require(self.role is None or self.role in ROLES,
                f"fleet group {self.name}: role must be prefill or decode (got {self.role!r})")
        require(self.role != "prefill" or self.policy in (None, "ar"),
                f"fleet group {self.name}: a prefill group drafts nothing: its policy is ar (got {self.policy!r})")

    @property
    def engine_overrides(self) -> dict:
        return dict(self.engine)

    def as_table(self) -> dict:
        """The group as its TOML table (unset keys left out)."""
        table = {"name": self.name, "replicas": self.replicas}
        for key in ("role", "device", "tp", "draft_tp", "cost_model", "policy"):
            if getattr(self, key) is not None:
                table[key] = getattr(self, key)
        if self.engine:
            table["engine"] = dict(self.engine)
        return table


@dataclass(frozen=True, slots=True)
class Link:
    """What moving KV cache between two replicas costs, per GPU and direction."""

    name: str
    bytes_per_s: float
    latency_s: float
    source: str


# Bandwidths are one GPU's link, one way. The per-transfer latencies are
# assumptions (connection set-up, RDMA registration and the connector's
# bookkeeping dominate the wire's microseconds), not measurements.
LINKS = {
    "nvlink": Link("nvlink", 450e9, 10e-6, "NVLink 4 on H100/H200 SXM: 900 GB/s a GPU, 450 GB/s each way "
                                          "(NVIDIA H100 and H200 datasheets); latency assumed"),
    "ib-400g": Link("ib-400g", 50e9, 20e-6, "InfiniBand NDR, 400 Gb/s a GPU (NVIDIA ConnectX-7 datasheet; a DGX "
                                            "H100 has one 400 Gb/s port a GPU); latency assumed"),
    "ethernet-100g": Link("ethernet-100g", 12.5e9, 50e-6, "100 Gb/s Ethernet (RoCE) a GPU; latency assumed"),
}
DEFAULT_LINK = "ib-400g"


def parse_link(spec: str) -> Link:
    """A link by name (:data:`LINKS`) or as ``GB_PER_S:LATENCY_US`` (e.g. ``25:40``)."""
    if spec in LINKS:
        return LINKS[spec]
    bandwidth, sep, latency = spec.partition(":")
    try:
        gb_s, us = float(bandwidth), float(latency)
    except ValueError:
        gb_s = us = float("nan")
    require(sep == ":" and math.isfinite(gb_s) and math.isfinite(us) and gb_s > 0 and us >= 0,
            f"kv_link must be one of {', '.join(LINKS)} or GB_PER_S:LATENCY_US with GB/s > 0 and us >= 0 "
            f"(got {spec!r})")
    return Link(spec, gb_s * 1e9, us * 1e-6, "given as bandwidth:latency")


def groups_of(entries, where: str) -> tuple[Group, ...]:
    """``[[group]]`` tables as groups: each key known, the names distinct,
    at least one group and at most routers.MAX_REPLICAS replicas in all."""
    require(isinstance(entries, list) and entries,
            f"{where}: a fleet needs at least one [[group]] table with its replicas (got none)")
    groups = []
    for k, entry in enumerate(entries):
        at = f"{where} group {k + 1}"
        require(isinstance(entry, dict), f"{at}: must be a table with replicas = N (got {entry!r})")
        for key in entry:
            require(key in GROUP_KEYS, f"{at}: unknown key {key!r} (allowed: {', '.join(GROUP_KEYS)})")
        require("replicas" in entry, f"{at}: replicas is missing (how many replicas of this setup, "
                                     f"1..{routers.MAX_REPLICAS})")
        engine = entry.get("engine", {})
        require(isinstance(engine, dict), f"{at}: engine must be a table of [engine] keys (got {engine!r})")
        values = {key: value for key, value in entry.items() if key != "engine"}
        values.setdefault("name", f"g{k}")
        try:
            groups.append(Group(**values, engine=tuple(sorted(engine.items()))))
        except InputError as err:
            raise InputError(f"{at}: {err}") from None
    names = [g.name for g in groups]
    require(len(set(names)) == len(names), f"{where}: group names must be distinct (got {', '.join(names)})")
    total = sum(g.replicas for g in groups)
    require(total <= routers.MAX_REPLICAS,
            f"{where}: the groups hold {total} replicas in all, more than {routers.MAX_REPLICAS}")
    roles = {g.role for g in groups}
    require(roles in ({None}, set(ROLES)),
            f"{where}: a disaggregated fleet gives every group a role, and has prefill and decode groups "
            f"(got roles {', '.join(str(g.role) for g in groups)})")
    return tuple(groups)


def disaggregated(groups: tuple[Group, ...]) -> bool:
    """Whether the fleet splits into prefill and decode replicas."""
    return any(g.role is not None for g in groups)


def fleet_overrides(table: dict, where: str) -> dict:
    """A fleet file's (or ``[fleet]`` table's) keys as config overrides:
    ``fleet`` (the groups) and the router keys it sets."""
    require(isinstance(table, dict), f"{where}: [fleet] must be a table")
    for key in table:
        require(key in FILE_KEYS, f"{where}: unknown key {key!r} (allowed: {', '.join(FILE_KEYS)})")
    out = {"fleet": groups_of(table.get("group"), where)}
    for key in ("router", "router_staleness_ms", "kv_link"):
        if key in table:
            out[key] = table[key]
    return out


def load(path: str | Path) -> dict:
    """``--fleet FILE.toml`` as config overrides (:func:`fleet_overrides`)."""
    return fleet_overrides(read_toml(path, "--fleet"), f"--fleet {path}")


def describe(groups: tuple[Group, ...]) -> str:
    """One line: each group's count and what it sets."""
    parts = []
    for g in groups:
        sets = [f"{key} {getattr(g, key)}" for key in ("role", "device", "tp", "draft_tp", "cost_model", "policy")
                if getattr(g, key) is not None]
        sets += [f"{k}={v}" for k, v in g.engine]
        parts.append(f"{g.name} x{g.replicas}" + (f" ({', '.join(sets)})" if sets else ""))
    return "; ".join(parts)


__all__ = ["Link", "LINKS", "DEFAULT_LINK", "parse_link", "Group", "GROUP_KEYS", "ROLES", "groups_of", "disaggregated",
           "fleet_overrides", "load", "describe"]
