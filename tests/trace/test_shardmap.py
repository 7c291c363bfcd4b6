"""The shard-map data model: lookups, totals, to_dict/from_dict, and malformed JSON."""
import copy
import json

import pytest

from tpviz import SourceError, shard_map
from tpviz.trace.shardmap import SCHEMA, Piece, ShardMap


@pytest.fixture(scope="module")
def qwen():
    return shard_map("Qwen/Qwen3-0.6B", 2)


def test_lookups(qwen):
    assert Piece(0, 10, 25, 3).size == 15
    q = qwen.tensor("model.layers.*.self_attn.q_proj.weight")
    assert [p.rank for p in q.pieces] == [0, 1] and q.rank_pieces(1)[0].start == 1024
    with pytest.raises(KeyError):
        qwen.tensor("model.layers.0.self_attn.q_proj.weight")  # names use '*', not a layer index
    assert {t.family for t in qwen.family("qkv")} == {"qkv"}
    assert {t.name for t in qwen.family("embed")} == {"model.embed_tokens.weight"}
    assert qwen.model_dtype_bytes == 2


def test_to_dict_shape(qwen):
    d = qwen.to_dict()
    assert list(d)[:5] == ["schema", "tp_size", "rules", "engine", "model"] and d["schema"] == SCHEMA
    assert d["engine"] == "vLLM 0.33"
    emb = d["tensors"][0]
    assert emb["name"] == "model.embed_tokens.weight" and "layers" not in emb and "experts" not in emb
    assert emb["note"].startswith("tied")  # kept when present...
    # ...dropped if empty
    assert "note" not in next(t for t in d["tensors"] if t["name"].endswith("q_proj.weight"))
    json.dumps(d)  # plain JSON types only


def test_from_dict_round_trip(qwen):
    d = json.loads(qwen.to_json(indent=1))
    back = ShardMap.from_dict(d)
    assert back.to_dict() == qwen.to_dict()
    assert back.tensors[0].pieces == qwen.tensors[0].pieces and isinstance(back.tensors[0].pieces[0], Piece)
    assert back.ranks[1].kv_heads == qwen.ranks[1].kv_heads == [4, 5, 6, 7]


@pytest.mark.parametrize("name", ["deepseek-ai/DeepSeek-V3", "google/gemma-3-27b-it",
                                  "TheBloke/Llama-2-13B-chat-GPTQ",
                                  "nvidia/Llama-3.1-70B-Instruct-FP8", "openai/gpt-oss-120b"])
def test_from_dict_rebuilds_the_model_spec(name):
    """The JSON's model plus its groups give back the same typed spec: per-layer kinds, quantization and
    all."""
    m = shard_map(name, 2)
    back = ShardMap.from_dict(json.loads(m.to_json()))
    assert back.model == m.model and back.model.layers == m.model.layers and back.model.quant == m.model.quant
    assert back.model.moe_layers == m.model.moe_layers and back.to_dict() == m.to_dict()


def _broken(d: dict) -> dict:
    out = {}
    out["not a dict"] = []
    out["no schema"] = {k: v for k, v in d.items() if k != "schema"}
    out["wrong schema"] = {**d, "schema": "tpviz.shardmap/0"}
    out["no ranks"] = {k: v for k, v in d.items() if k != "ranks"}
    out["tensors not a list"] = {**d, "tensors": 3}
    out["tensors None"] = {**d, "tensors": None}
    out["tensor is a string"] = {**d, "tensors": ["x"]}
    t0 = d["tensors"][0]
    out["pieces a string"] = {**d, "tensors": [{**t0, "pieces": "ab"}]}
    out["piece a list"] = {**d, "tensors": [{**t0, "pieces": [[0, 0, 1, 0]]}]}
    out["unknown tensor key"] = {**d, "tensors": [{**t0, "extra": 1}]}
    out["missing tensor key"] = {**d, "tensors": [{k: v for k, v in t0.items() if k != "shape"}]}
    out["params a dict"] = {**d, "params": {"a": 1}}
    out["rank missing field"] = {**d, "ranks": [{"rank": 0}]}
    out["model a list"] = {**d, "model": []}
    out["unknown model key"] = {**d, "model": {**d["model"], "extra": 1}}
    out["group mixer a string"] = {**d, "groups": [{**d["groups"][0], "mixer": "attention"}]}
    return out


@pytest.mark.parametrize("case", list(_broken({"tensors": [{}], "model": {}, "groups": [{}]})))
def test_from_dict_rejects_malformed(case, qwen):
    bad = _broken(copy.deepcopy(qwen.to_dict()))[case]
    with pytest.raises(SourceError) as err:
        ShardMap.from_dict(bad)
    assert str(err.value) and "\n" not in str(err.value)
