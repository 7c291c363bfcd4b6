"""Kimi-K2.5 (vLLM 0.33 models/kimi_k25.py): DeepSeek-V3's decoder under language_model, its routed experts
INT4 (compressed-tensors pack-quantized, group 32), against every tensor of the published checkpoint, with
its shape and dtype, as a model-information report lists them (docs/presets.md), and its MoonViT tower and
projector (models/kimi_k25_vit.py)."""
import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec, presets
from tpviz.errors import TPSizeError
from tpviz.trace.checkpoint import compare
from tpviz.trace.shardmap import numel
from tests.helpers.errors import one_line

KIMI = "moonshotai/Kimi-K2.5"
BYTES = {"bf16": 2, "f32": 4, "i32": 4}
LM, ALL, DENSE, MOE = "language_model.model.layers.", range(61), range(1), range(1, 61)
# the report's weight list: (name, layers, experts, shape, dtype); 208,550 tensors, 554.27 GiB
ROWS = [("language_model.lm_head.weight", None, None, (163840, 7168), "bf16"),
        ("language_model.model.embed_tokens.weight", None, None, (163840, 7168), "bf16"),
        ("language_model.model.norm.weight", None, None, (7168,), "bf16"),
        *((f"{LM}*.{n}", ALL, None, s, "bf16") for n, s in (
            ("input_layernorm.weight", (7168,)), ("post_attention_layernorm.weight", (7168,)),
            ("self_attn.kv_a_layernorm.weight", (512,)), ("self_attn.kv_a_proj_with_mqa.weight", (576, 7168)),
            ("self_attn.kv_b_proj.weight", (16384, 512)), ("self_attn.o_proj.weight", (7168, 8192)),
            ("self_attn.q_a_layernorm.weight", (1536,)), ("self_attn.q_a_proj.weight", (1536, 7168)),
            ("self_attn.q_b_proj.weight", (12288, 1536)))),
        *((f"{LM}*.mlp.{n}.weight", DENSE, None, s, "bf16") for n, s in (
            ("down_proj", (7168, 18432)), ("gate_proj", (18432, 7168)), ("up_proj", (18432, 7168)))),
        *((f"{LM}*.mlp.experts.*.{n}.{part}", MOE, range(384), s, dt)
          for n, packed, scale in (("down_proj", (7168, 256), (7168, 64)),
                                   ("gate_proj", (2048, 896), (2048, 224)),
                                   ("up_proj", (2048, 896), (2048, 224)))
          for part, s, dt in (("weight_packed", packed, "i32"), ("weight_scale", scale, "bf16"),
                              ("weight_shape", (2,), "i32"))),
        (f"{LM}*.mlp.gate.e_score_correction_bias", MOE, None, (384,), "f32"),
        (f"{LM}*.mlp.gate.weight", MOE, None, (384, 7168), "bf16"),
        *((f"{LM}*.mlp.shared_experts.{n}.weight", MOE, None, s, "bf16") for n, s in (
            ("down_proj", (7168, 2048)), ("gate_proj", (2048, 7168)), ("up_proj", (2048, 7168)))),
        ("mm_projector.pre_norm.bias", None, None, (1152,), "bf16"),
        ("mm_projector.pre_norm.weight", None, None, (1152,), "bf16"),
        ("mm_projector.proj.0.bias", None, None, (4608,), "bf16"),
        ("mm_projector.proj.0.weight", None, None, (4608, 4608), "bf16"),
        ("mm_projector.proj.2.bias", None, None, (7168,), "bf16"),
        ("mm_projector.proj.2.weight", None, None, (7168, 4608), "bf16"),
        *((f"vision_tower.encoder.blocks.*.{n}", range(27), None, s, "bf16") for n, s in (
            ("mlp.fc0.bias", (4304,)), ("mlp.fc0.weight", (4304, 1152)), ("mlp.fc1.bias", (1152,)),
            ("mlp.fc1.weight", (1152, 4304)), ("norm0.bias", (1152,)), ("norm0.weight", (1152,)),
            ("norm1.bias", (1152,)), ("norm1.weight", (1152,)), ("wo.bias", (1152,)),
            ("wo.weight", (1152, 1152)),
            ("wqkv.bias", (3456,)), ("wqkv.weight", (3456, 1152)))),
        ("vision_tower.encoder.final_layernorm.bias", None, None, (1152,), "bf16"),
        ("vision_tower.encoder.final_layernorm.weight", None, None, (1152,), "bf16"),
        ("vision_tower.patch_embed.pos_emb.weight", None, None, (64, 64, 1152), "bf16"),
        ("vision_tower.patch_embed.proj.bias", None, None, (1152,), "bf16"),
        ("vision_tower.patch_embed.proj.weight", None, None, (1152, 3, 14, 14), "bf16")]


def checkpoint() -> dict[str, int]:
    """Every tensor of the report's list and its stored bytes."""
    out = {}
    for name, layers, experts, shape, dtype in ROWS:
        size = BYTES[dtype]
        for d in shape:
            size *= d
        for i in layers if layers is not None else [None]:
            one = name if i is None else name.replace("*", str(i), 1)
            for e in experts if experts is not None else [None]:
                out[one if e is None else one.replace("*", str(e), 1)] = size
    return out


@pytest.fixture(scope="module")
def stored():
    return checkpoint()


def test_the_list_is_the_reports(stored):
    """208,550 tensors and 554.27 GiB, as the report counts them (595 GB, as the release was announced)."""
    assert len(stored) == 208_550
    assert sum(stored.values()) == 595_148_192_736 and round(sum(stored.values()) / 2 ** 30, 2) == 554.27


def test_every_tensor_name_and_size(stored):
    """Name for name and byte for byte, MoonViT and its projector too, but the 69,120 weight_shape tensors
    (int32 [2] on disk, 8 bytes each; the map sizes them as int64)."""
    m = shard_map(KIMI, 1, tensor_names=set(stored), checkpoint_source=KIMI)
    assert m.checkpoint["missing_in_map"] == [] and m.checkpoint["missing_in_checkpoint"] == []
    assert m.checkpoint["matched"] == len(stored)
    sizes = {n: s for n, s in stored.items() if not n.endswith("weight_shape")}
    assert compare(m, set(stored), KIMI, sizes)["bytes"]["count"] == 0
    tower = sum(s for n, s in stored.items() if n.startswith(("vision_tower.", "mm_projector.")))
    assert sum(t.copies * numel(t.shape) * 2 for t in m.tensors if t.tower) == tower == 942_287_840


def test_moonvit_split_at_tp8():
    """kimi_k25_vit.py: wqkv one QKVParallelLinear over the 16 heads of 72 (2 a GPU), wo row-parallel,
    mlp.fc0 column (4304 / 8 = 538 rows) and fc1 row; kimi_k25.py's projector ReplicatedLinear, whole."""
    m = shard_map(KIMI, 8)
    b = "vision_tower.encoder.blocks.*."
    qkv = sorted((p.rank, p.start, p.stop) for p in m.tensor(f"{b}wqkv.weight").pieces if p.rank == 1)
    assert qkv == [(1, 144, 288), (1, 1296, 1440), (1, 2448, 2592)]  # its q, k and v heads 2 and 3
    assert [(p.rank, p.start, p.stop) for p in m.tensor(f"{b}mlp.fc0.weight").pieces][:2] == [
        (0, 0, 538), (1, 538, 1076)]
    assert m.tensor(f"{b}wo.weight").split_dim == 1 and m.tensor(f"{b}mlp.fc1.weight").split_dim == 1
    for name in ("mm_projector.proj.0.weight", "mm_projector.proj.2.weight", "mm_projector.pre_norm.weight",
                 "vision_tower.patch_embed.pos_emb.weight"):
        t = m.tensor(name)
        assert t.split_dim is None and sorted(p.rank for p in t.pieces) == list(range(8)), name
    whole = shard_map(load_spec(KIMI).served(mm_encoder="data"), 8).tensor(f"{b}wqkv.weight")
    assert sorted((p.rank, p.start, p.stop) for p in whole.pieces) == [(r, 0, 3456) for r in range(8)]


def test_moonvit_left_out_when_vllm_would_quantize_it():
    """kimi_k25.py drops a compressed-tensors config for the tower but passes any other to it: such a
    checkpoint's tower is left out (named in the notes), not drawn in bf16."""
    cfg = presets()[KIMI]
    fp8 = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}
    m = shard_map({**cfg, "quantization_config": fp8, "text_config": {**cfg["text_config"],
                                                                     "quantization_config": fp8}}, 8)
    assert not any(t.tower for t in m.tensors)
    assert any("vision tower (and any projector" in n and "left out" in n for n in m.model.notes)


def test_quantized_as_vllm_reads_the_ignore_list():
    """compressed-tensors' ignore list (regexes over vLLM's module names) keeps attention, the shared experts,
    the dense MLP and lm_head in bf16; the routed experts alone are INT4, and the router's score bias is
    float32 (DeepseekV2MoE builds it so)."""
    m = shard_map(KIMI, 8)
    assert m.model.quant.scheme == "int4_group" and m.model.quant.group == 32
    packed = {t.name for t in m.tensors if t.name.endswith("weight_packed")}
    assert packed == {f"model.layers.*.mlp.experts.*.{n}.weight_packed"
                      for n in ("gate_proj", "up_proj", "down_proj")}
    bias = next(p for p in m.params if p.name.endswith("e_score_correction_bias"))
    assert bias.element_bytes == 4


def test_kv_cache_per_token_by_hand():
    """MLA caches the 512-wide latent and the 64-wide rope key whole on every GPU: (512 + 64) x 2 bytes x 61
    layers = 70,272 bytes per token at any tp."""
    for tp in (1, 8, 16):
        m = shard_map(KIMI, tp)
        assert all(r.kv_cache_bytes_per_token == 70_272 for r in m.ranks)


def test_tp_above_the_vision_heads_says_vllm_runs_the_tower_data_parallel():
    """16 vision heads over 32 GPUs: is_vit_use_data_parallel makes vLLM run MoonViT whole on every GPU,
    which the map draws under --mm-encoder-tp-mode data (the decoder's 64 heads split as usual)."""
    with pytest.raises(TPSizeError) as e:
        shard_map(KIMI, 32)
    assert one_line(e.value) and "runs this tower data-parallel by itself" in str(e.value)
    m = shard_map(load_spec(KIMI).served(mm_encoder="data"), 32)
    fc0 = m.tensor("vision_tower.encoder.blocks.*.mlp.fc0.weight")
    assert sorted((p.rank, p.start, p.stop) for p in fc0.pieces) == [(r, 0, 4304) for r in range(32)]
