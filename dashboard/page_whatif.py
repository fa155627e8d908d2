"""The what-if page: pick a device, model, workload, acceptance model and
policies; see latency per policy at your rate, latency and speedup over AR
across loads, the plan mix over time and acceptance length.

Imports: streamlit, pandas, simspec's public API, simspec_dashboard.whatif and .uploads.
Every widget default comes from a config dataclass (SimConfig, the default
workload, DashboardConfig); widget labels name the config field they set,
so a validation message ("rate_per_s must be > 0") points at its widget.
Bad input ends the page with one ``st.error``, never a traceback.
"""

from __future__ import annotations

import tomllib
from dataclasses import fields

import pandas as pd
import streamlit as st

from simspec import config as configuration
from simspec.serving import modes
from simspec.acceptance import PRESETS
from simspec.costs import MODELS
from simspec.costs.specs import TP_DEGREES
from simspec.fleet import groups as fleet_groups
from simspec.fleet.routers import MAX_REPLICAS, ROUTERS
from simspec.policies import POLICIES
from simspec.types import InputError
from simspec.workloads import WorkloadConfig, cv_to_burstiness
from simspec_dashboard import whatif
from simspec_dashboard.uploads import Refused, stop, uploaded_trace
from simspec_dashboard.whatif import PLAN_KINDS, DashboardConfig

SIM = configuration.SimConfig()
WORKLOAD = configuration.DEFAULT_WORKLOAD
DASH = DashboardConfig()
CUSTOM_ACCEPTANCE = "custom: iid:P or a calibrated acceptance.json"
SYNTHETIC, TRACE = "synthetic", "uploaded trace"
LATENCY_METRICS = {f"{stat}_{name}_ms": f"{stat} {name.upper()} (ms)"
                   for name in ("e2el", "ttft", "tpot", "itl") for stat in ("mean", "median", "p95", "p99")}
TABLE = {"mean_e2el_ms": "mean E2EL", "median_e2el_ms": "median E2EL", "p95_e2el_ms": "p95 E2EL",
         "p99_e2el_ms": "p99 E2EL", "mean_ttft_ms": "mean TTFT", "p95_ttft_ms": "p95 TTFT",
         "mean_tpot_ms": "mean TPOT", "spec_decode_acceptance_length": "accept length",
         "plan_share_tree": "tree rounds", "plan_share_linear": "linear rounds"}
SPEEDUP = "speedup vs AR"


@st.cache_data(show_spinner=False, max_entries=128)
def profile_status(device: str, model: str, tp: int = 1) -> whatif.ProfileStatus:
    return whatif.profile_status(device, model, tp)


@st.cache_data(show_spinner=False, max_entries=64)
def run_what_if(config_toml: str, loads: tuple[float, ...], num_requests: int, workers: int) -> whatif.WhatIf:
    """The cached what-if: keyed by the resolved config (as TOML) and the dashboard settings."""
    config = configuration.build(tomllib.loads(config_toml))
    return whatif.what_if(config, DashboardConfig(loads=loads, num_requests=num_requests, workers=workers))


@st.cache_resource(show_spinner=False)
def warm(workers: int) -> None:
    whatif.warm(workers)  # start the pool while the user reads the page


def _engine_policies() -> None:
    """A new engine starts from the policies it can run (its defaults)."""
    kind = st.session_state["engine"]
    st.session_state["policies"] = "\n".join(modes.DEFAULT_POLICIES.get(kind, DASH.policies))


def sidebar() -> tuple[configuration.SimConfig, DashboardConfig]:
    """Read the widgets into a config; raise Refused naming the bad input."""
    sb = st.sidebar
    sb.header("Scenario")
    model = sb.selectbox("Model (model)", list(MODELS), index=list(MODELS).index(SIM.model), key="model")
    model_config = sb.text_input("…or its config.json (model)", value="", key="model_config",
                                 placeholder="path to a Hugging Face config.json or its folder",
                                 help="a model from its own config file, read as `--model PATH` reads it "
                                      "(docs/models.md); when given it replaces the catalog choice")
    if model_config.strip():
        model = model_config.strip()
    tp = sb.selectbox("GPUs per replica (tp)", TP_DEGREES, index=TP_DEGREES.index(SIM.tp), key="tp",
                      help="tensor parallelism: the model sharded over this many GPUs of one node (docs/models.md)")
    device_names = whatif.devices()
    device = sb.selectbox("Device profile (device)", device_names, index=device_names.index(SIM.device), key="device",
                          format_func=lambda d: f"{d} · {profile_status(d, model, tp).calibration}")
    engine = sb.selectbox("Engine (engine)", modes.KINDS, index=modes.KINDS.index(SIM.engine.kind), key="engine",
                          on_change=_engine_policies,
                          help="simspec: every policy on simspec's own engine; vllm / sglang: that engine's "
                               "defaults on this device and only the policies it can run (docs/engines.md)")
    names = [p.name for p in PRESETS.values()]
    choice = sb.selectbox("Acceptance model (acceptance)", [*names, CUSTOM_ACCEPTANCE],
                          index=names.index(SIM.acceptance), key="acceptance")
    acceptance = choice if choice != CUSTOM_ACCEPTANCE else sb.text_input(
        "acceptance spec", value="iid:0.7", key="acceptance_custom").strip()

    sb.header("Workload")
    source = sb.radio("Requests from", (SYNTHETIC, TRACE), horizontal=True, key="source")
    num_requests = sb.number_input(f"Requests per run (num_requests; dashboard default {DASH.num_requests})",
                                   value=DASH.num_requests, step=50, key="num_requests")
    flags: dict = {"num_requests": int(num_requests)}  # simspec.config.from_flags' values
    if source == SYNTHETIC:
        arrivals = ("gamma", "poisson", "onoff")
        flags["arrival"] = sb.selectbox("Arrivals (arrival)", arrivals, index=arrivals.index(WORKLOAD.arrival),
                                        key="arrival")
        flags["rate"] = sb.number_input("Rate (rate_per_s, requests/s)", value=WORKLOAD.rate_per_s, step=1.0,
                                        key="rate")
        if flags["arrival"] == "gamma":
            flags["cv"] = sb.number_input("Inter-arrival CV (burstiness = 1/CV²)", value=WORKLOAD.burstiness ** -0.5,
                                          step=0.25, key="cv")
            try:
                cv_to_burstiness(flags["cv"])
            except InputError as err:
                raise Refused(f"Inter-arrival CV: {err}") from None
        elif flags["arrival"] == "onoff":
            flags["on_s"] = sb.number_input("Burst length (on_s, s)", value=WORKLOAD.on_s, key="on_s")
            flags["off_s"] = sb.number_input("Gap between bursts (off_s, s)", value=WORKLOAD.off_s, key="off_s")
    else:
        flags["trace"] = uploaded_trace(sb, "trace")
        flags["trace_speedup"] = sb.number_input("Trace speedup (trace_speedup: arrival times divided by)",
                                                    value=WorkloadConfig().trace_speedup, key="trace_speedup")
    flags["multimodal_share"] = sb.slider("Multimodal share (multimodal_share; traces without images)",
                                             0.0, 1.0, WORKLOAD.multimodal_share, 0.05, key="multimodal_share")
    with sb.expander("Lengths and images"):
        flags["prompt_mean"] = st.number_input("Mean text prompt (prompt_mean_tokens)",
                                               value=WORKLOAD.prompt_mean_tokens, key="prompt_mean")
        flags["output_mean"] = st.number_input("Mean output (output_mean_tokens)",
                                               value=WORKLOAD.output_mean_tokens, key="output_mean")
        flags["images_max"] = int(st.number_input("Images per multimodal request, at most (images_max)",
                                                     value=WORKLOAD.images_max, key="images_max"))

    sb.header("Fleet")
    replicas = sb.number_input(f"Replicas (replicas, 1..{MAX_REPLICAS}; the rate is the fleet's)", value=SIM.replicas,
                               step=1, key="replicas")
    router = sb.selectbox("Router (router)", ROUTERS, index=ROUTERS.index(SIM.router), key="router")
    fleet_text = sb.text_area("…or groups of different replicas (fleet: a fleet file's TOML)", value="", key="fleet",
                              height=100, placeholder='[[group]]\nreplicas = 2\ndevice = "a100-80gb"',
                              help="[[group]] tables as `simspec simulate --fleet` reads them (docs/fleets.md): "
                                   "each group's unset keys are the scenario's; with groups, Replicas stays 1")

    sb.header("Policies")
    text = sb.text_area("One per line, NAME or NAME:k=v,... (policies)", value="\n".join(DASH.policies), key="policies",
                        height=130)
    with sb.expander("Policies and their parameters"):
        st.table(pd.DataFrame([{"policy": name, "parameters (defaults)": ", ".join(
            f"{f.name}={f.default}" for f in fields(cls)) or "none"} for name, cls in POLICIES.items()]))
    loads_text = sb.text_input("Load levels (loads, x AR saturation rate)",
                               value=", ".join(f"{x:g}" for x in DASH.loads), key="loads")
    seed = sb.number_input("Seed (seed)", value=SIM.seed, step=1, key="seed")
    workers = sb.number_input("Worker processes (workers; 0: in this process)", value=DASH.workers, step=1,
                              key="workers")

    try:
        loads = tuple(float(x) for x in loads_text.replace(";", ",").split(",") if x.strip())
    except ValueError:
        raise Refused(f"loads must be numbers separated by commas (got {loads_text!r})") from None
    specs = [line.strip() for line in text.splitlines() if line.strip()]
    if not specs:
        raise Refused("policies must name at least one policy (got none)")
    try:
        fleet = {}
        if fleet_text.strip():
            try:
                table = tomllib.loads(fleet_text)
            except tomllib.TOMLDecodeError as err:
                raise InputError(f"fleet: not valid TOML ({err})") from None
            fleet = fleet_groups.fleet_overrides(table, "fleet")
        dash = DashboardConfig(loads=loads, num_requests=int(num_requests), workers=int(workers))
        measured_with = PRESETS.get(acceptance.lower())  # an EAGLE-3 preset is priced with the head it was measured with
        if measured_with is not None and measured_with.drafter != "eagle1":
            flags["drafter"] = measured_with.drafter
        values = {**flags, "model": model, "tp": int(tp), "device": device, "acceptance": acceptance,
                  "seed": int(seed), "policy": specs, "engine": engine, "replicas": int(replicas), "router": router}
        config = configuration.build(fleet, configuration.flag_overrides(values))
    except InputError as err:
        raise Refused(str(err)) from None
    return config, dash


def _table(point: whatif.Point) -> pd.DataFrame:
    speed = whatif.speedups(point.metrics)
    df = pd.DataFrame([{"policy": policy, SPEEDUP: speed[policy], **{label: m.get(key) for key, label in TABLE.items()}}
                       for policy, m in point.metrics.items()]).set_index("policy")
    for label in ("tree rounds", "linear rounds"):
        df[label] = df[label].map(lambda x: f"{x:.0%}")
    return df.round({label: 0 if "E2EL" in label else 1 for label in TABLE.values() if label.endswith(("L", "T"))}
                    | {"accept length": 2, SPEEDUP: 2})


def _curve(result: whatif.WhatIf, value) -> pd.DataFrame:
    """Rows: load levels (x saturation); columns: policies."""
    return pd.DataFrame({p: [value(level, p) for level in result.levels] for p in result.at_rate.metrics},
                        index=pd.Index([level.load for level in result.levels], name="load (x AR saturation)"))


def show_status(status: whatif.ProfileStatus) -> None:
    text = f"**Cost model: {status.calibration}** — {status.cost_model}"
    {"calibrated": st.success, "partly calibrated": st.warning}.get(status.calibration, st.error)(text)
    (st.info if status.validated else st.warning)(f"**Validation:** {status.validation}")


def show(result: whatif.WhatIf) -> None:
    config, at = result.config, result.at_rate
    load_now = at.rate_per_s / result.saturation_req_s
    cols = st.columns(4)
    cols[0].metric("AR saturation", f"{result.saturation_req_s:.2f} req/s")
    cols[1].metric(f"Your rate ({load_now:.2f} x saturation)", f"{at.rate_per_s:.2f} req/s")
    best = min(at.metrics, key=lambda p: at.metrics[p]["mean_e2el_ms"])
    cols[2].metric("Lowest mean E2EL at your rate", best)
    cols[3].metric("Its speedup over AR", f"{whatif.speedups(at.metrics)[best]:.2f}x")
    if result.baseline_added:
        st.caption("`ar` was added: it is the baseline of every speedup.")

    st.caption(modes.describe(config.engine))
    if config.fleet:
        st.caption(f"fleet behind {config.router}: {fleet_groups.describe(config.fleet)}; AR saturation is the "
                   f"groups' summed")
    elif config.replicas > 1:
        st.caption(f"fleet: {config.replicas} replicas behind {config.router}; AR saturation is the fleet's")
    st.subheader("Latency per policy at your rate")
    st.dataframe(_table(at))
    st.caption("Latencies in ms (vLLM `bench serve` definitions); speedup vs AR = AR's mean E2EL / the "
               "policy's; tree / linear rounds: share of verification rounds that verified a tree / a linear draft.")

    st.subheader("Latency vs load")
    keys = list(LATENCY_METRICS)
    metric = st.selectbox("Latency", keys, index=keys.index("p95_e2el_ms"), format_func=LATENCY_METRICS.get,
                          key="curve_metric")
    st.line_chart(_curve(result, lambda level, p: level.metrics[p][metric]), x_label="load (x AR saturation)",
                  y_label=LATENCY_METRICS[metric])
    left, right = st.columns(2)
    with left:
        st.subheader("Speedup over AR (mean E2EL)")
        st.line_chart(_curve(result, lambda level, p: whatif.speedups(level.metrics)[p]),
                      x_label="load (x AR saturation)", y_label="x AR")
    with right:
        st.subheader("Acceptance length")
        st.line_chart(_curve(result, lambda level, p: level.metrics[p]["spec_decode_acceptance_length"]),
                      x_label="load (x AR saturation)", y_label="tokens per round")
    st.markdown("**Acceptance length vs load** (tokens emitted per verification round, bonus token included)")
    st.dataframe(_curve(result, lambda level, p: level.metrics[p]["spec_decode_acceptance_length"]).round(2).T
                 .rename(columns=lambda x: f"{x:g}x"))

    st.subheader("Plan mix over time")
    points = {f"your rate ({at.rate_per_s:.2f} req/s)": at}
    points |= {f"{level.load:g} x saturation ({level.rate_per_s:.2f} req/s)": level for level in result.levels}
    point = points[st.selectbox("Served at", list(points), key="mix_at")]
    cols = st.columns(2)
    for k, (policy, shares) in enumerate(point.mix.items()):
        with cols[k % 2]:
            st.markdown(f"**{policy}**")
            st.area_chart(pd.DataFrame(shares.T, columns=list(PLAN_KINDS), index=pd.Index(point.mix_time_s.round(2),
                                                                                          name="time (s)")),
                          x_label="time (s)", y_label="share", height=220)
    st.markdown("**Tree rounds vs load** (share of verification rounds that verified a tree)")
    st.dataframe(_curve(result, lambda level, p: level.metrics[p].get("plan_share_tree", 0.0)).T
                 .map(lambda x: f"{x:.0%}").rename(columns=lambda x: f"{x:g}x"))
    st.caption(f"{result.requests} requests per run, {len(result.levels) + 1} runs x {len(config.policies)} "
               f"policies, seed {config.seed}; computed in {result.wall_s:.1f} s (results are cached).")


def main() -> None:
    st.title("simspec what-if")
    st.caption("Which speculative-decoding verification policy should this replica use, and what latency will "
               f"users see? Each run serves {DASH.num_requests} requests by default: enough for stable means and "
               "p95s within seconds; raise *Requests per run* for tighter tails.")
    try:
        config, dash = sidebar()
    except Refused as err:
        stop(err)
    warm(dash.workers)
    show_status(profile_status(config.device, config.model, config.tp))
    st.caption(f"{config.model} on {config.device} · acceptance {config.acceptance} · drafter context "
               f"{config.engine.drafter_context}")
    try:
        with st.spinner("simulating..."):
            result = run_what_if(configuration.to_toml(config), dash.loads, dash.num_requests, dash.workers)
    except InputError as err:
        stop(err)
    show(result)


if __name__ == "__main__":  # as Streamlit runs a page (not when a worker imports it)
    main()
