"""The dashboard's entry script: ``streamlit run`` runs this file (``simspec
dashboard`` does it for you), and it routes to the pages.

Imports: streamlit. Pages are files next to this one, run by Streamlit:
``page_whatif.py`` (the what-if), ``page_plan.py`` (the capacity plan) and
``page_profiles.py`` (device profiles and validation runs).
"""

from __future__ import annotations

import streamlit as st

# Streamlit runs this file as __main__; the what-if's worker processes (spawned)
# import __main__ again, as __mp_main__, and must not run the app.
if __name__ == "__main__":
    st.set_page_config(page_title="simspec what-if", layout="wide")
    st.navigation([
        st.Page("page_whatif.py", title="What-if", default=True),
        st.Page("page_plan.py", title="Capacity plan"),
        st.Page("page_profiles.py", title="Profiles and validation"),
    ]).run()
