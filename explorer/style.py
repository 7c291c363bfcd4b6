"""Page CSS shared by every page: on a phone-sized screen the wide figures scroll sideways instead of squeezing
their source and rank panels into each other, and Plotly's toolbar (which would cover the titles) is hidden."""
import streamlit as st

NARROW_PX = 700  # below this width the figures keep MIN_FIGURE_PX and scroll
MIN_FIGURE_PX = 980
CSS = f"""<style>
@media (max-width: {NARROW_PX}px) {{
  div[data-testid=stElementContainer]:has(div.stPlotlyChart) {{ overflow-x: auto; }}
  div[data-testid=stFullScreenFrame]:has(> div.stPlotlyChart) {{ min-width: {MIN_FIGURE_PX}px; }}
  div.stPlotlyChart .modebar-container {{ display: none; }}
}}
</style>"""


def narrow_screens() -> None:
    """Add the narrow-screen rules to the page (no visible element)."""
    st.html(CSS)
