"""The explorer's figure sections: which layer group is shown, and each figure's tab (key <-> family)."""
import streamlit as st

from tpviz.render import summary as S
from tpviz.render.plots.strip import layer_strip
from tpviz.trace.shardmap import ShardMap


def family_of(key: str) -> str:
    """A figure key's family ('qkv', 'experts', 'memory'): keys of a layer group's figures start 'group2_'."""
    return key.split("_", 1)[1] if key.startswith("group") and "_" in key else key


def tab_label(key: str) -> str:
    """A figure's tab: 'q/k/v', 'gate/up', 'memory'."""
    family = family_of(key)
    return "memory" if family == "memory" else S.FAMILY_LABELS.get(family, family).split(" (")[0]


def layer_groups(m: ShardMap, config: dict) -> int | None:
    """The layer strip and the group picker; returns the selected group's index (None: all layers)."""
    labels = [f"{i + 1}. {g.label} · layers {S.layer_span(g.layers)}" for i, g in enumerate(m.groups)]
    options = list(range(len(labels))) + [-1]
    if st.session_state.get("layer_group") not in options:  # opens on the group with the most layers
        st.session_state.layer_group = max(range(len(m.groups)), key=lambda i: (len(m.groups[i].layers), -i))
        st.session_state.group_auto = st.session_state.layer_group  # a link names a group only once picked
    group = st.session_state.layer_group
    # keyed by the group, so a click's own selection highlight is dropped once the group is shown
    event = st.plotly_chart(layer_strip(m, group if group >= 0 else None), theme=None, key=f"strip_{group}",
                            on_select="rerun", selection_mode="points", config=config)
    points = event.get("selection", {}).get("points", []) if isinstance(event, dict) else []
    if points and points[0].get("customdata") is not None and int(points[0]["customdata"]) != group:
        st.session_state.layer_group = int(points[0]["customdata"])
        st.rerun()
    chosen = st.radio("Layer group", options, key="layer_group", horizontal=False,
                      format_func=lambda i: "All layers" if i < 0 else labels[i])
    return None if chosen < 0 else chosen
