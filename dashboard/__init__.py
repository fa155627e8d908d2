"""The what-if dashboard, shipped as ``simspec_dashboard`` (``simspec dashboard``).

Imports: stdlib only here. ``whatif`` holds the computation (simspec's
public API, no Streamlit), ``app`` is the Streamlit entry script and the
``page_*`` modules are its pages (run by Streamlit, never imported).
"""

from __future__ import annotations

from pathlib import Path

APP = Path(__file__).with_name("app.py")  # what `streamlit run` is given

__all__ = ["APP"]
