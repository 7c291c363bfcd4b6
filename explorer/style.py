"""Page CSS shared by every page: on a narrow screen (a phone, or a laptop with the sidebar open) the wide
figures scroll sideways instead of squeezing their source and rank panels into each other, and Plotly's
toolbar (which would cover the titles) is hidden; the header's numbers wrap instead of being cut off with an
ellipsis."""
import streamlit as st

# the explorer's figures: no logo, and no selection tools (a shard map is not a data set)
PLOTLY_CONFIG = {"displaylogo": False, "modeBarButtonsToRemove": ["select2d", "lasso2d", "autoScale2d"]}

# below this window width (the sidebar takes about 340 px) figures keep MIN_FIGURE_PX and scroll
NARROW_PX = 1100
MIN_FIGURE_PX = 980
# the explorer's matrix-family figures (keys fig_<family>) keep MIN_FIGURE_PX in any column narrower than it
# (a 1100-1440 px window with the sidebar open too): their labels are placed for that width or more
FAMILY = "div[data-testid=stElementContainer][class*=st-key-fig_]:not(.st-key-fig_speed_terms)"
CSS = f"""<style>
div[data-testid=stMetricValue] > div, [data-testid=stMetricLabel] *,
div[data-testid=stMetricDelta] * {{ white-space: normal !important; overflow-wrap: anywhere;
  text-overflow: clip; overflow: visible !important; }}
div[data-testid=stMetricValue] {{ font-size: clamp(1.25rem, 2.3vw, 2.25rem); }}
{FAMILY} {{ overflow-x: auto; }}
{FAMILY} div[data-testid=stFullScreenFrame] {{ min-width: {MIN_FIGURE_PX}px; }}
@media (max-width: {NARROW_PX}px) {{
  div[data-testid=stElementContainer]:has(div.stPlotlyChart) {{ overflow-x: auto; }}
  div[data-testid=stFullScreenFrame]:has(> div.stPlotlyChart) {{ min-width: {MIN_FIGURE_PX}px; }}
  div.stPlotlyChart .modebar-container {{ display: none; }}
}}
</style>"""


def narrow_screens() -> None:
    """Add the narrow-screen rules to the page (no visible element)."""
    st.html(CSS)
