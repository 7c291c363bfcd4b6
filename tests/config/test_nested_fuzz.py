"""Property: any one value of a preset's config, at any depth (vision_config, audio_config, projector_config,
text_config, or an architecture's own key such as Step-3.5's swiglu_limits), replaced by junk or removed,
gives a valid map or one ValueError line, in the map, the planner and the validity table. test_properties
mutates the decoder's size keys; this reaches every key a preset has."""
import copy

from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.config.test_properties import SETTINGS, map_or_clear_error
from tpviz.config.normalize import normalize
from tpviz.config.sources import presets
from tpviz.deploy.ranking import rank_layouts
from tpviz.trace.validity import valid_table

PRESETS = presets()
GONE = object()  # the key removed
VALUES = st.one_of(st.sampled_from([GONE, None, True, 0, 1, 3, -1, 1.5, "x", "16", [], [1, 2], [[1]], {},
                                    2**19, 2**40]), st.integers(-2, 64))


def leaves(d, path=()):
    """The paths of every value that is not an object: ('vision_config', 'image_size')."""
    for key, value in d.items():
        yield from leaves(value, path + (key,)) if isinstance(value, dict) and value else [path + (key,)]


PATHS = sorted({(name, path) for name, cfg in PRESETS.items() for path in leaves(cfg)})


def mutated(name: str, path: tuple, value) -> dict:
    cfg = copy.deepcopy(PRESETS[name])
    at = cfg
    for key in path[:-1]:
        at = at[key]
    if value is GONE:
        at.pop(path[-1])
    else:
        at[path[-1]] = value
    return cfg


@settings(max_examples=300, **SETTINGS)
@given(where=st.sampled_from(PATHS), value=VALUES, tp=st.sampled_from([1, 2, 8]))
# each of these once took a traceback: an image smaller than its patch (a table of 0 rows), a 2^40-row
# position table, a deepstack list that is a number, a vision model_type that is a list, swiglu_limits true
@example(where=("google/gemma-3-4b-it", ("vision_config", "image_size")), value=3, tp=1)
@example(where=("google/gemma-4-31B-it", ("vision_config", "position_embedding_size")), value=2**40, tp=1)
@example(where=("Qwen/Qwen3.5-9B", ("vision_config", "deepstack_visual_indexes")), value=1.5, tp=1)
@example(where=("llava-hf/llava-onevision-qwen2-7b-ov-hf", ("vision_config", "model_type")), value=[], tp=1)
@example(where=("stepfun-ai/Step-3.5-Flash", ("swiglu_limits",)), value=True, tp=1)
def test_any_value_of_a_preset_maps_or_is_one_line(where, value, tp, shard_map_invariants):
    map_or_clear_error(mutated(*where, value), tp, "vllm", shard_map_invariants)


@settings(max_examples=40, **SETTINGS)
@given(where=st.sampled_from([p for p in PATHS if p[1][0] in ("vision_config", "audio_config")]),
       value=VALUES)
@example(where=("google/gemma-4-31B-it", ("vision_config", "position_embedding_size")), value=2**40)
def test_the_planner_takes_a_mutated_tower_or_says_why_in_one_line(where, value):
    try:
        rank_layouts(normalize(mutated(*where, value)), 8, 80.0)
    except ValueError as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))


@settings(max_examples=20, **SETTINGS)
@given(where=st.sampled_from([p for p in PATHS if p[1][0] in ("vision_config", "audio_config")]),
       value=VALUES)
# `tpviz valid` built a 2^40-row table before the sizes were checked where every plan is made
@example(where=("google/gemma-4-31B-it", ("vision_config", "position_embedding_size")), value=2**40)
@example(where=("google/gemma-3-4b-it", ("vision_config", "image_size")), value=3)
def test_the_validity_table_takes_a_mutated_tower_or_says_why_in_one_line(where, value):
    try:
        valid_table(mutated(*where, value), max_tp=8)
    except ValueError as e:
        assert str(e).strip() and "\n" not in str(e), repr(str(e))
