"""Kimi-K2.5 (vLLM 0.33 models/kimi_k25.py): DeepSeek-V3's decoder under language_model, its routed experts
INT4 (compressed-tensors pack-quantized, group 32), against every tensor of the published checkpoint, with
its shape and dtype, as a model-information report lists them (docs/presets.md). MoonViT and its projector
are left out of the map and named in one line."""
import pytest

from tpviz import shard_map
from tpviz.trace.checkpoint import compare

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


def test_every_text_tensor_name_and_size(stored):
    """The decoder name for name and byte for byte, but the 69,120 weight_shape tensors (int32 [2] on disk,
    8 bytes each; the map sizes them as int64); the tower and projector are left out, and the map says so."""
    m = shard_map(KIMI, 1, tensor_names=set(stored), checkpoint_source=KIMI)
    assert m.checkpoint["missing_in_map"] == [] and m.checkpoint["missing_in_checkpoint"] == []
    assert m.checkpoint["matched"] == sum(1 for n in stored if n.startswith("language_model."))
    sizes = {n: s for n, s in stored.items() if not n.endswith("weight_shape")}
    assert compare(m, set(stored), KIMI, sizes)["bytes"]["count"] == 0
    assert any("vision tower (and any projector" in n and "left out" in n for n in m.model.notes)
    assert not any(t.tower for t in m.tensors)


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
