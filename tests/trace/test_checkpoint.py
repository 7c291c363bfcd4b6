"""Checkpoint comparison against local safetensors folders: tiny folders whose names differ from the map in
known ways, sharded indexes, quantization tensors counted apart, header reading without tensor data, corrupt
files, and stored bytes against the map."""
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from tpviz import shard_map
from tpviz.trace.checkpoint import checkpoint_sentence, expand, local_tensor_names, read_header
from tpviz.errors import SourceError
from tests.helpers.checkpoint import LINEARS, NAMES, TINY, check, folder, names_only, save
from tests.helpers.errors import one_line


def test_map_names_are_the_llama_checkpoint_names():
    assert set(expand(shard_map(TINY, 1))) == NAMES and len(NAMES) == 21


def test_exact_match_from_folder_and_config_path(tmp_path):
    f = folder(tmp_path)
    for source, tp in ((str(f), 1), (str(f / "config.json"), 2), (f, 4)):
        m = shard_map(source, tp)
        assert names_only(m.checkpoint) == check(f), source
    assert (checkpoint_sentence(names_only(m.checkpoint))
            == f"Checkpoint check: all 21 tensor names of {f.resolve()} match the map.")
    assert shard_map(TINY, 1).checkpoint is None  # a dict source has no checkpoint at hand


def test_missing_extra_and_ignored_tensors(tmp_path):
    dropped = {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
               "model.layers.1.self_attn.q_proj.weight"}
    extra = {"model.layers.0.mlp.extra_norm.weight", "model.layers.1.mlp.extra_norm.weight",
             "model.final_logit_bias"}
    ignored = {"model.layers.0.self_attn.rotary_emb.inv_freq", "vision_tower.blocks.0.attn.weight",
               "mtp.layers.0.mlp.up_proj.weight", "model.visual.patch_embed.weight"}
    f = folder(tmp_path, (NAMES - dropped) | extra | ignored)
    m = shard_map(str(f), 1)
    assert names_only(m.checkpoint) == check(f, tensors=21 - 3 + 3 + 4, matched=18, verified=False,
                                 missing_in_checkpoint=["model.layers.*.mlp.down_proj.weight (2)",
                                                        "model.layers.*.self_attn.q_proj.weight"],
                                 missing_in_map=["model.layers.*.mlp.extra_norm.weight (2)",
                                                 "model.final_logit_bias"])
    assert checkpoint_sentence(names_only(m.checkpoint)) == (
        f"Checkpoint check against {f.resolve()}: the checkpoint lacks "
        "model.layers.*.mlp.down_proj.weight (2), model.layers.*.self_attn.q_proj.weight; the map lacks "
        "model.layers.*.mlp.extra_norm.weight (2), model.final_logit_bias.")


def test_multimodal_language_model_prefix(tmp_path):
    names = {"model.language_model." + n[len("model."):] if n.startswith("model.") else n for n in NAMES}
    names |= {"model.visual.blocks.0.attn.qkv.weight", "model.vision_tower.encoder.layers.0.fc1.weight",
              "vision_tower.x.weight", "multi_modal_projector.linear_1.weight"}
    f = folder(tmp_path, names)
    assert names_only(shard_map(str(f), 2).checkpoint) == check(f, tensors=25, prefix="model.language_model.")


def test_multimodal_projector_under_model_is_ignored(tmp_path):
    names = {"model.language_model." + n[6:] if n.startswith("model.") else n for n in NAMES}
    f = folder(tmp_path, names | {"model.multi_modal_projector.linear_1.weight",
                                  "model.vision_tower.a.weight"})
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f, tensors=23, prefix="model.language_model.")


def test_old_multimodal_layout_lm_head(tmp_path):
    names = {"language_model." + n for n in NAMES} | {"vision_model.x.weight",
                                                      "multi_modal_projector.linear_1.weight"}
    f = folder(tmp_path, names)
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f, tensors=23, prefix="language_model.")


def test_sharded_index(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    order = sorted(NAMES)
    # a stray single file: the index wins, as in transformers
    f = folder(tmp_path, NAMES - {"lm_head.weight"})
    (f
     / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 84}, "weight_map": {
        n: shards[i % 2] for i, n in enumerate(order)}}))
    # the shards need not exist: only the index is read
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    for k, shard in enumerate(shards):
        save(f / shard, order[k::2])
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "model.safetensors.index.json").write_text('{"weight_map": [1, ')
    with pytest.raises(SourceError) as e:
        shard_map(str(f), 1)
    assert one_line(e.value) and "not a valid safetensors index" in str(e.value)


def test_index_weight_map_must_be_an_object(tmp_path):
    f = folder(tmp_path, None)
    (f / "model.safetensors.index.json").write_text('{"weight_map": "model.safetensors"}')
    with pytest.raises(SourceError):
        local_tensor_names(f)


def test_quantization_tensors_counted_apart(tmp_path):
    fp8 = NAMES | {n + ".weight_scale_inv" for n in LINEARS} | {"model.layers.0.self_attn.k_scale"}
    f = folder(tmp_path, fp8)
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f, tensors=21 + 15, quantization_tensors=15)
    gptq = (NAMES - {n + ".weight" for n in LINEARS}) | {
        n + s for n in LINEARS for s in (".qweight", ".qzeros", ".scales", ".g_idx")}
    g = folder(tmp_path, gptq, sub="gptq")
    m = shard_map(str(g), 1)
    assert names_only(m.checkpoint) == check(g, tensors=7 + 14 * 4, quantization_tensors=56)
    assert checkpoint_sentence(names_only(m.checkpoint)).endswith("match the map (plus 56 "
                                                                  "quantization tensors).")


def test_gpt_oss_mxfp4_blocks_and_scales(tmp_path):
    cfg = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4,
           "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 64, "vocab_size": 128, "num_hidden_layers": 2, "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 8, "quantization_config": {"quant_method": "mxfp4"}}
    names = set(expand(shard_map(cfg, 1)))  # the MXFP4 map has the stacked blocks and scales themselves
    assert {n.split("experts.")[1] for n in names if "experts." in n} == {
        f"{p}_{s}" for p in ("gate_up_proj", "down_proj") for s in ("blocks", "scales", "bias")}
    f = folder(tmp_path, names, cfg)
    c = shard_map(str(f), 2).checkpoint
    assert (c["verified"], c["matched"], c["quantization_tensors"],
            c["tensors"]) == (True, len(names), 0, len(names))


def test_read_header_reads_no_tensor_data(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.zeros(1000, 100), "b.bias": torch.zeros(3)}, str(p),
              metadata={"format": "pt"})
    size = struct.unpack("<Q", p.read_bytes()[:8])[0]
    p.write_bytes(p.read_bytes()[:8 + size + 10])  # header intact, the 400 kB of data cut off
    h = read_header(p)
    assert set(h) == {"a.weight", "b.bias"} and h["a.weight"]["shape"] == [1000, 100]
    assert local_tensor_names(tmp_path) == {"a.weight", "b.bias"}


@pytest.mark.parametrize("data, words", [
    (b"", "cannot read the safetensors header"), (b"\x01\x02", "cannot read the safetensors header"),
    (struct.pack("<Q", 1 << 40) + b"{}", "is not a safetensors file"),
    (struct.pack("<Q", 50) + b'{"a": {"dtype": "F32"', "cannot read the safetensors header"),
    (struct.pack("<Q", 4) + b"\xff\xfe{}", "cannot read the safetensors header"),
    (b"PK\x03\x04 this is a zip, not safetensors" * 4, "")])
def test_corrupt_file_is_one_line_source_error(tmp_path, data, words):
    f = folder(tmp_path, None)
    (f / "model.safetensors").write_bytes(data)
    for call in (lambda: read_header(f / "model.safetensors"), lambda: shard_map(str(f), 1)):
        with pytest.raises(SourceError) as e:
            call()
        assert one_line(e.value) and words in str(e.value) and "model.safetensors" in str(e.value)


@pytest.mark.parametrize("header", [b"[]  ", b"7   "])
def test_non_object_header_is_source_error(tmp_path, header):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(SourceError):
        read_header(p)


def test_stray_consolidated_file_is_not_read(tmp_path):
    f = folder(tmp_path)
    save(f / "consolidated.safetensors", {"layers.0.attention.wq.weight",
                                          "tok_embeddings.weight", "output.weight"})
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "consolidated.safetensors").write_bytes(b"garbage")  # never opened
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "model.safetensors").unlink()
    assert shard_map(str(f), 1).checkpoint is None and local_tensor_names(f) is None


def test_stored_bytes_are_compared_with_the_map(tmp_path):
    """With the weight files at hand, each tensor's stored bytes (from the header) are checked against the
    map."""
    from tpviz.config.normalize import normalize
    spec = normalize(TINY)
    m = shard_map(TINY, 1)
    shapes = {}
    for t in m.tensors:  # a real-sized bf16 checkpoint of the tiny config
        for i in t.layers or [None]:
            shapes[t.name if i is None else t.name.replace("*", str(i))] = t.shape
    tensors = {n: torch.zeros(shape, dtype=torch.bfloat16) for n, shape in shapes.items()}
    f = tmp_path / "real"
    f.mkdir()
    (f / "config.json").write_text(json.dumps(TINY))
    save_file(tensors, str(f / "model.safetensors"))
    c = shard_map(str(f), 2).checkpoint
    assert c["verified"] and c["bytes"] == {"checked": True, "differ": [], "count": 0}
    assert checkpoint_sentence(c).endswith("match the map, byte for byte.")
    tensors["lm_head.weight"] = tensors["lm_head.weight"].float()  # one tensor stored in float32
    save_file(tensors, str(f / "model.safetensors"))
    c = shard_map(str(f), 2).checkpoint
    want = spec.vocab_size * spec.hidden_size
    assert (c["verified"]
            and c["bytes"]["differ"] == [f"lm_head.weight (checkpoint {4 * want} bytes, map {2 * want})"])
    assert "1 tensors are stored in other sizes" in checkpoint_sentence(c)


def test_a_long_list_of_missing_tensors_says_how_many_more():
    from tpviz.trace.checkpoint import _patterns
    names = [f"model.layers.{i}.t{k}.weight" for k in range(8) for i in range(k + 1)] + ["model.norm.weight"]
    shown = _patterns(names)
    assert shown[:2] == ["model.layers.*.t7.weight (8)", "model.layers.*.t6.weight (7)"] and len(shown) == 7
    assert shown[-1] == "and 3 more kinds (4 tensors)"  # t1 (2), t0 (1) and model.norm.weight (1) left out
    assert _patterns(names[:3]) == ["model.layers.*.t1.weight (2)", "model.layers.*.t0.weight"]
