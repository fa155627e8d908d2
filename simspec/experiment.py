"""One simulation scenario, end to end: the library call behind
``simspec simulate`` and the dashboard.

Imports: numpy, tqdm, simspec's modules. Resolves a :class:`SimConfig` into
a model, a device, a cost model, an acceptance model and a workload, then
serves the same requests with every policy. The seed's workload stream and
the simulator's difficulty and round streams are separate children of it
(simspec.seeds), so policies are compared on common random numbers.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace

import numpy as np
from tqdm import tqdm

from simspec import acceptance, compiled, costs, metrics, policies, seeds, workloads
from simspec.serving import modes
from simspec.config import SimConfig, group_config
from simspec.fleet import disagg, groups as fleet_groups
from simspec.fleet.groups import Group
from simspec.runfolder import RunMeta
from simspec.fleet.run import FleetRun, simulate_fleet
from simspec.sim import simulate
from simspec.types import InputError, Request, RunLog, require

TABLE_COLUMNS = (
    [f"{stat}_{name}_ms" for name in ("ttft", "tpot", "itl", "e2el") for stat in ("mean", "median", "p95", "p99")]
    + ["request_throughput", "output_throughput", "spec_decode_acceptance_length"]
)


@dataclass(frozen=True, slots=True, kw_only=True)
class Scenario:
    """A config resolved into the objects a simulation needs."""

    config: SimConfig
    model: costs.ModelSpec
    gpu: costs.GpuSpec
    costs: costs.CostModel
    acceptance: acceptance.AcceptanceModel
    requests: tuple[Request, ...]
    kv_budget_tokens: int
    clipped_requests: int = 0  # requests cut to the model's context (workload.over_context = "clip")
    members: tuple["Member", ...] = ()  # the fleet's groups, resolved (config.fleet; none: identical replicas)


@dataclass(frozen=True, slots=True, kw_only=True)
class Member:
    """One group of a fleet resolved: its own config, cost model and KV budget."""

    group: Group
    config: SimConfig  # simspec.config.group_config
    model: costs.ModelSpec
    gpu: costs.GpuSpec
    costs: costs.CostModel
    kv_budget_tokens: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Results:
    scenario: Scenario
    logs: tuple[RunLog, ...]
    metrics: dict[str, dict[str, float]]  # {policy: {metric: value}}, metric names as vLLM's
    fleets: tuple[FleetRun, ...] = ()  # per policy: each replica's log and who served what (logs: the merged ones)

    @property
    def meta(self) -> RunMeta:
        """What the run folder's marker says of this run."""
        s = self.scenario
        return RunMeta(kind="simulate", seed=s.config.seed, policies=served_policies(s.config),
                       cost_model=s.costs.label, calibrated=s.costs.calibrated, calibration=s.costs.calibration,
                       acceptance=s.acceptance.name, model=s.model.name, device=s.gpu.slug,
                       kv_budget_tokens=s.kv_budget_tokens, clipped_requests=s.clipped_requests,
                       engine=s.config.engine.kind, engine_version=modes.VERSIONS[s.config.engine.kind])


def model_of(config: SimConfig) -> costs.ModelSpec:
    """The scenario's model: its spec, drafter and tensor-parallel degree,
    at the workload's image size where it gives one size. With a
    distribution of sizes the model keeps its own default size; each image
    then gets its visual tokens from :func:`image_rule`."""
    model = costs.model_spec(config.model, config.drafter, config.tp)
    if config.draft_tp is not None and config.draft_tp != model.draft_degree:
        model = replace(model, draft_tensor_parallel=config.draft_tp)
    if config.workload.image_size is not None:
        sizes = workloads.image_sizes(config.workload.image_size)  # each side already checked by WorkloadConfig
        if len(sizes.sizes) == 1:
            model = model.at_image_size(*sizes.sizes[0])
    return model


def image_rule(model: costs.ModelSpec) -> workloads.ImageRule:
    """``model``'s visual tokens for one image of (width, height) pixels
    (costs.ModelSpec.at_image_size). The cost model prices the vision
    encoder per visual token at ``model``'s patches per token, so an image
    size whose rule gives another ratio is refused rather than mispriced
    (Qwen2-VL's rule gives 4 patches a token at every size)."""

    def tokens(width: int, height: int) -> int:
        sized = model.at_image_size(width, height)
        require(sized.vision_patches_per_image * model.visual_tokens_per_image
                == sized.visual_tokens_per_image * model.vision_patches_per_image,
                f"image_size {width}x{height}: {model.name} gives {sized.vision_patches_per_image} encoder patches for "
                f"{sized.visual_tokens_per_image} visual tokens, another ratio than the "
                f"{model.vision_patches_per_image}:{model.visual_tokens_per_image} its vision encoder is priced at")
        return sized.visual_tokens_per_image

    return tokens


def resolve(config: SimConfig) -> Scenario:
    model = model_of(config)
    gpu = costs.gpu_spec(config.device)
    ss = seeds.stream(config.seed, "workload")
    workload = workloads.make_workload(config.workload, workloads.WorkloadStreams.from_seed_sequence(ss),
                                       visual_tokens_per_image=model.visual_tokens_per_image,
                                       max_context_tokens=model.max_context_tokens,
                                       image_tokens=image_rule(model))
    cost_model = costs.build(config.cost_model, model, gpu, engine=config.engine.kind)
    accepts = acceptance.build(config.acceptance, model.name, config.workload.temperature)
    return Scenario(config=config, model=model, gpu=gpu, costs=cost_model, acceptance=accepts, requests=workload.requests,
                    clipped_requests=workload.clipped, kv_budget_tokens=config.engine.kv_budget_tokens(model, gpu),
                    members=tuple(_member(config, group) for group in config.fleet))


def _member(config: SimConfig, group: Group) -> Member:
    own = group_config(config, group)
    try:
        model, gpu = model_of(own), costs.gpu_spec(own.device)
        return Member(group=group, config=own, model=model, gpu=gpu,
                      costs=costs.build(own.cost_model, model, gpu, engine=own.engine.kind),
                      kv_budget_tokens=own.engine.kv_budget_tokens(model, gpu))
    except InputError as err:
        raise InputError(f"fleet group {group.name}: {err}") from None


def served_policies(config: SimConfig) -> tuple[str, ...]:
    """The runs' labels: the config's policies, or, for a fleet whose every
    group (every decode group, disaggregated) names its policy, the one run
    of those (``"h100 linear:k=3 + a100 ar"``)."""
    serving = [g for g in config.fleet if g.role != disagg.PREFILL]
    if serving and all(g.policy for g in serving):
        return (" + ".join(f"{g.name} {g.policy}" for g in serving),)
    return config.policies


def _policy_of(group: Group, spec: str) -> str:
    return "ar" if group.role == disagg.PREFILL else group.policy or spec


def _per_replica(scenario: Scenario) -> list[Member]:
    """Each replica's group, in the fleet's order of replicas."""
    return [m for m in scenario.members for _ in range(m.group.replicas)]


def replica_groups(scenario: Scenario) -> list[str] | None:
    """Each replica's group name (None: identical replicas, no groups)."""
    return [m.group.name for m in _per_replica(scenario)] or None


def replica_policies(scenario: Scenario, spec: str) -> list[str]:
    """The policy each replica serves in the run of ``spec`` (a group's own,
    else ``spec``; a prefill replica's: ar)."""
    return [_policy_of(m.group, spec) for m in _per_replica(scenario)]


def replica_setups(scenario: Scenario, spec: str) -> list[dict]:
    """Each replica's simspec.sim.simulate arguments for the run of policy
    ``spec`` on the scenario's fleet (a group with its own policy keeps it;
    a group's replicas share one dict, which spec_aware measures once)."""
    serve = {id(m): dict(policy=policies.parse(_policy_of(m.group, spec)), costs=m.costs, engine=m.config.engine,
                         kv_budget_tokens=m.kv_budget_tokens) for m in scenario.members}
    return [serve[id(m)] for m in _per_replica(scenario)]


def run(config: SimConfig, *, progress: bool = False, event_detail: bool = True) -> Results:
    """Serve the scenario's requests with each policy of ``config``."""
    return run_scenario(resolve(config), progress=progress, event_detail=event_detail)


def run_scenario(scenario: Scenario, *, progress: bool = False, event_detail: bool = True) -> Results:
    """Serve a resolved scenario's requests with each policy of its config
    (for a scenario whose parts were changed after :func:`resolve`).
    ``event_detail`` False: the logs keep no per-chunk and per-round arrays
    (simspec.sim.simulate), which the metrics and run folders never read."""
    config = scenario.config
    logs, fleets = [], []
    n = len(scenario.requests)
    compiling = progress and compile_note()
    labels = served_policies(config)
    with tqdm(total=n * len(labels), unit="req", disable=not progress, leave=False) as bar:
        for k, spec in enumerate(labels):
            bar.set_description(spec)

            def advance(done: int, offset=k * n) -> None:
                nonlocal compiling
                if compiling:  # the first call compiled the kernels: the bar's clock starts now
                    compiling = False
                    bar.reset()
                bar.update(offset + done - bar.n)

            common = dict(router=config.router, staleness_s=config.router_staleness_ms / 1e3, label=spec,
                          acceptance=scenario.acceptance, seed=config.seed, progress=advance if progress else None,
                          event_detail=event_detail)
            if fleet_groups.disaggregated(config.fleet):
                run = disagg.serve(scenario.requests, setups=replica_setups(scenario, spec),
                                   roles=[m.group.role for m in _per_replica(scenario)],
                                   link=fleet_groups.parse_link(config.kv_link),
                                   bytes_per_token=max(m.model.kv_bytes_per_token for m in scenario.members), **common)
            elif config.fleet:
                run = simulate_fleet(scenario.requests, replicas=config.fleet_replicas,
                                     setups=replica_setups(scenario, spec), **common)
            else:
                run = simulate_fleet(scenario.requests, replicas=config.replicas, policy=policies.parse(spec),
                                     costs=scenario.costs, engine=config.engine,
                                     kv_budget_tokens=scenario.kv_budget_tokens, **common)
            logs.append(run.log)
            fleets.append(run)
    table = {log.policy: metrics.summarize(log, slo_ttft_ms=config.slo_ttft_ms, slo_tpot_ms=config.slo_tpot_ms,
                                           slo_e2el_ms=config.slo_e2el_ms,
                                           empty_as_zero=config.engine.kind == "vllm")
             for log in logs}
    if config.fleet_replicas > 1:  # the merged log's busy time is the replicas'; the fleet's share is their mean
        for row in table.values():
            row["gpu_busy_fraction"] /= config.fleet_replicas
    return Results(scenario=scenario, logs=tuple(logs), metrics=table, fleets=tuple(fleets))


def compile_note(say=None) -> bool:
    """On a run that will compile the step kernels (nothing cached for this
    code yet), say so on stderr before the progress bar starts; whether it will.
    The kernel checked is the step itself, which the compiled serving loop
    and the Python path (prefix caching, the encoder budget) both compile."""
    if compiled.cached("steps", "run_steps"):
        return False
    where = f"cached in {compiled.CACHE_DIR}" if compiled.CACHING else "not cached: the folder cannot be written"
    (say or (lambda line: print(line, file=sys.stderr, flush=True)))(
        f"compiling the step kernels once (a minute or two; {where})")
    return True


def cost_model_line(scenario: Scenario, width: int | None = 120) -> str:
    """The cost model as every result shows it: its status word first, then
    its label and what to do about it, wrapped at ``width`` columns (None:
    one line)."""
    import textwrap

    c = scenario.costs
    status, advice = {"calibrated": ("CALIBRATED", ""),
                      "partly calibrated": ("PARTLY CALIBRATED", "; profile the rest with `simspec profile-gpu`"),
                      "uncalibrated": ("UNCALIBRATED", "; no profile of this device: run `simspec profile-gpu`"),
                      }[c.calibration]
    line = f"{status} cost model: {c.label}{advice}"
    return line if width is None else "\n".join(textwrap.wrap(line, width, subsequent_indent="  ",
                                                              break_on_hyphens=False))


def saturation_rate(config: SimConfig, *, policy: str = "ar", requests: int = 800) -> float:
    """Requests per second the scenario's replicas sustain with ``policy``
    (:func:`burst_rate` over ``requests`` of the workload's mix): one
    replica's rate times the replicas, or summed over a fleet's groups (a
    disaggregated fleet's decode groups, each measured as if it prefilled
    too: a reference rate, not the split fleet's own)."""
    if config.fleet:
        return sum(saturation_rate(group_config(config, g), policy=policy, requests=requests) * g.replicas
                   for g in config.fleet if g.role != disagg.PREFILL)
    burst = replace(config, replicas=1,
                    workload=replace(config.workload, num_requests=requests, duration_s=None))
    scenario = resolve(burst)
    return config.replicas * burst_rate(scenario.requests, policy=policy, costs=scenario.costs,
                                        acceptance=scenario.acceptance, engine=config.engine,
                                        kv_budget_tokens=scenario.kv_budget_tokens, seed=config.seed)


def rate_at_load(load: float, saturation_per_s: float) -> float:
    """The request rate of ``load``, a multiple of the AR saturation rate
    ``saturation_per_s`` (:func:`saturation_rate`): how a sweep, its time
    estimate, the tuner, the what-if page and validation all turn loads into rates."""
    return load * saturation_per_s


def burst_rate(requests, *, policy: str, costs, acceptance, engine, kv_budget_tokens: int, seed: int) -> float:
    """Requests per second a replica sustains when its queue never empties:
    ``requests`` all arrive at once, and the rate is 90% of them over the
    time the 90% took (the drain at the end, with a shrinking batch, is
    left out)."""
    queue = [replace(r, arrival_s=0.0) for r in requests]
    log = simulate(queue, policy=policies.parse(policy), costs=costs, acceptance=acceptance, engine=engine,
                   kv_budget_tokens=kv_budget_tokens, seed=seed)
    finish = np.sort(log.table.finish_s)
    k = int(0.9 * len(finish))
    return k / finish[k - 1]
