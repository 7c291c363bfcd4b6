"""Quantized models end to end (research quant.md sections 0-6): bytes against published checkpoint sizes,
real safetensors folders read header only, and quantization_config that is malformed, unknown, ignores a layer
or meets a fused qkv on disk. The layouts by hand: test_quant.py."""
import json
import struct

import pytest
import torch
from safetensors.torch import save_file

from tpviz import shard_map
from tpviz.trace.checkpoint import expand, read_header
from tpviz.errors import ConfigError
from tests.helpers.quant import AWQ, BLOCK, CT, GPTQ, A, L, llama


def test_memory_matches_published_checkpoints():
    assert shard_map("openai/gpt-oss-20b", 1).total_weight_bytes == 13761264768  # index total_size
    big = shard_map("openai/gpt-oss-120b", 8)
    assert big.total_weight_bytes == 65248815744
    # per GPU at tp 8: experts 128x36 x (768x(1440+90) u8 + 768 bf16 bias + 2880x(192+12) u8 + 2880 bf16 bias)
    # = 8155496448 (allocation 384 rows); split rest (4255115904 - 27179136)/8; replicated norms/router/o bias
    assert [r.weight_bytes for r in big.ranks] == [8155496448 + 528492096 + 27179136] * 8
    ds = shard_map("deepseek-ai/DeepSeek-V3", 8)  # the published 688586727753 includes the MTP layer (~2.2%)
    assert 0.97 * 688586727753 < ds.total_weight_bytes < 688586727753
    # replicated: 61 x (q_a 1536x7168 + kv_a 576x7168 fp8, their scale grids 12x56 + 5x56 f32, 4 norms bf16)
    # + 58 routers 256x7168 bf16 (+256 bias float32, as DeepseekV2MoE builds it) + the final norm
    rep = 61 * (11010048 + 2688 + 4128768 + 1120 + 32768) + 58 * (3670016 + 1024) + 14336
    assert rep == 1138633568
    assert [r.weight_bytes for r in ds.ranks] == [(ds.total_weight_bytes - rep) // 8 + rep] * 8
    gptq = shard_map("TheBloke/Llama-2-13B-chat-GPTQ", 1).total_weight_bytes
    # 40 x (int4 317194240/2 + fp16 scales 4956160 + int32 zeros 1239040) + norms + fp16 embed and lm_head
    assert gptq == 40 * (158597120 + 4956160 + 1239040) + 40 * 20480 + 10240 + 655360000 == 7247882240
    assert abs(gptq - 7.25e9) < 0.03 * 7.25e9


TINY = {"model_type": "llama", "hidden_size": 256, "num_attention_heads": 2,
        "num_key_value_heads": 1, "head_dim": 128,
        "intermediate_size": 256, "vocab_size": 128, "num_hidden_layers": 1, "torch_dtype": "bfloat16"}
LINEAR = {"self_attn.q_proj": (256, 256), "self_attn.k_proj": (128, 256), "self_attn.v_proj": (128, 256),
          **{n: (256, 256) for n in ("self_attn.o_proj", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj")}}


def checkpoint(tmp_path, q, stored):
    """A folder with config.json and one model.safetensors: bf16 embeddings and norms plus stored(N, K) per
    linear."""
    f = tmp_path / q["quant_method"]
    f.mkdir()
    (f / "config.json").write_text(json.dumps({**TINY, "quantization_config": q}))
    t = {n: torch.zeros(128, 256, dtype=torch.bfloat16)
         for n in ("model.embed_tokens.weight", "lm_head.weight")}
    t |= {n: torch.ones(256, dtype=torch.bfloat16) for n in (
        "model.norm.weight", "model.layers.0.input_layernorm.weight",
        "model.layers.0.post_attention_layernorm.weight")}
    for name, (n, k) in LINEAR.items():
        t |= {f"model.layers.0.{name}.{s}": v for s, v in stored(n, k).items()}
    save_file(t, str(f / "model.safetensors"))
    return f, t


@pytest.mark.parametrize("q, stored, dtypes", [
    (BLOCK, lambda n, k: {"weight": torch.zeros(n, k, dtype=torch.float8_e4m3fn),
                          "weight_scale_inv": torch.ones(-(-n // 128), -(-k // 128))}, {"F8_E4M3", "F32"}),
    (GPTQ, lambda n, k: {"qweight": torch.zeros(k // 8, n, dtype=torch.int32),
                         "qzeros": torch.zeros(k // 128, n // 8,
                         dtype=torch.int32), "scales": torch.ones(k // 128, n, dtype=torch.float16),
                         "g_idx": torch.zeros(k, dtype=torch.int32)}, {"I32", "F16"})])
def test_real_checkpoint_folder_verifies(tmp_path, q, stored, dtypes):
    f, t = checkpoint(tmp_path, q, stored)
    path = f / "model.safetensors"
    size = struct.unpack("<Q", path.read_bytes()[:8])[0]
    with open(path, "r+b") as fh:  # drop every tensor byte: only the header may be read
        fh.truncate(8 + size)
    header = read_header(path)
    assert {n: h["shape"] for n, h in header.items()} == {n: list(v.shape) for n, v in t.items()}
    assert {h["dtype"] for n, h in header.items() if ".layers.0.self_attn" in n} == dtypes
    m = shard_map(str(f), 2)
    assert m.checkpoint["verified"] and m.checkpoint["tensors"] == len(t)
    # every stored tensor the map names has the checkpoint's shape (g_idx is dropped by vLLM 0.33: not mapped)
    names = expand(m)
    assert {n: m.tensor(names[n]).shape for n in t if n in names} == {n: list(v.shape) for n, v in t.items()
                                                                    if not n.endswith("g_idx")}
    assert m.checkpoint["quantization_tensors"] == (7 if q is GPTQ else 0)


def test_a_method_tpviz_does_not_read_is_refused_not_drawn_at_the_model_dtype():
    """bitsandbytes stores int8 weights with .SCB scales (a real 8-bit Llama-3.1-8B index): drawn as bf16,
    its memory would read 1.77x its stored bytes."""
    with pytest.raises(ConfigError) as e:
        shard_map(llama({"quant_method": "bitsandbytes", "load_in_8bit": True}), 2)
    assert "\n" not in str(e.value) and "quant_method 'bitsandbytes'" in str(e.value)


@pytest.mark.parametrize("q, key", [({**BLOCK, "weight_block_size": [0, 128]}, "weight_block_size"),
                                    ({**BLOCK, "weight_block_size": [128]}, "weight_block_size"),
                                    ({**BLOCK, "weight_block_size": "x"}, "weight_block_size"),
                                    ({**GPTQ, "group_size": 0}, "group_size"),
                                    ({**AWQ, "group_size": 0}, "group_size"),
                                    ({**GPTQ, "bits": 3}, "bits"), ({**AWQ, "bits": 3}, "bits"),
                                    # keys vLLM's from_config requires: it refuses to load without them
                                    ({k: v for k, v in GPTQ.items() if k != "bits"}, "lacks bits"),
                                    ({k: v for k, v in GPTQ.items() if k != "sym"}, "lacks sym"),
                                    ({k: v for k, v in AWQ.items() if k != "zero_point"}, "lacks zero_point"),
                                    ({**CT, "format": "sparse-24-bitmask"}, "sparse"),
                                    ({**CT, "sparsity_config": {"targets": ["Linear"],
                                                                "format": "sparse-bitmask"}},
                                     "no longer loads")])
def test_malformed_quantization_config_is_one_line(q, key):
    with pytest.raises(ConfigError) as e:
        shard_map(llama(q), 1)
    assert key in str(e.value) and "\n" not in str(e.value)


def test_ignore_entry_for_one_layer():
    m = shard_map(llama({**BLOCK, "ignored_layers": ["model.layers.1.mlp.down_proj"]},
                        num_hidden_layers=2), 1)
    assert m.tensor(f"{L}down_proj.weight_scale_inv").layers == [0]


def test_fused_qkv_on_disk_is_quantized():
    m = shard_map({**TINY, "model_type": "phi3", "num_key_value_heads": 2, "quantization_config": BLOCK}, 1)
    assert m.tensor(f"{A}qkv_proj.weight_scale_inv").shape == [6, 2]  # 768 rows, 256 columns in 128 blocks
    assert next(p for p in m.params if p.name == f"{A}qkv_proj.weight").element_bytes == 1


@pytest.mark.parametrize("tp", (1, 2))
def test_awq_kv_cache_matches_unquantized(tp):
    plain, m = shard_map(llama(), tp), shard_map(llama(AWQ), tp)
    assert [(r.kv_heads, r.kv_cache_bytes_per_token) for r in m.ranks] == \
           [(r.kv_heads, r.kv_cache_bytes_per_token) for r in plain.ranks]


def test_mxfp4_refuses_an_intermediate_size_off_the_32_block():
    from tpviz.config.sources import presets
    cfg = dict(presets()["openai/gpt-oss-20b"], intermediate_size=48)
    with pytest.raises(ConfigError, match="MXFP4 experts need intermediate_size divisible by 32.*got 48"):
        shard_map(cfg, 2)


@pytest.mark.parametrize("keys", [("quantization", "quantization_config"), ("quantization",),
                                  ("quantization_config",)])
def test_mlx_checkpoint_is_refused_in_one_line(keys):
    """mlx_lm writes group_size and bits with no quant_method (and packed weights with .scales/.biases):
    vLLM reads that as unquantized and cannot load it, so no memory figure is given."""
    cfg = {**llama(), **{k: {"group_size": 64, "bits": 4} for k in keys}}
    with pytest.raises(ConfigError) as e:
        shard_map(cfg, 2)
    assert "\n" not in str(e.value) and "MLX checkpoint (4-bit, group 64" in str(e.value)
    assert "vLLM 0.33" in str(e.value)
