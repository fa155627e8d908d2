"""The planning page: traffic, SLOs, candidate GPUs, TP degrees,
policies, routers and disaggregated units in; the cheapest fleet that meets every SLO out, with the ranked
candidates, the Pareto plot of cost against the tightest SLO, and the
winner's launch settings. The search is ``simspec plan``'s
(:func:`simspec.plan.plan`), run when *Plan* is pressed and cached.

Imports: streamlit, simspec's public API (config, plan, costs, fleet.routers,
workloads), simspec_dashboard.uploads.
"""

from __future__ import annotations

import tomllib

import streamlit as st

from simspec import config as configuration, plan as planning
from simspec.costs import MODELS
from simspec.costs.specs import TP_DEGREES
from simspec.fleet.routers import ROUTERS
from simspec.serving import modes
from simspec.types import InputError
from simspec.workloads import WorkloadConfig, cv_to_burstiness
from simspec_dashboard.uploads import Refused, stop, uploaded_trace

SIM = configuration.SimConfig()
WORKLOAD = configuration.DEFAULT_WORKLOAD
PLAN = planning.PlanConfig(slos=(planning.parse_slo("p99_ttft_ms=2000"),))  # the defaults (an SLO is required)
SYNTHETIC, TRACE = "synthetic", "uploaded trace"
SLO_WIDGETS = (("p99_ttft_ms", 2000.0), ("p99_tpot_ms", 50.0), ("p99_e2el_ms", 0.0))  # 0: no bound
SHOWN = ("rank", "status", "device", "tp", "max_num_seqs", "policy", "engine", "router", "split", "replicas", "gpus",
         "usd_per_hour", "headroom_per_s", "tokens_per_usd", "tightest_slo", "tightest_ratio")


def plan_config(settings: tuple) -> planning.PlanConfig:
    """The plan's settings (hashable: the cache's key) as the search takes them."""
    s = dict(settings)
    return planning.PlanConfig(**{**s, "slos": tuple(planning.parse_slo(x) for x in s["slos"]),
                                  "prices": dict(s["prices"])})


@st.cache_data(show_spinner=False, max_entries=16)
def run_plan(config_toml: str, settings: tuple) -> tuple[planning.Plan, str]:
    """The cached search: keyed by the scenario (as TOML) and the plan's settings."""
    base = configuration.build(tomllib.loads(config_toml))
    result = planning.plan(base, plan_config(settings))
    return result, planning.launch(result, base)


def _numbers(text: str, cast, label: str) -> tuple:
    try:
        return tuple(cast(x) for x in text.replace(";", ",").split(",") if x.strip())
    except ValueError:
        raise Refused(f"{label} must be numbers separated by commas (got {text!r})") from None


def _traffic(sb) -> tuple[dict, float]:
    """The model, engine and workload widgets: simspec.config.from_flags' values, and the growth."""
    sb.header("Model and traffic")
    model = sb.selectbox("Model (model)", list(MODELS), index=list(MODELS).index(SIM.model), key="plan_model")
    model_config = sb.text_input("…or its config.json (model)", value="", key="plan_model_config",
                                 placeholder="path to a Hugging Face config.json or its folder")
    flags: dict = {"model": model_config.strip() or model}
    flags["engine"] = sb.selectbox("Engine (engine)", modes.KINDS, index=modes.KINDS.index(SIM.engine.kind),
                                   key="plan_engine")
    if sb.radio("Requests from", (SYNTHETIC, TRACE), horizontal=True, key="plan_source") == SYNTHETIC:
        flags["arrival"] = "gamma"
        flags["rate"] = sb.number_input("Rate (rate_per_s, requests/s)", value=WORKLOAD.rate_per_s, step=1.0,
                                        key="plan_rate")
        flags["cv"] = sb.number_input("Inter-arrival CV (burstiness = 1/CV²; 1 is Poisson)",
                                      value=WORKLOAD.burstiness ** -0.5, step=0.25, key="plan_cv")
        try:
            cv_to_burstiness(flags["cv"])
        except InputError as err:
            raise Refused(f"Inter-arrival CV: {err}") from None
    else:
        flags["trace"] = uploaded_trace(sb, "plan_trace")
        flags["trace_speedup"] = WorkloadConfig().trace_speedup
    growth = sb.number_input("Growth (growth: the traffic x this)", value=PLAN.growth, step=0.5, key="plan_growth")
    flags["multimodal_share"] = sb.slider("Multimodal share (multimodal_share)", 0.0, 1.0,
                                          WORKLOAD.multimodal_share, 0.05, key="plan_multimodal_share")
    return flags, float(growth)


def _slos(sb) -> tuple[str, ...]:
    sb.header("SLOs (0: no bound)")
    slos = []
    for metric, default in SLO_WIDGETS:
        bound = sb.number_input(f"{metric} at most", value=default, step=10.0, key=f"plan_{metric}")
        if bound:
            slos.append(f"{metric}={bound:g}")
    if not slos:
        raise Refused("SLOs: give at least one bound (e.g. p99_ttft_ms 2000)")
    return tuple(slos)


def _candidates(sb) -> dict:
    """The candidate GPUs (with their prices), TP degrees, policies, engine modes, routers, disaggregated units
    and batch limits."""
    sb.header("Candidates")
    devices = sb.multiselect("GPUs (devices)", list(planning.PRICES), default=list(PLAN.devices), key="plan_devices")
    if not devices:
        raise Refused("GPUs (devices): choose at least one")
    tps = sb.multiselect("Tensor-parallel degrees (tp)", TP_DEGREES, default=list(PLAN.tps), key="plan_tps")
    if not tps:
        raise Refused("Tensor-parallel degrees (tp): choose at least one")
    policy_text = sb.text_input("Policies, comma-separated (policies)", value=",".join(PLAN.policies),
                                key="plan_policies")
    specs = tuple(s.strip() for s in policy_text.split(",") if s.strip())
    if not specs:
        raise Refused("policies must name at least one policy (got none)")
    engines = sb.multiselect("Engine modes (engines; none: the engine above)", list(modes.KINDS), default=[],
                             key="plan_engines")
    routers = sb.multiselect("Routers (routers; none: round_robin)", list(ROUTERS), default=[], key="plan_routers")
    try:
        splits = planning.parse_splits(sb.text_input("Disaggregated units, P:D,... (splits; empty: none)", value="",
                                                     key="plan_splits"))
    except InputError as err:
        raise Refused(str(err)) from None
    prefill_devices = sb.multiselect("Prefill GPUs of those units (prefill_devices; none: the decode side's)",
                                     list(planning.PRICES), default=[], key="plan_prefill_devices")
    batch_limits = _numbers(sb.text_input("Batch limits (max_num_seqs; empty: the engine's)", value="",
                                          key="plan_batch_limits"), int, "max_num_seqs")
    with sb.expander("Prices ($ per GPU-hour)"):
        st.caption(planning.PRICES_SOURCE)
        prices = tuple((d, float(st.number_input(d, value=planning.PRICES[d], step=0.1, key=f"plan_price_{d}")))
                       for d in sorted({*devices, *prefill_devices}))
    return dict(devices=tuple(devices), tps=tuple(int(t) for t in tps), policies=specs, engines=tuple(engines),
                routers=tuple(routers), splits=splits, prefill_devices=tuple(prefill_devices),
                batch_limits=batch_limits, prices=prices)


def _search(sb) -> tuple[dict, int]:
    """The search's size, and the seed."""
    with sb.expander("Search"):
        requests = st.number_input("Requests per capacity probe (requests)", value=PLAN.requests, step=50,
                                   key="plan_requests")
        confirm_seeds = st.number_input("Seeds per confirmation (confirm_seeds)", value=PLAN.confirm_seeds,
                                        key="plan_confirm_seeds")
        finalists = st.number_input("Finalists (finalists)", value=PLAN.finalists, key="plan_finalists")
        jobs = st.number_input("Worker processes (jobs)", value=PLAN.jobs, key="plan_jobs")
        seed = st.number_input("Seed (seed)", value=SIM.seed, step=1, key="plan_seed")
    return dict(requests=int(requests), confirm_seeds=int(confirm_seeds), finalists=int(finalists),
                jobs=int(jobs)), int(seed)


def sidebar() -> tuple[configuration.SimConfig, tuple]:
    """Read the widgets into the scenario and the plan's settings (hashable); raise Refused naming the bad input."""
    sb = st.sidebar
    flags, growth = _traffic(sb)
    slos = _slos(sb)
    candidates = _candidates(sb)
    search, seed = _search(sb)
    settings = tuple(sorted({**candidates, **search, "slos": slos, "growth": growth}.items()))
    try:
        base = configuration.from_flags({**flags, "seed": seed})
        plan_config(settings)  # checked here, so that an error names its widget before any search
    except InputError as err:
        raise Refused(str(err)) from None
    return base, settings


def show(result: planning.Plan, command: str) -> None:
    w = result.winner
    cols = st.columns(4)
    cols[0].metric("Traffic", f"{result.target_per_s:.3g} req/s")
    if w is not None:
        c = w.candidate
        cols[1].metric("Cheapest fleet", f"{w.replicas} x {c.device} TP{c.tp}")
        cols[2].metric("Cost", f"${w.usd_per_hour:,.2f}/h")
        cols[3].metric("Output tokens per $", f"{w.tokens_per_usd:,.0f}")
        st.success(planning.verdict(result))
    else:
        st.warning(planning.verdict(result))
    if result.ranking:
        st.caption(result.ranking)
    n = len(result.rows)
    st.caption(f"{n} candidates: {result.unfit} do not fit, {result.pruned} cannot meet the SLOs at any count, "
               f"{sum(r.status in ('confirmed', 'missed') for r in result.rows)} confirmed as whole fleets; "
               f"{result.simulated_requests:,} requests simulated.")
    frame = planning.frame(result)
    st.subheader("Candidates, cheapest first")
    st.dataframe(frame[[c for c in (*SHOWN, *(s.metric for s in result.slos), "note") if c in frame]],
                 hide_index=True)
    st.download_button("plan.csv", frame.to_csv(index=False), file_name="plan.csv", mime="text/csv",
                       key="plan_download")
    if planning.pareto(result):
        st.subheader("Cost against the tightest SLO")
        st.image(planning.pareto_plot(result), width=720)
        st.caption("Each point a fleet served at the traffic; below the red line it meets every SLO. The dashed "
                   "line joins the fleets no other beats on both cost and the tightest SLO.")
    if command:
        st.subheader(f"Launch one replica (of {w.replicas})")
        st.code(command, language="bash")


def main() -> None:
    st.title("Capacity plan")
    st.caption("Which GPUs, tensor-parallel degree, replica count and speculative policy serve this traffic "
               "within the SLOs for the least money? The search of `simspec plan` (docs/planning.md): each "
               "candidate's one-replica capacity by bisection, fleets sized from it, the cheapest confirmed as "
               "whole fleets on common seeds.")
    try:
        base, settings = sidebar()
    except Refused as err:
        stop(err)
    key = (configuration.to_toml(base), settings)
    if st.button("Plan", type="primary", key="plan_run"):
        st.session_state["plan_key"] = key
    if st.session_state.get("plan_key") != key:
        st.info("Set the traffic, SLOs and candidates on the left, then press **Plan**.")
        st.stop()
    try:
        with st.spinner("planning..."):
            result, command = run_plan(*key)
    except InputError as err:
        stop(err)
    show(result, command)


if __name__ == "__main__":  # as Streamlit runs a page (not when a worker imports it)
    main()
