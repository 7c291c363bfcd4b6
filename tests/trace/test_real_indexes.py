"""The regression set: real checkpoints' config.json with their model.safetensors.index.json (tensor names
and total_size only, tests/data/indexes/SOURCES.md says where each came from). Each map names exactly the
index's tensors outside the parts it says it leaves out, and stores what total_size says at tp 1; a
checkpoint tpviz cannot model yet is refused in one line that names why."""
import gzip
import json
from pathlib import Path

import pytest

from tpviz import shard_map
from tpviz.config.spec import DTYPE_BYTES
from tpviz.errors import ConfigError
from tests.helpers.errors import one_line

DATA = Path(__file__).resolve().parents[1] / "data" / "indexes"
FILES = sorted(DATA.glob("*.json.gz"))
# what each refused checkpoint is refused for (until tpviz models it)
REFUSED = {
    "Qwen/Qwen-VL-Chat-Int4": "vLLM served QWenLMHeadModel until 0.23.0",
    "delsakov/mcp_tests": "own model file (models/mistral3.py)",
    # its language_config leaves out the layer and head counts (the checkpoint holds 30 layers):
    # tests/archs/test_multimodal_wrappers.py maps it with them given
    "deepseek-ai/deepseek-vl2": "language_config is missing num_hidden_layers",
    "lmstudio-community/Qwen3-14B-MLX-4bit": "this is an MLX checkpoint",
    "jeevanchaps/Meta-Llama3.1-8B-Instruct-assessment": "quant_method 'bitsandbytes'",
}
# their vision tower is mapped (plan/tower.py): every one of its tensors is named and counted
TOWERS = {"Qwen/Qwen2.5-VL-7B-Instruct": "qwen2_5_vl", "allenai/olmOCR-7B-0225-preview": "qwen2_vl",
          "Qwen/Qwen3-VL-Embedding-8B": "qwen3_vl", "nvidia/Cosmos-Reason2-8B": "qwen3_vl",
          "google/medgemma-27b-it": "siglip", "InJuly7/Qwen3-VL-MoE": "qwen3_vl",
          "openbmb/MiniCPM-V-2_6": "minicpmv", "openbmb/MiniCPM-V-4_5": "minicpmv",
          "openbmb/MiniCPM-V-2": "minicpmv2_0"}
# an embedding checkpoint that names the generation class: vLLM serves it with --runner pooling, which
# builds no lm_head, so the map's lm_head is what the checkpoint lacks
LACKS = {"Qwen/Qwen3-VL-Embedding-8B": ["lm_head.weight"]}


def load(path: Path) -> dict:
    return json.loads(gzip.decompress(path.read_bytes()))


def test_the_set_is_large_and_varied():
    cases = [load(f) for f in FILES]
    assert len(cases) >= 30 and len({c["config"].get("model_type") for c in cases}) >= 20
    assert set(REFUSED) | set(TOWERS) <= {c["repo"] for c in cases}


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name.removesuffix(".json.gz"))
def test_map_against_the_real_index(path):
    case = load(path)
    names = set(case["tensors"])
    if case["repo"] in REFUSED:
        with pytest.raises(ConfigError) as e:
            shard_map(case["config"], 1, tensor_names=names, checkpoint_source=case["repo"])
        assert one_line(e.value) and REFUSED[case["repo"]] in str(e.value)
        return
    m = shard_map(case["config"], 1, tensor_names=names, checkpoint_source=case["repo"])
    check = m.checkpoint
    assert check["missing_in_map"] == [] and check["missing_in_checkpoint"] == LACKS.get(case["repo"], [])
    tower = [t for t in m.tensors if t.tower]
    assert (m.model.tower.kind if tower else None) == TOWERS.get(case["repo"])
    prefixes = m.model.tower.prefixes if tower else ()
    assert sum(t.copies for t in tower) == sum(1 for n in names if any(p in n for p in prefixes))
    if not case["total_size"]:  # two indexes carry no (or a zero) total_size
        return
    # a float32 checkpoint is served in bfloat16 (dtype auto): its stored bytes are twice the map's
    stored = m.total_weight_bytes * DTYPE_BYTES[m.model.config_dtype] / DTYPE_BYTES[m.model.dtype]
    if case["repo"] in LACKS:  # the lm_head it lacks: vocab x hidden
        stored -= m.model.vocab_size * m.model.hidden_size * m.model.dtype_bytes
    ratio = stored / case["total_size"]
    assert abs(ratio - 1) < 0.01, ratio
