"""The run configuration: every default once, TOML in and out, and the
flags that set it.

Imports: the standard library, tomli_w, simspec.types, .files, .workloads,
.scheduling (EngineConfig), .acceptance (default preset), .costs (the names
flags accept), .policies (validation). No argparse: the CLI registers
:data:`FLAGS` as options and hands their values to :func:`from_flags`, as
the dashboard hands its widgets' values.

A config file mirrors :class:`SimConfig`: top-level keys for the scenario,
``[workload]`` and ``[engine]`` tables for those records. Unknown keys are
errors that name the key and the table. Policies are strings as on the
command line (``"linear:k=5"``) or tables (``{name = "linear", k = 5}``).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from pathlib import Path

import tomli_w

from simspec.serving import modes
from simspec.acceptance import DEFAULT_PRESET, PRESETS
from simspec.costs import COST_MODEL_FORMS, GPUS, MODELS, gpu_spec, model_spec
from simspec.costs.catalog import check_drafter
from simspec.costs.specs import TP_DEGREES
from simspec.files import read_toml
from simspec.fleet import groups as fleet_groups, routers
from simspec.serving.config import EngineConfig
from simspec.types import InputError, check_types, checked, field_types, require
from simspec.workloads import WorkloadConfig, cv_to_burstiness

DEFAULT_POLICIES = ("ar", "linear:k=3", "linear:k=5", "tree", "truncate", "marginal")
DEFAULT_WORKLOAD = WorkloadConfig()
"""The default scenario's workload: :class:`WorkloadConfig`'s field defaults, named here for the flags' defaults."""


@dataclass(frozen=True, slots=True, kw_only=True)
class SimConfig:
    """One simulation scenario, compared across policies."""

    model: str = "LLaVA-1.5-7B"
    device: str = "h100-sxm"
    cost_model: str = "auto"
    drafter: str = "eagle1"  # what the cost model prices as drafting (simspec.costs.specs.DRAFTER_FORMS)
    tp: int = 1  # GPUs a replica's model is sharded over (tensor parallelism): one of TP_DEGREES
    # GPUs the drafter is sharded over: None the target's degree (vLLM's
    # and SGLang's default), or 1 (vLLM's draft_tensor_parallel_size=1);
    # modes.check_draft_tp says what each engine accepts.
    draft_tp: int | None = None
    # Identical replicas of this setup serving the workload together, and
    # what sends each request to one (simspec.fleet.routers.ROUTERS).
    replicas: int = 1
    router: str = "round_robin"
    router_staleness_ms: float = 0.0  # how late a router that reads load hears that a request finished
    # Or groups of replicas of different setups behind the router
    # (simspec.fleet.groups): each group's unset keys are this config's.
    fleet: tuple = ()
    # What a disaggregated fleet's KV cache moves over (simspec.fleet.groups.LINKS, or GB_PER_S:LATENCY_US).
    kv_link: str = fleet_groups.DEFAULT_LINK
    acceptance: str = DEFAULT_PRESET
    policies: tuple[str, ...] = DEFAULT_POLICIES
    seed: int = 0
    slo_ttft_ms: float | None = None
    slo_tpot_ms: float | None = None
    slo_e2el_ms: float | None = None
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)

    def __post_init__(self):
        check_types(self)
        require(all(isinstance(p, str) for p in self.policies),
                f"policies must be strings like 'linear:k=5' (got {list(self.policies)})")
        require(len(self.policies) >= 1, "policies must name at least one policy (got none)")
        require(len(set(self.policies)) == len(self.policies), f"policies must be distinct (got {list(self.policies)})")
        for spec in self.policies:
            modes.check_policy(self.engine.kind, spec)  # parses it too
        require(self.seed >= 0, f"seed must be >= 0 (got {self.seed})")
        check_drafter(self.drafter)
        require(self.tp in TP_DEGREES, f"tp must be one of {', '.join(map(str, TP_DEGREES))} (got {self.tp})")
        modes.check_draft_tp(self.engine.kind, self.tp, self.draft_tp)
        require(all(isinstance(g, fleet_groups.Group) for g in self.fleet),
                f"fleet must be groups (simspec.fleet.groups.Group; got {self.fleet!r})")
        fleet_groups.parse_link(self.kv_link)
        if self.fleet:
            require(self.replicas == 1, f"replicas and fleet both say how many replicas serve: give --replicas for "
                                        f"identical ones or a fleet's groups (got replicas {self.replicas} and a "
                                        f"fleet)")
            routers.check(self.router, self.fleet_replicas)
            for group in self.fleet:
                group_config(self, group)  # each group's setup valid, on its device
        else:
            routers.check(self.router, self.replicas)
        require(0 <= self.router_staleness_ms <= routers.MAX_STALENESS_MS,
                f"router_staleness_ms must be in 0..{routers.MAX_STALENESS_MS:g} (got {self.router_staleness_ms})")
        for name in ("slo_ttft_ms", "slo_tpot_ms", "slo_e2el_ms"):
            value = getattr(self, name)
            require(value is None or value > 0, f"{name} must be > 0 (got {value})")


    @property
    def fleet_replicas(self) -> int:
        """The replicas serving: the fleet's groups' in all, else ``replicas``."""
        return sum(g.replicas for g in self.fleet) if self.fleet else self.replicas


def group_config(config: SimConfig, group: fleet_groups.Group) -> SimConfig:
    """One replica of fleet ``group`` as a config of its own: the group's
    keys over ``config``'s (simspec.fleet.groups). A group that changes the
    engine kind, device or degree starts from that engine's preset there;
    one that names a policy serves with it alone."""
    device = group.device if group.device is not None else config.device
    tp = group.tp if group.tp is not None else config.tp
    draft_tp = group.draft_tp if group.draft_tp is not None else (config.draft_tp if group.tp is None else None)
    overrides = group.engine_overrides
    engine = config.engine
    kind = overrides.get("kind", engine.kind)
    try:
        gpu_spec(device)  # a device the run does not use otherwise is checked here, named with its group
        if (kind, device, tp) != (engine.kind, config.device, config.tp):
            engine = _replace(engine, modes.preset(kind, device, tp))
        engine = _replace(engine, overrides)
        return SimConfig(model=config.model, device=device, cost_model=group.cost_model or config.cost_model,
                         drafter=config.drafter, tp=tp, draft_tp=draft_tp, acceptance=config.acceptance,
                         policies=(group.policy,) if group.policy else config.policies, seed=config.seed,
                         slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms,
                         slo_e2el_ms=config.slo_e2el_ms, workload=config.workload, engine=engine)
    except InputError as err:
        raise InputError(f"fleet group {group.name}: {err}") from None
    except TypeError as err:
        raise InputError(f"fleet group {group.name} [engine]: {err}") from None


_TABLES = {"workload": WorkloadConfig, "engine": EngineConfig}
STOPS = {"num_requests", "duration_s"}  # either ends a synthetic workload


def _policy_spec(entry) -> str:
    """A TOML policy entry (string or table) as its command-line string."""
    if isinstance(entry, str):
        return entry
    if isinstance(entry, dict) and isinstance(entry.get("name"), str):
        params = ",".join(f"{k}={v}" for k, v in entry.items() if k != "name")
        return f"{entry['name']}:{params}" if params else entry["name"]
    raise InputError(f"policies entries must be strings like 'linear:k=5' or tables with a name (got {entry!r})")


def _checked(table: dict, allowed, where: str) -> dict:
    names = [f.name for f in fields(allowed)]
    for key in table:
        if key not in names:
            raise InputError(f"{where}: unknown key {key!r} (allowed: {', '.join(names)})")
    return table


def _check_file_types(data: dict, path: Path) -> None:
    """Every value of the file has its field's type, even one a flag
    overrides: the error names the file and the key (``workload.seed``)."""
    top = field_types(SimConfig)
    for key, value in data.items():
        if key in _TABLES:
            hints = field_types(_TABLES[key])
            for name, item in value.items():
                checked(f"{path}: {key}.{name}", item, hints[name])
        elif key != "policies":
            checked(f"{path}: {key}", value, top[key])


def _model_table(table: dict, path: Path) -> str:
    """``[model]`` as the model string: ``name = "Qwen3-32B"`` (a catalog
    name), or ``config = "models/x/config.json"`` (a Hugging Face config,
    the file or its folder; a relative path is taken from the config
    file's folder, so the pair travels together)."""
    keys = sorted(table)
    require(keys in (["config"], ["name"]) and isinstance(table[keys[0]], str) and table[keys[0]],
            f"{path}: [model] takes one of name = \"CATALOG NAME\" or config = \"PATH\" (got {table!r})")
    if keys == ["name"]:
        return table["name"]
    given = Path(table["config"]).expanduser()
    return str(given if given.is_absolute() else (path.parent / given).resolve())


def _image_size_list(data: dict, where: str) -> None:
    """``[workload] image_size`` given as a TOML list of sizes
    (``["448x448:0.5", "1920x1080:0.5"]``) becomes the one string the field
    holds (``"448x448:0.5,1920x1080:0.5"``), in place."""
    table = data.get("workload")
    value = table.get("image_size") if isinstance(table, dict) else None
    if isinstance(value, list):
        require(value and all(isinstance(v, str) and v.strip() and "," not in v for v in value),
                f"{where}: workload.image_size as a list holds sizes like \"448x448:0.5\", one an entry (got {value!r})")
        table["image_size"] = ",".join(v.strip() for v in value)


def load(path: str | Path) -> dict:
    """Read a config file into keyword overrides of :class:`SimConfig`
    (nested dicts for the tables); validation happens in :func:`build`."""
    path = Path(path)
    data = read_toml(path, "--config")
    _checked(data, SimConfig, str(path))
    if isinstance(data.get("model"), dict):
        data["model"] = _model_table(data["model"], path)
    for name, record in _TABLES.items():
        if name in data:
            require(isinstance(data[name], dict), f"{path}: [{name}] must be a table")
            _checked(data[name], record, f"{path} [{name}]")
    _image_size_list(data, str(path))
    if "fleet" in data:
        fleet = fleet_groups.fleet_overrides(data.pop("fleet"), f"{path} [fleet]")
        for key in ("router", "router_staleness_ms", "kv_link"):
            require(not (key in fleet and key in data), f"{path}: {key} is set twice, at the top and in [fleet]")
        data.update(fleet)
    _check_file_types(data, path)
    if "policies" in data:
        require(isinstance(data["policies"], list), f"{path}: policies must be a list")
        data["policies"] = [_policy_spec(p) for p in data["policies"]]
    return data


def build(file_values: dict | None = None, flag_values: dict | None = None) -> SimConfig:
    """Defaults, overridden by the config file, overridden by flags. Both
    are dicts shaped like :class:`SimConfig` with nested dicts for tables."""
    merged: dict = {}
    for source in (file_values or {}, flag_values or {}):
        for key, value in source.items():
            if key in _TABLES:
                table = merged.setdefault(key, {})
                if key == "workload" and STOPS & value.keys():
                    for stop in STOPS:  # a later source's stop replaces an earlier one's
                        table.pop(stop, None)
                table.update(value)
            else:
                merged[key] = value
    base = SimConfig()
    tables = {}
    for name in _TABLES:
        overrides = dict(merged.pop(name, {}))
        if name == "workload":
            stops = STOPS & overrides.keys()
            # One of the two ends a run, so setting one clears the other's
            # default; a trace with neither set is replayed whole.
            if stops or overrides.get("arrival", base.workload.arrival) == "trace":
                overrides = {"num_requests": None, "duration_s": None, **overrides}
        start = getattr(base, name)
        if name == "engine":  # an engine mode's preset under the file's and the flags' fields
            kind = overrides.get("kind", start.kind)
            device = merged.get("device", base.device)
            tp = merged.get("tp", base.tp)
            if isinstance(kind, str) and isinstance(device, str):
                start = _replace(start, modes.preset(kind, device, tp if isinstance(tp, int) else 1))
                if kind in modes.DEFAULT_POLICIES and "policies" not in merged:
                    merged["policies"] = list(modes.DEFAULT_POLICIES[kind])
        try:
            tables[name] = _replace(start, overrides)
        except TypeError as err:
            raise InputError(f"[{name}]: {err}") from None
    if "policies" in merged:
        merged["policies"] = tuple(merged["policies"])
    if isinstance(merged.get("fleet"), dict):  # a [fleet] table read straight from TOML (to_toml's output)
        fleet = fleet_groups.fleet_overrides(merged.pop("fleet"), "[fleet]")
        for key, value in fleet.items():
            merged.setdefault(key, value)
    if "drafter" not in merged:  # a model with its own drafter (DeepSeek-V3's MTP module) drafts with it
        own = own_drafter(merged.get("model", base.model), base.drafter)
        if own != base.drafter:
            merged["drafter"] = own
    if "acceptance" not in merged:  # the default preset, unless it drafted with another drafter than this run's
        merged["acceptance"] = default_acceptance(merged.get("model", base.model), merged.get("drafter", base.drafter))
    try:
        return SimConfig(**merged, **tables)
    except TypeError as err:
        raise InputError(f"config: {err}") from None


def default_acceptance(model, drafter) -> str:
    """The acceptance a run takes when it names none: the default preset,
    or, where that was measured with another drafter than the run's, the
    preset measured on this catalog model with this drafter (EAGLE-3 heads,
    DeepSeek-V3's MTP), if there is one."""
    kind = drafter.partition(":")[0] if isinstance(drafter, str) else None
    if kind is None or PRESETS[DEFAULT_PRESET.lower()].drafter == kind:
        return DEFAULT_PRESET
    name = model.lower() if isinstance(model, str) else None
    return next((p.name for p in PRESETS.values() if p.model.lower() == name and p.drafter == kind), DEFAULT_PRESET)


def own_drafter(model, default: str) -> str:
    """The drafter ``model`` (a catalog name or config path) ships with:
    ``mtp`` for a model with a multi-token-prediction module, else
    ``default``. A model that cannot be read keeps ``default``: the run's
    own reading of it reports the error."""
    if not isinstance(model, str):
        return default
    try:
        return model_spec(model).drafter
    except InputError:
        return default


def _replace(record, overrides: dict):
    """``dataclasses.replace`` that rebuilds from all fields, so that
    validation in ``__post_init__`` sees the final combination."""
    values = {f.name: getattr(record, f.name) for f in fields(record)}
    values.update(overrides)
    return type(record)(**values)


LEFT_OUT = {"tp": 1, "replicas": 1, "router": "round_robin", "router_staleness_ms": 0.0, "fleet": (),
            "kv_link": fleet_groups.DEFAULT_LINK}
"""Keys left out of :func:`to_toml` at these values: a one-GPU, one-replica config reads (and hashes) as it did
before them."""


def to_toml(config: SimConfig) -> str:
    """The resolved config as a file ``--config`` reads back."""

    def plain(record) -> dict:
        return {f.name: getattr(record, f.name) for f in fields(record) if getattr(record, f.name) is not None}

    top = {k: v for k, v in plain(config).items() if k not in _TABLES and LEFT_OUT.get(k, object()) != v}
    top["policies"] = list(config.policies)
    for name in _TABLES:
        top[name] = plain(getattr(config, name))
    if config.fleet:
        top["fleet"] = {"group": [g.as_table() for g in config.fleet]}
    return tomli_w.dumps(top)


# -- flags -------------------------------------------------------------------------

@dataclass(frozen=True, slots=True)
class Flag:
    """A command-line flag of a scenario and the config field it sets."""

    name: str  # --kebab-case
    path: tuple[str, ...]  # config field, e.g. ("workload", "rate_per_s")
    type: type
    help: str

    @property
    def key(self) -> str:
        """The flag's name as a key of :func:`from_flags`' values (argparse's dest)."""
        return self.name[2:].replace("-", "_")

    @property
    def default(self):
        record = {"workload": DEFAULT_WORKLOAD, "engine": EngineConfig()}.get(self.path[0])
        if record is None:
            return {f.name: f.default for f in fields(SimConfig)}.get(self.path[0])
        return getattr(record, self.path[1])


FLAGS = (
    Flag("--model", ("model",), str, f"model: a catalog name ({', '.join(MODELS)}) or a Hugging Face "
                                          f"config.json (the file or its folder; docs/models.md)"),
    Flag("--device", ("device",), str, f"GPU: {', '.join(GPUS)}"),
    Flag("--cost-model", ("cost_model",), str, f"cost model: {COST_MODEL_FORMS}"),
    Flag("--drafter", ("drafter",), str, "what drafts, as priced: eagle1 (EAGLE-1/2, the target's LM head), eagle3 "
         "(EAGLE-3: three-feature fc, its own 32k-token head), medusa (4 heads over the last hidden state, one pass "
         "a round), mtp (the model's own multi-token-prediction module: DeepSeek-V3's default), ngram (prompt lookup: "
         "no GPU work) or draft-model:NAME (a separate draft model, e.g. "
         "draft-model:Vicuna-68M)"),
    Flag("--tp", ("tp",), int, "tensor-parallel GPUs per replica: 1, 2, 4 or 8 (weights, KV heads and the vision "
         "tower sharded; two all-reduces a layer, docs/models.md)"),
    Flag("--draft-tp", ("draft_tp",), int, "GPUs the drafter is sharded over: 1 or the target's --tp (default: "
         "the target's, as vLLM and SGLang run it; vllm and sglang accept only that, docs/engines.md)"),
    Flag("--replicas", ("replicas",), int, f"identical replicas serving the workload together behind --router "
         f"(1..{routers.MAX_REPLICAS}; the rate is the fleet's)"),
    Flag("--router", ("router",), str, f"what sends each request to a replica: {', '.join(routers.ROUTERS)}"),
    Flag("--router-staleness-ms", ("router_staleness_ms",), float, "how late a router that reads the replicas' "
         f"load hears that a request finished (0..{routers.MAX_STALENESS_MS:g} ms; default 0: at once)"),
    Flag("--acceptance", ("acceptance",), str, "acceptance preset (see `simspec presets`), iid:P or an "
         "acceptance.json; unset, the default preset, or with an eagle3 or mtp drafter the preset measured on the "
         "model with it where there is one (EAGLE-3/Llama-3.3-70B, MTP/DeepSeek-V3...)"),
    Flag("--seed", ("seed",), int, "random seed of the run"),
    Flag("--slo-ttft-ms", ("slo_ttft_ms",), float, "TTFT SLO for request_goodput"),
    Flag("--slo-tpot-ms", ("slo_tpot_ms",), float, "TPOT SLO for request_goodput"),
    Flag("--slo-e2el-ms", ("slo_e2el_ms",), float, "E2EL SLO for request_goodput"),
    Flag("--arrival", ("workload", "arrival"), str, "poisson, gamma, onoff or trace"),
    Flag("--rate", ("workload", "rate_per_s"), float, "mean request rate, requests/s"),
    Flag("--burstiness", ("workload", "burstiness"), float, "Gamma shape as vLLM's --burstiness (CV = 1/sqrt)"),
    Flag("--num-requests", ("workload", "num_requests"), int, "requests to serve"),
    Flag("--duration", ("workload", "duration_s"), float, "or: seconds of arrivals to serve"),
    Flag("--multimodal-share", ("workload", "multimodal_share"), float, "share of requests with images"),
    Flag("--images-min", ("workload", "images_min"), int, "images per multimodal request, at least"),
    Flag("--images-max", ("workload", "images_max"), int, "images per multimodal request, at most"),
    Flag("--prompt-mean", ("workload", "prompt_mean_tokens"), float, "mean text prompt tokens"),
    Flag("--output-mean", ("workload", "output_mean_tokens"), float, "mean output tokens"),
    Flag("--trace", ("workload", "trace_path"), str, "replay a trace (Azure CSV or Mooncake JSONL)"),
    Flag("--trace-speedup", ("workload", "trace_speedup"), float, "divide trace arrival times by this"),
    Flag("--on-s", ("workload", "on_s"), float, "onoff: mean burst length, s"),
    Flag("--off-s", ("workload", "off_s"), float, "onoff: mean gap between bursts, s"),
    Flag("--arrival-rescale", ("workload", "arrival_rescale"), str, "vllm: poisson/gamma gaps scaled so the last "
         "request arrives at N/rate, as `vllm bench serve` draws them (default: none)"),
    Flag("--shared-prefix-tokens", ("workload", "shared_prefix_tokens"), int,
         "text requests share their first N prompt tokens (a system prompt; prefix caching)"),
    Flag("--shared-prefixes", ("workload", "shared_prefixes"), int, "distinct shared system prompts (default 1)"),
    Flag("--image-size", ("workload", "image_size"), str,
         "every image's size, WIDTHxHEIGHT pixels, or a distribution each image draws from, WxH:WEIGHT,... (e.g. "
         "448x448:0.5,1920x1080:0.5): a dynamic-resolution model (Qwen2-VL, Qwen2.5-VL) turns each image's size into "
         "its visual tokens, a fixed-size one keeps its count; a trace's image_width/image_height or image_size "
         "column wins (default: the model's own, docs/models.md)"),
    Flag("--mix", ("workload", "mix"), str,
         "request classes and their shares, CLASS:SHARE,... of chat, translate, summarize, qa, math, rag, code (e.g. "
         "code:0.3,chat:0.5,summarize:0.2), or spec-bench (its six alike); each class its own acceptance level "
         "(docs/modelling.md; default: none, every request at the preset's level)"),
    Flag("--temperature", ("workload", "temperature"), float,
         "the requests' sampling temperature, 0 to 1: a preset's acceptance falls with it as the EAGLE papers' pairs "
         "at 0 and 1 say (docs/modelling.md; iid:P and acceptance files are taken as given; default 0, greedy)"),
    Flag("--image-pool", ("workload", "image_pool"), int,
         "multimodal requests show one of N images first (repeats hit the prefix cache; 0: all distinct)"),
    Flag("--prefix-caching", ("engine", "prefix_caching"), bool, "on or off: reuse KV of shared prefixes "
         "(vllm: on, as vLLM V1; simspec, sglang: off)"),
    Flag("--over-context", ("workload", "over_context"), str,
         "a request longer than the model's context: clip (cut to fit, counted) or error"),
    Flag("--engine", ("engine", "kind"), str, "the engine to follow: simspec, vllm (0.33) or sglang; each a preset of "
         "[engine] fields (docs/engines.md)"),
    Flag("--max-num-seqs", ("engine", "max_num_seqs"), int, "requests in the running batch"),
    Flag("--max-num-batched-tokens", ("engine", "max_num_batched_tokens"), int, "token budget per step"),
    Flag("--gpu-memory-utilization", ("engine", "gpu_memory_utilization"), float, "share of GPU memory used"),
    Flag("--mem-fraction-static", ("engine", "mem_fraction_static"), float,
         "--engine sglang: share of GPU memory for weights and KV cache (default: SGLang's own rule)"),
    Flag("--kv-cache-tokens", ("engine", "kv_cache_tokens"), int, "override the KV-cache size in tokens"),
    Flag("--drafter-context", ("engine", "drafter_context"), str, "drafter's view: full, none, selected:K, pooled:K"),
)
"""The scenario flags of ``simulate`` and ``tune``, each setting one config field."""
EXTRA_FLAGS = {"cv": "inter-arrival CV (sets burstiness)", "policy": "policies to compare (a list)",
               "fleet": "a fleet file of replica groups (simspec.fleet.groups)"}
"""Values :func:`from_flags` also takes, beyond :data:`FLAGS`."""


def flag_overrides(values: dict) -> dict:
    """Flag values (keyed by :attr:`Flag.key`, plus ``cv`` and ``policy``;
    None: not given) as config overrides shaped like a config file."""
    out: dict = {}
    for flag in FLAGS:
        value = values.get(flag.key)
        if value is None:
            continue
        if len(flag.path) == 1:
            out[flag.path[0]] = value
        else:
            out.setdefault(flag.path[0], {})[flag.path[1]] = value
    workload = out.setdefault("workload", {})
    require(values.get("cv") is None or values.get("burstiness") is None,
            "--cv and --burstiness both set the arrivals' burstiness (CV = 1/sqrt(burstiness)): give one")
    if values.get("cv") is not None:
        workload["burstiness"] = cv_to_burstiness(values["cv"])
    if values.get("trace") is not None and "arrival" not in workload:
        workload["arrival"] = "trace"
    if values.get("policy"):
        out["policies"] = list(values["policy"])
    if values.get("fleet"):
        for key, value in fleet_groups.load(values["fleet"]).items():
            out.setdefault(key, value)  # --router and --router-staleness-ms over the file's
    return out


def from_flags(values: dict, config_file: str | Path | None = None) -> SimConfig:
    """The scenario of flag ``values`` (:func:`flag_overrides`) over a
    config file's, over the defaults: what ``simspec simulate`` runs."""
    return build(load(config_file) if config_file else {}, flag_overrides(values))


__all__ = ["SimConfig", "DEFAULT_POLICIES", "DEFAULT_WORKLOAD", "FLAGS", "Flag", "load", "build", "to_toml",
           "flag_overrides", "from_flags", "group_config"]
