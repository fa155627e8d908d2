"""The profiles page: which device x model cost models are calibrated,
partly calibrated or uncalibrated, and what each device's live-vs-simulated
validation found.

Imports: streamlit, pandas, simspec's public API (costs), simspec_dashboard.whatif.
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from simspec import config as configuration
from simspec.costs import MODELS
from simspec_dashboard import whatif

SIM = configuration.SimConfig()


@st.cache_data(show_spinner=False, max_entries=128)
def profile_status(device: str, model: str) -> whatif.ProfileStatus:
    return whatif.profile_status(device, model)


def main() -> None:
    st.title("Profiles and validation")
    st.caption("A cost model is *calibrated* when it is fitted to profiles measured on the device, *partly "
               "calibrated* when some operators fall back to the datasheet roofline prior, *uncalibrated* when "
               "all of it is the prior. Profile a device with `simspec profile-gpu`; check the simulator against "
               "the live engine with `simspec validate`.")
    models = list(MODELS)
    model = st.selectbox("Model (model)", models, index=models.index(SIM.model), key="profiles_model")
    rows = []
    for device in whatif.devices():
        s = profile_status(device, model)
        rows.append({"device": device, "cost model": s.calibration, "validated": "yes" if s.validated else "no",
                     "fitted from": ", ".join(s.profiles) or "-", "label": s.cost_model})
    st.subheader(f"Cost models of {model}")
    st.dataframe(pd.DataFrame(rows).set_index("device"))

    st.subheader("Validation runs")
    shown = set()
    for device in whatif.devices():
        v = whatif.validation_for(device)
        if v is None or v.folder in shown:
            continue
        shown.add(v.folder)
        st.markdown(f"**{device}** — `{v.folder.name}/` ({v.model}, the live engine's model)")
        st.info(v.headline)
        cdf = v.folder / "latency_cdf.png"
        if cdf.is_file():
            st.image(str(cdf), caption="live vs simulated E2E latency CDFs", width=720)
    if not shown:
        st.warning("No validation runs found: run `simspec validate --out validation/<device>`.")


if __name__ == "__main__":  # as Streamlit runs a page (not when a worker imports it)
    main()
