"""Checkpoint comparison: tiny safetensors folders whose names differ from the map in known ways, header reading
without tensor data, unknown model types verified or refused, the real indexes in ../shared, and the hub index
offline (fake HF cache)."""
import hashlib
import json
from pathlib import Path
import os
import struct
import time

import pytest
import torch
from safetensors.torch import save_file

from tpviz import shard_map
from tpviz.checkpoint import (checkpoint_sentence, compare, expand, hub_tensor_names, local_tensor_names, read_header,
                              tensor_names_for)
from tpviz.errors import ConfigError, SourceError

TINY = {"model_type": "llama", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2,
        "intermediate_size": 128, "vocab_size": 128, "num_hidden_layers": 2}
LINEARS = [f"model.layers.{i}.{p}" for i in range(2) for p in (
    "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj",
    "mlp.down_proj")]
NAMES = {"model.embed_tokens.weight", "lm_head.weight", "model.norm.weight"} | {n + ".weight" for n in LINEARS} | {
    f"model.layers.{i}.{n}_layernorm.weight" for i in range(2) for n in ("input", "post_attention")}


def save(path, names):
    save_file({n: torch.zeros(2) for n in sorted(names)}, str(path))


def folder(tmp_path, names=NAMES, cfg=TINY, fname="model.safetensors", sub="ckpt"):
    f = tmp_path / sub
    f.mkdir(exist_ok=True)
    (f / "config.json").write_text(json.dumps(cfg))
    if names is not None:
        save(f / fname, names)
    return f


def names_only(c: dict) -> dict:
    """The name comparison (the stored-bytes part is tested on its own: these files hold dummy data)."""
    return {k: v for k, v in c.items() if k != "bytes"}


def check(f, **changes):
    return {"source": str(f.resolve()), "tensors": len(NAMES), "matched": len(NAMES), "prefix": "",
            "missing_in_checkpoint": [], "missing_in_map": [], "quantization_tensors": 0, "verified": True, **changes}


def one_line(e):
    return "\n" not in str(e.value) and str(e.value).strip()


def test_map_names_are_the_llama_checkpoint_names():
    assert set(expand(shard_map(TINY, 1))) == NAMES and len(NAMES) == 21


def test_exact_match_from_folder_and_config_path(tmp_path):
    f = folder(tmp_path)
    for source, tp in ((str(f), 1), (str(f / "config.json"), 2), (f, 4)):
        m = shard_map(source, tp)
        assert names_only(m.checkpoint) == check(f), source
    assert checkpoint_sentence(names_only(m.checkpoint)) == f"Checkpoint check: all 21 tensors of {f.resolve()} match the map."
    assert shard_map(TINY, 1).checkpoint is None  # a dict source has no checkpoint at hand


def test_missing_extra_and_ignored_tensors(tmp_path):
    dropped = {"model.layers.0.mlp.down_proj.weight", "model.layers.1.mlp.down_proj.weight",
               "model.layers.1.self_attn.q_proj.weight"}
    extra = {"model.layers.0.mlp.extra_norm.weight", "model.layers.1.mlp.extra_norm.weight", "model.final_logit_bias"}
    ignored = {"model.layers.0.self_attn.rotary_emb.inv_freq", "vision_tower.blocks.0.attn.weight",
               "mtp.layers.0.mlp.up_proj.weight", "model.visual.patch_embed.weight"}
    f = folder(tmp_path, (NAMES - dropped) | extra | ignored)
    m = shard_map(str(f), 1)
    assert names_only(m.checkpoint) == check(f, tensors=21 - 3 + 3 + 4, matched=18, verified=False,
                                 missing_in_checkpoint=["model.layers.*.mlp.down_proj.weight (2)",
                                                        "model.layers.*.self_attn.q_proj.weight"],
                                 missing_in_map=["model.layers.*.mlp.extra_norm.weight (2)", "model.final_logit_bias"])
    assert checkpoint_sentence(names_only(m.checkpoint)) == (
        f"Checkpoint check against {f.resolve()}: the checkpoint lacks model.layers.*.mlp.down_proj.weight (2), "
        "model.layers.*.self_attn.q_proj.weight; the map lacks model.layers.*.mlp.extra_norm.weight (2), "
        "model.final_logit_bias.")


def test_multimodal_language_model_prefix(tmp_path):
    names = {"model.language_model." + n[len("model."):] if n.startswith("model.") else n for n in NAMES}
    names |= {"model.visual.blocks.0.attn.qkv.weight", "model.vision_tower.encoder.layers.0.fc1.weight",
              "vision_tower.x.weight", "multi_modal_projector.linear_1.weight"}
    f = folder(tmp_path, names)
    assert names_only(shard_map(str(f), 2).checkpoint) == check(f, tensors=25, prefix="model.language_model.")


def test_multimodal_projector_under_model_is_ignored(tmp_path):
    names = {"model.language_model." + n[6:] if n.startswith("model.") else n for n in NAMES}
    f = folder(tmp_path, names | {"model.multi_modal_projector.linear_1.weight", "model.vision_tower.a.weight"})
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f, tensors=23, prefix="model.language_model.")


def test_old_multimodal_layout_lm_head(tmp_path):
    names = {"language_model." + n for n in NAMES} | {"vision_model.x.weight", "multi_modal_projector.linear_1.weight"}
    f = folder(tmp_path, names)
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f, tensors=23, prefix="language_model.model.")


def test_sharded_index(tmp_path):
    shards = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]
    order = sorted(NAMES)
    f = folder(tmp_path, NAMES - {"lm_head.weight"})  # a stray single file: the index wins, as in transformers
    (f / "model.safetensors.index.json").write_text(json.dumps({"metadata": {"total_size": 84}, "weight_map": {
        n: shards[i % 2] for i, n in enumerate(order)}}))
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)  # the shards need not exist: only the index is read
    for k, shard in enumerate(shards):
        save(f / shard, order[k::2])
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "model.safetensors.index.json").write_text('{"weight_map": [1, ')
    with pytest.raises(SourceError) as e:
        shard_map(str(f), 1)
    assert one_line(e) and "not a valid safetensors index" in str(e.value)


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
    assert checkpoint_sentence(names_only(m.checkpoint)).endswith("match the map (plus 56 quantization tensors).")


def test_gpt_oss_mxfp4_blocks_and_scales(tmp_path):
    cfg = {"model_type": "gpt_oss", "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 16,
           "intermediate_size": 64, "vocab_size": 128, "num_hidden_layers": 2, "num_local_experts": 4,
           "num_experts_per_tok": 2, "sliding_window": 8, "quantization_config": {"quant_method": "mxfp4"}}
    names = set(expand(shard_map(cfg, 1)))  # the MXFP4 map has the stacked blocks and scales themselves
    assert {n.split("experts.")[1] for n in names if "experts." in n} == {
        f"{p}_{s}" for p in ("gate_up_proj", "down_proj") for s in ("blocks", "scales", "bias")}
    f = folder(tmp_path, names, cfg)
    c = shard_map(str(f), 2).checkpoint
    assert (c["verified"], c["matched"], c["quantization_tensors"], c["tensors"]) == (True, len(names), 0, len(names))


def test_read_header_reads_no_tensor_data(tmp_path):
    p = tmp_path / "model.safetensors"
    save_file({"a.weight": torch.zeros(1000, 100), "b.bias": torch.zeros(3)}, str(p), metadata={"format": "pt"})
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
        assert one_line(e) and words in str(e.value) and "model.safetensors" in str(e.value)


@pytest.mark.parametrize("header", [b"[]  ", b"7   "])
def test_non_object_header_is_source_error(tmp_path, header):
    p = tmp_path / "model.safetensors"
    p.write_bytes(struct.pack("<Q", len(header)) + header)
    with pytest.raises(SourceError):
        read_header(p)


def test_stray_consolidated_file_is_not_read(tmp_path):
    f = folder(tmp_path)
    save(f / "consolidated.safetensors", {"layers.0.attention.wq.weight", "tok_embeddings.weight", "output.weight"})
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "consolidated.safetensors").write_bytes(b"garbage")  # never opened
    assert names_only(shard_map(str(f), 1).checkpoint) == check(f)
    (f / "model.safetensors").unlink()
    assert shard_map(str(f), 1).checkpoint is None and local_tensor_names(f) is None


MYSTERY = {**TINY, "model_type": "mystery_lm"}


def test_unknown_model_type_verified_by_checkpoint(tmp_path):
    m = shard_map(MYSTERY, 1)  # nothing at hand: mapped as Llama-like, with a note saying so
    assert m.checkpoint is None and any("mapped as a Llama-like decoder" in n for n in m.model.notes)
    f = folder(tmp_path, NAMES | {"model.layers.0.self_attn.rotary_emb.inv_freq"}, MYSTERY)
    m = shard_map(str(f), 2)
    assert names_only(m.checkpoint) == check(f, tensors=22)
    notes = [n for n in m.model.notes if "mystery_lm" in n]
    assert notes == [f"model_type 'mystery_lm' is not one tpviz knows; mapped as a Llama-like decoder, and every tensor "
                     f"name was verified against {f.resolve()}"]
    m = shard_map(MYSTERY, 1, tensor_names=NAMES, checkpoint_source="org/mystery")
    assert m.checkpoint["verified"] and m.model.notes[-1].endswith("verified against org/mystery")


@pytest.mark.parametrize("names", [NAMES - {"model.layers.1.mlp.up_proj.weight"}, NAMES | {"model.layers.0.mixer.A_log"},
                                   {"transformer.blocks.0.attn.Wqkv.weight", "transformer.wte.weight"}])
def test_unknown_model_type_not_matching_is_refused(tmp_path, names):
    f = folder(tmp_path, names, MYSTERY)
    with pytest.raises(ConfigError) as e:
        shard_map(str(f), 1)
    assert one_line(e) and "'mystery_lm' is not one tpviz knows" in str(e.value) and "refusing" in str(e.value)
    with pytest.raises(ConfigError):
        shard_map(MYSTERY, 1, tensor_names=names)
    known = shard_map(TINY, 1, tensor_names=names)  # a known type is only reported, never refused
    assert known.checkpoint["verified"] is False


@pytest.mark.parametrize("extra", [{"mamba_d_state": 16}, {"layer_types": ["linear_attention"] * 2},
                                   {"attn_layer_period": 8}, {"ssm_cfg": {}}])
def test_unknown_hybrid_config_refused_even_with_matching_checkpoint(tmp_path, extra):
    f = folder(tmp_path, NAMES, {**MYSTERY, **extra})
    for source in (str(f), {**MYSTERY, **extra}):
        with pytest.raises(ConfigError) as e:
            shard_map(source, 1)
        assert one_line(e) and next(iter(extra)) in str(e.value)


REAL = ["google__gemma-2-9b-it", "microsoft__Phi-3-mini-128k-instruct", "mistralai__Mistral-7B-Instruct-v0.3"]


@pytest.mark.parametrize("stem", REAL)
def test_real_indexes_verify(stem, shared_configs, tmp_path):
    shared = Path(__file__).resolve().parents[2] / "shared" / "configs"  # as tests/conftest.py finds it
    index = json.loads((shared / f"{stem}.index.json").read_text())
    names = set(index["weight_map"])
    m = shard_map(shared_configs[stem], 1, tensor_names=names, checkpoint_source=stem)
    real = {n for n in names if not n.endswith("rotary_emb.inv_freq")}
    assert names_only(m.checkpoint) == {"source": stem, "tensors": len(names), "matched": len(real), "prefix": "",
                            "missing_in_checkpoint": [], "missing_in_map": [], "quantization_tensors": 0, "verified": True}
    f = folder(tmp_path, None, shared_configs[stem])  # the same through a local folder holding config + index
    (f / "model.safetensors.index.json").write_text(json.dumps(index))
    assert names_only(shard_map(str(f), 2).checkpoint) == {**names_only(m.checkpoint), "source": str(f.resolve())}


def test_deepseek_mtp_layer_ignored():
    m = shard_map("deepseek-ai/DeepSeek-V3", 1)
    names = set(expand(m))
    mtp = {n.replace("layers.60.", "layers.61.") for n in names if "layers.60." in n} | {
        "model.layers.61." + s for s in ("eh_proj.weight", "enorm.weight", "hnorm.weight", "shared_head.head.weight",
                                         "shared_head.norm.weight", "embed_tokens.weight")}
    assert compare(m, names | mtp, "ds")["verified"]


# ---- hub index, offline ---------------------------------------------------------------------------------------------

@pytest.fixture
def offline_hub(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    for name in ("HF_HUB_CACHE", "HUGGINGFACE_HUB_CACHE", "HF_TOKEN"):
        monkeypatch.delenv(name, raising=False)
    return tmp_path / "hf" / "hub"


def cache_files(cache, repo, files, commit="0123456789abcdef0123456789abcdef01234567"):
    """The hub cache layout: blobs, a snapshot linking to them, refs/main."""
    repo_dir = cache / ("models--" + repo.replace("/", "--"))
    snap = repo_dir / "snapshots" / commit
    for d in (repo_dir / "refs", snap, repo_dir / "blobs"):
        d.mkdir(parents=True, exist_ok=True)
    (repo_dir / "refs" / "main").write_text(commit)
    for name, text in files.items():
        blob = repo_dir / "blobs" / hashlib.sha1(text.encode()).hexdigest()
        blob.write_text(text)
        try:
            os.symlink(os.path.relpath(blob, snap), snap / name)
        except OSError:
            (snap / name).write_text(text)


def test_hub_offline_empty_cache_is_none_quickly(offline_hub):
    t = time.monotonic()
    assert tensor_names_for("some-org/some-model") == (None, "some-org/some-model (model.safetensors.index.json)")
    assert hub_tensor_names("some-org/some-model") is None
    assert time.monotonic() - t < 5


def test_hub_cached_index_gives_names(offline_hub, tmp_path):
    index = {"metadata": {"total_size": 1}, "weight_map": {n: "model-00001-of-00001.safetensors" for n in NAMES}}
    cache_files(offline_hub, "some-org/cached-model", {"config.json": json.dumps(TINY),
                                                       "model.safetensors.index.json": json.dumps(index)})
    cache_files(offline_hub, "some-org/no-weight-map", {"model.safetensors.index.json": '{"metadata": {}}'})
    names, where = tensor_names_for(" some-org/cached-model ")
    assert names == NAMES and where == "some-org/cached-model (model.safetensors.index.json)"
    m = shard_map("some-org/cached-model", 1, tensor_names=names, checkpoint_source=where)
    assert m.checkpoint["verified"] and m.checkpoint["matched"] == 21
    assert hub_tensor_names("some-org/no-weight-map") is None


def test_tensor_names_for_non_hub_sources(tmp_path):
    f = folder(tmp_path)
    for source in ("meta-llama/Llama-3.1-8B", "qwen/qwen3-8b", str(f), "./ckpt", TINY, b"{}", "not a repo id"):
        assert tensor_names_for(source) == (None, ""), source


def test_stored_bytes_are_compared_with_the_map(tmp_path):
    """With the weight files at hand, each tensor's stored bytes (from the header) are checked against the map."""
    from tpviz.spec import normalize
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
    assert c["verified"] and c["bytes"]["differ"] == [f"lm_head.weight (checkpoint {4 * want} bytes, map {2 * want})"]
    assert "1 tensors are stored in other sizes" in checkpoint_sentence(c)
