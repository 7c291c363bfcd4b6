"""Step-3's text decoder (vLLM 0.33 models/step3_text.py) and the Step-3 wrapper (step3_vl.py) against hand
computation: transformers has no Step-3 class, and no copy of the release's config.json or index was found,
so the full-size checks take its dims from the model card (61 layers, 5 dense, hidden 7168, low-rank query
2048, 64 query heads of 256, 48 experts and top 3, one shared expert, 316B parameters for the LLM)."""
import pytest

from tpviz import shard_map
from tpviz.config.sources import load_spec
from tpviz.deploy.deployment import deploy
from tpviz.errors import ConfigError, MissingFieldError
from tpviz.plan import build_plan
from tpviz.plan.tensors import tensors
from tpviz.render.summary import kv_sentence
from tpviz.rules import Layout
from tpviz.trace.checkpoint import expand
from tpviz.trace.collectives import collectives
from tpviz.trace.validity import split_error

# the card's dims under Step3TextConfig's keys (vLLM 0.33 transformers_utils/configs/step3_vl.py); the MoE
# layers 4-59 are its class default, here as the comma-separated string step3_text.py parses
STEP3 = dict(architectures=["Step3TextForCausalLM"], model_type="step3_text", hidden_size=7168,
             intermediate_size=18432, num_attention_heads=64, num_attention_groups=1, num_hidden_layers=61,
             max_seq_len=65536, vocab_size=128815, rms_norm_eps=1e-5, moe_intermediate_size=5120,
             moe_num_experts=48, moe_top_k=3, max_position_embedding=65536, share_expert_dim=5120,
             share_q_dim=2048, head_dim=256, moe_layers_enum=",".join(map(str, range(4, 60))),
             torch_dtype="bfloat16")
TINY = dict(STEP3, hidden_size=64, intermediate_size=96, num_attention_heads=4, num_hidden_layers=3,
            vocab_size=512, moe_intermediate_size=32, moe_num_experts=4, moe_top_k=2, share_expert_dim=48,
            share_q_dim=24, head_dim=16, moe_layers_enum="1,2")
ATTN = "model.layers.*.self_attn."


def step3_params() -> int:
    h, heads, d, q = 7168, 64, 256, 2048
    attention = (q + 2 * d) * h + q + q * heads * d + heads * d * h  # qkv_proj, inter_norm, wq, o_proj
    moe = 48 * 3 * 5120 * h + 48 * h + 3 * 5120 * h  # routed experts, router, shared expert
    return 2 * 128815 * h + h + 61 * (attention + 2 * h) + 5 * 3 * 18432 * h + 56 * moe


def test_step3_by_hand_at_tp8():
    """The card's 316B LLM parameters; the one K/V head sits in the replicated qkv_proj, so every GPU caches
    61 layers x K and V of 256, whatever tp is."""
    m = shard_map(STEP3, 8)
    assert m.total_weight_bytes == 2 * step3_params() and round(step3_params() / 1e9) == 316
    assert [r.kv_cache_bytes_per_token for r in m.ranks] == [61 * 2 * 256 * 2] * 8
    qkv = m.tensor(f"{ATTN}k_proj.weight")
    assert qkv.split_dim is None and sorted(p.rank for p in qkv.pieces) == list(range(8))
    wq = m.tensor(f"{ATTN}wq.weight")  # 8 of the 64 heads a GPU: 2048 rows of the low-rank q each
    assert [(p.rank, p.start, p.stop) for p in wq.pieces][:2] == [(0, 0, 2048), (1, 2048, 4096)]
    assert m.tensor(f"{ATTN}o_proj.weight").split_dim == 1
    layers = {p.name: len(p.layers) for p in m.params if p.name.startswith("model.layers.*.")}
    assert layers["model.layers.*.mlp.gate_up_proj.weight"] == 5
    assert layers["model.layers.*.share_expert.gate_up_proj.weight"] == 56
    assert "1 KV head on 8 GPUs, so vLLM copies each KV head to 8 GPUs (head 0 on GPUs 0–7)" in kv_sentence(m)
    # o_proj; the MLP or FusedMoE; the shared expert's down_proj apart (reduce_results); the embedding
    reduces = [(c.count, c.bytes_per_token) for c in collectives(m) if c.op == "all-reduce"]
    assert reduces == [(61, 7168 * 2), (61, 7168 * 2), (56, 7168 * 2), (1, 7168 * 2)]


def test_step3_valid_tp():
    """tp divides the 64 heads, the MLP widths and the padded vocabulary (128832 = 64 x 2013); FusedMoEBlock
    refuses tp above the 48 experts, so 64 is out."""
    spec = load_spec(STEP3)
    assert [tp for tp in range(1, 65) if split_error(spec, tp)[0] is None] == [1, 2, 4, 8, 16, 32]
    assert "num_experts=48" in str(split_error(spec, 64)[0])
    placement = deploy(spec, Layout(8, ep=True)).expert_placement
    assert placement == [list(range(6 * i, 6 * i + 6)) for i in range(8)]


def test_step3_tiny_names_and_shapes_by_hand():
    """q_proj / k_proj / v_proj, inter_norm and wq; experts stacked per projection under moe.; the shared
    expert beside the block; layer 0 (not in moe_layers_enum) a gated MLP."""
    m = shard_map(TINY, 2)
    shapes = {t.name: tuple(t.shape) for t in tensors(build_plan(m.model))}
    one = "model.layers.1."
    layer = {n.removeprefix(one): s for n, s in shapes.items() if n.startswith(one)}
    assert layer == {"input_layernorm.weight": (64,), "post_attention_layernorm.weight": (64,),
                     "self_attn.q_proj.weight": (24, 64), "self_attn.k_proj.weight": (16, 64),
                     "self_attn.v_proj.weight": (16, 64), "self_attn.inter_norm.weight": (24,),
                     "self_attn.wq.weight": (64, 24), "self_attn.o_proj.weight": (64, 64),
                     "moe.gate.weight": (4, 64), "moe.gate_proj.weight": (4, 32, 64),
                     "moe.up_proj.weight": (4, 32, 64), "moe.down_proj.weight": (4, 64, 32),
                     "share_expert.gate_proj.weight": (48, 64), "share_expert.up_proj.weight": (48, 64),
                     "share_expert.down_proj.weight": (64, 48)}
    assert {n for n in shapes if n.startswith("model.layers.0.mlp.")} == {
        f"model.layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    assert set(expand(m)) == set(shapes) and "lm_head.weight" in shapes
    gate = m.tensor("model.layers.*.moe.gate_proj.weight")  # each expert's 32 rows cut in two
    assert [(p.rank, p.start, p.stop) for p in gate.pieces] == [(0, 0, 16), (1, 16, 32)]


def test_step3_reads_as_vllm_does():
    """Step3TextConfig's defaults fill the keys that are no dimension; the lm_head is its own tensor whatever
    tie_word_embeddings says; the MLPs run silu whatever hidden_act says; an index past the layers builds
    nothing."""
    bare = {k: v for k, v in TINY.items() if k not in ("share_q_dim", "head_dim", "moe_top_k")}
    spec = load_spec({**bare, "tie_word_embeddings": True, "hidden_act": "gelu", "moe_layers_enum": "1,2,7"})
    assert spec.layers[1].mixer.q_rank == 2048 and spec.head_dim == 256 and spec.num_experts_per_tok == 3
    assert not spec.tie_word_embeddings and spec.hidden_act == "silu" and spec.moe_layers == [1, 2]


def test_step3_refusals():
    with pytest.raises(ConfigError, match="num_attention_groups=2"):
        shard_map({**TINY, "num_attention_groups": 2}, 2)
    for enum in (None, [1, 2]):
        with pytest.raises(ConfigError, match="moe_layers_enum"):
            shard_map({**TINY, "moe_layers_enum": enum}, 2)
    with pytest.raises(ConfigError, match="not a comma-separated"):
        shard_map({**TINY, "moe_layers_enum": "1;2"}, 2)
    with pytest.raises(MissingFieldError, match="moe_intermediate_size"):
        shard_map({k: v for k, v in TINY.items() if k != "moe_intermediate_size"}, 2)


def test_step3_vl_maps_its_text_decoder_and_leaves_the_tower_out():
    """step3_vl.py builds text_config as Step3TextForCausalLM under the same names (model.*, lm_head.*); the
    vision tower (vision_model.*) and projector are left out, as the notes say."""
    vision = dict(hidden_size=1792, intermediate_size=3072, output_hidden_size=4096, num_hidden_layers=63,
                  num_attention_heads=16, image_size=728, patch_size=14)
    wrapped = dict(architectures=["Step3VLForConditionalGeneration"], model_type="step3_vl", hidden_size=64,
                   text_config=TINY, vision_config=vision, understand_projector_stride=2,
                   projector_bias=False)
    m, text = shard_map(wrapped, 2), shard_map(TINY, 2)
    assert set(expand(m)) == set(expand(text)) and m.total_weight_bytes == text.total_weight_bytes
    assert any("vision tower" in n and "left out" in n for n in m.model.notes)
    # a checkpoint's tower and projector tensors (step3_vl.py's vision_model, vit_downsampler(2),
    # vit_large_projector) are the parts left out, not a mismatch
    parts = {"vision_model.transformer.resblocks.0.attn.in_proj_weight", "vit_downsampler.weight",
             "vit_downsampler2.bias", "vit_large_projector.weight"}
    m = shard_map(wrapped, 2, tensor_names=set(expand(text)) | parts, checkpoint_source="tiny")
    assert m.checkpoint["verified"] and m.checkpoint["matched"] == len(expand(text)), m.checkpoint


def test_packed_int_quantization_of_the_replicated_tables_is_refused():
    """GPTQ / AWQ packing of a table every GPU holds whole (Step3's qkv_proj, MiniCPM3's latents) is not
    traced: refused in one line; FP8 blocks map (each GPU holds the whole table and its scales)."""
    awq = {"quant_method": "awq", "bits": 4, "group_size": 8, "zero_point": True, "version": "gemm"}
    with pytest.raises(ConfigError, match="replicated attention tables is not modelled"):
        shard_map({**TINY, "quantization_config": awq}, 2)
    fp8 = {"quant_method": "fp8", "weight_block_size": [8, 8], "activation_scheme": "dynamic"}
    m = shard_map({**TINY, "quantization_config": fp8}, 2)
    scales = m.tensor("model.layers.*.self_attn.k_proj.weight_scale_inv")
    assert scales.split_dim is None and sorted(p.rank for p in scales.pieces) == [0, 1]
